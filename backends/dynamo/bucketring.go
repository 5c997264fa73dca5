package dynamo

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter/storage"
)

// A token bucket with capacity leases (storage.BucketState.Leased) keeps,
// besides base and tat:
//
//   - e0, u0, e1, u1: the lease ring, the units granted to leases of lease
//     epoch e_j and not yet given back;
//   - s: consumption not yet settled into tat (spent units of returned
//     leases, plain takes, an expired epoch's units);
//   - h = s + u0 + u1 and c = tat + h, kept by every write;
//   - g and n: bounds of the stamps in s, and the settlements so far
//     (below).
//
// What is free for a take is min(MaxAmount - h, level - c): each bound is
// one attribute, so a take's condition ("c <= level - n AND h <= max - n")
// is exact whatever other writers did meanwhile, and no write but a
// settlement or a refund touches tat. A refund lowers tat and c together
// (ADD, relative), on condition that tat keeps it within the full bucket
// at its step, and gives back from s what tat has no room for (see
// docs/leases.md). Takes, lease takes and returns are relative (ADD) and
// do not conflict with one another (a refund's condition meets only
// other refunds and settlements, through tat); a slot taken over by a new
// epoch is set on condition that it is as seen (an expired epoch's slot
// no longer changes). Settlement, a write of its own sent without waiting
// when s passes a step (settleSteps), moves s into tat as if spent at one
// instant at or after every unit's stamp: by adding it when the bucket is
// not full at that instant, or, when it is, by setting tat to the full
// bucket's minus s (the refill the bucket could not hold is dropped, as
// every full bucket's is).
// A settlement moves what s held in the item its trigger (the write whose
// answer sends it) read, as if spent at one instant no earlier than any
// of their stamps, on condition that no other settlement landed since (n
// counts them); units that arrived since stay in s for the next. The
// instant comes from g, a number set to which every write adding to s
// adds its stamp rounded up to settleSkew (sets merge: the adds never
// conflict): the largest element the trigger read bounds every unit it
// read in s, however late or reordered their writes were. A settlement
// deletes the elements below that one and keeps it (it still bounds the
// units of a write that added the same element after the read). Counting
// s as spent then rather than when it was spent is stricter: the bucket
// holds up to s fewer tokens until then.
const (
	attrEpoch0, attrUnits0 = "e0", "u0"
	attrEpoch1, attrUnits1 = "e1", "u1"
	attrUnsettled          = "s"
	attrHeld               = "h"
	attrCommitted          = "c"
	attrSettled            = "n"
	attrGrid               = "g"
)

// ringAttrs are the attributes of ring slot j.
var ringAttrs = [2][2]string{{attrEpoch0, attrUnits0}, {attrEpoch1, attrUnits1}}

// decodeRing reads the lease ring of item into it, if it has one.
func decodeRing(a attrs, item map[string]types.AttributeValue, it *bucketItem) error {
	if _, ok := item[a.pre+attrHeld]; !ok {
		return nil
	}
	it.ring = true
	var err error
	if av, ok := item[a.pre+attrGrid]; ok {
		ns, isNS := av.(*types.AttributeValueMemberNS)
		if !isNS {
			return corrupt(bucketKind, a.pk, a.pre+attrGrid, "not a number set")
		}
		it.grid = it.grid[:0]
		for _, v := range ns.Value {
			g, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return corrupt(bucketKind, a.pk, a.pre+attrGrid, "%q: %v", v, err)
			}
			it.grid = append(it.grid, g)
		}
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{attrSettled, &it.settled}} {
		if _, ok := item[a.pre+f.name]; ok {
			if *f.v, err = getInt(bucketKind, a.pk, item, a.pre+f.name); err != nil {
				return err
			}
		}
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{
		{attrUnsettled, &it.unsettled}, {attrHeld, &it.held}, {attrCommitted, &it.committed},
		{attrEpoch0, &it.leased[0].Epoch}, {attrUnits0, &it.leased[0].Units},
		{attrEpoch1, &it.leased[1].Epoch}, {attrUnits1, &it.leased[1].Units},
	} {
		if *f.v, err = getInt(bucketKind, a.pk, item, a.pre+f.name); err != nil {
			return err
		}
	}
	return nil
}

