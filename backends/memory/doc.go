// Package memory is Sluice's in-process store: the embedded default, and the
// reference implementation of the limiter's store interfaces: [Store]
// implements [storage.Counter], [storage.PackedCounter], [storage.BucketStore]
// and [storage.LogStore]; [Leases] implements [storage.LeaseStore] and
// [storage.GaugeStore] for the concurrency limiter and the load shedders.
//
//	s, err := memory.New(memory.Config{})
//	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 100, Window: time.Minute})
//
// Keys are spread over 64 shards by a seeded hash; each shard is a map
// guarded by one mutex, so every decision's read-modify-write happens under
// that lock and is exact. The state is the process's own: in Lambda, each
// instance limits on its own.
//
// Memory is bounded: each shard holds at most MaxKeys/64 keys. When a new key
// arrives at a full shard, expired keys go first, then the least recently
// used one. Evicting a live key forgets its state (a bucket starts full
// again), so size MaxKeys above the number of keys active within the longest
// window; Stats reports evictions of live keys so that this can be alarmed.
//
// docs/stores.md ("Memory") states how each algorithm's state is kept and
// what a packed window's key costs.
package memory
