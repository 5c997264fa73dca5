package dynamo

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter"
)

const bucketKind = "token bucket"

// Attributes of a bucket item (see the package documentation).
const (
	attrBase = "base" // Unix ns: the origin of the refill grid
	attrTat  = "tat"  // tokens: the refills since base that the takes so far use up
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
	// legacy is the state of an item in the earlier layout (tokens,
	// updated), converted: base = updated, tat = -tokens. Its first write
	// replaces it on a condition on the old attributes.
	legacy    bool
	oldTokens int64
}

// bucketView is an op's view of a bucketItem: its step on the grid and the
// bucket there, as the limiter.BucketState that op.Apply decides on.
type bucketView struct {
	step  int64 // k, the op's grid step (negative: stamped before base)
	level int64 // RefillAmount*k
	state limiter.BucketState
	full  bool // tat is below the cap at k: the bucket holds MaxAmount
}

// maxLevel bounds RefillAmount*k and tat, so that every sum the protocol
// writes (level - MaxAmount, tat + n, ...) stays within int64.
const maxLevel = 1 << 61

// view is the bucket it holds as op (stamped op.Now) sees it, or ok=false
// when op.Now is so far from base that the level would leave maxLevel
// (a caller stamp centuries away, or a tiny RefillTime with a large
// RefillAmount on a key never idle for decades).
func (it bucketItem) view(op limiter.BucketOp) (v bucketView, ok bool) {
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
	v.state = limiter.BucketState{Tokens: tokens, Updated: it.base + k*rt}
	return v, true
}

// UpdateBucket implements [limiter.BucketStore] with conditional writes and
// no read in the common case: one UpdateItem per decision whatever the
// refill rate; see the package documentation.
func (s *Store) UpdateBucket(ctx context.Context, k limiter.Key, op limiter.BucketOp, ttl time.Duration) (limiter.Decision, error) {
	if op.MaxAmount <= 0 || op.MaxAmount > maxLevel || op.RefillTime <= 0 || op.RefillAmount <= 0 || op.N < 0 || op.N > op.MaxAmount {
		return limiter.Decision{}, fmt.Errorf("dynamo: bad bucket op (max %d, refill %v by %d, n %d)", op.MaxAmount, op.RefillTime, op.RefillAmount, op.N)
	}
	pk := itemKey(k)
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	if err := s.waitRefunds(ctx, pk); err != nil {
		return limiter.Decision{}, err
	}

	var (
		cur        bucketItem
		found      bool // cur is a stored bucket (else: assume none is stored)
		fromServer bool // cur came from DynamoDB during this call
		next       bucketItem
		d          limiter.Decision
		plan       bucketPlan
	)
	if v, ok := s.cache.get(pk); ok {
		cur, found = v.(bucketItem), true
	}
	err := s.writer().conditional(ctx, bucketKind+" "+pk, condWrite{
		next: func(ctx context.Context) (*dynamodb.UpdateItemInput, error) {
			var err error
			plan, next, d, err = s.planBucket(op, cur, found, fromServer)
			if err != nil {
				return nil, fmt.Errorf("dynamo: %s %s: %w", bucketKind, pk, err)
			}
			if plan.read {
				// A Get is only as good as the state it was computed
				// on: confirm a remembered state with a read.
				st, ok, err := s.readBucket(ctx, pk)
				if err != nil {
					return nil, err
				}
				cur, found, fromServer = st, ok, true
				if plan, next, d, err = s.planBucket(op, cur, found, fromServer); err != nil {
					return nil, fmt.Errorf("dynamo: %s %s: %w", bucketKind, pk, err)
				}
			}
			if plan.kind == writeNone {
				return nil, nil
			}
			return s.bucketInput(pk, op, cur, plan, next, ttl), nil
		},
		written: func(out *dynamodb.UpdateItemOutput) error {
			if !plan.relative() {
				s.cache.put(pk, next)
				return nil
			}
			stored, err := decodeBucket(pk, out.Attributes)
			if err != nil {
				s.cache.remove(pk)
				return err
			}
			// The decision of the op on the state it was applied to.
			before := stored
			switch plan.kind {
			case writeTake:
				before.tat -= op.N
			case writeRefund:
				before.tat += op.N
			case writeStrict:
				before.base, before.tat = plan.base, stored.tat+plan.level
			}
			v, ok := before.view(op)
			if !ok {
				s.cache.remove(pk)
				return corrupt(bucketKind, pk, attrTat, "out of range after a write: %d", stored.tat)
			}
			_, d, _ = op.Apply(v.state, true)
			s.cache.put(pk, stored)
			return nil
		},
		lost: func(item map[string]types.AttributeValue) (bool, error) {
			// The item DynamoDB returned is the state that beat us (or
			// the one our guess missed): apply the op to it, without a
			// read.
			var err error
			cur, found, err = s.bucketFromItem(pk, item)
			fromServer = true
			return err == nil, err
		},
	})
	if err != nil {
		// The write may or may not have happened: what is remembered may
		// be stale, which the next write's condition catches.
		return limiter.Decision{}, err
	}
	return d, nil
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
}

