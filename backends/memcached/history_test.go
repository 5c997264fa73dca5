package memcached_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestHistory runs the history checker (limitertest.RunHistory) on the
// shared test memcached: 64 goroutines on hot keys with arrivals reordered
// on purpose, every algorithm, wall-clock and shared-clock stamps, checked
// against the exact model.
func TestHistory(t *testing.T) {
	limitertest.RunHistory(t, newStore(t, memcached.Config{KeyPrefix: "history:"}), limitertest.HistoryOptions{})
}

// TestHistoryProxy runs the window scenarios in the pipeline-safe mode for
// proxies (Config.Proxy: the get is sent after the incr's reply), which
// changes how a window's add and reads interleave with other writers', for
// 2 s each on the wall clock (the whole run stays within about 25 s).
func TestHistoryProxy(t *testing.T) {
	var windows []limitertest.Scenario
	for _, sc := range limitertest.DefaultScenarios() {
		if sc.Fixed != nil || sc.Sliding != nil {
			sc.Duration = 2 * time.Second
			windows = append(windows, sc)
		}
	}
	limitertest.RunHistory(t, newStore(t, memcached.Config{KeyPrefix: "history-proxy:", Proxy: true}), limitertest.HistoryOptions{
		Scenarios: windows,
		Clocks:    []limitertest.Clock{limitertest.WallClock},
	})
}

// TestHistoryBatched runs the history checker with every call in a batch
// with a companion window step before it (limitertest.CompanionStore): the
// batch's one read then names the companion's counters and the step's, and
// each item must reach its own step. The sliding window (20 sub-windows),
// the packed window and the token bucket, 2 s each on the shared clock.
func TestHistoryBatched(t *testing.T) {
	cs, err := limitertest.NewCompanionStore(newStore(t, memcached.Config{KeyPrefix: "history-batched:"}))
	if err != nil {
		t.Fatal(err)
	}
	var scs []limitertest.Scenario
	for _, sc := range append(limitertest.DefaultScenarios(), limitertest.PackedScenario()) {
		if sc.Name == "SlidingWindow" || sc.Name == "SlidingWindowPacked" || sc.Name == "TokenBucket" {
			sc.Duration = min(sc.Duration, 2*time.Second)
			scs = append(scs, sc)
		}
	}
	if len(scs) != 3 {
		t.Fatalf("%d scenarios, want 3", len(scs))
	}
	limitertest.RunHistory(t, cs, limitertest.HistoryOptions{
		Scenarios: scs,
		Clocks:    []limitertest.Clock{limitertest.SharedClock},
	})
}
