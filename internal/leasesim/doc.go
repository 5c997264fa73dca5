// Package leasesim is a deterministic discrete-event simulation of lease
// policies for hot keys: N processes deciding one key through one store
// item behind a partition's write cap, each spending units it took from
// the item in leases (docs/leases.md). It runs a token bucket (the
// DynamoDB GCRA layout with an outstanding-lease ring) and the bounded
// sliding window (slot counters), reports the admitted share of an exact
// serialized limiter on the same arrivals, the store requests per
// decision, throttled requests and lease units granted, returned and lost,
// and checks the admitted stamps with the history checker's rules
// (limitertest.CheckTrailingWindow, limitertest.CheckBucketBound).
//
// Time is simulated (int64 nanoseconds); draws come from math/rand/v2
// seeded by Config.Seed, so a run is reproducible. It is a design tool:
// nothing in production imports it.
package leasesim
