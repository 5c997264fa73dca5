// Package memcached is a limiter store on memcached (through
// github.com/bradfitz/gomemcache): atomic sub-window counters for the
// sliding and fixed windows ([limiter.Counter]), and compare-and-swap values
// for the token bucket ([limiter.BucketStore]) and the sliding log
// ([limiter.LogStore]).
//
//	s, err := memcached.New(memcached.Config{
//		Addrs:      []string{"cache-1:11211", "cache-2:11211"},
//		ServerName: "my-cache.serverless.use1.cache.amazonaws.com", // TLS
//		Timeout:    100 * time.Millisecond,
//	})
//	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 100, Window: time.Minute, SubWindows: 12})
//
// # Keys
//
// A limiter key (Space, Name) becomes the memcached key
//
//	KeyPrefix "k:" Space "/" Name                        when both are printable ASCII, Space has no '/' and it fits
//	KeyPrefix "h:" base64url(SHA-256(len(Space) Space Name))  otherwise
//
// followed by "|c<index>" for a sub-window counter, "|b" for a bucket or "|l"
// for a log. Keys are at most 250 bytes and never hold a space or a control
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
// # Windows: incr, add, get-multi
//
// Add(key, cur, span, n, ttl) is:
//
//  1. incr <key|c cur> n. If the counter does not exist (NOT_FOUND):
//     add <key|c cur> with value n and the expiry below; if that add finds
//     the counter present (NOT_STORED: another writer created it in
//     between), incr again.
//  2. One get-multi of <key|c cur+1> (reported as Counts.Later: traffic of
//     writers whose clock is ahead of the caller's) and <key|c cur-1> ...
//     <key|c cur-span+1>.
//
// Steps 1 and 2 are issued at the same time, on two connections, so a
// decision costs one round trip of latency, except near a sub-window
// boundary (see "Boundary guard" below), where 2 waits for 1. Sub (the
// refund of a denied request) is decr <key|c idx> n; memcached stops decr
// at zero, and a counter that is gone has nothing to give back.
//
// Why it is safe under races: incr and decr are atomic on the server, so the
// count of the current sub-window is exact: each request's incr returns the
// count including every request before it in that sub-window, and the
// windows decide on that returned value. add creates a counter only if none
// exists, so of two writers racing to create one, one creates it and the
// other increments it: no increment is lost. A counter is written only
// while its sub-window is current (plus refunds and lagging clocks), so
// the older counters read by step 2 are stable except near a boundary.
//
// Expiry: the add sets the counter's expiry to the TTL the limiter passes
// (window plus one sub-window), rounded up to whole seconds, plus a random
// 0..Jitter so that keys written together do not expire together. incr and
// decr do not extend it: the counter of sub-window i is created during i and
// read until the end of sub-window i+k, which is at most window plus one
// sub-window after its creation. Buckets and logs get their TTL on every
// write. Memcached reads expirations above 30 days as absolute Unix times,
// so longer TTLs are sent as now+TTL (and as 0, no expiry, past 2038).
//
// # Buckets and logs: gets and cas
//
// UpdateBucket and UpdateLog are optimistic read-modify-writes:
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
// update is lost and the bucket and log are exact. Attempts stop after
// Config.MaxRetries lost races or at the call's deadline, with an error
// wrapping [limiter.ErrConflict]. The value is a format byte and the state
// (varints; the log as [limiter.AppendLog] writes it); anything else under
// the key is reported as [limiter.ErrCorruptState], never read as empty.
//
// The cache saves a round trip only after a read that wrote nothing (a
// peek, or a denial in non-strict mode): memcached's text protocol answers a
// successful cas with STORED and no new CAS id, so after its own write a
// Store does not know the item's CAS id and drops its cache entry. (The
// meta protocol's "ms ... c" returns it, but gomemcache does not speak it.)
//
// # Connections and errors
//
// With Config.TLS or Config.ServerName every connection, to the nodes and to
// the discovery endpoint, is made by gomemcache's DialContext through
// crypto/tls with ServerName set (to ServerName, or else to the host being
// dialled), as ElastiCache Serverless requires. Config.Timeout is the
// deadline of one Store call, retries included (ctx's deadline if earlier),
// and the socket timeout. Calls run on their own goroutines so a call
// returns at its deadline even when the socket is stuck; the abandoned
// command finishes or times out in the background. When a command fails
// because a pooled connection was closed by the server (it restarted, or
// dropped an idle connection), the Store empties its idle pool and retries
// the command once on a new connection; a retried incr that had in fact
// reached the server counts a request twice, which errs on the strict side.
//
// Network and server failures, timeouts and cancelled contexts are returned
// wrapping [ErrUnavailable] (and context.DeadlineExceeded for every
// timeout), so the policy layer can apply a rule's fail mode; lost races
// wrap [limiter.ErrConflict]; values that are not ours wrap
// [limiter.ErrCorruptState]. On an error from Add the increment may or may
// not have happened.
//
// # Boundary guard
//
// Steps 1 and 2 of Add are not one atomic step. Take decision A in
// sub-window i and decision B in sub-window i+1, in flight at the same time
// just around the boundary. If A's read of i+1 reaches the server before
// B's incr of i+1, and B's read of i before A's incr of i, each misses the
// other; both may be allowed where an atomic store would have denied one.
// Config.BoundaryGuard (default Timeout + DefaultClockSkew) closes this: a
// decision whose sub-window, by the Store's own clock, began or ends less
// than the guard ago or ahead, or is not the current one at all (a replay,
// a skewed caller), does step 1 and then step 2: two round trips. Two such
// decisions A and B cannot both miss each other: if A's read of i+1 came
// before B's incr of i+1, then A's incr of i, which came before A's read,
// came before B's read of i, so B sees A. Applied to the last increment of
// each of the two counters, this shows the two sub-windows together never
// exceed what the estimator allows. Decisions far from a boundary keep the
// one-round-trip path: a call lasts at most Timeout, so with clocks within
// the skew allowance they cannot overlap with a decision of another
// sub-window.
//
// The sub-window length is not passed to Add; the Store takes it as
// ttl/span, which is what the limiter's windows pass (ttl = window + one
// sub-window = span sub-windows). If that ever stops dividing evenly,
// every decision takes two round trips: slower, still exact. Fixed windows
// (span 1) read no older counter and always take one round trip. The share
// of decisions that take two round trips is about 2*guard/sub-window: 8%
// for 5 s sub-windows (a minute in 12) and the default 210 ms guard; all of
// them when the sub-window is shorter than twice the guard.
//
// # What holds, and the limits of the approach
//
//   - Fixed window: exact within each calendar window (one atomic counter),
//     on any clock.
//   - Bounded sliding window, with the guard: never more than the limit in
//     any window-length interval, provided the clocks of the callers (the
//     now they pass) and of the hosts running Stores agree within
//     BoundaryGuard - Timeout, and a sub-window is at least twice the guard
//     (then no call can overlap decisions of sub-windows two apart, nor
//     race across both ends of one sub-window, and the argument above
//     covers every window-length interval). TestBoundaryGuard checks it
//     with 64 goroutines racing across a boundary. With shorter
//     sub-windows every decision takes two round trips and the argument
//     covers adjacent sub-windows only.
//   - Bounded sliding window, with BoundaryGuard < 0 (always one round
//     trip): each sub-window's count is still exact, but decisions that
//     race across a boundary can miss each other. Each extra request needs
//     a racing pair, one decision on each side that each missed the other:
//     the overshoot in a window is at most min(a, b), where a is the number
//     of allowed decisions of sub-window i whose increment the last allowed
//     decision of i+1 did not see, and b the converse. It is at most one
//     per disjoint racing pair, so at most half the decisions in flight
//     across the boundary, which under a burst is far more than one: 64
//     goroutines straddling a boundary have been seen to admit 29 over a
//     limit of 40.
//   - Later looks one sub-window ahead only (cur+1). A caller whose clock
//     lags a writer's by more than one sub-window does not see that
//     writer's traffic in cur+2 and later; an atomic store that reports every
//     newer sub-window would. Keep clocks synchronized (Amazon Time Sync)
//     well within a sub-window.
//   - Denied requests are counted until their refund (decr) lands, so
//     concurrent denials can briefly make a window stricter than it is.
//     A failed Add may have counted its request: stricter, never laxer.
//   - Interpolated estimator: over-admits when the oldest sub-window's
//     traffic was bunched, by design, on any store.
//   - Memcached is a cache: it may evict items under memory pressure before
//     they expire, and a restart loses everything. An evicted counter or
//     bucket comes back empty (full), which admits more. Size the cache so
//     that it does not evict (watch the evictions statistic); limits are
//     per memcached cluster, so per region.
package memcached
