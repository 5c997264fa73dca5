package limiter

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// The packed plan against brute force, at every slot offset of a top-level
// counter (the pattern repeats every 4^PackedLevels slots), on both sides of
// zero.
var planResolutions = []int{MinSlots, 65, 100, DefaultSlots, 250, 256, 257, MaxSlots}

func eachSlot(do func(f int64)) {
	for _, base := range []int64{-3 * pow4(storage.PackedLevels), 0, 1 << 40} {
		for f := base; f < base+pow4(storage.PackedLevels); f++ {
			do(f)
		}
	}
}

// countsOf is what a store holding the slot counts answers to op.
func countsOf(op *storage.PackedOp, slots map[int64]uint64) storage.PackedCounts {
	value := func(cell storage.PackedCell) uint64 {
		var v uint64
		for s, n := range slots {
			if idx, fld := storage.PackedField(s, int(cell.Level)); idx == cell.Index {
				v += n << (storage.PackedFieldBits * fld)
			}
		}
		return v
	}
	var c storage.PackedCounts
	for i, cell := range op.Reads[:op.NReads] {
		c.Read[i] = value(cell)
	}
	for l, a := range op.Adds {
		c.Added[l] = value(a.Cell)
	}
	return c
}

// Units all at the writer's own slot are where the adds' counters say,
// not at the first slot of the top-level field that holds it: RetryAfter
// is exactly when they leave the view (r+1 slots), not up to 63 slots
// early (a 3-per-minute demo rule said "retry after 56 s" for 61).
func TestPackedRetryAfterRecentUnits(t *testing.T) {
	for _, r := range planResolutions {
		for _, f := range []int64{1 << 20, 1<<20 + 37, 1<<20 + 63, 5<<20 + 200} {
			const limit = 3
			slots := map[int64]uint64{f: limit}
			op := storage.PackedPlan(f, r, 1, time.Millisecond)
			c := countsOf(&op, slots)
			fs := refineAtSlot(storage.PackedSpans(&op, r, &c, nil), &c, f)
			if j := packedRetryAfter(fs, f, r, 1, limit); j != int64(r)+1 {
				t.Errorf("r=%d f=%d: RetryAfter %d slots, want %d", r, f, j, r+1)
			}
			// Without the split, the bound is coarser (the old answer).
			if j := packedRetryAfter(storage.PackedSpans(&op, r, &c, nil), f, r, 1, limit); j > int64(r)+1 {
				t.Errorf("r=%d f=%d: unrefined RetryAfter %d slots, above the exact %d", r, f, j, r+1)
			}
		}
	}
}

// TestPackedRetryAfterIsALowerBound: at no slot before the one RetryAfter
// names would the store (Bounded at resolution r, with no more traffic)
// admit the request, and at that slot... it may still deny (the bound is
// on the coarse fields), but never later than when everything has left.
func TestPackedRetryAfterIsALowerBound(t *testing.T) {
	rs := rand.New(rand.NewPCG(13, 2))
	for _, r := range planResolutions {
		const limit = 200
		eachSlot(func(f int64) {
			if rs.IntN(16) != 0 {
				return
			}
			slots := map[int64]uint64{}
			for s := f - 2*int64(r); s <= f+int64(r); s++ {
				if rs.IntN(2) == 0 {
					slots[s] = uint64(rs.IntN(6))
				}
			}
			n := int64(1 + rs.IntN(10))
			op := storage.PackedPlan(f, r, n, time.Millisecond)
			c := countsOf(&op, slots)
			if storage.PackedTotal(&op, r, &c)+n <= limit {
				return // would be admitted
			}
			if rs.IntN(3) == 0 {
				// The adds' values from another instant than the reads
				// (memcached): fewer units in the finer fields.
				for l := range c.Added {
					c.Added[l] /= 2
				}
			}
			fs := refineAtSlot(storage.PackedSpans(&op, r, &c, nil), &c, f)
			j := packedRetryAfter(fs, f, r, n, limit)
			exact := func(g int64) int64 {
				var sum int64
				for s := g - int64(r); s <= g+int64(r); s++ {
					sum += int64(slots[s])
				}
				return sum
			}
			for g := f + 1; g < f+j; g++ {
				if exact(g)+n <= limit {
					t.Fatalf("r=%d f=%d n=%d: RetryAfter names slot f+%d, but the store admits at f+%d", r, f, n, j, g-f)
				}
			}
			if j > 2*int64(r)+1 {
				t.Fatalf("r=%d f=%d: RetryAfter of %d slots, past when everything has left", r, f, j)
			}
		})
	}
}