// ringMode is the form of a writeRing.
type ringMode uint8

const (
	ringOps  ringMode = iota // relative, on an item with a ring
	ringInit                 // an item without a ring gets one
	ringNew                  // no item yet
)

// ringWrite is what a writeRing changes.
type ringWrite struct {
	mode ringMode
	// consumed is added to s (negative: a refund); slot j's units change
	// by du[j] on condition that its epoch is cond[j] (0: no change), and
	// by at least -du[j] units when du[j] < 0; a slot in reset[j] is set
	// to to[j] on condition that it is exactly from[j] (its old units
	// become consumption).
	consumed int64
	du       [2]int64
	cond     [2]int64
	reset    [2]bool
	from, to [2]storage.LeaseSlot
	// refund is what a refund gives back through tat (tat and c lower by
	// it, on condition that tat keeps room for it); consumed < 0 gives
	// back the rest from s.
	refund int64
	// need is what the op takes: free must hold it (0: no condition).
	need  int64
	level int64 // RefillAmount*k at the op's step
	// The new item (ringNew): tat and s.
	tat int64
}

// planRing plans an op on a bucket with capacity leases, or one that
// takes or ends a lease: op.Apply decides on the item's view (tokens
// less s, the ring), and the write carries the op's effect relative to
// the stored item.
func planRing(op storage.BucketOp, cur bucketItem, found, fromServer bool) (bucketPlan, bucketItem, storage.Decision, error) {
	if !found {
		st, d, write := op.Apply(storage.BucketState{}, false)
		if !write {
			return bucketPlan{read: !fromServer}, bucketItem{}, d, nil
		}
		// A full bucket at base (tat = -MaxAmount), less what the op
		// consumed, unsettled.
		w := ringWrite{mode: ringNew, tat: -op.MaxAmount, consumed: op.MaxAmount - st.Tokens}
		for j := range 2 {
			w.reset[j], w.to[j] = st.Leased[j] != (storage.LeaseSlot{}), st.Leased[j]
		}
		return bucketPlan{kind: writeRing, base: st.Updated, ring: w}, bucketItem{}, d, nil
	}
	v, ok := cur.view(op)
	if !ok {
		// Decades from the grid's origin: not served with leases.
		return bucketPlan{}, bucketItem{}, storage.Decision{}, fmt.Errorf("stamp %d out of range of the bucket's refill grid (base %d)", op.Now, cur.base)
	}
	st, d, write := op.Apply(v.state, true)
	if !write {
		// A denial or a read on a remembered state: confirm it.
		return bucketPlan{read: !fromServer}, bucketItem{}, d, nil
	}
	if st.Updated != v.state.Updated {
		return bucketPlan{}, bucketItem{}, storage.Decision{}, fmt.Errorf("a strict bucket does not lease")
	}
	w := ringWrite{mode: ringOps, level: v.level}
	if !cur.ring {
		w.mode = ringInit
	}
	// The op's consumption: what the tokens lost, less the units of the
	// epochs Apply let expire (they stay in their slots until a new epoch
	// takes the slot over: the same free either way).
	expired := int64(0)
	for j := range 2 {
		c, n := cur.leased[j], st.Leased[j]
		switch {
		case c == n:
		case n == (storage.LeaseSlot{}): // expired, left as stored
			expired += c.Units
		case c.Epoch == n.Epoch:
			w.du[j], w.cond[j] = n.Units-c.Units, c.Epoch
		case c != (storage.LeaseSlot{}) && !fromServer:
			// A new epoch takes over a slot that expired in a state
			// remembered from before: another process has most likely
			// taken it over since. Add to it as the new epoch's; if no
			// one has, the condition fails and the slot is taken over on
			// the state DynamoDB returns.
			w.du[j], w.cond[j] = n.Units, n.Epoch
			expired += c.Units
		default: // a new epoch takes the slot over (the old one expired)
			w.reset[j], w.from[j], w.to[j] = true, c, n
			expired += c.Units
		}
	}
	w.consumed = v.state.Tokens - st.Tokens - expired
	if w.consumed < 0 {
		room := max(cur.tat-(v.level-op.MaxAmount), 0)
		n := -w.consumed
		w.refund, w.consumed = splitRefund(n, room, cur.unsettled)
		if capped := op.Refund() && v.state.Tokens-expired+op.N > op.MaxAmount; (capped || w.refund-w.consumed < n) && !fromServer {
			// Capped on a remembered item: confirm the room with a
			// read (others' takes since made more; had they made less,
			// the write's conditions would fail and return the item).
			return bucketPlan{read: true}, bucketItem{}, d, nil
		}
		if w.refund == 0 && w.consumed == 0 && w.du == [2]int64{} && w.reset == [2]bool{} && w.mode == ringOps {
			return bucketPlan{}, bucketItem{}, d, nil // nothing fits
		}
	}
	if op.Take() && d.Allowed {
		w.need = max(d.Granted, op.N)
	}
	return bucketPlan{kind: writeRing, base: cur.base, level: v.level, ring: w}, bucketItem{}, d, nil
}

