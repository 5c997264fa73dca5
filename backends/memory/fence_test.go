package memory_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestFence runs the fence conformance suite (limitertest.RunFence).
func TestFence(t *testing.T) {
	limitertest.RunFence(t, newStore(t, memory.Config{}))
}

// TestFenceHistory: 16 goroutines add with the old fence, arrivals
// reordered, while the fence is raised; no add with the old fence lands
// after RaiseFence returned, and every add answered nil is counted.
func TestFenceHistory(t *testing.T) {
	seed, err := limitertest.HistorySeed()
	if err != nil {
		t.Fatal(err)
	}
	h, err := limitertest.RunFenceHistory(context.Background(), newStore(t, memory.Config{}), limitertest.FenceHistoryOptions{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d: %+v", seed, h)
	if err := h.Err(); err != nil {
		t.Error(err)
	}
}

// TestFenceHistoryFailsBroken: the same history on a store that ignores
// the fence (memory.BreakFence) fails.
func TestFenceHistoryFailsBroken(t *testing.T) {
	s := newStore(t, memory.Config{})
	memory.BreakFence(s)
	h, err := limitertest.RunFenceHistory(context.Background(), s, limitertest.FenceHistoryOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Err()
	t.Logf("broken store: %+v: %v", h, err)
	if err == nil {
		t.Error("the history of a store that ignores the fence passed")
	}
}

// TestBucketFence runs the bucket fence conformance suite
// (limitertest.RunBucketFence): takes and lease takes fenced, reads,
// refunds and returns not.
func TestBucketFence(t *testing.T) {
	limitertest.RunBucketFence(t, newStore(t, memory.Config{}))
}

// TestBucketFenceHistory: 16 goroutines take from a bucket with the old
// fence (plain and lease takes), arrivals reordered, while the fence is
// raised; no take with the old fence lands after RaiseFence returned, and
// every token a take was answered is taken from the bucket.
func TestBucketFenceHistory(t *testing.T) {
	seed, err := limitertest.HistorySeed()
	if err != nil {
		t.Fatal(err)
	}
	h, err := limitertest.RunBucketFenceHistory(context.Background(), newStore(t, memory.Config{}), limitertest.FenceHistoryOptions{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d: %+v", seed, h)
	if err := h.Err(); err != nil {
		t.Error(err)
	}
}

// TestBucketFenceHistoryFailsBroken: the same history on a store that
// ignores the fence (memory.BreakFence) fails.
func TestBucketFenceHistoryFailsBroken(t *testing.T) {
	s := newStore(t, memory.Config{})
	memory.BreakFence(s)
	h, err := limitertest.RunBucketFenceHistory(context.Background(), s, limitertest.FenceHistoryOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Err()
	t.Logf("broken store: %+v: %v", h, err)
	if err == nil {
		t.Error("the history of a store that ignores the fence passed")
	}
}
