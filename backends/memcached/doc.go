// Package memcached is a limiter store on memcached (through
// github.com/bradfitz/gomemcache): atomic sub-window counters for the
// sliding and fixed windows ([limiter.Counter]), packed multi-level
// counters for the packed sliding window ([limiter.PackedCounter]), and
// compare-and-swap values
// for the token bucket ([limiter.BucketStore]) and the sliding log
// ([limiter.LogStore]).
//
//	s, err := memcached.New(memcached.Config{
//		Addrs:   []string{"cache-1:11211", "cache-2:11211"},
//		Timeout: 100 * time.Millisecond,
//	})
//	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 100, Window: time.Minute, SubWindows: 12})
//
// ElastiCache Serverless is one TLS endpoint in front of many shards:
//
//	s, err := memcached.New(memcached.Config{
//		Addrs:      []string{"my-cache-abc123.serverless.use1.cache.amazonaws.com:11211"},
//		ServerName: "my-cache-abc123.serverless.use1.cache.amazonaws.com", // turns TLS on
//		Proxy:      true,
//	})
//
// # Keys
//
// A limiter key (Space, Name) becomes the memcached key
//
//	KeyPrefix "k:" Space "/" Name                        when both are printable ASCII, Space has no '/' and it fits
//	KeyPrefix "h:" base64url(SHA-256(len(Space) Space Name))  otherwise
//
// followed by "|c<index>" for a sub-window counter, "|p<level>:<index>"
// for a packed window's counter, "|b" for a bucket or "|l" for a log (a
// packed window's base is readable only if that longer suffix fits too). Keys are at most 250 bytes and never hold a space or a control
// byte, so a name like "a\r\nflush_all" is one (hashed) key and never a
// command. The readable and hashed forms differ after the prefix, the
// readable form is injective because Space has no '/', and the hashed form
// is as collision resistant as SHA-256, so two limiter keys never share an
// item.
//
// # Nodes
//
// Keys are spread over the nodes by consistent hashing ([Ring], ketama
// style, 160 points per node): adding a fourth node to three moves about a
// quarter of the keys, where gomemcache's default (CRC-32 modulo n) moves
// three quarters. The ring places an item by the part of its key before the
// last '|', so all the items of one limiter key are on one node and a
// decision talks to one server. With Config.AutoDiscovery the node list
// comes from an ElastiCache configuration endpoint ("config get cluster",
// or "get AmazonElastiCache:cluster" on old engines), read at New and
// refreshed every DiscoveryInterval; a newer config version replaces the
// ring.
//
// # Windows: add, incr, get in one pipeline
//
// Add(key, cur, span, n, ttl) writes three commands at once on one
// connection to the key's node, and reads their three replies: one round
// trip.
//
//	add <key|c cur> 0 <exp> 1        data "0": create the counter at zero if it is missing
//	incr <key|c cur> n               the reply is the count after the add: Counts.C[0]
//	get <key|c cur+span-1> ... <key|c cur+1> <key|c cur-1> ... <key|c cur-span+1>
//
// The newer sub-windows (cur+1 to cur+span-1, or cur+1 for a fixed window)
// add up to Counts.Later: traffic of writers whose clocks are ahead of the
// caller's. The add fails harmlessly (NOT_STORED) when the counter exists;
// if the counter vanishes between add and incr (evicted, flush_all), the
// incr finds nothing and the pipeline is sent again. A Store skips the add
// of a counter it created itself within its TTL, as it does for a packed
// window's (see Packed windows): a warm fixed window is one incr. Sub (the refund of a
// denied request) is decr <key|c idx> n; memcached stops decr at zero, and a
// counter that is gone has nothing to give back. With n == 0 only the get is
// sent.
//
// Why it is safe under races: memcached runs the commands of one connection
// in order, each to completion, and incr is atomic. So the incr returns a
// count that includes every earlier increment of the sub-window, and the
// get runs after the incr, so it sees every increment that came before
// ours, in every sub-window. Take the requests allowed in any window-length
// interval (at most span consecutive sub-windows) and among them the one X
// whose incr came last: X's get ran after all their increments and read
// every sub-window they are in (X reads span-1 sub-windows on either side of
// its own), so X counted them all, and X was allowed only if they fit the
// limit. The bounded sliding window therefore never allows more than its
// limit in any window-length interval, whatever the callers' clocks and
// however requests race, as on an atomic store. (Refunds only remove what
// denied requests added.)
//
// This needs the commands to reach memcached in order on one connection. A
// proxy in front of several shards (ElastiCache Serverless, mcrouter,
// twemproxy) may run the incr and the get concurrently on different shards
// (it keeps one key's commands in order: add then incr); set Config.Proxy
// and the get is sent after the incr's reply: two round trips, same
// guarantee.
//
// Why not incr in parallel with one get-multi on a second connection (the
// first design, and the usual one): the two are then not ordered. A
// decision A at the end of sub-window i and B at the start of i+1 can each
// miss the other (A's read of i+1 before B's incr, B's read of i before A's
// incr), and both be allowed. Over the two sub-windows the overshoot is at
// most min(a, b), where a is the number of allowed requests of i whose
// increment the last allowed request of i+1 did not see, and b the converse:
// at most one extra request per disjoint racing pair, so at most half the
// decisions in flight across the boundary, which under a burst is far more
// than one (64 goroutines straddling a boundary admitted 29 over a limit of
// 40 in this package's tests of that design). Ordering the reads after the
// incr only near boundaries fixes it at the price of a second round trip
// there and of assumptions on clocks. It was also slower here: gomemcache's
// GetMulti spawns a goroutine per call, and two concurrent requests cost
// more than two sequential ones on a busy host (see docs/benchmarks.md).
//
// Expiry: the add sets the counter's expiry to the TTL the limiter passes
// (2*span sub-windows: the view and the out-of-order horizon of
// [limiter.Counter]), rounded up to whole seconds plus one (memcached's
// clock ticks once a second, so an expiry of N seconds lives between N-1
// and N), plus a random 0..Jitter so that keys written together do not
// expire together. incr and decr do
// not extend it: the counter of sub-window i is created during i, read by
// punctual writers until the end of sub-window i+span-1, and by writers
// whose requests arrive up to a horizon of span sub-windows late (stamped
// before they travelled, or on a clock that lags) until the end of
// sub-window i+2*span-1. Counters are never deleted, only expire, so a late
// writer within that time finds exactly the counters it needs and its
// refund (decr) lands on the counter it incremented. Memcached cannot tell
// that a writer is later than that (it does not track the newest
// sub-window): its counters may then be gone and it decides on what is
// left; with clocks in sync and the call deadline shorter than a window
// this does not arise. Buckets and logs get their TTL on every
// write. Every expiration is sent as an absolute Unix time, now plus the
// TTL rounded up plus 4 s of slack (0, no expiry, past 2038): memcached
// turns a relative one into a time on its own coarse clock, which lags
// after the server stalls, so items written as it resumes expired at once
// (TestExpiryAfterStall). The slack covers a client clock up to 2 s
// behind the server's.
//
// # Packed windows: add, incr per level, one get
//
// A packed window (limiter.Packed, 160 slots per window by default) keeps
// its slot counts in counters of four 16-bit fields at four levels: the
// level-l counter of index i is the item <key|pl:i> and covers slots
// i*4^l to (i+1)*4^l-1 (see [limiter.PackedCounter]). AddPacked (and a
// batch's packed step) writes, in one pipelined write on one connection to
// the key's node, for each level whose delta is not zero,
//
//	add <key|pl:idx> 0 <exp> 1       data "0": create the counter at zero if it is missing
//	incr <key|pl:idx> <delta>        the packed delta n<<(16*field); the reply is Added[l-1]
//
// then one get of the counters the decision reads (at most 8 at r = 160,
// each named once; the read of the level-4 counter just incremented takes
// the incr's reply instead), and reads the replies: one round trip, 4
// counters written and at most 11 distinct keys named (measured at the
// wire over every slot offset of a level-4 counter at r = 160: at most 8,
// 7.25 on average; TestPackedOneRoundTrip). incr is
// atomic on the 64-bit unsigned value and wraps modulo 2^64, never
// clamping a field: a field that overflows carries into the next, which
// the limiter detects from Added and undoes. The add gives the counter the
// TTL the limiter passes for its level ((4^l + 2r+2) slots: its span and
// the out-of-order horizon behind it), rounded up to a second, plus one,
// plus jitter, as for sub-window counters; incr does not extend it. If a
// counter vanishes between its add and its incr (evicted), only the levels
// whose incr found nothing are sent again (with the get), so no level is
// counted twice. The refund of a denied request is incr <key|pl:idx>
// <2^64-delta> per level (noreply in a batch; SubPacked waits for the
// replies): a subtraction modulo 2^64, exact also after adds that wrapped
// the whole 64-bit value (an overflow of the top field, below), where a
// decr would stop at zero. It never creates a counter; on one created again
// after an eviction it borrows into the top field (stricter, until the
// counter expires). The store never answers Stale: it forgets by age.
//
// A Store remembers the packed counters its own adds created (STORED),
// with the moment before that round was written, in a bounded cache
// (64 shards of at most 512 limiter keys; keys whose Space and Name
// exceed 256 bytes are not cached), which also keeps each key's base so
// that a warm decision does not build it again. Until the level's TTL has
// passed since then, a counter it knows is sent its incr alone: a warm
// decision is 4 incrs and one get (5 commands, was 9), still one round
// trip. memcached keeps an item at least that long (the expiry adds a
// second and more) unless it evicts it early or is flushed; the incr then
// answers NOT_FOUND, and that level is sent again with its add (the
// recovery above: no level counted twice; such a request may take four
// rounds in all before ErrConflict, not three), and forgotten. A counter
// whose add answered NOT_STORED exists, but since when is unknown (another
// Store, or a forgotten entry, created it): it is not remembered, and
// its add goes with every decision, so Stores sharing keys skip only the
// adds of the counters each created.
//
// Why it is safe under races: the argument of the sub-window counters
// carries over. A writer's incrs precede its get on its connection, so of
// the requests allowed in any window-length interval, the one X whose last
// incr came last read, through its get, every other's every level; its
// own level-4 counter it read from its last incr's reply, which follows
// every other's incrs of that counter too. The read of a counter is taken
// from an incr's reply only for the last incr of the request for that
// reason (an earlier level's reply could miss a concurrent writer's incr
// that precedes the request's own get). With Config.Proxy the get is sent
// after the incrs' replies, two round trips, and reads every counter,
// the last incr's too: the incrs run on their shards in any order, so no
// one reply is known to follow every other writer's incrs.
//
// # Buckets, logs and leases: gets and cas
//
// UpdateBucket and UpdateLog are optimistic read-modify-writes, run by the
// package's one loop, which [Leases] runs too (without the cache: every
// lease decision is made on a fresh gets):
//
//  1. Take the item cached for the key (value and CAS id from this Store's
//     last read of it), or read it with gets.
//  2. Apply the algorithm's op. A result that writes nothing is returned
//     only if it was computed on a fresh read; a cached item may be stale,
//     so otherwise read and apply again.
//  3. Write with cas on the item's CAS id, or with add if there was no item.
//     EXISTS (someone wrote since), NOT_FOUND (expired or evicted) or
//     NOT_STORED (someone created it) means the race was lost: read again,
//     wait a random, growing time, and go back to 2.
//
// Every write is conditional on the exact state it was computed from, so no
// update is lost and the bucket, log and lease set are exact. The pause
// before the retry after lost race i is random in (0, RetryBackoff*2^(i-1)],
// capped at 20 ms. Attempts stop after Config.MaxRetries lost races (a
// stale cached item is not counted) or at the call's deadline, with an
// error wrapping [limiter.ErrConflict] (and context.DeadlineExceeded when
// the deadline ended them). The value is a format byte and the state
// (varints; the log as [limiter.AppendLog] writes it; the lease set as
// [limiter.AppendLeases] does); anything else under the key is reported as
// [limiter.ErrCorruptState], never read as empty.
//
// The cache saves a round trip only after a read that wrote nothing (a
// peek, or a denial in non-strict mode): memcached's text protocol answers a
// successful cas with STORED and no new CAS id, so after its own write a
// Store does not know the item's CAS id and drops its cache entry. (The
// meta protocol's "ms ... c" returns it, but gomemcache does not speak it.)
//
// # Batches: a request's steps in one pipeline per node
//
// The Store is a [limiter.Batcher]: [limiter.Decide] (and so a Stack and the
// policy's rules) hands it every step of a request at once, and Do writes
// the steps bound for one node in one pipelined write on one connection,
// nodes in parallel, then reads the replies in order: one round trip per
// node (a connection's write buffer is 32 KB, so a batch is one write).
//
//	window take      [add <key|c cur> ...] / incr <key|c cur> n / its reads   (as Add; no add for a counter known to exist)
//	window refund    decr <key|c idx> n noreply                                        no reply: nothing to wait for
//	packed take      [add <key|pl:idx> ...] / incr <key|pl:idx> <delta>, per level / its reads   (as AddPacked; no add for a counter known to exist)
//	packed refund    incr <key|pl:idx> <2^64-delta> noreply, per level (a subtraction modulo 2^64)
//	bucket or log    cas <key|b> 0 <exp> <len> <cas id>  (the item cached from an earlier gets), or
//	                 add <key|b> 0 <exp> <len>           (no cached item: a new key)
//	                 its read: <key|b>                   the item after the write, with its new CAS id
//	reads            get <every key the steps read>      last, once; gets when a bucket or log step is in the batch
//
// The reads go last, as one get naming every key: memcached sends the
// replies it holds when a retrieval command ends, so a get in mid-pipeline
// would split the reply in two segments and the client would wait for the
// second. Memcached answers the keys it holds in the order asked (a key
// named twice, twice), and each item goes to the step that asked for it.
//
// A bucket or log step is applied to the item the store cached (value and
// CAS id from the last gets of the key) and sent as a speculative cas (or
// add, for a key it has not seen): STORED confirms the decision, and the
// gets that follows in the same pipeline caches the item, with its new CAS
// id, for the next call. A write that lost (EXISTS, NOT_FOUND, NOT_STORED)
// leaves the fresh item in the cache and the step goes on as the cas loop
// below, from it: more round trips only after a lost race or on a process's
// first call on an existing key. When the op on the cached item would write
// nothing (a denial), only the gets is sent, and the op is applied to its
// fresh reply.
//
// Refunds are sent without waiting. A window's is a decr noreply in the
// pipeline (memcached sends no reply). A bucket's or a log's runs on its own
// goroutine as the cas loop (exact: it never loses a race, it retries),
// under the store's timeout and detached from the caller's context, at most
// 64 in flight (more are sent in the pipeline and waited for); a later bucket
// or log call of the store on that key waits for them, so a process reads
// its own refunds. One that fails leaves its units counted (stricter, never
// laxer) and is counted by LostRefunds; WaitRefunds waits for them all.
//
// With Config.Proxy a proxy may run a pipeline's commands on different
// shards in any order, keeping one key's in order. Do then sends two
// rounds on the connection: every step's writes with the buckets' and
// logs' gets (the keys they wrote), then, after those replies, the
// windows' reads as get commands of at most 16 KB each (ElastiCache
// Serverless's limit): two round trips whatever the number of steps, one
// when no window reads. A read thus follows every write of the request,
// as in one pipeline on one server. Replies to a get are matched to its
// keys in any order (a proxy that splits a get over shards may merge them
// out of order). docs/consistency.md has the history runs through a
// sharding proxy.
//
// # Circuit breakers per node
//
// With Config.Breaker, each node has its own circuit breaker
// (internal/circuit, the state machine of backends/breaker): after
// Breaker.Failures calls in a row that found the node unavailable (a
// refused, reset or dropped connection, a dial or socket timeout, the
// caller's deadline while waiting for it; not a reply that breaks the
// protocol, a corrupt value or a lost race, which are answers, nor the
// caller's cancellation) calls for its keys fail at once with an error
// wrapping limiter.ErrBreakerOpen and limiter.ErrUnavailable, for
// Breaker.OpenFor; then one call at a time probes it, and one the node
// answers closes the breaker. The other nodes' keys are not affected, in
// the same batch too. Two places see a node:
//
//   - The Store's pool (windows, refunds, every batch's pipeline): exec asks
//     the node's breaker before it dials and reports the call's outcome.
//   - gomemcache (the cas loop of buckets and logs, [Leases] on
//     [Store.Client]): the client picks a node through a selector that asks
//     its breaker, and since its calls end inside gomemcache, its
//     connections report instead: a failed dial, read or write counts as a
//     failure, the first bytes of a reply as an answer; a report while the
//     breaker is half-open decides its probe.
//
// Breakers are made on a node's first call and kept while the node is in
// the ring: an auto-discovery refresh that removes a node forgets its
// breaker (a node that returns starts closed). [Store.Breakers] returns
// their states; Breaker.OnChange and Breaker.Logger see each transition
// with the node's address.
//
// # Connections and errors
//
// Window counters use the Store's own small connection pool (gomemcache
// cannot pipeline); buckets and logs use gomemcache. Both dial through the
// same function: with Config.TLS or Config.ServerName it is crypto/tls,
// given to gomemcache as its DialContext, with ServerName set (to
// ServerName, or else to the host being dialled), as ElastiCache Serverless
// requires; the discovery endpoint is dialled the same way. Config.Timeout
// is the deadline of one Store call, retries included (ctx's deadline if
// earlier), and the socket timeout. Counter connections carry the call's
// deadline and are interrupted when ctx is cancelled; gomemcache calls run
// on their own goroutines so that the call returns at its deadline, the
// abandoned command finishing or timing out in the background.
//
// When a command fails because a pooled connection turns out to have been
// closed by the server (it restarted, or dropped an idle connection), the
// Store drops that pool's idle connections to the node and runs the command
// once more on a new connection. A retried incr that had in fact reached the
// server counts a request twice, which errs on the strict side.
//
// Every failure of a Store or Leases call goes through one mapping, so the
// policy layer can apply a rule's fail mode and tell the causes apart with
// errors.Is: network and server failures (SERVER_ERROR, an unexpected
// reply), timeouts and cancelled contexts wrap [ErrUnavailable] (and so
// [limiter.ErrUnavailable]; and context.DeadlineExceeded for every
// timeout); lost races wrap [limiter.ErrConflict]; values that are not ours
// (a foreign or damaged value, a CLIENT_ERROR to incr or decr) wrap
// [limiter.ErrCorruptState]. Memcached never throttles, so nothing wraps
// [limiter.ErrThrottled]. The original error stays in the chain. On an
// error from Add the increment may or may not have happened.
//
// # What holds, and the limits of the approach
//
//   - Fixed window: exact within each calendar window (one atomic counter).
//   - Bounded sliding window: never more than the limit in any
//     window-length interval (the argument above), provided the node runs
//     one connection's commands in order (set Config.Proxy otherwise), the
//     counters are not evicted, and the node set does not change under the
//     key.
//   - Token bucket and sliding log: exact (every write is a cas or add on
//     the state it was computed from); under heavy contention on one key a
//     call can run out of retries or time and fail with ErrConflict.
//   - The guarantees are on the timestamps callers pass, whatever order the
//     requests arrive in within the horizon (above). Later reaches span-1
//     sub-windows ahead, which covers every window-length interval that
//     holds the caller's sub-window; a fixed window reads only its own
//     counter (the incr's reply), exact per calendar window. In real time,
//     callers whose clocks
//     disagree by a good part of a window each count their traffic in
//     different windows, and together admit more: keep clocks synchronized
//     (Amazon Time Sync) well within a sub-window.
//   - Denied requests are counted until their refund lands, so
//     concurrent denials can briefly make a window stricter than it is; a
//     failed Add may have counted its request: stricter, never laxer.
//   - Interpolated estimator: over-admits when the oldest sub-window's
//     traffic was bunched, by design, on any store.
//   - Memcached is a cache: it may evict items under memory pressure before
//     they expire, and a restart or a change of the node list (which moves
//     a key to another node) loses state. A counter or bucket that is lost
//     comes back empty (full), which admits more. Size the cache so that it
//     does not evict (watch the evictions statistic). Limits are per
//     memcached cluster, so per region.
//   - Packed sliding window: as the bounded sliding window at r sub-windows
//     (the argument above), with the same conditions. A field holds at
//     most the limit (at most limiter.MaxPackedLimit) plus the units of
//     denied requests whose refund has not landed; if more than about
//     2^15 of them are in flight for one slot field, the field overflows
//     and the limiter denies and gives back, but other decisions that read
//     the field meanwhile count too few: a packed window takes calls of
//     cost at most limiter.PackedMaxCost (its default MaxCost; a larger
//     MaxCost keeps sub-window counters), which keeps 1,000 calls in
//     flight below it. Fields 0 to 2 borrow back
//     exactly; an overflow of field 3 wraps the 64-bit value, and the
//     refunds, subtractions modulo 2^64, take it back exactly in whatever
//     order they land (the conformance suite's RefundsAfterTopCarry; a
//     decr, which stops at zero, lost every unit of the counter there).
//   - A window decision sends an add that fails once the counter exists,
//     unless its Store created that counter and knows it alive (see Packed
//     windows): Stores sharing keys each send the adds of the counters
//     they did not create, a little server work traded for a constant
//     single round trip.
package memcached
