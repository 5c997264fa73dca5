package limiter

import (
	"fmt"
	"strconv"
	"time"
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
	// [PackedCounter], SubWindows is zero (a window that names its
	// sub-windows keeps them), the limit is at most MaxPackedLimit,
	// MaxCost is at most PackedMaxCost, the estimator is Bounded,
	// CountDenied is off and the window cuts into
	// Slots (DefaultSlots when zero) slots of at least 100us. The window's
	// Config reports the choice.
	Auto Representation = iota
	// SubWindowCounters is one counter per sub-window (SubWindows of
	// them, read all at once): every store implements it ([Counter]).
	SubWindowCounters
	// Packed is the packed multi-level representation at a resolution of
	// Slots slots per window: it decides as Bounded with Slots
	// sub-windows, reading a few counters ([PackedCounter]). It needs a
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

// ParseRepresentation parses the names String returns ("" is Auto).
func ParseRepresentation(s string) (Representation, error) {
	switch s {
	case "auto", "":
		return Auto, nil
	case "subwindows":
		return SubWindowCounters, nil
	case "packed":
		return Packed, nil
	}
	return 0, fmt.Errorf("%w: unknown representation %q (want auto, subwindows or packed)", ErrInvalidConfig, s)
}

// ServesPacked reports whether store serves packed windows: it implements
// [PackedCounter] and, if it is a wrapper that forwards PackedCounter to
// another store (a circuit breaker, a test's delaying store), it says the
// store it wraps does, with a method ServesPacked() bool. Auto picks Packed
// only on such a store, so that a wrapper does not make a window packed
// over a store that cannot serve it.
func ServesPacked(store any) bool {
	if _, ok := store.(PackedCounter); !ok {
		return false
	}
	if f, ok := store.(interface{ ServesPacked() bool }); ok {
		return f.ServesPacked()
	}
	return true
}

// packedFits reports whether cfg can be a packed window on store: what
// Auto checks.
func packedFits(store Counter, cfg SlidingWindowConfig) bool {
	if !ServesPacked(store) {
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
	// PackedLevels is the number of levels of a packed window.
	PackedLevels = 4
	// PackedFieldBits is the width of one field; a counter (64 bits) packs
	// 64/PackedFieldBits = 4 fields.
	PackedFieldBits = 16
	// MaxPackedLimit is the largest limit of a packed window: a field holds
	// at most the limit of admitted units (a field never spans more than a
	// window), and the other half of its range is left to the units of
	// denied requests in flight (added, not yet refunded). Larger limits
	// use SubWindowCounters (NewSlidingWindow refuses them with Packed).
	MaxPackedLimit = 1<<(PackedFieldBits-1) - 1
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
	// MaxPackedReads is the most counters a [PackedOp] reads.
	MaxPackedReads = 10
)

// PackedCell names one counter of a packed window: Level (1 to
// PackedLevels) and Index (the counter covers slots
// [Index*4^Level, (Index+1)*4^Level)).
type PackedCell struct {
	Level uint8
	Index int64
}

// First is the first slot the counter covers, Last its last.
func (c PackedCell) First() int64 { return c.Index << (2 * c.Level) }

// Last is the last slot the counter covers.
func (c PackedCell) Last() int64 { return (c.Index+1)<<(2*c.Level) - 1 }

// PackedDelta is a packed amount for one counter: each 16-bit field of
// Delta is added to (subtracted from) the same field of the counter. TTL is
// how long a store that forgets by age must keep the counter after creating
// it.
type PackedDelta struct {
	Cell  PackedCell
	Delta uint64
	TTL   time.Duration
}

// PackedOp is one decision's storage step on a packed window.
type PackedOp struct {
	// Slot is the writer's slot (its stamp over the slot length).
	Slot int64
	// Keep is how many slots behind the newest slot written to the key a
	// store that tracks it must hold counters for (see [PackedCounter]).
	Keep int64
	// Adds are the deltas to add, one per level (Adds[l-1] for level l).
	// An entry with Delta 0 is skipped: it creates nothing.
	Adds [PackedLevels]PackedDelta
	// Reads[:NReads] are the counters to read after the adds. A cell may
	// also be one of Adds.
	Reads  [MaxPackedReads]PackedCell
	NReads int
}

// maxPackedKeep bounds PackedOp.Keep as a store checks it: far above any
// window's 2r+1 slots.
const maxPackedKeep = 1 << 20

// Check reports a malformed op (nil, a reads count or Keep out of range, an
// add not at its own level, a read at no level), for stores that check what
// they are given before touching state.
func (op *PackedOp) Check() error {
	if op == nil || op.NReads < 0 || op.NReads > MaxPackedReads || op.Keep < 1 || op.Keep > maxPackedKeep {
		if op == nil {
			return fmt.Errorf("bad packed op: nil")
		}
		return fmt.Errorf("bad packed op (keep %d, %d reads)", op.Keep, op.NReads)
	}
	for i, a := range op.Adds {
		if int(a.Cell.Level) != i+1 {
			return fmt.Errorf("bad packed op: add %d at level %d", i, a.Cell.Level)
		}
	}
	for _, c := range op.Reads[:op.NReads] {
		if c.Level < 1 || c.Level > PackedLevels {
			return fmt.Errorf("bad packed op: read at level %d", c.Level)
		}
	}
	return nil
}

// PackedCounts is a packed store's answer to AddPacked.
type PackedCounts struct {
	// Added[l-1] is the value of the level-l counter of Adds after the
	// add (0 for an entry with Delta 0).
	Added [PackedLevels]uint64
	// Read[i] is the value of Reads[i] after the adds (0 for a counter
	// the store does not hold).
	Read [MaxPackedReads]uint64
	// Stale reports that the op named a counter the store may have
	// dropped (past the horizon, below): nothing was added, and Added and
	// Read are zero.
	Stale bool
}

// pow4 is 4^l.
func pow4(l int) int64 { return int64(1) << (2 * l) }

// PackedField returns the index of the level-l counter holding slot and the
// field (0 to 3) of slot in it.
func PackedField(slot int64, level int) (index int64, field int) {
	return slot >> (2 * level), int((slot >> (2 * (level - 1))) & 3)
}

// FieldOf returns field j (0 to 3) of a packed counter value.
func FieldOf(v uint64, j int) uint64 { return (v >> (PackedFieldBits * j)) & (1<<PackedFieldBits - 1) }

// packedRead is what the limiter uses of one counter read: fields lo..hi.
type packedRead struct {
	lo, hi int8
}

// packedPlan is the op of one decision at slot f, with the fields used of
// each counter read.
type packedPlan struct {
	op    PackedOp
	reads [MaxPackedReads]packedRead
}

// planPacked builds the op of n units at slot f for resolution r: a delta
// at every level, and reads that cover the slots f-r to f+r exactly once
// (fields of the last top-level counter may run past f+r: newer slots,
// counted as Later, stricter). slot is the slot length (for TTLs).
func planPacked(f int64, r int, n int64, slot time.Duration) packedPlan {
	var p packedPlan
	keep := PackedKeep(r)
	p.op.Slot, p.op.Keep = f, keep
	for l := 1; l <= PackedLevels; l++ {
		idx, fld := PackedField(f, l)
		p.op.Adds[l-1] = PackedDelta{
			Cell:  PackedCell{Level: uint8(l), Index: idx},
			Delta: uint64(n) << (PackedFieldBits * fld),
			TTL:   satMul(slot, time.Duration(pow4(l)+keep+1)),
		}
	}
	read := func(l int, idx int64, lo, hi int) {
		i := p.op.NReads
		p.op.Reads[i] = PackedCell{Level: uint8(l), Index: idx}
		p.reads[i] = packedRead{lo: int8(lo), hi: int8(hi)}
		p.op.NReads++
	}
	pos, end := f-int64(r), f+int64(r)
	for l := 1; l < PackedLevels && pos <= end; l++ {
		if pos&(pow4(l)-1) == 0 {
			continue // aligned: a field of the level above starts here
		}
		idx, lo := PackedField(pos, l)
		next := (idx + 1) * pow4(l)
		_, hi := PackedField(min(end, next-1), l)
		read(l, idx, lo, hi)
		pos = next
	}
	if pos <= end {
		top := PackedLevels
		first, _ := PackedField(pos, top)
		last, hiLast := PackedField(end, top)
		for i := first; i <= last; i++ {
			lo, hi := 0, 3
			if i == first {
				_, lo = PackedField(pos, top)
			}
			if i == last {
				hi = hiLast
			}
			read(top, i, lo, hi)
		}
	}
	return p
}

// fieldSpan is a field's slots and its count, for RetryAfter.
type fieldSpan struct {
	first, last int64
	n           uint64
}

// fields returns the fields the plan reads, with their counts in c.
func (p *packedPlan) fields(c *PackedCounts, out []fieldSpan) []fieldSpan {
	for i := 0; i < p.op.NReads; i++ {
		cell := p.op.Reads[i]
		w := pow4(int(cell.Level) - 1)
		for j := p.reads[i].lo; j <= p.reads[i].hi; j++ {
			first := cell.First() + int64(j)*w
			out = append(out, fieldSpan{first: first, last: first + w - 1, n: FieldOf(c.Read[i], int(j))})
		}
	}
	return out
}

// total is the count the plan's reads hold, saturating.
func (p *packedPlan) total(c *PackedCounts) int64 {
	var sum uint64
	for i := 0; i < p.op.NReads; i++ {
		for j := p.reads[i].lo; j <= p.reads[i].hi; j++ {
			sum += FieldOf(c.Read[i], int(j)) // at most 10*4 fields of 16 bits
		}
	}
	return int64(sum)
}

// overflowed reports whether one of the op's adds of n wrapped its field.
func (p *packedPlan) overflowed(c *PackedCounts, n int64) bool {
	for l := 1; l <= PackedLevels; l++ {
		_, fld := PackedField(p.op.Slot, l)
		if FieldOf(c.Added[l-1], fld) < uint64(n) {
			return true
		}
	}
	return false
}

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
func refineAtSlot(fs []fieldSpan, c *PackedCounts, f int64) []fieldSpan {
	for l := PackedLevels; l >= 2; l-- {
		w := pow4(l - 1)
		k := -1
		for i := range fs {
			if fs[i].first <= f && f <= fs[i].last && fs[i].last-fs[i].first+1 == w {
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
			sum += FieldOf(c.Added[l-2], j)
		}
		if sum != x.n {
			return fs // another instant: keep the coarse field
		}
		fs = append(fs[:k], fs[k+1:]...)
		sub := w / 4
		for j := range 4 {
			first := x.first + int64(j)*sub
			fs = append(fs, fieldSpan{first: first, last: first + sub - 1, n: FieldOf(c.Added[l-2], j)})
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
func packedRetryAfter(fs []fieldSpan, f int64, r int, n, limit int64) int64 {
	for j := int64(1); ; j++ {
		g := f + j
		sum := uint64(n)
		for _, x := range fs {
			if x.first >= g-int64(r) {
				sum += x.n
			}
		}
		if sum <= uint64(limit) {
			return j
		}
	}
}

// packedSub returns the refund op of n units at slot f.
func packedSub(f int64, r int, n int64, slot time.Duration) PackedOp {
	op := planPacked(f, r, n, slot).op
	op.NReads = 0
	return op
}

// judgePacked turns a packed store's answer into a decision.
func (w *SlidingWindow) judgePacked(st *Step, res *StepResult, t int64) (Decision, Step, bool, error) {
	if res.Err != nil {
		return Decision{}, Step{}, false, w.storeErr(res.Err)
	}
	f := st.Packed.Slot
	elapsed := t - f*w.sub
	d := Decision{Limit: w.cfg.Limit, Name: w.cfg.Name, ResetAfter: time.Duration(int64(w.r+1)*w.sub - elapsed)}
	c := &res.Packed
	if c.Stale {
		// Past the horizon: nothing was added, and the view is gone.
		// Denied; no later stamp of this writer's is known to fit sooner.
		d.RetryAfter = 1
		return d, Step{}, false, nil
	}
	// The plan made by plan (st.Packed is its op), and its refund: the same
	// deltas, reading nothing (what packedSub builds).
	p := &packedPlan{op: st.Packed, reads: st.packedReads}
	undo := Step{Kind: StepPackedSub, Key: st.Key, N: st.N, Packed: st.Packed}
	undo.Packed.NReads = 0
	if p.overflowed(c, st.N) {
		// A field carried: give the units back (the subtraction borrows
		// back exactly) and deny.
		d.RetryAfter = 1
		return d, undo, true, nil
	}
	total := p.total(c)
	if st.need > 0 {
		if got, remaining, ok := leaseGot(total, w.cfg.Limit, st.N, st.need); ok {
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
	var buf [4*MaxPackedReads + 3*3]fieldSpan
	fs := refineAtSlot(p.fields(c, buf[:0]), c, f)
	for i := range fs { // our own units are given back
		if fs[i].first <= f && f <= fs[i].last {
			fs[i].n -= min(fs[i].n, uint64(st.N))
		}
	}
	j := packedRetryAfter(fs, f, w.r, st.N, w.cfg.Limit)
	d.RetryAfter = max(time.Duration(j*w.sub-elapsed), 1)
	return d, undo, true, nil
}

// PackedPlan returns the op a packed window at resolution r, with slots of
// slotLen, sends for n units at slot: its deltas and reads (n = 0: the
// reads alone, adding nothing). Stores' tests use it.
func PackedPlan(slot int64, r int, n int64, slotLen time.Duration) PackedOp {
	return planPacked(slot, r, n, slotLen).op
}

// PackedTotal is the count a packed window at resolution r reads in c, the
// answer to op = PackedPlan(slot, r, ...): the fields of op.Reads it uses.
func PackedTotal(op *PackedOp, r int, c *PackedCounts) int64 {
	p := planPacked(op.Slot, r, 1, 0)
	return p.total(c)
}
