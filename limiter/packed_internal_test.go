package limiter

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// The packed plan against brute force, at every slot offset of a top-level
// counter (the pattern repeats every 4^PackedLevels slots), on both sides of
// zero.
var planResolutions = []int{MinSlots, 65, 100, DefaultSlots, 250, 256, 257, MaxSlots}

func eachSlot(do func(f int64)) {
	for _, base := range []int64{-3 * pow4(PackedLevels), 0, 1 << 40} {
		for f := base; f < base+pow4(PackedLevels); f++ {
			do(f)
		}
	}
}

// fieldsOf lists the read fields of p, each with its first and last slot
// and level.
type planField struct {
	first, last int64
	level       int
}

func planFields(p *packedPlan) []planField {
	var out []planField
	for i := 0; i < p.op.NReads; i++ {
		c := p.op.Reads[i]
		w := pow4(int(c.Level) - 1)
		for j := p.reads[i].lo; j <= p.reads[i].hi; j++ {
			first := c.First() + int64(j)*w
			out = append(out, planField{first, first + w - 1, int(c.Level)})
		}
	}
	return out
}

func TestPackedPlanCoversTheView(t *testing.T) {
	for _, r := range planResolutions {
		maxKeys := 0
		eachSlot(func(f int64) {
			p := planPacked(f, r, 1, time.Millisecond)
			lo, hi := f-int64(r), f+int64(r)
			// Every slot of [f-r, f+r] is counted exactly once; none
			// before; after f+r only the rest of the top-level field
			// holding f+r (newer slots, counted as Later).
			cover := map[int64]int{}
			for _, x := range planFields(&p) {
				if x.first < lo {
					t.Fatalf("r=%d f=%d: a field of level %d starts at %d, before the oldest slot in view %d", r, f, x.level, x.first, lo)
				}
				if x.first > hi {
					t.Fatalf("r=%d f=%d: a field of level %d starts at %d, after f+r %d", r, f, x.level, x.first, hi)
				}
				if x.last > hi && x.level != PackedLevels {
					t.Fatalf("r=%d f=%d: a field of level %d runs past f+r to %d", r, f, x.level, x.last)
				}
				for s := x.first; s <= x.last; s++ {
					cover[s]++
				}
			}
			for s := lo; s <= hi; s++ {
				if cover[s] != 1 {
					t.Fatalf("r=%d f=%d: slot %d (offset %d) counted %d times", r, f, s, s-f, cover[s])
				}
			}
			for s, n := range cover {
				if n != 1 {
					t.Fatalf("r=%d f=%d: slot %d counted %d times", r, f, s, n)
				}
			}
			// Adds: the counter holding f at every level, its field.
			for l := 1; l <= PackedLevels; l++ {
				a := p.op.Adds[l-1]
				if int(a.Cell.Level) != l || a.Cell.First() > f || a.Cell.Last() < f || a.Cell.Last()-a.Cell.First()+1 != pow4(l) {
					t.Fatalf("r=%d f=%d: level %d adds to %+v", r, f, l, a.Cell)
				}
				j := (f - a.Cell.First()) / pow4(l-1)
				if a.Delta != 1<<(16*j) {
					t.Fatalf("r=%d f=%d: level %d delta %#x, want field %d", r, f, l, a.Delta, j)
				}
				if want := time.Duration(pow4(l)+PackedKeep(r)+1) * time.Millisecond; a.TTL != want {
					t.Fatalf("r=%d f=%d: level %d TTL %v, want %v", r, f, l, a.TTL, want)
				}
			}
			names := map[PackedCell]bool{}
			for _, a := range p.op.Adds {
				names[a.Cell] = true
			}
			for _, c := range p.op.Reads[:p.op.NReads] {
				names[c] = true
			}
			maxKeys = max(maxKeys, len(names))
		})
		if r == DefaultSlots && maxKeys != 8 {
			t.Errorf("r=%d: at most %d counters named per decision, want 8 (docs/accuracy.md)", r, maxKeys)
		}
		t.Logf("r=%d: at most %d counters named per decision", r, maxKeys)
	}
}

// counters builds every level's counter values from slot counts.
func counters(slots map[int64]uint64) map[PackedCell]uint64 {
	m := map[PackedCell]uint64{}
	for s, n := range slots {
		for l := 1; l <= PackedLevels; l++ {
			idx, fld := PackedField(s, l)
			m[PackedCell{uint8(l), idx}] += n << (16 * fld)
		}
	}
	return m
}

func read(p *packedPlan, m map[PackedCell]uint64) PackedCounts {
	var c PackedCounts
	for i, cell := range p.op.Reads[:p.op.NReads] {
		c.Read[i] = m[cell]
	}
	for l, a := range p.op.Adds {
		c.Added[l] = m[a.Cell]
	}
	return c
}

