// Package breaker is a circuit breaker in front of a limiter store: while
// a backend is down, decisions follow each rule's fail mode at once
// instead of each waiting for the deadline.
//
// [Store] wraps a store implementing [storage.Counter],
// [storage.BucketStore] and [storage.LogStore] (and forwards
// [storage.PackedCounter] and batches to a backend that has them) with one
// [Breaker] for the whole backend; [Leases] puts the load shedders' store
// ([storage.LeaseStore], [storage.GaugeStore]) behind the same breaker. The
// authorizer uses it for DynamoDB; [Nodes] is a breaker per node, which the
// memcached store puts in front of each node (memcached.Config.Breaker), so
// that one dead node fails only its own keys.
//
// A [Breaker] has three states:
//
//   - Closed: every call goes to the store. Config.Failures calls in a row
//     that found the backend unavailable (errors wrapping
//     [storage.ErrUnavailable]), from Config.Keys distinct keys or with a
//     refused connection, open it, so one hot or slow key never opens it for
//     the others. A call the store answered resets the count: a success,
//     [storage.ErrConflict], [storage.ErrCorruptState], and a throttle
//     ([storage.ErrThrottled]: the store refused one key for capacity).
//   - Open: every call fails at once with an error wrapping
//     [storage.ErrBreakerOpen] and [storage.ErrUnavailable] (so the rule's
//     fail mode applies), for Config.OpenFor.
//   - Half-open: the next call is the one probe; a probe the store answers
//     closes the breaker, one that fails opens it for another OpenFor.
//
// No timer runs: the state moves when a call arrives. A backend that answers
// again at time R is in use again by R + OpenFor + the deadline + the gap to
// the next call (TestRecoveryBound). Transitions are counted (a Breaker's
// [Stats]), logged with log/slog and reported to Config.OnChange.
//
// docs/authorizer.md ("Circuit breakers") has the settings, metrics and
// log lines; docs/benchmarks.md what an outage costs with and without it.
// The package imports only the limiter package and the standard library.
package breaker
