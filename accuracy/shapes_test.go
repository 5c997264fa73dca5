package accuracy

import (
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// shapeTestLimits are small limits, so the shapes stay short under -race.
var shapeTestLimits = []Params{{Limit: 2, Window: time.Second}, {Limit: 10, Window: time.Minute}, {Limit: 40, Window: time.Minute}}

// TestModelIsTheLimiter: the fast model decides as the real
// limiter.SlidingWindow (Bounded, k sub-windows) on every shape, costs
// included, and as the sliced prototype with k x 4 slices at r = 4k.
func TestModelIsTheLimiter(t *testing.T) {
	t.Parallel()
	for _, p := range shapeTestLimits {
		for _, k := range []int{4, 5, 20} {
			for _, sh := range Shapes() {
				tr := sh.Generate(p, k, 6, 1)
				var got []int64
				boundedModel(tr, p, k, modelBounded, &got)
				res, err := Simulate(tr, p, Config{Algorithm: Bounded, SubWindows: k})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, res.Admits) {
					t.Errorf("%s, k=%d, %s: the model admitted %d, limiter.SlidingWindow %d", limitName(p), k, sh.Name, len(got), len(res.Admits))
				}
				if res.WorstWindow > p.Limit {
					t.Errorf("%s, bounded k=%d, %s: %d units in a window, above the limit", limitName(p), k, sh.Name, res.WorstWindow)
				}
				if k != 5 {
					continue
				}
				got = got[:0]
				boundedModel(tr, p, 4*k, modelBounded, &got)
				sl, err := Simulate(tr, p, Config{Algorithm: Sliced, SubWindows: k, Slices: 4})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, sl.Admits) {
					t.Errorf("%s, r=%d, %s: the model admitted %d, the sliced prototype %d", limitName(p), 4*k, sh.Name, len(got), len(sl.Admits))
				}
			}
		}
	}
}

// TestExactUnitsIsTheLog: on costed shapes, limiter.SlidingLog admits
// what ExactUnits and the exact model admit.
func TestExactUnitsIsTheLog(t *testing.T) {
	t.Parallel()
	p := Params{Limit: 10, Window: time.Minute}
	for _, sh := range Shapes() {
		tr := sh.Generate(p, 20, 6, 2)
		res, err := Simulate(tr, p, Config{Algorithm: Log})
		if err != nil {
			t.Fatal(err)
		}
		n, u := ExactUnits(tr, p.Limit, p.Window)
		ex := exactModel(tr, p)
		if res.Admitted != n || res.AdmittedUnits != u || ex.Admitted != n || ex.AdmittedUnits != u {
			t.Errorf("%s: log %d/%d units, ExactUnits %d/%d, exact model %d/%d", sh.Name, res.Admitted, res.AdmittedUnits, n, u, ex.Admitted, ex.AdmittedUnits)
		}
		if res.WorstWindow > p.Limit {
			t.Errorf("%s: the exact log took %d units in a window", sh.Name, res.WorstWindow)
		}
	}
}

func shortShapes() ShapeOptions {
	o := DefaultShapeOptions()
	o.Limits = shapeTestLimits
	o.Windows, o.Seeds = 8, 2
	o.Resolutions = []int{4, 20, 40}
	return o
}

// TestBoundedNeverOvershootsOnShapes: the matrix finds no overshoot for
// Bounded on any shape, and catches a deliberately over-admitting
// estimator (one that forgets the partly visible sub-window) under a flood
// and on the edge-end burst; the interpolated estimator of the real
// limiter overshoots there too.
func TestBoundedNeverOvershootsOnShapes(t *testing.T) {
	t.Parallel()
	o := shortShapes()
	m, err := RunShapes(o)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range o.Resolutions {
		if w := m.WorstAt(i); w.Overshoot > 1 {
			t.Errorf("bounded r=%d overshoots: %.2f on %s", r, w.Overshoot, m.where(w))
		}
	}
	leaky, err := runShapes(o, modelLeaky)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range o.Resolutions {
		for s, sh := range leaky.Shapes {
			if sh.Name != "edge-end" && sh.Name != "poisson-10x" {
				continue
			}
			over := 0.0
			for l := range leaky.Cells {
				over = max(over, leaky.Cells[l][s][i].Overshoot)
			}
			if over <= 1 {
				t.Errorf("the leaky estimator at r=%d was not caught on %s (overshoot %.2f)", r, sh.Name, over)
			}
		}
	}
	p := DefaultParams
	for _, sh := range Shapes() {
		if sh.Name != "edge-end" {
			continue
		}
		res, err := Simulate(sh.Generate(p, 20, 12, 1), p, Config{Algorithm: Interpolated, SubWindows: 20})
		if err != nil {
			t.Fatal(err)
		}
		if res.WorstWindow <= p.Limit {
			t.Errorf("interpolated k=20 on %s: worst window %d, want above the limit", sh.Name, res.WorstWindow)
		}
	}
}

