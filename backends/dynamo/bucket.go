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

// UpdateBucket implements [limiter.BucketStore] with conditional writes and
// no read in the common case; see the package documentation.
func (s *Store) UpdateBucket(ctx context.Context, k limiter.Key, op limiter.BucketOp, ttl time.Duration) (limiter.Decision, error) {
	if op.MaxAmount <= 0 || op.RefillTime <= 0 || op.RefillAmount <= 0 || op.N < 0 {
		return limiter.Decision{}, fmt.Errorf("dynamo: bad bucket op (max %d, refill %v by %d, n %d)", op.MaxAmount, op.RefillTime, op.RefillAmount, op.N)
	}
	pk := itemKey(k)
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()

	var (
		cur        limiter.BucketState
		found      bool // cur is a stored bucket (else: assume none is stored)
		fromServer bool // cur came from DynamoDB during this call
		next       limiter.BucketState
		d          limiter.Decision
		delta      int64 // of a relative write; 0 for an exact one
	)
	if v, ok := s.cache.get(pk); ok {
		cur, found = v.(limiter.BucketState), true
	}
	err := s.writer().conditional(ctx, bucketKind+" "+pk, condWrite{
		next: func(ctx context.Context) (*dynamodb.UpdateItemInput, error) {
			var write bool
			next, d, write = op.Apply(cur, found)
			if !write && !fromServer {
				// A denial (or a Get) is only as good as the state it was
				// computed on: confirm a remembered state with a read.
				st, ok, err := s.readBucket(ctx, pk)
				if err != nil {
					return nil, err
				}
				cur, found, fromServer = st, ok, true
				next, d, write = op.Apply(cur, found)
			}
			if !write {
				return nil, nil
			}
			var in *dynamodb.UpdateItemInput
			in, delta = s.bucketWrite(pk, op, cur, found, next, ttl)
			return in, nil
		},
		written: func(out *dynamodb.UpdateItemOutput) error {
			if delta == 0 {
				s.cache.put(pk, next)
				return nil
			}
			stored, err := decodeBucket(pk, out.Attributes)
			if err != nil {
				s.cache.remove(pk)
				return err
			}
			// The decision of the op on the state it was applied to.
			_, d, _ = op.Apply(limiter.BucketState{Tokens: stored.Tokens - delta, Updated: stored.Updated}, true)
			s.cache.put(pk, stored)
			return nil
		},
		lost: func(item map[string]types.AttributeValue) (bool, error) {
			// The item DynamoDB returned is the state that beat us: apply
			// the op to it, without a read.
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

// bucketFromItem decodes item (nil: no bucket stored) and remembers it.
func (s *Store) bucketFromItem(pk string, item map[string]types.AttributeValue) (limiter.BucketState, bool, error) {
	if len(item) == 0 {
		s.cache.remove(pk)
		return limiter.BucketState{}, false, nil
	}
	st, err := decodeBucket(pk, item)
	if err != nil {
		s.cache.remove(pk)
		return st, false, err
	}
	s.cache.put(pk, st)
	return st, true, nil
}

func decodeBucket(pk string, item map[string]types.AttributeValue) (limiter.BucketState, error) {
	tokens, err := getInt(bucketKind, pk, item, attrTokens)
	if err != nil {
		return limiter.BucketState{}, err
	}
	if tokens < 0 {
		return limiter.BucketState{}, corrupt(bucketKind, pk, attrTokens, "negative: %d", tokens)
	}
	updated, err := getInt(bucketKind, pk, item, attrUpdated)
	if err != nil {
		return limiter.BucketState{}, err
	}
	return limiter.BucketState{Tokens: tokens, Updated: updated}, nil
}

// readBucket reads the bucket with a strongly consistent read.
func (s *Store) readBucket(ctx context.Context, pk string) (limiter.BucketState, bool, error) {
	s.counter.reads.Add(1)
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      s.table,
		Key:            keyAttr(pk),
		ConsistentRead: aws.Bool(true),
	}, s.optFns...)
	if err != nil {
		return limiter.BucketState{}, false, mapError("token bucket read", err)
	}
	return s.bucketFromItem(pk, out.Item)
}

// deltaRange reports whether next can be written as a relative update of the
// stored tokens (tokens += delta) conditioned on the stored tokens lying in
// [lo, hi] and the stored refill time being cur.Updated: for every stored
// state that meets the condition, op.Apply would compute exactly that
// update. This is the case when no refill is due on cur (Updated does not
// move) and the op takes N tokens and is allowed (any stored count in
// [N, MaxAmount] allows it too), or refunds N tokens without reaching the
// cap (any count in [0, MaxAmount-N]). Concurrent writers whose ops all fit
// then all succeed, in any order, without retrying.
func deltaRange(op limiter.BucketOp, cur limiter.BucketState, found bool, next limiter.BucketState) (lo, hi, delta int64, ok bool) {
	if !found || next.Updated != cur.Updated || cur.Tokens < 0 || cur.Tokens > op.MaxAmount || op.N <= 0 {
		return 0, 0, 0, false
	}
	delta = next.Tokens - cur.Tokens
	switch {
	case op.Take() && delta == -op.N:
		return op.N, op.MaxAmount, delta, true
	case !op.Take() && delta == op.N:
		return 0, op.MaxAmount - op.N, delta, true
	}
	return 0, 0, 0, false
}

// bucketWrite is the conditional UpdateItem that stores next, computed by
// op from cur, and the delta of a relative write (0 for a write of the
// exact state).
func (s *Store) bucketWrite(pk string, op limiter.BucketOp, cur limiter.BucketState, found bool, next limiter.BucketState, ttl time.Duration) (*dynamodb.UpdateItemInput, int64) {
	in := &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyAttr(pk),
		ExpressionAttributeNames: map[string]string{"#t": attrTokens, "#u": attrUpdated, "#x": AttrTTL},
	}
	if lo, hi, delta, ok := deltaRange(op, cur, found, next); ok && !s.exactOnly {
		in.UpdateExpression = aws.String("SET #t = #t + :d, #x = :x")
		in.ConditionExpression = aws.String("#u = :u AND #t BETWEEN :lo AND :hi")
		in.ExpressionAttributeValues = map[string]types.AttributeValue{
			":d": numAttr(delta), ":x": s.ttlValue(ttl), ":u": numAttr(cur.Updated),
			":lo": numAttr(lo), ":hi": numAttr(hi),
		}
		in.ReturnValues = types.ReturnValueAllNew
		return in, delta
	}
	in.UpdateExpression = aws.String("SET #t = :t, #u = :u, #x = :x")
	in.ExpressionAttributeValues = map[string]types.AttributeValue{
		":t": numAttr(next.Tokens), ":u": numAttr(next.Updated), ":x": s.ttlValue(ttl),
	}
	if found {
		// ABA is harmless: Apply is a pure function of (tokens, updated).
		in.ConditionExpression = aws.String("#t = :t0 AND #u = :u0")
		in.ExpressionAttributeValues[":t0"] = numAttr(cur.Tokens)
		in.ExpressionAttributeValues[":u0"] = numAttr(cur.Updated)
	} else {
		in.ConditionExpression = aws.String("attribute_not_exists(#k)")
		in.ExpressionAttributeNames["#k"] = AttrPK
	}
	return in, 0
}
