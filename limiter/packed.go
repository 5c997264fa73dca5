package limiter

import (
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// The packed representation of a sliding window: the window is
// cut into r slots, and the slot counts are kept in counters of 4 fields of
// 16 bits at 4 levels. Level l's counter of index i covers slots
// [i*4^l, (i+1)*4^l); its field j is the total of the 4^(l-1) slots from
// i*4^l + j*4^(l-1). A decision adds its packed delta n<<(16*field) to its
// counter at every level, and reads, climbing from the oldest slot in view,
// one counter per level holding the slots still in view, then the top-level
// counters up to r slots ahead: it decides exactly as the Bounded
// estimator with r sub-windows, reading at most 8 counters at r = 160.

// Representation selects how a [SlidingWindow] keeps its counts in the
// store.
type Representation uint8

const (
	// Auto, the zero value, is Packed when the window allows it and
	// SubWindowCounters otherwise: Packed when the store implements
	// [storage.PackedCounter], SubWindows is zero (a window that names its
	// sub-windows keeps them), the limit is at most MaxPackedLimit,
	// MaxCost is at most PackedMaxCost, the estimator is Bounded,
	// CountDenied is off and the window cuts into
	// Slots (DefaultSlots when zero) slots of at least 100us. The window's
	// Config reports the choice.
	Auto Representation = iota
	// SubWindowCounters is one counter per sub-window (SubWindows of
	// them, read all at once): every store implements it ([storage.Counter]).
	SubWindowCounters
	// Packed is the packed multi-level representation at a resolution of
	// Slots slots per window: it decides as Bounded with Slots
	// sub-windows, reading a few counters ([storage.PackedCounter]). It needs a
	// store that implements PackedCounter, a limit of at most
	// MaxPackedLimit, the Bounded estimator and no CountDenied.
	Packed
)

// String returns "auto", "subwindows" or "packed".
func (r Representation) String() string {
	switch r {
	case Auto:
		return "auto"
	case SubWindowCounters:
		return "subwindows"
	case Packed:
		return "packed"
	}
	return "representation(" + strconv.Itoa(int(r)) + ")"
}

// UnmarshalText parses the names String returns ("" is Auto).
func (r *Representation) UnmarshalText(text []byte) error {
	switch s := string(text); s {
	case "auto", "":
		*r = Auto
	case "subwindows":
		*r = SubWindowCounters
	case "packed":
		*r = Packed
	default:
		return fmt.Errorf("%w: unknown representation %q (want auto, subwindows or packed)", ErrInvalidConfig, s)
	}
	return nil
}

// packedFits reports whether cfg can be a packed window on store: what
// Auto checks.
func packedFits(store storage.Counter, cfg SlidingWindowConfig) bool {
	if !storage.ServesPacked(store) {
		return false
	}
	slots := cfg.Slots
	if slots == 0 {
		slots = DefaultSlots
	}
	return cfg.SubWindows == 0 && cfg.Limit <= MaxPackedLimit && cfg.MaxCost <= PackedMaxCost && cfg.Estimator == Bounded && !cfg.CountDenied &&
		slots >= MinSlots && slots <= MaxSlots && cfg.Window%time.Duration(slots) == 0 &&
		cfg.Window/time.Duration(slots) >= minSlotLen
}

// minSlotLen is the shortest slot of a packed window.
const minSlotLen = 100 * time.Microsecond

const (
	// MaxPackedLimit is the largest limit of a packed window: a field holds
	// at most the limit of admitted units (a field never spans more than a
	// window), and the other half of its range is left to the units of
	// denied requests in flight (added, not yet refunded). Larger limits
	// use SubWindowCounters (NewSlidingWindow refuses them with Packed).
	MaxPackedLimit = 1<<(storage.PackedFieldBits-1) - 1
	// PackedMaxCost is the largest SlidingWindowConfig.MaxCost of a packed
	// window. A slot field holds at most the limit of admitted units, and
	// the other half of its 16 bits (2^15) is left to the units of denied
	// calls in flight: added, not yet given back. Past that the field
	// carries into the next one (or out of the counter), and every decision
	// that reads it meanwhile counts 65,536 units too few: over-admission.
	// 32 keeps 1,000 calls in flight at once on
	// one key within the bound, AWS Lambda's default concurrency per region
	// (a Lambda environment serves one request at a time); a rule whose
	// cost is larger keeps sub-window counters. It is also the MaxCost of
	// a packed window given none: a call costing more is refused with
	// ErrInvalidCost rather than risking the overflow.
	PackedMaxCost = 32
	// DefaultSlots is the resolution of a packed window when none is
	// given: the fewest slots per window that admit at least 97% of the
	// exact log on every traffic shape of docs/accuracy.md.
	DefaultSlots = 160
	// MinSlots is the smallest resolution: a top-level field (4^3 slots)
	// must fit in a window, so that it never holds more admitted units
	// than the limit.
	MinSlots = 64
	// MaxSlots is the largest resolution.
	MaxSlots = 512
)

// pow4 is 4^l.
func pow4(l int) int64 { return int64(1) << (2 * l) }

// refineAtSlot splits the top-level field that holds the writer's slot f
// (its units, all recent, would otherwise be assumed at the field's first
// slot, up to 63 slots early) with the counters the op added to: the
// level-l counter at f covers exactly the level-(l+1) field that holds f,
// in four finer fields, down to single slots at level 1. Those values
// (Added) may come from another instant than the read (memcached's incrs
// and get are separate commands, so other writers' units can fall between
// them): a split is used only when its fields add up to the coarse count,
// as they do when the add and the reads are one atomic step (memory,
// DynamoDB); otherwise the field stays coarse, its units assumed at its
// first slot, and RetryAfter stays a lower bound.
func refineAtSlot(fs []storage.PackedSpan, c *storage.PackedCounts, f int64) []storage.PackedSpan {
	for l := storage.PackedLevels; l >= 2; l-- {
		w := pow4(l - 1)
		k := -1
		for i := range fs {
			if fs[i].First <= f && f <= fs[i].Last && fs[i].Last-fs[i].First+1 == w {
				k = i
				break
			}
		}
		if k < 0 {
			return fs
		}
		x := fs[k]
		var sum uint64
		for j := range 4 {
			sum += storage.FieldOf(c.Added[l-2], j)
		}
		if sum != x.N {
			return fs // another instant: keep the coarse field
		}
		fs = append(fs[:k], fs[k+1:]...)
		sub := w / 4
		for j := range 4 {
			first := x.First + int64(j)*sub
			fs = append(fs, storage.PackedSpan{First: first, Last: first + sub - 1, N: storage.FieldOf(c.Added[l-2], j)})
		}
	}
	return fs
}

// packedRetryAfter is a lower bound, in slots from f, on when n units fit
// again with no more traffic: the first slot g > f at which the units that
// are certainly still in view (every field's units assumed at its first
// slot, so that they leave as early as they can), plus n, fit the limit. A
// store at g counts at least that much, so nothing the store would admit is
// denied earlier (the deny cache relies on it).
func packedRetryAfter(fs []storage.PackedSpan, f int64, r int, n, limit int64) int64 {
	for j := int64(1); ; j++ {
		g := f + j
		sum := uint64(n)
		for _, x := range fs {
			if x.First >= g-int64(r) {
				sum += x.N
			}
		}
		if sum <= uint64(limit) {
			return j
		}
	}
}

// overflowed reports whether one of op's adds of n wrapped its field.
func overflowed(op *storage.PackedOp, c *storage.PackedCounts, n int64) bool {
	for l := 1; l <= storage.PackedLevels; l++ {
		_, fld := storage.PackedField(op.Slot, l)
		if storage.FieldOf(c.Added[l-1], fld) < uint64(n) {
			return true
		}
	}
	return false
}

// packedSub returns the refund op of n units at slot f.
func packedSub(f int64, r int, n int64, slot time.Duration) storage.PackedOp {
	op := storage.PackedPlan(f, r, n, slot)
	op.NReads = 0
	return op
}

// judgePacked turns a packed store's answer into a decision.
func (w *SlidingWindow) judgePacked(st *storage.Step, res *storage.StepResult, t, n int64) (Decision, storage.Step, bool, error) {
	if res.Err != nil {
		return Decision{}, storage.Step{}, false, w.storeErr(res.Err)
	}
	f := st.Packed.Slot
	elapsed := t - f*w.sub
	d := Decision{Limit: w.cfg.Limit, Name: w.cfg.Name, ResetAfter: time.Duration(int64(w.r+1)*w.sub - elapsed)}
	c := &res.Packed
	if c.Stale {
		// Past the horizon: nothing was added, and the view is gone.
		// Denied; no later stamp of this writer's is known to fit sooner.
		d.RetryAfter = 1
		return d, storage.Step{}, false, nil
	}
	// The refund of the plan made by plan (st.Packed): the same deltas,
	// reading nothing (what packedSub builds).
	undo := storage.Step{Kind: storage.StepPackedSub, Key: st.Key, N: st.N, Packed: st.Packed}
	undo.Packed.NReads = 0
	if overflowed(&st.Packed, c, st.N) {
		// A field carried: give the units back (the subtraction borrows
		// back exactly) and deny.
		d.RetryAfter = 1
		return d, undo, true, nil
	}
	total := storage.PackedTotal(&st.Packed, w.r, c)
	if need := leaseNeed(st, n); need > 0 {
		if got, remaining, ok := leaseGot(total, w.cfg.Limit, st.N, need); ok {
			undo.Packed = packedSub(f, w.r, st.N-got, time.Duration(w.sub))
			undo.N = st.N - got
			return leaseTaken(d, undo, got, remaining)
		}
	}
	if total <= w.cfg.Limit {
		d.Allowed = true
		d.Remaining = w.cfg.Limit - total
		return d, undo, false, nil
	}
	var buf [4*storage.MaxPackedReads + 3*3]storage.PackedSpan
	fs := refineAtSlot(storage.PackedSpans(&st.Packed, w.r, c, buf[:0]), c, f)
	for i := range fs { // our own units are given back
		if fs[i].First <= f && f <= fs[i].Last {
			fs[i].N -= min(fs[i].N, uint64(st.N))
		}
	}
	j := packedRetryAfter(fs, f, w.r, st.N, w.cfg.Limit)
	d.RetryAfter = max(time.Duration(j*w.sub-elapsed), 1)
	return d, undo, true, nil
}
