// Package dynamo keeps limiter state in one DynamoDB table, with one
// request per decision in the common case and no lost update under any
// contention. [Store] implements [limiter.BucketStore] (token buckets),
// [limiter.Counter] (sliding and fixed windows) and [limiter.LogStore]
// (sliding logs).
//
// # Table layout
//
// One table, partition key "pk" (String), no sort key, TTL attribute "ttl"
// (Number, Unix seconds). The CDK app creates it in AWS; [CreateTable]
// creates it for tests and local use. Every item is one key of one
// algorithm: pk is the limiter key's Space and Name, escaped ('%XX' for
// every byte that is not printable ASCII, and for '%', '/' and '#') and
// joined by '/'; a key longer than 160 bytes becomes the Space, "/#" and the
// SHA-256 of the key in base64url. Every write sets ttl to the wall-clock
// time the state must be kept (the limiter's ttl, rounded up, plus a
// second), so idle keys expire. DynamoDB deletes expired items lazily (up to
// days later) and correctness never depends on it: an expired item still
// read is still a valid state (a bucket refills, old sub-windows are out of
// view, old log entries are dropped). Items stay under 1 KB (one write
// capacity unit): a bucket is about 50 bytes plus the key, a full window
// view and horizon of 42 counters (the default 20 sub-windows) about 340,
// and a log is refused beyond 1 KB.
//
// # Token buckets
//
// Item: tokens (N), updated (N, Unix ns of the last refill accounting). The
// store remembers the last state it saw per key in a bounded in-process LRU
// (the warm Lambda), applies the op (limiter.BucketOp.Apply, pure) to it
// and writes the result with ONE UpdateItem, no read first:
//
//   - When no refill is due on the remembered state and the op takes N
//     tokens and is allowed (or refunds N without reaching the cap), the
//     write is relative: SET tokens = tokens + :delta, on condition
//     updated = :updated AND tokens BETWEEN :lo AND :hi ([N, max] for a take,
//     [0, max-N] for a refund). For every stored state meeting the condition,
//     Apply computes exactly that update, so the write is exact even if the
//     remembered token count is stale, and concurrent takes that all fit all
//     succeed without retrying. The decision is recomputed from the new
//     state the write returns (ReturnValues=ALL_NEW).
//   - Otherwise (a refill is due, strict mode restarts the timer, a refund
//     reaches the cap) the new state is written on condition that the item
//     holds exactly the remembered values (tokens = :t0 AND updated = :u0).
//     No version number is needed: Apply is a pure function of (tokens,
//     updated), so an ABA change is harmless.
//   - A key the store has not seen is written as a new full bucket on
//     condition attribute_not_exists(pk).
//
// The write runs in the package's one conditional-write loop, the same for
// buckets, logs, window refunds and leases ([Leases]):
// every write asks for ReturnValuesOnConditionCheckFailure=ALL_OLD, so when
// the condition fails DynamoDB returns the current item, and the store
// applies the op to it and writes again, still without a read. The first
// retry is immediate, later ones wait a full-jitter pause of up to
// Config.BackoffBase doubled per retry, capped at Config.BackoffMax; after
// Config.MaxAttempts lost races, or when the next pause would outlast the
// deadline, the call fails with an error wrapping [limiter.ErrConflict].
// Each retried lost race is counted in Stats.Conflicts.
//
// A denial is never decided on a remembered state alone (another process
// may have refunded tokens): when Apply on the remembered state writes
// nothing (a plain denial, or a Get), the store confirms with a strongly
// consistent GetItem and applies the op to what it reads; a denial that
// writes (strict mode) is confirmed by its conditional write succeeding, and
// a denial computed on the item a failed condition returned is the server's
// state. So a warm key costs one request per decision, allowed or denied,
// and a key new to the process two (the guess that it is absent, then the
// write on the returned item).
//
// # Windows
//
// Item: one Number attribute per sub-window, named by its index modulo 2^30
// in five base64url characters (so a name only recurs 2^30 sub-windows
// later). Add is ONE UpdateItem:
//
//	ADD <cur> :n  SET ttl = :ttl  REMOVE <cur-2span>, <cur-2span-1>, <stale names seen before>
//	condition: attribute_not_exists(<cur>) OR attribute_type(<cur>, N)
//	ReturnValues=ALL_NEW
//
// ADD is atomic, so concurrent adds never conflict and every caller sees a
// count that includes its own add and every add before it, in one
// linearizable step: a window never admits more than its estimator allows.
// The returned item gives the counts of the view (cur, cur-1, ...,
// cur-span+1) and, as Counts.Later, of the span-1 sub-windows after cur
// (another writer's clock is ahead, or its request arrived first).
//
// Out-of-order writers ([limiter.Counter]): a writer removes only counters
// more than 2*span-1 sub-windows behind its own, the view plus the horizon.
// Since no writer's sub-window is newer than the newest, no counter that a
// writer up to span sub-windows behind the newest needs is ever removed:
// a late writer within the horizon finds its whole view, and its refund
// lands on the counter it added to. Counters past that are removed: the two
// just behind by name in every Add, others (left by gaps in traffic) by
// the names the last response showed, in this process's next Add, or at
// once with a second UpdateItem when there are eight or more of them. A
// writer further behind than the horizon (the item holds a counter more
// than span sub-windows newer than its own) moves its add into the oldest
// sub-window of the newest writer's view with a second UpdateItem (ADD
// <that> :n, ADD <cur> -n, on condition <cur> >= n), and is judged from
// there against every newer counter (Counts.Moved); if the move fails,
// its add sits in a counter no punctual writer reads, so it is denied.
// Such a writer costs two requests (Stats.Moves counts them).
//
// Sub (a refund) is one UpdateItem, ADD <idx> -n on condition <idx> >= n; if
// the counter holds less, it is taken down to zero with a condition on the
// value the failed write returned, so it never goes negative; a counter
// that is gone has nothing to give back. An Add of 0 is a consistent
// GetItem.
//
// Size: a key with traffic in every sub-window holds 2*span counters, about
// 8 bytes each for counts under 1000 (5-byte name, number): a 20-sub-window
// window (the default) about 340 bytes plus the key, one write unit; 40
// sub-windows about 660 bytes; at 60 sub-windows and large counts an item
// can pass 1 KB and cost two write units.
//
// # Sliding logs
//
// Item: log (Binary, limiter.AppendLog), v (N, version). The log is written
// with one UpdateItem on condition v = :remembered AND log = :remembered_log
// (attribute_not_exists(pk) for a new key), in the same conditional-write
// loop and with the same denial rules as buckets. Under contention on one
// key a log admits one writer per round trip. A log whose item would
// exceed 1 KB is refused with an error wrapping [ErrItemTooLarge] (a few
// hundred entries; use a sliding window for larger limits).
//
// # Errors, deadlines and retries
//
// Every call runs under the caller's deadline (Config.Timeout when the
// context has none). A failed condition is never an error by itself. Every
// error of a DynamoDB request, for [Store] and [Leases] alike, goes through
// one mapping, so that the policy layer can apply the rule's fail mode and
// count the cause with errors.Is:
//
//   - Throttling wraps [ErrThrottled] (and so [limiter.ErrThrottled]):
//     ProvisionedThroughputExceededException, ThrottlingException,
//     RequestLimitExceeded, and the generic Throttling, ThrottledException,
//     RequestThrottledException and TooManyRequestsException, as the SDK's
//     retryer classifies them, or a transaction cancelled for throttling.
//   - Lost races wrap [limiter.ErrConflict]: retries spent or no time left
//     for the next pause, as above (and a failed condition, transaction
//     conflict or multi-Region write conflict no loop retries).
//   - Every other DynamoDB error wraps [ErrUnavailable] (and so
//     [limiter.ErrUnavailable]): network errors, timeouts and cancelled
//     contexts (also a context that ends between lost races), 5xx, a missing
//     table (ResourceNotFoundException), refused credentials or
//     permissions, and any other request the service did not carry out.
//   - An item with a missing attribute or one of the wrong type gives an
//     error wrapping [limiter.ErrCorruptState] naming the key and attribute;
//     the store never resets it to a full bucket or an empty window.
//     Conditions check the types of what a write updates in place, so a
//     damaged item fails the condition and is read back and reported,
//     rather than failing the request.
//
// The original error stays in the chain (errors.As finds the SDK's types).
// The only other errors are the caller's: an op with bad numbers, and a log
// that would outgrow its item ([ErrItemTooLarge]).
//
// The store's requests use [NewRetryer] (Config.Retryer) instead of the
// client's retryer: the SDK's standard retryer with 3 attempts, a 5-50 ms
// full-jitter backoff (the SDK default backs off up to 20 s) and no retry
// started with less than the maximum backoff left before the deadline, so a
// throttled request fails with its throttling error well within the
// deadline.
//
// The client's HTTP transport is the caller's; [NewHTTPClient] builds one
// bounded by the deadline (the authorizer uses it): connect and TLS
// handshake timeouts of the deadline, at most [MaxConnsPerHost] connections
// to the endpoint (dialing, in use and idle together), idle ones closed
// after [IdleConnTimeout]. With the SDK's default transport (30 s connect
// timeout, no useful per-host bound) a stalled endpoint makes the open
// connections grow with the request rate: each request whose deadline
// passes leaves its dial running. A circuit breaker in front of the store
// (backends/breaker) stops the calls altogether during an outage.
//
// # Regions
//
// Conditional writes and ADD are atomic within one region. With a global
// table in the default (asynchronous, last writer wins) mode, each region
// enforces its limit separately; see the infra documentation for the modes.
package dynamo
