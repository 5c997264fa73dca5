// Package breaker is a circuit breaker in front of a limiter store: while
// a backend is down, decisions follow each rule's fail mode at once
// instead of each waiting for the deadline.
//
// A [Breaker] counts consecutive store failures that say the backend is
// unreachable or failing (errors wrapping [limiter.ErrUnavailable]). A
// fault is scoped to what failed: the failures that open it must come
// from Config.Keys distinct keys (3 by default), or be refused
// connections, so one hot or slow key never opens it for the others; and
// a throttle ([limiter.ErrThrottled], the store refusing one key for
// capacity) is an answer, not a failure. It has three states:
//
//   - Closed: every call goes to the store. Config.Failures such failures
//     in a row, from Config.Keys distinct keys, open it; a call that
//     reached the store and got an answer (success, [limiter.ErrConflict],
//     [limiter.ErrCorruptState], [limiter.ErrThrottled]) resets the
//     count; other errors (the caller's: a bad cost, a time out of range,
//     an item too large) neither count nor reset.
//   - Open: every call fails at once, without reaching the store, with an
//     error wrapping [limiter.ErrBreakerOpen] and [limiter.ErrUnavailable]
//     (so the rule's fail mode applies), for Config.OpenFor.
//   - Half-open: after OpenFor, the next call is let through as the one
//     probe; calls while it runs fail at once as in Open. A probe that
//     reaches the store closes the breaker; one that fails with
//     ErrUnavailable opens it again for OpenFor.
//
// A backend that answers within the deadline again at time R is in use
// again by R + OpenFor + the deadline + the gap until the next request:
// the worst case is a return just after a probe left for the backend
// while it still hung, which fails at its deadline and opens the breaker
// for another OpenFor (TestRecoveryBound). A backend that still misses
// the deadline after it returns (a cold server) is not back yet.
//
// No timer runs: the state advances when a call arrives, on the
// configured clock. Transitions are counted ([Breaker.Stats]), logged
// (log/slog: "circuit breaker open" at WARN, "circuit breaker closed" at
// INFO, a failed probe at WARN) and reported to Config.OnChange (the
// authorizer's metrics).
//
// [Store] wraps a store implementing [limiter.Counter],
// [limiter.BucketStore] and [limiter.LogStore] (memcached, DynamoDB) with
// one breaker for the whole backend: every key shares it. The memcached
// store has its own breakers per node (memcached.Config.Breaker, on the
// same state machine, internal/circuit), which keep the healthy nodes'
// keys on the store while one node is down; the authorizer uses those for
// memcached and this package for DynamoDB. Store also forwards
// [limiter.PackedCounter] (the packed sliding window) to a backend that
// implements it, through the same breaker; on one that does not, the
// packed calls fail with [limiter.ErrInvalidConfig]. [Leases]
// puts the load shedders' store ([limiter.LeaseStore],
// [limiter.GaugeStore]) behind the same breaker as the counters of its
// backend.
//
// The state machine lives in internal/circuit; [Breaker], [Config],
// [State] and [Stats] name its types.
//
// This package imports only the limiter package, internal/circuit and the
// standard library.
package breaker
