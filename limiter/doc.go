// Package limiter holds Sluice's rate-limiting algorithms and the small store
// interfaces they need.
//
// Algorithms:
//
//   - [TokenBucket]: Smyte's token bucket (maxAmount, refillTime,
//     refillAmount; reduce and get; strict mode; caller timestamps). The
//     bucket parameters are part of the stored key, so two callers with
//     different parameters never share a bucket. Exact on every store.
//   - [SlidingWindow]: the approximated sliding window of ClassDojo and
//     Criteo, built from k sub-window counters, with two estimators:
//     [Interpolated] (the articles' weighting of the oldest sub-window, which
//     can over-admit when the previous window's traffic was bunched) and
//     [Bounded] (never admits more than the limit in any window-length
//     interval, at the price of admitting less). With the [Packed]
//     representation it is Bounded at a resolution of Slots (default 160)
//     slots per window, kept in packed counters of 4 levels, reading a few
//     counters per decision ([PackedCounter]).
//   - [FixedWindow]: one counter per calendar window.
//   - [SlidingLog]: an exact sliding log of timestamps, the accuracy
//     reference, for small limits.
//   - [Stack]: several limits on one key (100/min and 2/s); all must pass and
//     a denial gives back what the others took.
//   - [Concurrency]: Stripe's concurrent-requests limiter: Acquire before the
//     work, Release after; a lease expires after its TTL, so a lost release
//     (a crashed Lambda) never leaks capacity for longer.
//   - [FleetShedder] and [UtilizationShedder]: Stripe's load shedders. The
//     fleet-usage shedder keeps a share of a global concurrency limit for
//     [Critical] traffic; the worker-utilization shedder is Stripe's slow
//     derivative controller, shedding the lowest [Priority] first. [Shedders]
//     chains them.
//
// Every algorithm takes the current time as an argument (now), so callers can
// replay historical traffic with their own timestamps and tests run on a fixed
// clock; [Clock] supplies it in production. Time going backwards (clock skew
// between Lambda hosts) never mints tokens or unblocks a key.
//
// Stores are declared here as interfaces shaped at the level of one decision's
// storage step, so that a backend can answer in one network round trip:
// [Counter] for the windows, [PackedCounter] (optional) for the packed
// window, [BucketStore] for the token bucket, [LogStore]
// for the sliding log, [LeaseStore] for concurrency leases and [GaugeStore]
// for published values such as the fleet's utilization. [Decide] checks a
// request's limits as one batch of [Item]s: each becomes a [Step], the
// steps bound for one store go to it at once ([Batcher], or one call per
// step for a store without it), one place refunds a denied batch and picks
// the deciding limit, and each limit's [DenyCache] answers a key its store
// denied until the denial's RetryAfter, without a store request. The
// limiters' AllowN and [Stack] use it. The in-process store is in backends/memory; memcached
// and DynamoDB live in backends/memcached and backends/dynamo. This package
// imports the standard library only.
package limiter
