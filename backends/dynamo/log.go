package dynamo

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter"
)

const logKind = "sliding log"

// logState is a sliding log as last seen: its entries and version.
type logState struct {
	entries []int64 // never modified once cached
	version int64
}

// UpdateLog implements [limiter.LogStore]: the log is one Binary attribute
// (limiter.AppendLog) written with a condition on a version number.
func (s *Store) UpdateLog(ctx context.Context, k limiter.Key, op limiter.LogOp, ttl time.Duration) (limiter.Decision, error) {
	if op.Limit <= 0 || op.Window <= 0 || op.N < 0 {
		return limiter.Decision{}, fmt.Errorf("dynamo: bad log op (limit %d, window %v, n %d)", op.Limit, op.Window, op.N)
	}
	pk := itemKey(k)
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	if err := s.waitRefunds(ctx, pk); err != nil {
		return limiter.Decision{}, err
	}

	var (
		cur               logState
		found, fromServer bool
		stored            logState
		d                 limiter.Decision
	)
	if v, ok := s.cache.get(pk); ok {
		cur, found = v.(logState), true
	}
	buf := make([]int64, 0, len(cur.entries)+int(min(op.N, limiter.MaxLogLimit)))
	err := s.writer().conditional(ctx, logKind+" "+pk, condWrite{
		next: func(ctx context.Context) (*dynamodb.UpdateItemInput, error) {
			next, dd, write := op.Apply(append(buf[:0], cur.entries...))
			if !write && !fromServer {
				// Confirm a decision made on a remembered log with a read.
				st, ok, err := s.readLog(ctx, pk)
				if err != nil {
					return nil, err
				}
				cur, found, fromServer = st, ok, true
				next, dd, write = op.Apply(append(buf[:0], cur.entries...))
			}
			d = dd
			if !write {
				return nil, nil
			}
			stored = logState{entries: append([]int64(nil), next...), version: cur.version + 1}
			return s.logWrite(pk, cur, found, stored, ttl)
		},
		written: func(*dynamodb.UpdateItemOutput) error {
			s.cache.put(pk, stored)
			return nil
		},
		lost: func(item map[string]types.AttributeValue) (bool, error) {
			var err error
			cur, found, err = s.logFromItem(pk, item)
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

// logWrite is the conditional UpdateItem that replaces the log cur (absent
// when !found) by next, or an error wrapping ErrItemTooLarge.
func (s *Store) logWrite(pk string, cur logState, found bool, next logState, ttl time.Duration) (*dynamodb.UpdateItemInput, error) {
	enc := limiter.AppendLog(nil, next.entries)
	ttlv := s.ttlValue(ttl)
	size := len(AttrPK) + len(pk) + len(attrLog) + len(enc) + len(attrVersion) + numberSize(next.version) +
		len(AttrTTL) + len(ttlv.(*types.AttributeValueMemberN).Value)
	if size > ItemBudget {
		return nil, fmt.Errorf("dynamo: sliding log %q: %w: %d entries take %d bytes; lower the limit (a log item holds roughly 300 entries a few ms apart) or use a sliding window",
			pk, ErrItemTooLarge, len(next.entries), size)
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyAttr(pk),
		UpdateExpression:         aws.String("SET #l = :l, #v = :v, #x = :x"),
		ExpressionAttributeNames: map[string]string{"#l": attrLog, "#v": attrVersion, "#x": AttrTTL},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":l": &types.AttributeValueMemberB{Value: enc}, ":v": numAttr(next.version), ":x": ttlv,
		},
	}
	if found {
		// The version alone would let an item rewritten outside this
		// protocol with the same version be overwritten: require the exact
		// log seen too (no extra capacity, a few hundred bytes of request).
		in.ConditionExpression = aws.String("#v = :v0 AND #l = :l0")
		in.ExpressionAttributeValues[":v0"] = numAttr(cur.version)
		in.ExpressionAttributeValues[":l0"] = &types.AttributeValueMemberB{Value: limiter.AppendLog(nil, cur.entries)}
	} else {
		in.ConditionExpression = aws.String("attribute_not_exists(#k)")
		in.ExpressionAttributeNames["#k"] = AttrPK
	}
	return in, nil
}

func (s *Store) readLog(ctx context.Context, pk string) (logState, bool, error) {
	s.counter.reads.Add(1)
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      s.table,
		Key:            keyAttr(pk),
		ConsistentRead: aws.Bool(true),
	}, s.optFns...)
	if err != nil {
		return logState{}, false, mapError("sliding log read", err)
	}
	return s.logFromItem(pk, out.Item)
}

func (s *Store) logFromItem(pk string, item map[string]types.AttributeValue) (logState, bool, error) {
	if len(item) == 0 {
		s.cache.remove(pk)
		return logState{}, false, nil
	}
	st, err := decodeLog(pk, item)
	if err != nil {
		s.cache.remove(pk)
		return st, false, err
	}
	s.cache.put(pk, st)
	return st, true, nil
}

func decodeLog(pk string, item map[string]types.AttributeValue) (logState, error) {
	version, err := getInt(logKind, pk, item, attrVersion)
	if err != nil {
		return logState{}, err
	}
	av, ok := item[attrLog]
	if !ok {
		return logState{}, corrupt(logKind, pk, attrLog, "missing")
	}
	b, ok := av.(*types.AttributeValueMemberB)
	if !ok {
		return logState{}, corrupt(logKind, pk, attrLog, "want a Binary, got %s", typeName(av))
	}
	entries, err := limiter.ParseLog(b.Value, nil)
	if err != nil {
		return logState{}, fmt.Errorf("dynamo: sliding log item %q (version %s): %w", pk, strconv.FormatInt(version, 10), err)
	}
	return logState{entries: entries, version: version}, nil
}
