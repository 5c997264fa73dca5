package leasesim

import "slices"

// item is the store's state of one key: a bucket (GCRA on a refill grid,
// as backends/dynamo keeps it, plus the outstanding-lease ring of
// docs/leases.md) or a sliding window's slot counters. The simulated store
// applies requests one at a time, in the order they reach it: each is
// atomic, as one UpdateItem or one pipelined memcached batch is.
type item struct {
	cfg *Config

	// Bucket: grid origin, tat (refill tokens used up since base) and the
	// outstanding leases: units taken by live leases, per expiry epoch end.
	started bool
	base    int64
	tat     int64
	ring    []outstanding
	newest  int64 // the newest stamp of an op applied (bucket returns)

	// Window: units per slot.
	slots map[int64]int64
}

// outstanding is one entry of a bucket's ring: the units of the live
// leases that expire at exp (an epoch end), and how many leases.
type outstanding struct {
	exp, units, leases int64
}

// ref names what a return gives back to: the bucket's ring entry (exp) or
// the window slot the lease's units were counted in.
type ref struct {
	exp  int64 // bucket
	slot int64 // window
}

// takeResult is a store's answer to a take.
type takeResult struct {
	got        int64 // units granted, 0..want
	remaining  int64 // capacity left after the take
	holders    int64 // live leases on the item (bucket)
	retryAfter int64 // ns until one unit is there, when got == 0
	ref        ref
	partial    bool // the store had some but fewer than asked: a second write
}

// --- token bucket --------------------------------------------------------

// capOf is MaxAmount minus the units of live leases; lift first applies
// every ring entry that expired at or before stamp t, in expiry order: at
// each, tat is lifted to level(exp) - (max - outstanding before it), so
// the refill that the lowered cap discarded while the lease lived is not
// handed out when the cap rises again.
func (it *item) lift(t int64) {
	c := it.cfg
	slices.SortFunc(it.ring, func(a, b outstanding) int { return cmp64(a.exp, b.exp) })
	for len(it.ring) > 0 && it.ring[0].exp <= t {
		out := it.outstanding()
		lv := floorDiv(it.ring[0].exp-it.base, int64(c.Refill))
		if c.Broken != BucketNoOutstanding {
			it.tat = max(it.tat, lv-(c.Limit-out))
		}
		it.ring = it.ring[1:]
	}
}

func (it *item) outstanding() int64 {
	var o int64
	for _, e := range it.ring {
		o += e.units
	}
	return o
}

func (it *item) holders() int64 {
	var h int64
	for _, e := range it.ring {
		h += e.leases
	}
	return h
}

// bucketTokens is the tokens an op stamped t sees: min(cap, level - tat).
func (it *item) bucketTokens(t int64) (tokens, level int64) {
	c := it.cfg
	if !it.started {
		it.started, it.base, it.tat = true, t, -c.Limit
	}
	it.newest = max(it.newest, t)
	it.lift(t)
	level = floorDiv(t-it.base, int64(c.Refill))
	cp := c.Limit - it.outstanding()
	if c.Broken == BucketNoOutstanding {
		cp = c.Limit
	}
	return min(cp, level-it.tat), level
}

// bucketTake takes up to want tokens at stamp t for a lease expiring at
// exp (exp == 0: a per-request take, spent at once, not outstanding).
func (it *item) bucketTake(t, want, exp int64) takeResult {
	c := it.cfg
	tokens, level := it.bucketTokens(t)
	cp := c.Limit - it.outstanding()
	if c.Broken == BucketNoOutstanding {
		cp = c.Limit
	}
	var r takeResult
	r.got = max(0, min(want, tokens))
	r.partial = r.got > 0 && r.got < want
	if r.got > 0 {
		it.tat = max(it.tat, level-cp) + r.got
		if exp != 0 {
			i := slices.IndexFunc(it.ring, func(e outstanding) bool { return e.exp == exp })
			if i < 0 {
				it.ring = append(it.ring, outstanding{exp: exp})
				i = len(it.ring) - 1
			}
			it.ring[i].units += r.got
			it.ring[i].leases++
			r.ref.exp = exp
		}
	} else {
		// Until one more refill step, or the first ring entry's expiry
		// when the cap is what holds the tokens back (a lower bound).
		ra := (it.tat + 1 - level) * int64(c.Refill)
		r.retryAfter = max(1, it.base+(level+1)*int64(c.Refill)-t, ra)
	}
	tk, _ := it.bucketTokens(t)
	r.remaining = max(0, tk)
	r.holders = it.holders()
	return r
}

// bucketReturn gives back unspent of a lease of got units whose ring entry
// is exp, stamped t (the lease's end): the cap is first lifted at t with
// the lease still outstanding, then tat gives the unspent units back and
// the entry drops the lease. A return whose entry is gone (an op stamped at
// or after its expiry was applied first) is refused: its units stay used
// (counted, never free). It reports whether it was applied.
func (it *item) bucketReturn(t, exp, got, unspent int64) bool {
	c := it.cfg
	i := slices.IndexFunc(it.ring, func(e outstanding) bool { return e.exp == exp })
	if i < 0 || it.newest >= exp {
		return false
	}
	if c.Broken != BucketNoOutstanding {
		lv := floorDiv(min(t, exp)-it.base, int64(c.Refill))
		it.tat = max(it.tat, lv-(c.Limit-it.outstanding()))
	}
	it.tat -= unspent
	it.ring[i].units -= got
	it.ring[i].leases--
	if it.ring[i].leases == 0 {
		it.ring = slices.Delete(it.ring, i, i+1)
	}
	return true
}

// --- sliding window ------------------------------------------------------

// windowTake adds want units to slot at (the counted slot) and reads slots
// from-r .. to+r+J (J: the contract's longest lease span, Config.Span),
// as one step; the units over the limit are given back at once (the
// excess refund: a second write, reported as partial).
func (it *item) windowTake(from, to, at, want int64) takeResult {
	c := it.cfg
	if it.slots == nil {
		it.slots = map[int64]int64{}
	}
	it.slots[at] += want
	r := int64(c.Slots)
	hi := to + r + c.spanSlots() // 0 with leases off: today's Ahead
	var sum int64
	for s := from - r; s <= hi; s++ {
		sum += it.slots[s]
	}
	var res takeResult
	res.got = max(0, min(want, c.Limit-(sum-want)))
	if excess := want - res.got; excess > 0 {
		it.slots[at] -= excess
		sum -= excess
		res.partial = res.got > 0
	}
	res.remaining = max(0, c.Limit-sum)
	res.ref.slot = at
	if res.got == 0 {
		res.retryAfter = 1 // until the next slot at least; the deny cache's lower bound
	}
	return res
}

// windowReturn gives back a lease's units: unspent from the counted slot,
// and, when the lease spanned slots, its spent units moved from the
// counted slot to the slots of their stamps.
func (it *item) windowReturn(at, unspent int64, spent map[int64]int64) {
	it.slots[at] -= unspent
	for s, n := range spent {
		if s != at {
			it.slots[at] -= n
			it.slots[s] += n
		}
	}
}

func cmp64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
