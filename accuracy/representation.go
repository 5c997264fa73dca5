package accuracy

import (
	"fmt"
	"slices"
)

// This file describes the window representations by what a
// memcached decision touches. Each stays exact at a resolution of r slots
// per window, so its decisions are the Bounded model's with that r
// (model.go): they differ in the keys a decision names, the items a key
// keeps, and what the store must do.

// RepKind is a family of representations.
type RepKind uint8

const (
	// RepBounded is today's limiter.SlidingWindow: one memcached counter
	// per sub-window (r = k <= 60); a decision incrs its own and gets the k
	// in view and the k newer ones (storage.Ahead): 2k+1 keys.
	RepBounded RepKind = iota
	// RepPacked is a hierarchy of packed counters: Levels families, the
	// counters of level l holding 4 fields of 16 bits, each the total of
	// 4^(l-1) consecutive slots of W/r (level 1: slot counts, which is
	// accuracy.SlicedWindow with 4 slices when Levels is 1). A decision
	// incrs its counter at every level (one packed delta each) and gets,
	// climbing from the oldest slot in view, the counter of each level
	// that holds the slots still in view, then the top-level counters up to
	// r slots ahead (Later). Exact at resolution r: it decides as Bounded
	// with r sub-windows.
	RepPacked
	// RepCached is one counter per sub-window (r = k <= 60) with the
	// closed sub-windows' counts kept in the process. Under today's
	// out-of-order contract a writer may be a whole window late, so no
	// sub-window in view is closed: a decision reads what RepBounded reads.
	// Warm is what a warm decision would read if the horizon were cut to
	// one sub-window (its own counter, one ahead, the previous one, and a
	// late-units counter); a cold one reads 2k+1.
	RepCached
)

// Representation is a family and, for RepPacked, its levels.
type Representation struct {
	Kind   RepKind
	Levels int
}

// Representations are the representations the report compares.
var Representations = []Representation{
	{Kind: RepBounded}, {Kind: RepCached},
	{Kind: RepPacked, Levels: 1}, {Kind: RepPacked, Levels: 2}, {Kind: RepPacked, Levels: 3}, {Kind: RepPacked, Levels: 4},
}

// packedFields is the number of 16-bit fields a 64-bit memcached counter
// packs. A field holds the limit (below 2^15) plus the denied units in
// flight (another 2^15 before a carry into the next field).
const packedFields = 4

func (rep Representation) String() string {
	switch rep.Kind {
	case RepBounded:
		return "bounded (today)"
	case RepCached:
		return "cached closed sub-windows"
	case RepPacked:
		if rep.Levels == 1 {
			return "packed, 1 level (sliced x4)"
		}
		return fmt.Sprintf("packed, %d levels", rep.Levels)
	}
	return "representation?"
}

// Name labels the representation at resolution r.
func (rep Representation) Name(r int) string {
	switch rep.Kind {
	case RepCached:
		return fmt.Sprintf("cached k=%d", r)
	case RepPacked:
		return fmt.Sprintf("packed L=%d r=%d", rep.Levels, r)
	}
	return fmt.Sprintf("bounded k=%d", r)
}

// valid reports whether the representation can have resolution r.
func (rep Representation) valid(r int) bool {
	if rep.Kind == RepPacked {
		return r >= 1 && rep.Levels >= 1
	}
	return r >= 1 && r <= 60 // limiter.MaxSubWindows
}

// pow4 is 4^l.
func pow4(l int) int64 { return int64(1) << (2 * l) }

// blocks is the most aligned blocks of b that n consecutive indices touch.
func blocks(n, b int64) int64 {
	if n <= 0 {
		return 0
	}
	return (n-1+b-1)/b + 1
}

// packedKeys returns the keys (level, index) one decision at slot f names
// with levels levels at resolution r: its own counter at every level, and
// the counters whose fields cover slots f-r (the oldest in view) to f+r.
func packedKeys(levels int, r, f int64) [][2]int64 {
	var keys [][2]int64
	add := func(l, i int64) {
		k := [2]int64{l, i}
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	for l := 1; l <= levels; l++ {
		add(int64(l), floorDiv(f, pow4(l)))
	}
	pos, end := f-r, f+r
	for l := 1; l < levels; l++ {
		if pos%pow4(l) == 0 {
			continue // aligned: a field of the level above starts here
		}
		add(int64(l), floorDiv(pos, pow4(l)))
		pos = (floorDiv(pos, pow4(l)) + 1) * pow4(l)
	}
	top := pow4(levels)
	for i := floorDiv(pos, top); i <= floorDiv(end, top); i++ {
		add(int64(levels), i)
	}
	return keys
}

// KeysRead is the most keys one memcached decision names (incr'ed or
// read) at resolution r, over every slot offset; warm is RepCached's warm
// figure (0 for the others).
func (rep Representation) KeysRead(r int) (keys, warm int) {
	switch rep.Kind {
	case RepPacked:
		base := int64(1) << 40 // any slot: the pattern repeats every 4^levels
		for f := base; f < base+pow4(rep.Levels); f++ {
			keys = max(keys, len(packedKeys(rep.Levels, int64(r), f)))
		}
		return keys, 0
	case RepCached:
		return 2*r + 1, 4
	}
	return 2*r + 1, 0
}

// Writes is the counters one decision increments (and a refund
// decrements).
func (rep Representation) Writes() int {
	if rep.Kind == RepPacked {
		return rep.Levels
	}
	return 1
}

// ItemsPerKey is the most memcached items a key with steady traffic keeps
// alive: the counters written within their time to live, 2(r+1) slots
// (the view plus the out-of-order horizon), at every level.
func (rep Representation) ItemsPerKey(r int) int {
	span := 2 * int64(r+1)
	if rep.Kind != RepPacked {
		return int(span)
	}
	n := int64(0)
	for l := 1; l <= rep.Levels; l++ {
		n += blocks(span, pow4(l))
	}
	return int(n)
}