// splitRefund splits a refund of n tokens into what tat gives back (up to
// room, what tat lacks of the full bucket at the op's step) and what s
// does (up to unsettled); what neither holds is dropped. It returns the
// part through tat and the change of s (not positive).
func splitRefund(n, room, unsettled int64) (viaTat, consumed int64) {
	viaTat = min(n, room)
	return viaTat, -min(n-viaTat, unsettled)
}

// added is what the write adds to s.
func (w *ringWrite) added() int64 {
	n := w.consumed
	for j := range 2 {
		if w.reset[j] {
			n += w.from[j].Units
		}
	}
	return n
}

// ringClauses adds plan's writeRing to u.
func (s *Store) ringClauses(u *update, a attrs, op storage.BucketOp, plan bucketPlan) {
	w := &plan.ring
	name := func(attr string) string { return u.name(a.pre + attr) }
	// held is the change of h (and of c): the consumption and the leased
	// units; an old epoch's units move from its slot to s (no change).
	held := w.consumed
	for j := range 2 {
		held += w.du[j]
		if w.reset[j] {
			held += w.to[j].Units
		}
	}
	u.allNew = true
	setSlots := func() {
		for j := range 2 {
			u.set = append(u.set, name(ringAttrs[j][0])+" = "+u.num(w.to[j].Epoch), name(ringAttrs[j][1])+" = "+u.num(w.to[j].Units))
		}
	}
	if w.added() > 0 || w.mode != ringOps {
		gn, gv := name(attrGrid), u.numSet(gridOf(op.Now))
		if w.mode == ringOps {
			u.add = append(u.add, gn+" "+gv)
		} else {
			u.set = append(u.set, gn+" = "+gv)
		}
	}
	switch w.mode {
	case ringNew:
		b, t := name(attrBase), name(attrTat)
		u.set = append(u.set, b+" = "+u.num(plan.base), t+" = "+u.num(w.tat), name(attrUnsettled)+" = "+u.num(w.consumed),
			name(attrHeld)+" = "+u.num(held), name(attrCommitted)+" = "+u.num(w.tat+held))
		setSlots()
		u.cond = append(u.cond, "attribute_not_exists("+t+") AND attribute_not_exists("+b+")")
		return
	case ringInit:
		// The ring's first write: h and c from what tat holds now.
		t, hn := name(attrTat), name(attrHeld)
		u.cond = append(u.cond, name(attrBase)+" = "+u.num(plan.base), "attribute_not_exists("+hn+")")
		u.set = append(u.set, name(attrUnsettled)+" = "+u.num(max(w.consumed, 0)), hn+" = "+u.num(held), name(attrCommitted)+" = "+t+" + "+u.num(held-w.refund))
		s.refundClauses(u, a, op, plan)
		setSlots()
		if w.need > 0 {
			u.cond = append(u.cond, t+" <= "+u.num(plan.level-w.need))
		}
		return
	}
	s.ringOpsClauses(u, a, op, plan, held)
}

