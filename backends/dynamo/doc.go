// Package dynamo keeps limiter state in one DynamoDB table, with one
// request per decision in the common case and no lost update under any
// contention. [Store] implements [storage.BucketStore] (token buckets),
// [storage.Counter] (sliding and fixed windows), [storage.PackedCounter]
// (packed sliding windows) and [storage.LogStore] (sliding logs); [Leases]
// keeps the concurrency limiter's leases and the load shedders' gauges.
//
//	cfg, err := config.LoadDefaultConfig(ctx, config.WithHTTPClient(dynamo.NewHTTPClient(250*time.Millisecond)))
//	s, err := dynamo.New(dynamodb.NewFromConfig(cfg), dynamo.Config{Table: "sluice-state"})
//	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 100, RefillTime: time.Second, RefillAmount: 10})
//
// The table has a partition key "pk" (String) and a TTL attribute "ttl"
// (Number); the CDK app creates it, [CreateTable] creates it for tests and
// DynamoDB Local. Every limit of one key Name lives in one item, and a
// write to an item is one conditional UpdateItem that returns the new item:
// a window adds with ADD (atomic: concurrent adds never conflict), a token
// bucket takes with a condition on the range of values that allow the take
// (GCRA on a refill grid: concurrent takes that fit all succeed, with no
// read first), a log writes on the exact state it read. A failed condition
// returns the current item, and the write is decided or retried from it.
// [Store.Do] sends a request's items at once: one round trip of latency.
//
// Errors wrap [ErrThrottled], [ErrUnavailable] (and so the limiter's),
// [storage.ErrConflict] or [storage.ErrCorruptState] (a damaged item is
// never read as a full bucket). Calls run under the caller's deadline
// (Config.Timeout when it has none), retried by [NewRetryer]; use
// [NewHTTPClient] so that a stalled endpoint cannot pile up connections.
// With a global table each region enforces its limit separately.
//
// docs/stores.md ("DynamoDB") states the storage protocol: the table
// layout, each algorithm's update expressions and conditions and why each
// is safe under races, out-of-order writers, refunds, errors and retries.
// docs/consistency.md says what holds under concurrency; docs/benchmarks.md
// what it costs.
package dynamo
