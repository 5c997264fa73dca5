package memory_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/limiter"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestHistory runs the history checker (limitertest.RunHistory): 64
// goroutines on hot keys with arrivals reordered on purpose, every algorithm,
// wall-clock and shared-clock stamps, checked against the exact model.
func TestHistory(t *testing.T) {
	limitertest.RunHistory(t, newStore(t, memory.Config{}), limitertest.HistoryOptions{})
}

// TestHistoryPacked runs the history checker on the packed sliding window
// (limiter.Packed): arrivals reordered across slot and level boundaries
// (the run fails unless some late arrival crossed a boundary of every
// level).
func TestHistoryPacked(t *testing.T) {
	limitertest.RunHistory(t, newStore(t, memory.Config{}), limitertest.HistoryOptions{
		Scenarios: []limitertest.Scenario{limitertest.PackedScenario()},
	})
}

// dropLevel is a broken packed store: it drops the add of one level, so
// the readers that read that level (the oldest slots of their view) miss
// units.
type dropLevel struct {
	*memory.Store
	level int
}

func (d dropLevel) AddPacked(ctx context.Context, k limiter.Key, op *limiter.PackedOp) (limiter.PackedCounts, error) {
	o := *op
	o.Adds[d.level-1].Delta = 0
	c, err := d.Store.AddPacked(ctx, k, &o)
	c.Added[d.level-1] = op.Adds[d.level-1].Delta // hide it from the overflow check
	return c, err
}

// TestHistoryFailsBrokenPacked shows the checker fails a packed store that
// loses the adds of level 2 or level 3.
func TestHistoryFailsBrokenPacked(t *testing.T) {
	for _, level := range []int{2, 3} {
		t.Run(strconv.Itoa(level), func(t *testing.T) {
			seed, err := limitertest.HistorySeed()
			if err != nil {
				t.Fatal(err)
			}
			rep, err := limitertest.RunScenario(context.Background(), dropLevel{newStore(t, memory.Config{}), level},
				limitertest.PackedScenario(), limitertest.SharedClock, limitertest.HistoryOptions{Workers: 64, Keys: 2, Seed: seed})
			if err != nil {
				t.Fatal(err)
			}
			t.Log(rep.Summary())
			if len(rep.Violations) == 0 {
				t.Fatalf("seed %d: the checker passed a store that drops level %d's adds", seed, level)
			}
			t.Logf("level %d dropped: %d windows over the limit, first %v", level, len(rep.Violations), rep.Violations[0])
		})
	}
}
