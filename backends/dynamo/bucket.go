package dynamo

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter/storage"
)

const bucketKind = "token bucket"

// Attributes of a bucket item (see the package documentation).
const (
	attrBase = "b" // Unix ns: the origin of the refill grid
	attrTat  = "t" // tokens: the refills since base that the takes so far use up
)

// bucketItem is a bucket as stored: a refill grid (base, base+RefillTime,
// ...) and tat, the number of refill tokens counted from base that the
// takes so far have used up (GCRA's theoretical arrival time, counted in
// tokens on the grid). An op stamped now, in grid step
// k = floor((now-base)/RefillTime), sees min(MaxAmount, RefillAmount*k - tat)
// tokens: a take of n adds n to tat, a refund subtracts it, and a bucket
// that is full at k (tat < RefillAmount*k - MaxAmount) is first brought to
// RefillAmount*k - MaxAmount (the cap). The refills of step k are in the
// formula, not in the item: no write has to move anything when a refill is
// due, so concurrent takes never conflict over the refill time.
type bucketItem struct {
	base, tat int64
	// The lease ring (bucketring.go), when ring: the leased units per
	// epoch, the consumption not yet settled into tat (unsettled), and the
	// sums kept for the conditions (committed = tat + held, held =
	// unsettled + the leased units).
	ring                       bool
	leased                     [2]storage.LeaseSlot
	unsettled, committed, held int64
	// settled counts the settlements; grid bounds the stamps in
	// unsettled (bucketring.go).
	settled int64
	grid    []int64
	// fence is the limit's fence (fence.go) in the item it was decoded
	// from: a fenced take decided on the server's state knows it.
	fence int64
}

// bucketView is an op's view of a bucketItem: its step on the grid and the
// bucket there, as the storage.BucketState that op.Apply decides on.
type bucketView struct {
	step  int64 // k, the op's grid step (negative: stamped before base)
	level int64 // RefillAmount*k
	state storage.BucketState
	full  bool // tat is below the cap at k: the bucket holds MaxAmount
}

// maxLevel bounds RefillAmount*k and tat, so that every sum the protocol
// writes (level - MaxAmount, tat + n, ...) stays within int64.
const maxLevel = 1 << 61

// view is the bucket it holds as op (stamped op.Now) sees it, or ok=false
// when op.Now is so far from base that the level would leave maxLevel
// (a caller stamp centuries away, or a tiny RefillTime with a large
// RefillAmount on a key never idle for decades).
func (it bucketItem) view(op storage.BucketOp) (v bucketView, ok bool) {
	rt := int64(op.RefillTime)
	d := op.Now - it.base
	if (d < 0) != (op.Now < it.base) { // the difference overflowed
		return v, false
	}
	k := d / rt
	if d%rt != 0 && d < 0 {
		k--
	}
	if k > maxLevel/op.RefillAmount || k < -maxLevel/op.RefillAmount || it.tat > maxLevel || it.tat < -maxLevel {
		return v, false
	}
	v.step, v.level = k, op.RefillAmount*k
	tokens := v.level - it.tat
	if tokens > op.MaxAmount {
		tokens, v.full = op.MaxAmount, true
	}
	v.state = storage.BucketState{Tokens: tokens - it.unsettled, Updated: it.base + k*rt, Leased: it.leased}
	return v, true
}

// KeepsLeased implements [storage.LeaseKeeper]: a bucket item keeps its
// capacity lease ring (bucketring.go) once a lease is taken.
func (s *Store) KeepsLeased() bool { return true }

// UpdateBucket implements [storage.BucketStore] with conditional writes and
// no read in the common case: one UpdateItem per decision whatever the
// refill rate; see the package documentation.
func (s *Store) UpdateBucket(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration) (storage.Decision, error) {
	return s.updateBucket(ctx, k, op, ttl, 0)
}

// UpdateBucketFenced implements [storage.BucketFencer]: UpdateBucket
// whose write, when op takes, also has the condition that the limit's
// fence attribute is absent or at most fence (docs/fence.md). A failed
// condition whose item shows a fence above it is answered ErrFenced,
// never retried.
func (s *Store) UpdateBucketFenced(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration, fence int64) (storage.Decision, error) {
	return s.updateBucket(ctx, k, op, ttl, fence)
}

