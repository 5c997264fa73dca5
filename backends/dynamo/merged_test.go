package dynamo_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestHistoryMerged runs the merged history checker: a window, a bucket and
// a fixed window on one key decided together (one UpdateItem per batch on
// the key's item), mixed with single-step calls of each on the same key,
// batches held back whole so that they arrive out of order, 64 goroutines
// on 2 keys, every limit's history checked.
func TestHistoryMerged(t *testing.T) {
	if testing.Short() {
		t.Skip("the history checker takes seconds")
	}
	s, r, _ := newStore(t, dynamo.Config{})
	limitertest.RunMergedHistory(t, limitertest.BucketsAtStamp(s))
	st := s.Stats()
	t.Logf("%d requests (%d failed: lost races); %d conflicts, %d moves, %d lost refunds", r.load(), r.failed.Load(), st.Conflicts, st.Moves, st.LostRefunds)
}

// The merged history checker fails a store whose merged writes drop the
// bucket's condition (every bucket write exact, so each one merged with the
// windows' overwrites the bucket blindly): shown before trusting it.
func TestHistoryMergedFailsBroken(t *testing.T) {
	if testing.Short() {
		t.Skip("the history checker takes seconds")
	}
	s, _, _ := newStore(t, dynamo.Config{})
	dynamo.SetExactOnly(s, true)
	dynamo.BreakMerged(s)
	seed, err := limitertest.HistorySeed()
	if err != nil {
		t.Fatal(err)
	}
	sc := limitertest.DefaultMergedScenario()
	// Up to three runs (a cold server holds the first calls back past the
	// horizon, where violations are excused): one must find the store out.
	for try := range uint64(3) {
		rep, err := limitertest.RunMergedScenario(context.Background(), limitertest.BucketsAtStamp(s), sc, limitertest.SharedClock, limitertest.HistoryOptions{Seed: seed + try})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(rep.Summary())
		if len(rep.Violations) > 0 {
			t.Logf("broken merged store: %d windows of stamps over a limit, first %v", len(rep.Violations), rep.Violations[0])
			return
		}
	}
	t.Fatalf("seeds %d to %d: the checker passed a store whose merged writes drop the bucket's condition, 3 times", seed, seed+2)
}
