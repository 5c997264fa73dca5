// Package limiter holds Sluice's rate-limiting algorithms: what a caller of
// the limits uses.
//
// Algorithms:
//
//   - [TokenBucket]: Smyte's token bucket (maxAmount, refillTime,
//     refillAmount; reduce and get; strict mode). Exact on every store.
//   - [SlidingWindow]: the approximated sliding window of ClassDojo and
//     Criteo, with the [Bounded] estimator (never more than the limit in any
//     window-length interval; the default) or the articles' [Interpolated]
//     one (over-admits bunched traffic). By default it keeps 160 slots per
//     window in packed counters ([Packed]), reading a few counters per
//     decision; [SubWindowCounters] keeps k sub-window counters.
//   - [FixedWindow]: one counter per calendar window.
//   - [SlidingLog]: an exact sliding log of timestamps, the accuracy
//     reference, for small limits.
//   - [Stack]: several limits on one key (100/min and 2/s); all must pass and
//     a denial gives back what the others took.
//   - [Concurrency]: Stripe's concurrent-requests limiter, with leases that
//     expire after their TTL, so a crashed Lambda never leaks capacity.
//   - [FleetShedder] and [UtilizationShedder]: Stripe's load shedders,
//     keeping capacity for [PriorityCritical] traffic and shedding the lowest
//     [Priority] first; [Shedders] chains them.
//
// Every algorithm takes the current time as an argument (now), so callers can
// replay historical traffic with their own timestamps and tests run on a fixed
// clock; [Clock] supplies it in production. Time going backwards (clock skew
// between Lambda hosts) never mints tokens or unblocks a key.
//
// A request's limits are decided as one batch by [Decide] (the limiters'
// AllowN, Refund and [Stack] use it): the steps bound for one store go to
// it at once, as one [storage.Batcher.Do], one place refunds a denied batch
// and picks the deciding limit ([Tighter]), and a deny cache answers a key
// its store denied until the denial's RetryAfter, without a store request.
// The stores are interfaces shaped at the level of one decision's storage
// step, so that a backend can answer in one round trip: package
// limiter/storage states them (what a store implementer needs, in one
// place), and backends/memory, backends/memcached and backends/dynamo
// implement them. This package imports the standard library and
// limiter/storage only.
//
// docs/consistency.md says what holds under concurrency and out-of-order
// arrivals; docs/stores.md how each backend keeps the state.
package limiter
