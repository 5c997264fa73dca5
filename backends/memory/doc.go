// Package memory is Sluice's in-process store: the embedded default, and the
// reference implementation of the limiter's store interfaces: [Store]
// implements [limiter.Counter], [limiter.PackedCounter], [limiter.BucketStore]
// and [limiter.LogStore];
// [Leases] implements [limiter.LeaseStore] and [limiter.GaugeStore] for the
// concurrency limiter and the load shedders.
//
// Storage protocol: keys are spread over 64 shards by a seeded hash; each
// shard is a map guarded by one mutex, so every decision's read-modify-write
// happens under that lock and is exact. Window counters are a ring of
// sub-window counts per key holding the newest 2*span sub-windows written:
// the view and the out-of-order horizon of [limiter.Counter], so a writer
// up to span sub-windows behind the newest finds its whole view and its
// refund lands on the counter it added to; a writer further behind is
// counted in the oldest sub-window of the newest writer's view
// (Counts.Moved). Reads never move the ring. Packed window counters
// ([limiter.PackedCounter]) are, per level, a ring of 64-bit counters
// holding every counter that covers a slot within op.Keep of the newest
// slot added to the key; deltas are added modulo 2^64 (the limiter detects
// a carry), refunds clamp each field at 0, and an op naming a counter older
// than that is answered Stale without changing anything (never created
// again). A packed key at the default 160 slots holds 116 counters (83, 23,
// 7 and 3 per level: about 2.8 KB, against 336 bytes for 20 sub-window
// counters), allocated on its first add. Buckets are the stored state,
// logs a sorted slice reused in place. Every write sets an
// expiry (the TTL the limiter asks for); an expired key reads as absent.
//
// Memory is bounded: each shard holds at most MaxKeys/64 keys. When a new key
// arrives at a full shard, expired keys go first, then the least recently
// used one. Evicting a live key forgets its state (a bucket starts full
// again), so size MaxKeys above the number of keys active within the longest
// window; Stats reports evictions of live keys so that this can be alarmed.
package memory
