package limiter_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// farCounting is a counted store that says its writes cross regions
// (storage.CrossRegionWriter).
type farCounting struct{ *limitertest.CountingStore }

func (farCounting) WritesCrossRegions() bool { return true }

// TestLeasesCrossRegionColdKey: a key deciding about 3 a second (one
// decision, then 300 ms), on a store that answers in up to 160 ms (a
// DelayStore over the memory store). A regional store (one that does not
// say its writes cross regions) sends every decision to the store however
// slow it is: the key's rate is under the smallest lease (8 units) and it
// stays cold, as without the round-trip rule (which, applied to every
// store, leases it at 2 or 3 units and fails these rows). A store that
// says its writes cross regions leases the same key from 2 units (a lease
// saves 100 ms of round trips), so fewer store calls than decisions;
// without the rule it too sends every decision.
func TestLeasesCrossRegionColdKey(t *testing.T) {
	const decisions, every, delay = 12, 300 * time.Millisecond, 160 * time.Millisecond
	for _, alg := range []string{"window", "bucket"} {
		for _, far := range []bool{false, true} {
			name := alg + "/regional"
			if far {
				name = alg + "/cross-region"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				counted := limitertest.NewCountingStore(limitertest.NewDelayStore(newMemory(t), delay, 1))
				var store limitertest.Store = counted
				if far {
					store = farCounting{counted}
				}
				var l interface {
					limiter.Limiter
					LeaseStats() limiter.LeaseStats
				}
				var err error
				if alg == "bucket" {
					l, err = limiter.NewTokenBucket(store, limiter.TokenBucketConfig{Name: "cold", MaxAmount: 1000, RefillTime: time.Second, RefillAmount: 100, Leases: true})
				} else {
					l, err = limiter.NewSlidingWindow(store, limiter.SlidingWindowConfig{Name: "cold", Limit: 1000, Window: time.Minute,
						Representation: limiter.SubWindowCounters, Leases: true})
				}
				if err != nil {
					t.Fatal(err)
				}
				for i := range decisions {
					d, err := l.AllowN(t.Context(), "k", time.Now(), 1)
					if err != nil {
						t.Fatal(err)
					}
					if !d.Allowed {
						t.Fatalf("decision %d denied", i)
					}
					time.Sleep(every)
				}
				calls, st := counted.Calls(), l.LeaseStats()
				t.Logf("%s: %d decisions, %d store calls, %d from leases; leases %+v", name, decisions, calls, st.Decisions, st)
				switch {
				case !far && (calls != decisions || st.Takes != 0):
					t.Errorf("a regional store: %d store calls and %d lease takes (%d units) for %d decisions, want one call a decision and no lease", calls, st.Takes, st.Granted, decisions)
				case far && (calls >= decisions || st.Decisions == 0):
					t.Errorf("a cross-region store: %d store calls for %d decisions, %d from leases: want fewer calls than decisions (the key leases from 2 units)", calls, decisions, st.Decisions)
				}
			})
		}
	}
}
