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
	limitertest.RunHistory(t, newStore(t, memcached.Config{KeyPrefix: "history:"}), limitertest.HistoryOptions{Parallel: true})
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
		Parallel:  true,
	})
}

// TestHistoryBatched runs the history checker with every call in a batch
// with a companion window step before it (limitertest.RunHistoryBatched):
// the batch's one read then names the companion's counters and the step's,
// and each item must reach its own step.
func TestHistoryBatched(t *testing.T) {
	limitertest.RunHistoryBatched(t, newStore(t, memcached.Config{KeyPrefix: "history-batched:"}))
}
