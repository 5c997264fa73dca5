package memory_test

import (
	"context"
	"strings"
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

// TestHistoryBucketExpiry runs the history checker on a bucket left alone
// between bursts (limitertest.BucketExpiryScenario): the store keeps a
// bucket its TTL after the last write.
func TestHistoryBucketExpiry(t *testing.T) {
	limitertest.RunHistory(t, newStore(t, memory.Config{}), limitertest.HistoryOptions{
		Scenarios: []limitertest.Scenario{limitertest.BucketExpiryScenario()},
		Parallel:  true,
	})
}

// TestHistoryFailsEarlyBucketExpiry shows the checker fails the store when
// it keeps a bucket only a quarter of its TTL after the last write
// (memory.BreakBucketExpiry), on the scenario the store passes.
func TestHistoryFailsEarlyBucketExpiry(t *testing.T) {
	seed, err := limitertest.HistorySeed()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("history seed %d (%s=%d to replay the draws)", seed, limitertest.SeedEnv, seed)
	s := newStore(t, memory.Config{})
	memory.BreakBucketExpiry(s)
	rep, err := limitertest.RunScenario(context.Background(), s, limitertest.BucketExpiryScenario(), limitertest.WallClock,
		limitertest.HistoryOptions{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s; store: %+v", rep.Summary(), s.Stats())
	err = rep.Err()
	if err == nil {
		t.Fatalf("the checker passed a store that drops a bucket at a quarter of its TTL (seed %d)", seed)
	}
	if !strings.Contains(err.Error(), "token bucket history") {
		t.Fatalf("failed for another reason than the bucket history: %v", err)
	}
	t.Logf("as expected: %v", err)
}
