package dynamo

import (
	"context"
	"fmt"
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
//   - h = s + u0 + u1 and c = tat + h, kept by every write.
//
// What is free for a take is min(MaxAmount - h, level - c): each bound is
// one attribute, so a take's condition ("c <= level - n AND h <= max - n")
// is exact whatever other writers did meanwhile, and no write but the
// settlement touches tat. Takes, lease takes and returns are relative
// (ADD) and do not conflict with one another; a slot taken over by a new
// epoch is set on condition that it is as seen (an expired epoch's slot
// no longer changes). Settlement, a write of its own sent without waiting
// when s passes a step (settleAt), moves s into tat: by adding it
// when the bucket is not full at that instant, or, when it is, by setting
// tat to the full bucket's minus s (the refill the bucket could not hold
// is dropped, as every full bucket's is). It reads s in the write itself,
// so settlements never conflict with one another either. Counting s as
// spent at the settlement rather than when it was spent is stricter: the
// bucket holds up to s fewer tokens until then.
const (
	attrEpoch0, attrUnits0 = "e0", "u0"
	attrEpoch1, attrUnits1 = "e1", "u1"
	attrUnsettled          = "s"
	attrHeld               = "h"
	attrCommitted          = "c"
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
		// A refund: from what is unsettled, the rest dropped (stricter).
		w.consumed = -min(-w.consumed, cur.unsettled)
	}
	if op.Take() && d.Allowed {
		w.need = max(d.Granted, op.N)
	}
	return bucketPlan{kind: writeRing, base: cur.base, level: v.level, ring: w}, bucketItem{}, d, nil
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
		u.set = append(u.set, name(attrUnsettled)+" = "+u.num(w.consumed), hn+" = "+u.num(held), name(attrCommitted)+" = "+t+" + "+u.num(held))
		setSlots()
		if w.need > 0 {
			u.cond = append(u.cond, t+" <= "+u.num(plan.level-w.need))
		}
		return
	}
	u.cond = append(u.cond, name(attrBase)+" = "+u.num(plan.base))
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
		if consumed < 0 {
			u.cond = append(u.cond, sn+" >= "+u.num(-consumed))
		}
	}
	if held != 0 || w.need > 0 {
		hn, cn := name(attrHeld), name(attrCommitted)
		if held != 0 {
			u.add = append(u.add, hn+" "+u.num(held), cn+" "+u.num(held))
		}
		if w.need > 0 {
			u.cond = append(u.cond, cn+" <= "+u.num(plan.level-w.need), hn+" <= "+u.num(op.MaxAmount-w.need))
		}
	}
}

// settleSkew is how far past a write's stamp its settlement counts s as
// spent.
const settleSkew = 50 * time.Millisecond

// settleAt is the step of unsettled consumption at which a write's
// answer sends a settlement: a quarter of the bucket (at least 4
// tokens), or a thirty-second when the bucket is full and the write is a
// lease's. Only a full bucket shows fewer tokens than it holds while s
// is unsettled (its refill since the spending is credited at the
// settlement), by up to the step: a hot key's step is small, a cold
// key's (which leased once) costs a settlement per quarter of its bucket.
func settleAt(op storage.BucketOp, full bool) int64 {
	if full && op.Leases() {
		return max(op.MaxAmount/32, 4)
	}
	return max(op.MaxAmount/4, 4)
}

// maybeSettle sends, without waiting, the settlement of stored (the item
// a write of op just returned, which added added to s) when that write
// took s past a multiple of settleAt (one write does, not every write
// that sees s large): s moves into tat as if spent at op.Now plus
// settleSkew, by an addition when the bucket is not full then, else by
// setting tat to the full bucket's less s. Each reads s in
// the write: a settlement whose regime changed before it landed fails
// and is dropped (the next write's answer sends another).
func (s *Store) maybeSettle(a attrs, op storage.BucketOp, stored bucketItem, added int64) {
	if !stored.ring || added <= 0 {
		return
	}
	// As if spent settleSkew after the stamp of the write that crossed
	// the step: every unit in s was spent by then, if the stamps of
	// writes that reach the item at once are within settleSkew of one
	// another (what spent later and is settled with them, a late clock's,
	// is settled early by the difference: the bucket holds that many
	// more tokens until its next settlement).
	now := op.Now + int64(settleSkew)
	rt := int64(op.RefillTime)
	if now < stored.base {
		return
	}
	floor := op.RefillAmount*((now-stored.base)/rt) - op.MaxAmount
	step := settleAt(op, stored.tat < floor)
	if stored.unsettled < step || (stored.unsettled-added)/step == stored.unsettled/step {
		return
	}
	u := newUpdate()
	name := func(attr string) string { return u.name(a.pre + attr) }
	t, sn, hn := name(attrTat), name(attrUnsettled), name(attrHeld)
	u.cond = append(u.cond, name(attrBase)+" = "+u.num(stored.base), sn+" > "+u.num(0))
	if stored.tat >= floor {
		u.set = append(u.set, t+" = "+t+" + "+sn)
		u.cond = append(u.cond, t+" >= "+u.num(floor))
	} else {
		f := u.num(floor)
		u.set = append(u.set, t+" = "+f+" + "+sn, name(attrCommitted)+" = "+f+" + "+hn)
		u.cond = append(u.cond, t+" < "+f)
	}
	u.set = append(u.set, hn+" = "+hn+" - "+sn, sn+" = "+u.num(0))
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