func TestPackedTotalIsBounded(t *testing.T) {
	rs := rand.New(rand.NewPCG(13, 1))
	for _, r := range planResolutions {
		eachSlot(func(f int64) {
			if rs.IntN(8) != 0 {
				return
			}
			// Traffic from two windows before the view to f+r, none
			// after: the plan's total is exactly Bounded's with r
			// sub-windows.
			slots := map[int64]uint64{}
			for s := f - 2*int64(r) - 300; s <= f+int64(r); s++ {
				if rs.IntN(3) == 0 {
					slots[s] = uint64(rs.IntN(40))
				}
			}
			p := planPacked(f, r, 1, time.Millisecond)
			c := read(&p, counters(slots))
			var want int64
			for s := f - int64(r); s <= f+int64(r); s++ {
				want += int64(slots[s])
			}
			if got := p.total(&c); got != want {
				t.Fatalf("r=%d f=%d: total %d, want %d (slots f-r..f+r)", r, f, got, want)
			}
		})
	}
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
			p := planPacked(f, r, 1, time.Millisecond)
			m := counters(slots)
			c := read(&p, m)
			fs := refineAtSlot(p.fields(&c, nil), &c, f)
			if j := packedRetryAfter(fs, f, r, 1, limit); j != int64(r)+1 {
				t.Errorf("r=%d f=%d: RetryAfter %d slots, want %d", r, f, j, r+1)
			}
			// Without the split, the bound is coarser (the old answer).
			if j := packedRetryAfter(p.fields(&c, nil), f, r, 1, limit); j > int64(r)+1 {
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
			p := planPacked(f, r, n, time.Millisecond)
			c := read(&p, counters(slots))
			if p.total(&c)+n <= limit {
				return // would be admitted
			}
			if rs.IntN(3) == 0 {
				// The adds' values from another instant than the reads
				// (memcached): fewer units in the finer fields.
				for l := range c.Added {
					c.Added[l] /= 2
				}
			}
			fs := refineAtSlot(p.fields(&c, nil), &c, f)
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
	p := planPacked(5, DefaultSlots, 3, time.Millisecond)
	var c PackedCounts
	for l, a := range p.op.Adds {
		c.Added[l] = a.Delta * 7
	}
	if p.overflowed(&c, 3) {
		t.Fatal("no overflow reported as one")
	}
	// Level 2's field wrapped: 0xffff + 3 = 2 there, a carry above.
	_, fld := PackedField(5, 2)
	c.Added[1] = 2<<(16*fld) + 1<<(16*(fld+1))
	if !p.overflowed(&c, 3) {
		t.Fatal("a wrapped field not reported")
	}
}

// packedFake is a store with PackedCounter that does nothing (for
// configuration checks).
type packedFake struct{ Counter }

func (packedFake) AddPacked(context.Context, Key, *PackedOp) (PackedCounts, error) {
	return PackedCounts{}, nil
}
func (packedFake) SubPacked(context.Context, Key, *PackedOp) error { return nil }

type counterOnly struct{ Counter }

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
		store Counter
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
		r, err := ParseRepresentation(s)
		if err != nil || (s != "" && r.String() != s) {
			t.Fatalf("ParseRepresentation(%q) = %v, %v", s, r, err)
		}
	}
	if _, err := ParseRepresentation("sliced"); !errors.Is(err, ErrInvalidConfig) {
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
	d, undo, undoNow, err := w.judge(&st, &StepResult{Packed: PackedCounts{Stale: true}}, now)
	if err != nil || d.Allowed || d.RetryAfter <= 0 || undo.Kind != 0 || undoNow {
		t.Fatalf("Stale: %+v undo %v now %v err %v: want a denial with nothing to give back", d, undo.Kind, undoNow, err)
	}
	var c PackedCounts // every added field reads 0 < 5: wrapped
	d, undo, undoNow, err = w.judge(&st, &StepResult{Packed: c}, now)
	if err != nil || d.Allowed || undo.Kind != StepPackedSub || !undoNow || undo.Packed.Adds != st.Packed.Adds {
		t.Fatalf("overflow: %+v undo %v now %v err %v: want a denial giving back the same deltas", d, undo.Kind, undoNow, err)
	}
}

// TestPackedOpCheck: a planned op passes; each malformed shape a store
// refuses is refused.
func TestPackedOpCheck(t *testing.T) {
	ok := PackedPlan(1<<20, 160, 3, time.Millisecond)
	if err := ok.Check(); err != nil {
		t.Fatalf("a planned op: %v", err)
	}
	var nilOp *PackedOp
	for name, op := range map[string]*PackedOp{
		"nil":          nilOp,
		"keep 0":       func() *PackedOp { o := ok; o.Keep = 0; return &o }(),
		"keep huge":    func() *PackedOp { o := ok; o.Keep = maxPackedKeep + 1; return &o }(),
		"reads < 0":    func() *PackedOp { o := ok; o.NReads = -1; return &o }(),
		"reads > max":  func() *PackedOp { o := ok; o.NReads = MaxPackedReads + 1; return &o }(),
		"add level":    func() *PackedOp { o := ok; o.Adds[1].Cell.Level = 3; return &o }(),
		"read level 0": func() *PackedOp { o := ok; o.NReads = 1; o.Reads[0].Level = 0; return &o }(),
	} {
		if err := op.Check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