// ringOpsClauses adds plan's writeRing on an item with a ring to u: held
// is the change of h.
func (s *Store) ringOpsClauses(u *update, a attrs, op storage.BucketOp, plan bucketPlan, held int64) {
	w := &plan.ring
	name := func(attr string) string { return u.name(a.pre + attr) }
	u.cond = append(u.cond, name(attrBase)+" = "+u.num(plan.base))
	s.refundClauses(u, a, op, plan)
	consumed := w.consumed
	for j := range 2 {
		switch {
		case w.reset[j]:
			en, un := name(ringAttrs[j][0]), name(ringAttrs[j][1])
			consumed += w.from[j].Units // the old epoch's units, now consumed
			u.set = append(u.set, en+" = "+u.num(w.to[j].Epoch), un+" = "+u.num(w.to[j].Units))
			u.cond = append(u.cond, en+" = "+u.num(w.from[j].Epoch)+" AND "+un+" = "+u.num(w.from[j].Units))
		case w.cond[j] != 0:
			en, un := name(ringAttrs[j][0]), name(ringAttrs[j][1])
			u.add = append(u.add, un+" "+u.num(w.du[j]))
			u.cond = append(u.cond, en+" = "+u.num(w.cond[j]))
			if w.du[j] < 0 {
				u.cond = append(u.cond, un+" >= "+u.num(-w.du[j]))
			}
		}
	}
	if consumed != 0 {
		sn := name(attrUnsettled)
		u.add = append(u.add, sn+" "+u.num(consumed))
		if consumed < 0 && !s.brokenRefundRoom {
			u.cond = append(u.cond, sn+" >= "+u.num(-consumed))
		}
	}
	// c changes with h and with tat (a refund's part through tat).
	dc := held - w.refund
	if s.brokenRefundC {
		dc = held
	}
	if held != 0 {
		u.add = append(u.add, name(attrHeld)+" "+u.num(held))
	}
	if dc != 0 {
		u.add = append(u.add, name(attrCommitted)+" "+u.num(dc))
	}
	if w.need > 0 {
		u.cond = append(u.cond, name(attrCommitted)+" <= "+u.num(plan.level-w.need), name(attrHeld)+" <= "+u.num(op.MaxAmount-w.need))
	}
}

// refundClauses adds the part of plan's refund that tat gives back: tat
// lowers by it (c too, in the caller), on condition that tat keeps it
// within the full bucket at the op's step (tat - refund >= level - max).
// That one comparison is exact: with it, what the refill holds after,
// level - tat, is at most MaxAmount, and what is free for a take,
// min(MaxAmount - h, level - c), grows by the refund exactly.
func (s *Store) refundClauses(u *update, a attrs, op storage.BucketOp, plan bucketPlan) {
	w := &plan.ring
	if w.refund <= 0 {
		return
	}
	t := u.name(a.pre + attrTat)
	u.set = append(u.set, t+" = "+t+" - "+u.num(w.refund))
	if !s.brokenRefundRoom {
		u.cond = append(u.cond, t+" >= "+u.num(plan.level-op.MaxAmount+w.refund))
	}
}

// gridOf is stamp rounded up to settleSkew, in settleSkews.
func gridOf(stamp int64) int64 {
	k := int64(settleSkew)
	g := stamp / k
	if stamp%k > 0 {
		g++
	}
	return g
}

// settleSkew is g's step: a settlement counts what it moves as spent up
// to that long after the latest of their stamps (stricter the longer);
// shorter adds more elements to g.
const settleSkew = 50 * time.Millisecond

// maxGrid is the size of g from which a settlement is sent at the fine
// step whatever else holds, so that a bucket that leased once and went
// cold keeps a small item (g grows by at most one element per write, and
// the fine step is a few writes).
const maxGrid = 8

