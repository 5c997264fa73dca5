package storage

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The packed plan against brute force, at every slot offset of a top-level
// counter (the pattern repeats every 4^PackedLevels slots), on both sides of
// zero.
var planResolutions = []int{64, 65, 100, 160, 250, 256, 257, 512} // limiter's MinSlots, DefaultSlots, MaxSlots and others

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
		if r == 160 && maxKeys != 8 { // limiter.DefaultSlots
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
