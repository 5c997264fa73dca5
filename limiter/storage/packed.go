package storage

import (
	"fmt"
	"time"
)

func satMul(a, b time.Duration) time.Duration {
	if a != 0 && b > (1<<63-1)/a {
		return 1<<63 - 1
	}
	return a * b
}

const (
	// PackedLevels is the number of levels of a packed window.
	PackedLevels = 4
	// PackedFieldBits is the width of one field; a counter (64 bits) packs
	// 64/PackedFieldBits = 4 fields.
	PackedFieldBits = 16
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

// maxPackedKeep bounds PackedOp.Keep as a store checks it: far above any
// window's 2r+1 slots.
const maxPackedKeep = 1 << 20

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

// fields returns the fields the plan reads, with their counts in c.
func (p *packedPlan) fields(c *PackedCounts, out []PackedSpan) []PackedSpan {
	for i := 0; i < p.op.NReads; i++ {
		cell := p.op.Reads[i]
		w := pow4(int(cell.Level) - 1)
		for j := p.reads[i].lo; j <= p.reads[i].hi; j++ {
			first := cell.First() + int64(j)*w
			out = append(out, PackedSpan{First: first, Last: first + w - 1, N: FieldOf(c.Read[i], int(j))})
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

// PackedSpan is one field a packed window reads: the slots it covers and
// its count.
type PackedSpan struct {
	First, Last int64
	N           uint64
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

// PackedSpans appends to dst the fields of c.Read that a packed window at
// resolution r uses, for op = PackedPlan(slot, r, ...): each with the
// slots it covers and its count, what [PackedTotal] adds up.
func PackedSpans(op *PackedOp, r int, c *PackedCounts, dst []PackedSpan) []PackedSpan {
	p := planPacked(op.Slot, r, 0, 0)
	return p.fields(c, dst)
}