// settleSteps are the steps of unsettled consumption at which a write's
// answer sends a settlement: coarse, a quarter of the bucket, always;
// fine, a thirty-second, when the bucket is full and the write is a
// lease's, or when g has maxGrid elements (each at least 4 tokens). Only
// a full bucket shows fewer tokens than it holds while s is unsettled
// (its refill since the spending is credited at the settlement), by up
// to the step: a hot key's step is small, a cold key's (which leased
// once) costs a settlement per quarter of its bucket.
func settleSteps(op storage.BucketOp) (fine, coarse int64) {
	return max(op.MaxAmount/32, 4), max(op.MaxAmount/4, 4)
}

// maybeSettle sends, without waiting, the settlement of stored (the item
// a write of op just returned, which added added to s) when that write
// took s past a multiple of a step (settleSteps): what s held moves into
// tat as if spent at g's largest element, by an addition when the bucket
// is not full then, else by setting tat to the full bucket's less it. A
// settlement that another beat, or whose regime changed before it
// landed, fails and is dropped (a later write's answer sends another).
//
// Every trigger is a crossing of s, which the item's writes ADD to one
// after another, so exactly one write sends each settlement however many
// processes write the key. (A trigger read from a process's own view,
// such as "this write added a new element to g", fires in every process
// whose cached item lacks the element: on a hot key that was a storm of
// settlements conflicting on n, which the partition cap then throttled.)
func (s *Store) maybeSettle(a attrs, op storage.BucketOp, stored bucketItem, added int64) {
	if !stored.ring || added <= 0 || len(stored.grid) == 0 {
		return
	}
	// What stored holds in s, as if spent at its largest g: no unit of it
	// is stamped later.
	top := slices.Max(stored.grid)
	now := top * int64(settleSkew)
	rt := int64(op.RefillTime)
	if now < stored.base {
		return
	}
	floor := op.RefillAmount*((now-stored.base)/rt) - op.MaxAmount
	crossed := func(step int64) bool {
		return stored.unsettled >= step && (stored.unsettled-added)/step != stored.unsettled/step
	}
	fine, coarse := settleSteps(op)
	full := stored.tat < floor
	if !crossed(coarse) && !(crossed(fine) && (full && op.Leases() || len(stored.grid) >= maxGrid)) {
		return
	}
	u := newUpdate()
	name := func(attr string) string { return u.name(a.pre + attr) }
	t, sn, hn, nn := name(attrTat), name(attrUnsettled), name(attrHeld), name(attrSettled)
	amount := u.num(stored.unsettled)
	u.cond = append(u.cond, name(attrBase)+" = "+u.num(stored.base), sn+" >= "+amount)
	if stored.settled == 0 {
		u.cond = append(u.cond, "attribute_not_exists("+nn+")")
	} else {
		u.cond = append(u.cond, nn+" = "+u.num(stored.settled))
	}
	if stored.tat >= floor {
		u.set = append(u.set, t+" = "+t+" + "+amount)
		u.cond = append(u.cond, t+" >= "+u.num(floor))
	} else {
		f := u.num(floor)
		u.set = append(u.set, t+" = "+f+" + "+amount, name(attrCommitted)+" = "+f+" + "+hn)
		u.cond = append(u.cond, t+" < "+f)
	}
	u.set = append(u.set, hn+" = "+hn+" - "+amount, sn+" = "+sn+" - "+amount, nn+" = "+u.num(stored.settled+1))
	if below := slices.DeleteFunc(slices.Clone(stored.grid), func(g int64) bool { return g == top }); len(below) > 0 {
		u.del = append(u.del, name(attrGrid)+" "+u.numSet(below...))
	}
	timeout := s.cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	// Keyed apart from the item's refunds: the key's next decision does
	// not wait for it (a settlement only makes the bucket less strict).
	s.refunds.Go(a.pk+"\x00settle", timeout, func(ctx context.Context) error {
		s.counter.settlements.Add(1)
		if _, err := s.client.UpdateItem(context.WithValue(ctx, detachedRefund{}, true), s.input(a.pk, u), s.optFns...); err != nil {
			s.counter.settlesLost.Add(1)
		}
		return nil
	}, nil)
}
