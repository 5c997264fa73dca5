package dynamo

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter/storage"
)

var (
	_ storage.Fencer       = (*Store)(nil)
	_ storage.BucketFencer = (*Store)(nil)
)

// attrFence is a limit's fence (storage.Fencer), a Number beside a
// window's counters or a bucket's attributes (one character: never a
// counter's name, nor a bucket's: b, t, s, h, c, n, g, e0, u0, e1, u1).
const attrFence = "f"

// RaiseFence implements [storage.Fencer], on a window's key or a
// bucket's alike: one UpdateItem that SETs the limit's fence attribute to
// f, with the item's ttl as every write sets
// it (ttl is what the limit asks), on condition that the fence is absent
// or below f. A failed condition means it was already at f or above:
// done. The write is linearizable, so every fenced add after it sees the
// fence, and every one before it is in the item a consistent read
// returns.
func (s *Store) RaiseFence(ctx context.Context, k storage.Key, f int64, ttl time.Duration) error {
	if f <= 0 {
		return fmt.Errorf("dynamo: bad fence %d", f)
	}
	a, err := s.attrsOf(k)
	if err != nil {
		return err
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	u := newUpdate()
	name, v := u.name(a.pre+attrFence), u.num(f)
	u.set = append(u.set, name+" = "+v)
	u.cond = append(u.cond, "(attribute_not_exists("+name+") OR "+name+" < "+v+")")
	u.keepTTL(ttl)
	_, err = s.client.UpdateItem(ctx, s.input(a.pk, u), s.optFns...)
	if _, higher := conditionFailed(err); err != nil && !higher {
		return mapError("raise fence", err)
	}
	return nil
}

// fenceOf reads the limit's fence (a's) in item: 0 when it has none, an
// error wrapping storage.ErrCorruptState when it is not a Number.
func fenceOf(a attrs, item map[string]types.AttributeValue) (int64, error) {
	av, ok := item[a.pre+attrFence]
	if !ok {
		return 0, nil
	}
	nv, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return 0, corrupt(windowKind, a.pk, a.pre+attrFence, "want a Number, got %s", typeName(av))
	}
	f, err := strconv.ParseInt(nv.Value, 10, 64)
	if err != nil {
		return 0, corrupt(windowKind, a.pk, a.pre+attrFence, "want a fence, got %q", nv.Value)
	}
	return f, nil
}