// updateBucket is UpdateBucket, a take fenced when fence > 0.
func (s *Store) updateBucket(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration, fence int64) (storage.Decision, error) {
	if err := validBucket(op); err != nil {
		return storage.Decision{}, err
	}
	a, err := s.attrsOf(k)
	if err != nil {
		return storage.Decision{}, err
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	if err := s.waitRefunds(ctx, a.pk); err != nil {
		return storage.Decision{}, err
	}
	p := s.newBucketPart(a, op, ttl)
	p.fenceAt(fence)
	if err := s.writeOne(ctx, a.pk, p); err != nil {
		return storage.Decision{}, err
	}
	return p.d, nil
}

func validBucket(op storage.BucketOp) error {
	if op.MaxAmount <= 0 || op.MaxAmount > maxLevel || op.RefillTime <= 0 || op.RefillAmount <= 0 || op.N < 0 || op.N > op.MaxAmount {
		return fmt.Errorf("dynamo: bad bucket op (max %d, refill %v by %d, n %d)", op.MaxAmount, op.RefillTime, op.RefillAmount, op.N)
	}
	return nil
}

// bucketPart is a bucket's op as a part of a write (UpdateBucket).
type bucketPart struct {
	s          *Store
	a          attrs
	op         storage.BucketOp
	ttl        time.Duration
	shadow     bool       // a Shadow step: its denial does not deny the batch
	cur        bucketItem // the state last seen
	found      bool       // cur is a stored bucket (else: assume none is stored)
	fromServer bool       // cur came from DynamoDB during this call
	next_      bucketItem // the item after the write
	d          storage.Decision
	plan       bucketPlan
	merged     bool // sent with other parts (Store.brokenMerged)
	notApplied bool
	fence      int64 // Step.Fence of a take: 0 for none
}

// fenceAt fences the part at f when its op takes (a lease take, with a
// return it carries, included); refunds, returns and reads never are.
func (p *bucketPart) fenceAt(f int64) {
	if p.op.Take() {
		p.fence = f
	}
}

// fenced is the error of a take fenced below the item's fence f.
func (p *bucketPart) fenced(f int64) error {
	return fmt.Errorf("dynamo: %s %s: take fenced at %d, item's fence %d: %w", bucketKind, p.a.pk, p.fence, f, storage.ErrFenced)
}

func (s *Store) newBucketPart(a attrs, op storage.BucketOp, ttl time.Duration) *bucketPart {
	p := &bucketPart{s: s, a: a, op: op, ttl: ttl}
	if v, ok := s.cache.get(a.cacheKey()); ok {
		p.cur, p.found = v.(bucketItem), true
	}
	return p
}

func (p *bucketPart) next(ctx context.Context, u *update) (bool, error) {
	s, pk, op := p.s, p.a.pk, p.op
	var err error
	p.plan, p.next_, p.d, err = s.planBucket(op, p.cur, p.found, p.fromServer)
	if err != nil {
		return false, fmt.Errorf("dynamo: %s %s: %w", bucketKind, pk, err)
	}
	if p.plan.read {
		// A Get is only as good as the state it was computed on:
		// confirm a remembered state with a read.
		st, ok, err := s.readBucket(ctx, p.a)
		if err != nil {
			return false, err
		}
		p.cur, p.found, p.fromServer = st, ok, true
		if p.plan, p.next_, p.d, err = s.planBucket(op, p.cur, p.found, p.fromServer); err != nil {
			return false, fmt.Errorf("dynamo: %s %s: %w", bucketKind, pk, err)
		}
	}
	if p.plan.kind == writeNone {
		if p.fence > 0 && p.fromServer && p.cur.fence > p.fence && !s.brokenFence {
			return false, p.fenced(p.cur.fence) // a denial on a state the take may not use
		}
		return false, nil
	}
	s.bucketClauses(u, p.a, op, p.cur, p.plan, p.next_, p.ttl, p.merged && s.brokenMerged)
	if p.fence > 0 && !s.brokenFence {
		f := u.name(p.a.pre + attrFence)
		u.cond = append(u.cond, "(attribute_not_exists("+f+") OR "+f+" <= "+u.num(p.fence)+")")
	}
	return true, nil
}

// denied reports a take denied on the server's state that denies the
// batch.
func (p *bucketPart) denied() bool {
	return p.plan.kind == writeNone && p.op.Take() && !p.d.Allowed && !p.shadow
}

func (p *bucketPart) written(_ context.Context, item map[string]types.AttributeValue) error {
	s, a, op := p.s, p.a, p.op
	if p.plan.kind == writeRing {
		// The decision holds by the write's conditions; remember what
		// was stored.
		if stored, found, err := decodeBucket(a, item); err == nil && found {
			s.cache.put(a.cacheKey(), stored)
			s.maybeSettle(a, op, stored, p.plan.ring.added())
		} else {
			s.cache.remove(a.cacheKey())
		}
		return nil
	}
	if !p.plan.relative() {
		s.cache.put(a.cacheKey(), p.next_)
		return nil
	}
	stored, found, err := decodeBucket(a, item)
	if err == nil && !found {
		err = corrupt(bucketKind, a.pk, a.pre+attrTat, "missing after a write")
	}
	if err != nil {
		s.cache.remove(a.cacheKey())
		return err
	}
	// The decision of the op on the state it was applied to.
	before := stored
	switch p.plan.kind {
	case writeTake:
		before.tat -= op.N
	case writeRefund:
		before.tat += op.N
	case writeStrict:
		before.base, before.tat = p.plan.base, stored.tat+p.plan.level
	}
	v, ok := before.view(op)
	if !ok {
		s.cache.remove(a.cacheKey())
		return corrupt(bucketKind, a.pk, a.pre+attrTat, "out of range after a write: %d", stored.tat)
	}
	_, p.d, _ = op.Apply(v.state, true)
	s.cache.put(a.cacheKey(), stored)
	return nil
}

func (p *bucketPart) lost(old map[string]types.AttributeValue) (bool, error) {
	// The item DynamoDB returned is the state that beat us (or the one
	// our guess missed): apply the op to it, without a read.
	var err error
	p.cur, p.found, err = p.s.bucketFromItem(p.a, old)
	p.fromServer = true
	if p.fence > 0 && err == nil && !p.s.brokenFence {
		// A fence above ours failed the condition, or would on a retry
		// (a fence never goes down): refused, not a lost race.
		f, ferr := fenceOf(p.a, old)
		if ferr != nil || f > p.fence {
			return false, cmp.Or(ferr, p.fenced(f))
		}
	}
	return err == nil, err
}

func (p *bucketPart) result() storage.StepResult {
	if p.notApplied {
		return storage.StepResult{NotApplied: true}
	}
	return storage.StepResult{Decision: p.d}
}

// skip marks a take not applied (another part denied the batch).
func (p *bucketPart) skip() bool {
	if !p.op.Take() || p.shadow {
		return false
	}
	p.notApplied = true
	return true
}

// writeKind is the form of a bucket write.
type writeKind uint8

const (
	writeNone   writeKind = iota // nothing to write: the decision is final
	writeTake                    // tat += n, on condition tat in [level-max, level-n]
	writeFull                    // tat = level-max+n, on condition tat < level-max
	writeRefund                  // tat -= n, on condition tat >= level-max+n
	writeCap                     // tat = level-max, on condition tat < level-max+n
	writeStrict                  // base = now, tat -= level, on condition tat > level-n
	writeCreate                  // a new item, on condition it does not exist
	writeExact                   // base and tat, on condition on the exact old item
	writeRing                    // a bucket with capacity leases (bucketring.go)
)

// bucketPlan is the write an op makes on the state last seen: its form and
// the numbers of its condition. Every form but writeExact and writeCreate
// is conditioned on base and on a range of tat over which op.Apply makes
// the same change, so a stale tat does not fail it.
type bucketPlan struct {
	kind  writeKind
	read  bool  // confirm with a read first (a Get on a remembered state)
	base  int64 // the grid the condition is on
	level int64 // RefillAmount*k on that grid
	// ring is a writeRing's write.
	ring ringWrite
}

// relative reports whether the write changes tat relative to the stored
// value, so that the decision is recomputed from the returned item.
func (p bucketPlan) relative() bool {
	return p.kind == writeTake || p.kind == writeRefund || p.kind == writeStrict
}

// planBucket applies op to cur (found: cur is stored; fromServer: it came
// from DynamoDB during this call) and picks the write: it returns the plan,
// the item after the write and the decision.
func (s *Store) planBucket(op storage.BucketOp, cur bucketItem, found, fromServer bool) (bucketPlan, bucketItem, storage.Decision, error) {
	if cur.ring || op.Leases() {
		return planRing(op, cur, found, fromServer)
	}
	if !found {
		st, d, write := op.Apply(storage.BucketState{}, false)
		if !write {
			if !fromServer { // a Get of a bucket this process never saw
				return bucketPlan{read: true}, bucketItem{}, d, nil
			}
			return bucketPlan{}, bucketItem{}, d, nil
		}
		return bucketPlan{kind: writeCreate}, bucketItem{base: st.Updated, tat: -st.Tokens}, d, nil
	}
	v, ok := cur.view(op)
	if !ok {
		if op.Now < cur.base {
			return bucketPlan{}, bucketItem{}, storage.Decision{}, fmt.Errorf("stamp %d too far behind the bucket's refill grid (base %d)", op.Now, cur.base)
		}
		// Move the grid forward (same phase) to where the numbers are
		// small again, with an exact write.
		moved, err := rebase(op, cur)
		if err != nil {
			return bucketPlan{}, bucketItem{}, storage.Decision{}, err
		}
		if v, ok = moved.view(op); !ok {
			return bucketPlan{}, bucketItem{}, storage.Decision{}, fmt.Errorf("stamp %d out of range of the bucket's refill grid", op.Now)
		}
		st, d, _ := op.Apply(v.state, true)
		return bucketPlan{kind: writeExact}, fromState(op, moved, v, st), d, nil
	}
	st, d, write := op.Apply(v.state, true)
	next := fromState(op, cur, v, st)
	plan := bucketPlan{base: cur.base, level: v.level}
	if !write {
		switch {
		case !op.Take():
			// A Get: final if the state came from the server.
			plan.read = !fromServer
			return plan, next, d, nil
		case fromServer:
			// A denial on the server's state.
			return plan, next, d, nil
		}
		// A denial on a remembered state: try the take anyway. If it
		// fails, the item returned with the failed condition decides.
		plan.kind = writeTake
		return plan, next, d, nil
	}
	switch {
	case s.exactOnly:
		plan.kind = writeExact
	case st.Updated != v.state.Updated:
		plan.kind = writeStrict
	case !op.Take():
		plan.kind = writeRefund
		if v.state.Tokens+op.N > op.MaxAmount { // reaches the cap
			plan.kind = writeCap
		}
	case v.full:
		plan.kind = writeFull
	default:
		plan.kind = writeTake
	}
	return plan, next, d, nil
}

// fromState is the item holding st, the state op.Apply returned for view v
// of it.
func fromState(op storage.BucketOp, it bucketItem, v bucketView, st storage.BucketState) bucketItem {
	if st.Updated != v.state.Updated { // strict mode restarted the grid at op.Now
		return bucketItem{base: st.Updated, tat: -st.Tokens}
	}
	return bucketItem{base: it.base, tat: v.level - st.Tokens}
}

// rebase moves it's grid forward by whole steps to the last grid point not
// after op.Now, keeping the bucket (full when the level overflowed).
func rebase(op storage.BucketOp, it bucketItem) (bucketItem, error) {
	rt := int64(op.RefillTime)
	k := (op.Now - it.base) / rt
	if k <= 0 || it.base > op.Now {
		return it, fmt.Errorf("stamp %d out of range of the bucket's refill grid (base %d)", op.Now, it.base)
	}
	base := it.base + k*rt
	// tokens at k: full unless tat is within MaxAmount of the level,
	// computed without forming the level.
	tokens := op.MaxAmount
	if k <= (it.tat+op.MaxAmount)/op.RefillAmount && it.tat <= maxLevel {
		tokens = min(op.MaxAmount, op.RefillAmount*k-it.tat)
	}
	return bucketItem{base: base, tat: -tokens}, nil
}

// bucketClauses adds the conditional write of plan, which stores next,
// computed from cur, to u.
// broken drops the condition (tests show the history checker fails such a
// store).
func (s *Store) bucketClauses(u *update, a attrs, op storage.BucketOp, cur bucketItem, plan bucketPlan, next bucketItem, ttl time.Duration, broken bool) {
	if broken {
		defer u.dropConds(len(u.cond))
	}
	u.keepTTL(ttl)
	if plan.kind == writeRing {
		s.ringClauses(u, a, op, plan)
		return
	}
	b, t := u.name(a.pre+attrBase), u.name(a.pre+attrTat)
	floor := plan.level - op.MaxAmount // below it, the bucket is full at the op's step
	onGrid := func() string { return b + " = " + u.num(plan.base) }
	if plan.kind != writeCreate { // which fails on any item
		// Decided without a lease ring: none may have appeared meanwhile
		// (a take's units would be taken twice; a write that changes tat
		// alone breaks c = tat + h, and the ring's takes, planned on tat
		// and conditioned on c, then lose again and again). Failed, it
		// is planned again on the ring the item returned.
		u.cond = append(u.cond, "attribute_not_exists("+u.name(a.pre+attrHeld)+")")
	}
	switch plan.kind {
	case writeTake:
		u.set = append(u.set, t+" = "+t+" + "+u.num(op.N))
		u.cond = append(u.cond, onGrid()+" AND "+t+" BETWEEN "+u.num(floor)+" AND "+u.num(plan.level-op.N))
	case writeFull:
		u.set = append(u.set, t+" = "+u.num(next.tat))
		u.cond = append(u.cond, onGrid()+" AND "+t+" < "+u.num(floor))
	case writeRefund:
		u.set = append(u.set, t+" = "+t+" - "+u.num(op.N))
		u.cond = append(u.cond, onGrid()+" AND "+t+" >= "+u.num(floor+op.N))
	case writeCap:
		u.set = append(u.set, t+" = "+u.num(next.tat))
		u.cond = append(u.cond, onGrid()+" AND "+t+" < "+u.num(floor+op.N))
	case writeStrict:
		u.set = append(u.set, b+" = "+u.num(next.base), t+" = "+t+" - "+u.num(plan.level))
		u.cond = append(u.cond, onGrid()+" AND "+t+" > "+u.num(plan.level-op.N))
	case writeCreate:
		u.set = append(u.set, b+" = "+u.num(next.base), t+" = "+u.num(next.tat))
		u.cond = append(u.cond, "attribute_not_exists("+t+") AND attribute_not_exists("+b+")")

	case writeExact:
		u.set = append(u.set, b+" = "+u.num(next.base), t+" = "+u.num(next.tat))
		u.cond = append(u.cond, b+" = "+u.num(cur.base)+" AND "+t+" = "+u.num(cur.tat))
	}
	if plan.relative() {
		u.allNew = true
	}
}

// bucketFromItem decodes the bucket of item (none: no bucket stored) and
// remembers it.
func (s *Store) bucketFromItem(a attrs, item map[string]types.AttributeValue) (bucketItem, bool, error) {
	st, found, err := decodeBucket(a, item)
	if err != nil || !found {
		s.cache.remove(a.cacheKey())
		return bucketItem{}, false, err
	}
	s.cache.put(a.cacheKey(), st)
	return st, true, nil
}

// decodeBucket decodes the bucket's attributes of item: found is false when
// it holds neither.
func decodeBucket(a attrs, item map[string]types.AttributeValue) (it bucketItem, found bool, err error) {
	_, hasTat := item[a.pre+attrTat]
	_, hasBase := item[a.pre+attrBase]
	if !hasTat && !hasBase {
		return bucketItem{}, false, nil
	}
	if it.tat, err = getInt(bucketKind, a.pk, item, a.pre+attrTat); err != nil {
		return bucketItem{}, false, err
	}
	if it.base, err = getInt(bucketKind, a.pk, item, a.pre+attrBase); err != nil {
		return bucketItem{}, false, err
	}
	if err := decodeRing(a, item, &it); err != nil {
		return bucketItem{}, false, err
	}
	if it.fence, err = fenceOf(a, item); err != nil {
		return bucketItem{}, false, err
	}
	return it, true, nil
}

// readBucket reads the bucket with a strongly consistent read.
func (s *Store) readBucket(ctx context.Context, a attrs) (bucketItem, bool, error) {
	s.counter.reads.Add(1)
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      s.table,
		Key:            keyAttr(a.pk),
		ConsistentRead: aws.Bool(true),
	}, s.optFns...)
	if err != nil {
		return bucketItem{}, false, mapError("token bucket read", err)
	}
	return s.bucketFromItem(a, out.Item)
}

// floorDiv is a/b rounded toward minus infinity.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
