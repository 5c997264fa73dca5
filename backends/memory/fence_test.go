package memory_test

import (
	"testing"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestFence runs the fence conformance suite (limitertest.RunFence).
func TestFence(t *testing.T) {
	limitertest.RunFence(t, newStore(t, memory.Config{}))
}

// TestFenceHistory: 16 goroutines add to a window's counters, and take
// from a bucket (with and without lease takes), with the old fence,
// arrivals reordered, while the fence is raised: none lands after
// RaiseFence returned, and every one answered nil is counted
// (limitertest.CheckFenceHistories); on a store that ignores the fence
// (memory.BreakFence) each history fails.
func TestFenceHistory(t *testing.T) {
	limitertest.CheckFenceHistories(t, func(t *testing.T) limitertest.Store { return newStore(t, memory.Config{}) }, func(s limitertest.Store) { memory.BreakFence(s.(*memory.Store)) },
		limitertest.FenceHistoryOptions{}, nil)
}

// TestBucketFence runs the bucket fence conformance suite
// (limitertest.RunBucketFence): takes and lease takes fenced, reads,
// refunds and returns not.
func TestBucketFence(t *testing.T) {
	limitertest.RunBucketFence(t, newStore(t, memory.Config{}))
}
