package limitertest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// dropLevel is a broken packed store: it skips one level's add (on the
// single-step path), and reports the add as done, hiding it from the
// overflow check, so the writers that read that level (the oldest slots of
// their view) miss units.
type dropLevel struct {
	Store
	p     storage.PackedCounter
	level int
}

func (d dropLevel) ServesPacked() bool { return true }

func (d dropLevel) AddPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) (storage.PackedCounts, error) {
	o := *op
	o.Adds[d.level-1].Delta = 0
	c, err := d.p.AddPacked(ctx, k, &o)
	c.Added[d.level-1] = op.Adds[d.level-1].Delta
	return c, err
}

func (d dropLevel) SubPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) error {
	return d.p.SubPacked(ctx, k, op)
}

// dropLevelBatch is dropLevel for a batching store: its batch path skips
// the level too.
type dropLevelBatch struct {
	dropLevel
	b storage.Batcher
}

func (d dropLevelBatch) Do(ctx context.Context, steps []storage.Step, out []storage.StepResult) {
	cp := append([]storage.Step(nil), steps...)
	for i := range cp {
		if cp[i].Kind == storage.StepPackedAdd {
			cp[i].Packed.Adds[d.level-1].Delta = 0
		}
	}
	d.b.Do(ctx, cp, out)
	for i := range steps {
		if steps[i].Kind == storage.StepPackedAdd {
			out[i].Packed.Added[d.level-1] = steps[i].Packed.Adds[d.level-1].Delta
		}
	}
}

// DropPackedLevel returns s (which must implement storage.PackedCounter)
// broken: the adds of one level (1-4) of every packed window are dropped,
// on its batch path too when s batches.
func DropPackedLevel(s Store, level int) (Store, error) {
	p, ok := s.(storage.PackedCounter)
	if !ok {
		return nil, fmt.Errorf("limitertest: %T does not implement storage.PackedCounter", s)
	}
	if level < 1 || level > storage.PackedLevels {
		return nil, fmt.Errorf("limitertest: packed level %d", level)
	}
	d := dropLevel{Store: s, p: p, level: level}
	if b, ok := s.(storage.Batcher); ok {
		return dropLevelBatch{d, b}, nil
	}
	return d, nil
}

// RunBrokenPacked shows the history checker fails a packed store that
// drops the adds of level 2 or of level 3 (DropPackedLevel): it runs
// PackedScenario on newStore(level) so broken, on the shared clock with 64
// goroutines on 2 keys, and fails unless the checker finds windows over
// the limit.
func RunBrokenPacked(t *testing.T, newStore func(t *testing.T, level int) Store) {
	for _, level := range []int{2, 3} {
		t.Run(strconv.Itoa(level), func(t *testing.T) {
			seed, err := HistorySeed()
			if err != nil {
				t.Fatal(err)
			}
			s, err := DropPackedLevel(newStore(t, level), level)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := RunScenario(context.Background(), s, PackedScenario(), SharedClock, HistoryOptions{Workers: 64, Keys: 2, Seed: seed})
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

// PackedMaxCostScenario is a packed window at its largest cost: the
// default MaxCost of a packed window (limiter.PackedMaxCost), one call in
// four costing 2 to 32, 400 per 400 ms at 160 slots, no deny cache (every
// denied call adds its units, then gives them back), delays below 50 ms,
// 2 s. Calls past the bound are refused by the limiter (ErrInvalidCost),
// so this is the heaviest load on a slot field's spare half that the API
// lets through.
func PackedMaxCostScenario() Scenario {
	return Scenario{Name: "SlidingWindowPackedMaxCost",
		Sliding: &limiter.SlidingWindowConfig{Name: "history-packed-max-cost", Limit: 400, Window: 400 * time.Millisecond,
			Representation: limiter.Packed, NoDenyCache: true},
		Duration: 2 * time.Second, MaxDelay: 50 * time.Millisecond, MaxCost: limiter.PackedMaxCost}
}
