package memory_test

import (
	"testing"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestHistory runs the history checker (limitertest.RunHistory): 64
// goroutines on hot keys with arrivals reordered on purpose, every algorithm,
// wall-clock and shared-clock stamps, checked against the exact model.
func TestHistory(t *testing.T) {
	limitertest.RunHistory(t, newStore(t, memory.Config{}), limitertest.HistoryOptions{Parallel: true})
}

// TestHistoryPacked runs the history checker on the packed sliding window
// (limiter.Packed): arrivals reordered across slot and level boundaries
// (the run fails unless some late arrival crossed a boundary of every
// level).
func TestHistoryPacked(t *testing.T) {
	limitertest.RunHistory(t, newStore(t, memory.Config{}), limitertest.HistoryOptions{
		Scenarios: []limitertest.Scenario{limitertest.PackedScenario()},
		Parallel:  true,
	})
}

// TestHistoryFailsBrokenPacked shows the checker fails a packed store that
// loses the adds of level 2 or level 3 (limitertest.RunBrokenPacked).
func TestHistoryFailsBrokenPacked(t *testing.T) {
	limitertest.RunBrokenPacked(t, func(t *testing.T, _ int) limitertest.Store { return newStore(t, memory.Config{}) })
}

// TestHistoryPackedMaxCost runs the history checker on a packed window
// whose calls cost up to limiter.PackedMaxCost, the most a packed window
// without MaxCost takes (limitertest.PackedMaxCostScenario).
func TestHistoryPackedMaxCost(t *testing.T) {
	limitertest.RunHistory(t, newStore(t, memory.Config{}), limitertest.HistoryOptions{
		Scenarios: []limitertest.Scenario{limitertest.PackedMaxCostScenario()},
		Parallel:  true,
	})
}
