package dynamo

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/limiter/storage"
)

var (
	_ storage.Resetter  = (*Store)(nil)
	_ storage.LogReader = (*Store)(nil)
)

// maxRemoveNames is the most attributes one reset UpdateItem removes (its
// expression stays far below DynamoDB's 4 KB).
const maxRemoveNames = 200

// Reset implements [storage.Resetter] on the item of k.Name, which holds
// every limit of that Name: it removes this limit's attributes (those
// named with k.Space's prefix) and no other. A consistent GetItem lists
// them; one UpdateItem (more past 200 names) REMOVEs them, with the
// bucket's or log's own names even if the read did not show them, on
// condition that the item exists (a REMOVE must not create an empty item
// without a ttl). op's bounds are not needed: the item lists its
// counters.
//
// Under concurrency (see [storage.Resetter]): an add between the read and
// the write to a counter the read did not show stays (that request is
// counted); any other is removed. The other limits' attributes and ttl
// are untouched, and so is a window's fence (storage.Fencer: a reset
// never lowers it), and the other processes' remembered states fail their
// conditions and are read again from the item.
func (s *Store) Reset(ctx context.Context, k storage.Key, op *storage.ResetOp) error {
	if op == nil {
		return fmt.Errorf("dynamo: bad reset: nil op")
	}
	a, err := s.attrsOf(k)
	if err != nil {
		return err
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	defer s.cache.remove(a.cacheKey())
	s.counter.reads.Add(1)
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      s.table,
		Key:            keyAttr(a.pk),
		ConsistentRead: aws.Bool(true),
	}, s.optFns...)
	if err != nil {
		return mapError("reset read", err)
	}
	if out.Item == nil {
		return nil // no item: nothing of any limit
	}
	var names []string
	switch op.Kind {
	case storage.StepBucket:
		names = append(names, a.pre+attrBase, a.pre+attrTat)
	case storage.StepLog:
		names = append(names, a.pre+attrLog, a.pre+attrVersion)
	}
	for name := range out.Item {
		if _, ok := a.own(name); ok && name != AttrPK && name != AttrTTL && name != a.pre+attrFence && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for len(names) > 0 {
		n := min(len(names), maxRemoveNames)
		if err := s.remove(ctx, a.pk, names[:n]); err != nil {
			return err
		}
		names = names[n:]
	}
	return nil
}

// remove removes the attributes names of item pk, if the item exists.
func (s *Store) remove(ctx context.Context, pk string, names []string) error {
	ph := make(map[string]string, len(names))
	var expr strings.Builder
	expr.WriteString("REMOVE ")
	for i, name := range names {
		p := "#" + strconv.Itoa(i)
		ph[p] = name
		if i > 0 {
			expr.WriteString(", ")
		}
		expr.WriteString(p)
	}
	ph["#pk"] = AttrPK
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyAttr(pk),
		UpdateExpression:         aws.String(expr.String()),
		ConditionExpression:      aws.String("attribute_exists(#pk)"),
		ExpressionAttributeNames: ph,
	}, s.optFns...)
	if _, gone := conditionFailed(err); gone {
		return nil // the item went meanwhile (expired): nothing left
	}
	if err != nil {
		return mapError("reset", err)
	}
	return nil
}

// ReadLog implements [storage.LogReader]: a consistent GetItem of k's
// item, and the log's entries in it (nil when it holds none).
func (s *Store) ReadLog(ctx context.Context, k storage.Key) ([]int64, error) {
	a, err := s.attrsOf(k)
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	st, _, err := s.readLog(ctx, a)
	if err != nil {
		return nil, err
	}
	return slices.Clone(st.entries), nil
}