// relative reports whether the write changes tat relative to the stored
// value, so that the decision is recomputed from the returned item.
func (p bucketPlan) relative() bool {
	return p.kind == writeTake || p.kind == writeRefund || p.kind == writeStrict
}

// planBucket applies op to cur (found: cur is stored; fromServer: it came
// from DynamoDB during this call) and picks the write: it returns the plan,
// the item after the write and the decision.
func (s *Store) planBucket(op limiter.BucketOp, cur bucketItem, found, fromServer bool) (bucketPlan, bucketItem, limiter.Decision, error) {
	if !found {
		st, d, write := op.Apply(limiter.BucketState{}, false)
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
			return bucketPlan{}, bucketItem{}, limiter.Decision{}, fmt.Errorf("stamp %d too far behind the bucket's refill grid (base %d)", op.Now, cur.base)
		}
		// Move the grid forward (same phase) to where the numbers are
		// small again, with an exact write.
		moved, err := rebase(op, cur)
		if err != nil {
			return bucketPlan{}, bucketItem{}, limiter.Decision{}, err
		}
		moved.legacy, moved.oldTokens = cur.legacy, cur.oldTokens
		if v, ok = moved.view(op); !ok {
			return bucketPlan{}, bucketItem{}, limiter.Decision{}, fmt.Errorf("stamp %d out of range of the bucket's refill grid", op.Now)
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
	case cur.legacy || s.exactOnly:
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
func fromState(op limiter.BucketOp, it bucketItem, v bucketView, st limiter.BucketState) bucketItem {
	if st.Updated != v.state.Updated { // strict mode restarted the grid at op.Now
		return bucketItem{base: st.Updated, tat: -st.Tokens}
	}
	return bucketItem{base: it.base, tat: v.level - st.Tokens}
}

// rebase moves it's grid forward by whole steps to the last grid point not
// after op.Now, keeping the bucket (full when the level overflowed).
func rebase(op limiter.BucketOp, it bucketItem) (bucketItem, error) {
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

// bucketInput is the conditional UpdateItem of plan, which stores next,
// computed from cur.
func (s *Store) bucketInput(pk string, op limiter.BucketOp, cur bucketItem, plan bucketPlan, next bucketItem, ttl time.Duration) *dynamodb.UpdateItemInput {
	in := &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyAttr(pk),
		ExpressionAttributeNames: map[string]string{"#b": attrBase, "#a": attrTat, "#x": AttrTTL},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":x": s.ttlValue(ttl), ":b": numAttr(plan.base),
		},
	}
	vals := in.ExpressionAttributeValues
	set := func(update, cond string) {
		in.UpdateExpression, in.ConditionExpression = aws.String(update), aws.String(cond)
	}
	floor := plan.level - op.MaxAmount // below it, the bucket is full at the op's step
	switch plan.kind {
	case writeTake:
		set("SET #a = #a + :n, #x = :x", "#b = :b AND #a BETWEEN :lo AND :hi")
		vals[":n"], vals[":lo"], vals[":hi"] = numAttr(op.N), numAttr(floor), numAttr(plan.level-op.N)
	case writeFull:
		set("SET #a = :a, #x = :x", "#b = :b AND #a < :lo")
		vals[":a"], vals[":lo"] = numAttr(next.tat), numAttr(floor)
	case writeRefund:
		set("SET #a = #a - :n, #x = :x", "#b = :b AND #a >= :lo")
		vals[":n"], vals[":lo"] = numAttr(op.N), numAttr(floor+op.N)
	case writeCap:
		set("SET #a = :a, #x = :x", "#b = :b AND #a < :lo")
		vals[":a"], vals[":lo"] = numAttr(next.tat), numAttr(floor+op.N)
	case writeStrict:
		set("SET #b = :now, #a = #a - :level, #x = :x", "#b = :b AND #a > :hi")
		vals[":now"], vals[":level"], vals[":hi"] = numAttr(next.base), numAttr(plan.level), numAttr(plan.level-op.N)
	case writeCreate:
		delete(vals, ":b")
		vals[":nb"], vals[":a"] = numAttr(next.base), numAttr(next.tat)
		in.ExpressionAttributeNames["#k"] = AttrPK
		set("SET #b = :nb, #a = :a, #x = :x", "attribute_not_exists(#k)")
	case writeExact:
		delete(vals, ":b")
		vals[":nb"], vals[":a"] = numAttr(next.base), numAttr(next.tat)
		if cur.legacy {
			// ABA is harmless: the old layout's state is a pure
			// function of (tokens, updated).
			in.ExpressionAttributeNames["#t"], in.ExpressionAttributeNames["#u"] = attrTokens, attrUpdated
			vals[":t0"], vals[":u0"] = numAttr(cur.oldTokens), numAttr(cur.base)
			set("SET #b = :nb, #a = :a, #x = :x REMOVE #t, #u", "attribute_not_exists(#a) AND #t = :t0 AND #u = :u0")
		} else {
			vals[":b0"], vals[":a0"] = numAttr(cur.base), numAttr(cur.tat)
			set("SET #b = :nb, #a = :a, #x = :x", "#b = :b0 AND #a = :a0")
		}
	}
	if plan.relative() {
		in.ReturnValues = types.ReturnValueAllNew
	}
	return in
}

// bucketFromItem decodes item (nil: no bucket stored) and remembers it.
func (s *Store) bucketFromItem(pk string, item map[string]types.AttributeValue) (bucketItem, bool, error) {
	if len(item) == 0 {
		s.cache.remove(pk)
		return bucketItem{}, false, nil
	}
	st, err := decodeBucket(pk, item)
	if err != nil {
		s.cache.remove(pk)
		return st, false, err
	}
	s.cache.put(pk, st)
	return st, true, nil
}

// decodeBucket decodes a bucket item, in this layout or the earlier one
// (tokens, updated).
func decodeBucket(pk string, item map[string]types.AttributeValue) (bucketItem, error) {
	_, hasTat := item[attrTat]
	_, hasTokens := item[attrTokens]
	if !hasTat && hasTokens {
		tokens, err := getInt(bucketKind, pk, item, attrTokens)
		if err != nil {
			return bucketItem{}, err
		}
		if tokens < 0 {
			return bucketItem{}, corrupt(bucketKind, pk, attrTokens, "negative: %d", tokens)
		}
		updated, err := getInt(bucketKind, pk, item, attrUpdated)
		if err != nil {
			return bucketItem{}, err
		}
		return bucketItem{base: updated, tat: -tokens, legacy: true, oldTokens: tokens}, nil
	}
	tat, err := getInt(bucketKind, pk, item, attrTat)
	if err != nil {
		return bucketItem{}, err
	}
	base, err := getInt(bucketKind, pk, item, attrBase)
	if err != nil {
		return bucketItem{}, err
	}
	return bucketItem{base: base, tat: tat}, nil
}

// readBucket reads the bucket with a strongly consistent read.
func (s *Store) readBucket(ctx context.Context, pk string) (bucketItem, bool, error) {
	s.counter.reads.Add(1)
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      s.table,
		Key:            keyAttr(pk),
		ConsistentRead: aws.Bool(true),
	}, s.optFns...)
	if err != nil {
		return bucketItem{}, false, mapError("token bucket read", err)
	}
	return s.bucketFromItem(pk, out.Item)
}