func TestPackedOverflowDetected(t *testing.T) {
	op := storage.PackedPlan(5, DefaultSlots, 3, time.Millisecond)
	var c storage.PackedCounts
	for l, a := range op.Adds {
		c.Added[l] = a.Delta * 7
	}
	if overflowed(&op, &c, 3) {
		t.Fatal("no overflow reported as one")
	}
	// Level 2's field wrapped: 0xffff + 3 = 2 there, a carry above.
	_, fld := storage.PackedField(5, 2)
	c.Added[1] = 2<<(16*fld) + 1<<(16*(fld+1))
	if !overflowed(&op, &c, 3) {
		t.Fatal("a wrapped field not reported")
	}
}

// packedFake is a store with PackedCounter that does nothing (for
// configuration checks).
type packedFake struct{ storage.Counter }

func (packedFake) AddPacked(context.Context, storage.Key, *storage.PackedOp) (storage.PackedCounts, error) {
	return storage.PackedCounts{}, nil
}
func (packedFake) SubPacked(context.Context, storage.Key, *storage.PackedOp) error { return nil }

type counterOnly struct{ storage.Counter }

func TestPackedConfig(t *testing.T) {
	ok := SlidingWindowConfig{Name: "p", Limit: 100, Window: time.Second, Representation: Packed}
	w, err := NewSlidingWindow(packedFake{}, ok)
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Config().Slots; got != DefaultSlots {
		t.Fatalf("Slots defaults to %d, want %d", got, DefaultSlots)
	}
	for _, c := range []struct {
		name  string
		store storage.Counter
		edit  func(*SlidingWindowConfig)
		field string
	}{
		{"store without PackedCounter", counterOnly{}, func(*SlidingWindowConfig) {}, "representation"},
		{"limit above 16-bit fields", packedFake{}, func(c *SlidingWindowConfig) { c.Limit = MaxPackedLimit + 1 }, "limit"},
		{"interpolated", packedFake{}, func(c *SlidingWindowConfig) { c.Estimator = Interpolated }, "estimator"},
		{"count denied", packedFake{}, func(c *SlidingWindowConfig) { c.CountDenied = true }, "count-denied"},
		{"too few slots", packedFake{}, func(c *SlidingWindowConfig) { c.Slots = MinSlots - 1 }, "slots"},
		{"too many slots", packedFake{}, func(c *SlidingWindowConfig) { c.Slots = MaxSlots + 1 }, "slots"},
		{"slots do not divide", packedFake{}, func(c *SlidingWindowConfig) { c.Window = time.Second + 1 }, "slots"},
		{"slots too short", packedFake{}, func(c *SlidingWindowConfig) { c.Window = 10 * time.Millisecond; c.Slots = 128 }, "slots"},
		{"slots without packed", packedFake{}, func(c *SlidingWindowConfig) { c.Representation = SubWindowCounters; c.Slots = 160 }, "slots"},
		{"unknown representation", packedFake{}, func(c *SlidingWindowConfig) { c.Representation = Packed + 1 }, "representation"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.edit(&cfg)
			_, err := NewSlidingWindow(c.store, cfg)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("got %v, want ErrInvalidConfig naming %q", err, c.field)
			}
		})
	}
	if MaxPackedLimit != 32767 {
		t.Fatalf("MaxPackedLimit %d", MaxPackedLimit)
	}
	for _, s := range []string{"packed", "subwindows", ""} {
		var r Representation
		if err := r.UnmarshalText([]byte(s)); err != nil || (s != "" && r.String() != s) {
			t.Fatalf("UnmarshalText(%q) = %v, %v", s, r, err)
		}
	}
	var r Representation
	if err := r.UnmarshalText([]byte("sliced")); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("unknown representation parsed: %v", err)
	}
}

// TestPackedStaleAndOverflowDeny: a Stale answer and a wrapped field both
// deny, the wrapped one giving its units back at once.
func TestPackedStaleAndOverflowDeny(t *testing.T) {
	w, err := NewSlidingWindow(packedFake{}, SlidingWindowConfig{Name: "p", Limit: 100, Window: time.Second, Representation: Packed})
	if err != nil {
		t.Fatal(err)
	}
	now := int64(1_700_000_000_000_000_000)
	st, _, err := w.plan("k", time.Unix(0, now), 5)
	if err != nil {
		t.Fatal(err)
	}
	d, undo, undoNow, err := w.judge(&st, &storage.StepResult{Packed: storage.PackedCounts{Stale: true}}, now, 5)
	if err != nil || d.Allowed || d.RetryAfter <= 0 || undo.Kind != 0 || undoNow {
		t.Fatalf("Stale: %+v undo %v now %v err %v: want a denial with nothing to give back", d, undo.Kind, undoNow, err)
	}
	var c storage.PackedCounts // every added field reads 0 < 5: wrapped
	d, undo, undoNow, err = w.judge(&st, &storage.StepResult{Packed: c}, now, 5)
	if err != nil || d.Allowed || undo.Kind != storage.StepPackedSub || !undoNow || undo.Packed.Adds != st.Packed.Adds {
		t.Fatalf("overflow: %+v undo %v now %v err %v: want a denial giving back the same deltas", d, undo.Kind, undoNow, err)
	}
}
