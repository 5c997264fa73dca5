// Package memcached is a limiter store on memcached (through
// github.com/bradfitz/gomemcache): atomic counters for the fixed and
// sliding windows ([storage.Counter], [storage.PackedCounter]) and
// compare-and-swap values for the token bucket ([storage.BucketStore]) and
// the sliding log ([storage.LogStore]); [Leases] keeps the concurrency
// limiter's leases and the load shedders' gauges.
//
//	s, err := memcached.New(memcached.Config{
//		Addrs:   []string{"cache-1:11211", "cache-2:11211"},
//		Timeout: 100 * time.Millisecond,
//	})
//	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 100, Window: time.Minute})
//
// ElastiCache Serverless is one TLS endpoint in front of many shards, which
// may reorder a pipeline across keys; Proxy keeps the windows exact there:
//
//	s, err := memcached.New(memcached.Config{
//		Addrs:      []string{"my-cache-abc123.serverless.use1.cache.amazonaws.com:11211"},
//		ServerName: "my-cache-abc123.serverless.use1.cache.amazonaws.com", // turns TLS on
//		Proxy:      true,
//	})
//
// Keys are spread over the nodes by a consistent-hash [Ring] (or the nodes
// of an ElastiCache cluster, with Config.AutoDiscovery), all the items of
// one limiter key on one node. A request's limits go to [Store.Do] as one
// batch: one pipelined write and one read per node, one round trip (two
// with Config.Proxy). A window's decision is add+incr+get on one
// connection, exact because memcached runs one connection's commands in
// order; a bucket or log is a speculative cas on the item last read, exact
// because every write is conditional on the state it was computed from.
// With Config.Breaker each node has its own circuit breaker.
//
// Errors wrap [ErrUnavailable] (network, server, timeouts; and so
// [storage.ErrUnavailable]), [storage.ErrConflict] (lost races ran out of
// retries or time) or [storage.ErrCorruptState]. memcached is a cache: an
// evicted or restarted counter comes back empty, so size it not to evict.
//
// docs/stores.md ("memcached") states the storage protocol: the commands,
// their order and why each is safe under races, the keys, expiries, proxy
// mode and breakers. docs/consistency.md says what holds under concurrency;
// docs/benchmarks.md what it costs.
package memcached