// TestShapesAreDeterministic: a shape's trace is a function of its seed,
// and different seeds give different traces.
func TestShapesAreDeterministic(t *testing.T) {
	p := Params{Limit: 10, Window: time.Minute}
	for _, sh := range Shapes() {
		a, b, c := sh.Generate(p, 20, 8, 1), sh.Generate(p, 20, 8, 1), sh.Generate(p, 20, 8, 2)
		if !slices.Equal(a.Times, b.Times) || !slices.Equal(a.Costs, b.Costs) {
			t.Errorf("%s: two traces from seed 1 differ", sh.Name)
		}
		if slices.Equal(a.Times, c.Times) {
			t.Errorf("%s: seeds 1 and 2 give the same trace", sh.Name)
		}
		if len(a.Times) == 0 || !slices.IsSorted(a.Times) || a.Costs != nil && len(a.Costs) != len(a.Times) {
			t.Errorf("%s: %d requests, sorted %v, %d costs", sh.Name, len(a.Times), slices.IsSorted(a.Times), len(a.Costs))
		}
		for _, n := range a.Costs {
			if n < 1 || n > p.maxCost() {
				t.Fatalf("%s: cost %d", sh.Name, n)
			}
		}
	}
}

// TestPackedKeysCoverTheView: the counters a packed decision reads cover
// every slot Bounded counts, from the oldest slot in view (f-r) to r slots
// ahead, with fields that start exactly at f-r (the climb), and the
// decision names its own counter at every level.
func TestPackedKeysCoverTheView(t *testing.T) {
	for levels := 1; levels <= 4; levels++ {
		for _, r := range []int64{4, 5, 20, 64, 160} {
			for f := int64(1 << 30); f < 1<<30+pow4(levels)+3; f++ {
				keys := packedKeys(levels, r, f)
				covered := func(slot int64) bool {
					for _, k := range keys {
						if floorDiv(slot, pow4(int(k[0]))) == k[1] {
							return true
						}
					}
					return false
				}
				for slot := f - r; slot <= f+r; slot++ {
					if !covered(slot) {
						t.Fatalf("L=%d r=%d f=%d: slot %d (offset %d) not read", levels, r, f, slot, slot-f)
					}
				}
				// The first slot read at a field boundary of its level: the
				// slots before f-r are either in another counter or in
				// fields the reader skips (level 1: one slot per field).
				for l := 1; l <= levels; l++ {
					if !slices.Contains(keys, [2]int64{int64(l), floorDiv(f, pow4(l))}) {
						t.Fatalf("L=%d r=%d f=%d: its own level-%d counter is not named", levels, r, f, l)
					}
				}
				if got, _ := (Representation{Kind: RepPacked, Levels: levels}).KeysRead(int(r)); len(keys) > got {
					t.Fatalf("L=%d r=%d: %d keys at f=%d, KeysRead says at most %d", levels, r, len(keys), f, got)
				}
			}
		}
	}
	// Today's window: 2k+1 (storage.Ahead).
	if got, _ := (Representation{Kind: RepBounded}).KeysRead(20); got != 41 {
		t.Errorf("bounded k=20: %d keys, want 41", got)
	}
}

// TestPackedReplayIsBounded replays the shapes (short traces) through the
// real packed limiter.SlidingWindow on the memory store: every decision is
// the Bounded model's at the same resolution, never above the limit; and
// the comparison catches a model of another resolution.
func TestPackedReplayIsBounded(t *testing.T) {
	o := DefaultShapeOptions()
	o.Seeds, o.Windows = 1, 6
	rep, err := RunPackedReplay(o, limiter.DefaultSlots)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mismatches != 0 {
		t.Fatalf("%d of %d decisions differ from Bounded at r=%d; first: %s", rep.Mismatches, rep.Decisions, rep.Slots, rep.FirstMismatch)
	}
	if w := rep.Worst(); w.Overshoot > 1 {
		t.Fatalf("overshoot %.2f", w.Overshoot)
	}
	if rep.Keys != 8 {
		t.Fatalf("%d counters named per decision at r=160, want 8", rep.Keys)
	}
	// The check can fail: against Bounded at r=20 the same replay differs.
	p := o.Limits[2]
	i := slices.IndexFunc(Shapes(), func(sh Shape) bool { return sh.Name == "poisson-2x" })
	tr := Shapes()[i].Generate(p, 0, o.Windows, 1)
	want := make([]bool, len(tr.Times))
	boundedModelOf(tr, p, 20, modelBounded, nil, want)
	if _, mism, _, err := replayPacked(tr, p, limiter.DefaultSlots, want); err != nil || mism == 0 {
		t.Fatalf("against Bounded at r=20: %d mismatches (err %v), want some", mism, err)
	}
}
