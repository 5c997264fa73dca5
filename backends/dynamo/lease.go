package dynamo

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter/storage"
)

// Leases keeps the leases of the concurrent-requests limiter and the
// fleet-usage shedder ([storage.LeaseStore]) and published values such as
// the fleet's utilization ([storage.GaugeStore]) in the store's table.
//
// # Lease items
//
// One item per key: pk, leases (Map: lease ID -> expiry in Unix ns, N), lv
// (N, a version bumped by every write) and ttl. An acquire is ONE
// UpdateItem in the common case, with no read first:
//
//	SET leases.<id> = :expires, ttl = :ttl  ADD lv :1
//	condition: size(leases) < :capacity AND attribute_type(leases, M) AND attribute_type(lv, N)
//	ReturnValues=ALL_NEW, ReturnValuesOnConditionCheckFailure=ALL_OLD
//
// The condition counts every stored lease, expired or not, so it can only
// be stricter than the limit: after the write at most Capacity leases are
// stored, so at most Capacity are live. Concurrent acquires that all fit
// all succeed without retrying. The decision is [storage.LeaseOp.Apply] on
// the returned item. (The type checks make a damaged item fail the
// condition, so that it is read and reported as [storage.ErrCorruptState],
// instead of failing the request.)
//
// When the condition fails (the map is full, possibly of expired leases, or
// the item does not exist) DynamoDB returns the current item; Apply on it
// decides. A denial that drops nothing stands (the item is the server's
// state at the failed condition). Otherwise the whole new map is written on
// condition lv = :seen (attribute_not_exists(pk) for a new item) by the
// package's conditional-write loop, the one buckets and logs use: ALL_OLD
// on failure, and a lost race applies the op to the returned item and
// writes again, the first retry at once and later ones after a jittered,
// growing pause, at most Config.MaxAttempts times (or until the deadline),
// then fails with an error wrapping [storage.ErrConflict]. Every write
// bumps lv, so no update is lost.
//
// A release is ONE UpdateItem that never conflicts with other writers:
// REMOVE leases.<id> ADD lv :1, on condition attribute_type(leases, M) AND
// attribute_type(lv, N) only, so that a key without an item (nothing to
// release) is not created; a failed condition on an item that exists is
// reported as [storage.ErrCorruptState].
//
// Errors are those of [Store]: throttling wraps [ErrThrottled], every other
// DynamoDB error (network, timeout, 5xx, a missing table) [ErrUnavailable].
//
// The ttl attribute is the wall-clock time the last lease written expires,
// plus a second (DynamoDB deletes expired items lazily; the leases' own
// expiries decide, so an expired item still read is still correct). An item
// costs about 25 bytes per live lease: a capacity of up to about 35 stays in
// one write capacity unit, and a fleet-wide capacity of 1000 costs about 25
// units per write. Conditional writes are atomic within one region only.
//
// # Gauges
//
// One item per gauge: gv (N, the value), ga (N, its time) and ttl, written
// with UpdateItem (last writer wins) and read with a consistent GetItem.
//
// # Keys
//
// pk is "#L/" (leases) or "#G/" (gauges), the escaped Space, "/" and the
// escaped Name (every byte that is not printable ASCII, and '%', '/' and
// '#', as %XX); a pk longer than 160 bytes is "#L/#" or "#G/#" and the
// base64url SHA-256 of the key. [Store]'s keys never start with "#L/" or
// "#G/", so one table serves both.
type Leases struct {
	client Client
	table  *string
	cfg    Config
	optFns []func(*dynamodb.Options)
}

var (
	_ storage.LeaseStore = (*Leases)(nil)
	_ storage.GaugeStore = (*Leases)(nil)
)

const (
	attrLeases       = "leases"
	attrLeaseVersion = "lv"
	attrGaugeValue   = "gv"
	attrGaugeAt      = "ga"
)

// NewLeases returns a lease and gauge store on client and cfg.Table (the
// table [CreateTable] makes). Table, Timeout, MaxAttempts, BackoffBase,
// BackoffMax, Retryer and Clock of cfg are used, with the defaults of
// [New].
func NewLeases(client Client, cfg Config) (*Leases, error) {
	cfg, err := cfg.withDefaults(client)
	if err != nil {
		return nil, err
	}
	retryer := cfg.Retryer
	return &Leases{
		client: client,
		table:  aws.String(cfg.Table),
		cfg:    cfg,
		optFns: []func(*dynamodb.Options){func(o *dynamodb.Options) { o.Retryer = retryer }},
	}, nil
}

func (l *Leases) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if l.cfg.Timeout < 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, l.cfg.Timeout)
}

// AcquireLease implements [storage.LeaseStore] (see the protocol above).
func (l *Leases) AcquireLease(ctx context.Context, k storage.Key, op storage.LeaseOp) (storage.Decision, error) {
	if op.Capacity <= 0 || op.Capacity > storage.MaxLeases {
		return storage.Decision{}, fmt.Errorf("dynamo: bad lease capacity %d", op.Capacity)
	}
	if err := ctx.Err(); err != nil {
		return storage.Decision{}, mapError("acquire lease", err)
	}
	ctx, cancel := l.deadline(ctx)
	defer cancel()
	pk := leaseKey("#L/", k)
	what := "acquire lease " + pk
	exp := op.Now + int64(op.TTL)
	if op.TTL < 0 || exp < op.Now {
		exp = math.MaxInt64
	}

	d, item, full, err := l.addLease(ctx, pk, what, op, exp)
	if err != nil || !full {
		return d, err
	}
	return l.rewriteLeases(ctx, pk, what, op, item)
}

// addLease is the fast path: add the lease if the map has room, expired
// leases counted. Its failed condition is not a lost race (the set is
// full, or there is no item): full reports it, with the item it returned
// (nil: none), for the slow path.
func (l *Leases) addLease(ctx context.Context, pk, what string, op storage.LeaseOp, exp int64) (d storage.Decision, item map[string]types.AttributeValue, full bool, err error) {
	out, err := l.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           l.table,
		Key:                 keyAttr(pk),
		UpdateExpression:    aws.String("SET #ls.#id = :exp, #ttl = :ttl ADD #lv :one"),
		ConditionExpression: aws.String("size(#ls) < :cap AND attribute_type(#ls, :M) AND attribute_type(#lv, :N)"),
		ExpressionAttributeNames: map[string]string{
			"#ls": attrLeases, "#id": op.ID, "#ttl": AttrTTL, "#lv": attrLeaseVersion,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":exp": numAttr(exp),
			":ttl": l.ttlAttr(op.TTL),
			":one": numAttr(1),
			":cap": numAttr(op.Capacity),
			":M":   &types.AttributeValueMemberS{Value: "M"},
			":N":   &types.AttributeValueMemberS{Value: "N"},
		},
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, l.optFns...)
	if err != nil {
		item, failed := conditionFailed(err)
		if !failed {
			return storage.Decision{}, nil, false, mapError(what, err)
		}
		return storage.Decision{}, item, true, nil
	}
	cur, _, err := parseLeaseItem(out.Attributes)
	if err != nil {
		return storage.Decision{}, nil, false, fmt.Errorf("dynamo: %s: %w", what, err)
	}
	_, d, _ = op.Apply(cur)
	if !d.Allowed { // cannot happen: the item holds our lease
		return storage.Decision{}, nil, false, fmt.Errorf("dynamo: %s: %w: written lease missing", what, storage.ErrCorruptState)
	}
	return d, nil, false, nil
}

// rewriteLeases is the slow path: apply op to item, the item DynamoDB
// returned (nil: none), and write it whole on condition that nothing
// changed since, again from the item a lost race returns.
func (l *Leases) rewriteLeases(ctx context.Context, pk, what string, op storage.LeaseOp, item map[string]types.AttributeValue) (storage.Decision, error) {
	var d storage.Decision
	err := l.writer().conditional(ctx, what, condWrite{
		next: func(context.Context) (*dynamodb.UpdateItemInput, error) {
			cur, version, err := parseLeaseItem(item)
			if err != nil {
				return nil, fmt.Errorf("dynamo: %s: %w", what, err)
			}
			next, dd, write := op.Apply(cur)
			d = dd
			if !write {
				return nil, nil
			}
			return l.leasesInput(pk, next, op.Now, version, item == nil), nil
		},
		lost: func(old map[string]types.AttributeValue) (bool, error) {
			item = old
			return true, nil
		},
	})
	if err != nil {
		return storage.Decision{}, err
	}
	return d, nil
}

// leasesInput writes the leases next of item pk whole, at version+1, on
// condition that the item is at version (or, when missing, still is).
func (l *Leases) leasesInput(pk string, next []storage.LeaseEntry, now, version int64, missing bool) *dynamodb.UpdateItemInput {
	m := make(map[string]types.AttributeValue, len(next))
	for _, e := range next {
		m[e.ID] = numAttr(e.Expires)
	}
	in := &dynamodb.UpdateItemInput{
		TableName:        l.table,
		Key:              keyAttr(pk),
		UpdateExpression: aws.String("SET #ls = :m, #lv = :v, #ttl = :ttl"),
		ExpressionAttributeNames: map[string]string{
			"#ls": attrLeases, "#lv": attrLeaseVersion, "#ttl": AttrTTL,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":m":   &types.AttributeValueMemberM{Value: m},
			":v":   numAttr(version + 1),
			":ttl": l.ttlAttr(storage.LeaseExpiry(next, now)),
		},
	}
	if missing {
		in.ConditionExpression = aws.String("attribute_not_exists(#pk)")
		in.ExpressionAttributeNames["#pk"] = AttrPK
	} else {
		in.ConditionExpression = aws.String("#lv = :seen")
		in.ExpressionAttributeValues[":seen"] = numAttr(version)
	}
	return in
}

// ReleaseLease implements [storage.LeaseStore]: one UpdateItem removing
// op.ID, which never conflicts. Leases expired at op.Now are left for the
// next acquire to drop.
func (l *Leases) ReleaseLease(ctx context.Context, k storage.Key, op storage.ReleaseOp) error {
	if err := ctx.Err(); err != nil {
		return mapError("release lease", err)
	}
	ctx, cancel := l.deadline(ctx)
	defer cancel()
	pk := leaseKey("#L/", k)
	what := "release lease " + pk
	return l.writer().conditional(ctx, what, condWrite{
		next: func(context.Context) (*dynamodb.UpdateItemInput, error) {
			return &dynamodb.UpdateItemInput{
				TableName:        l.table,
				Key:              keyAttr(pk),
				UpdateExpression: aws.String("REMOVE #ls.#id ADD #lv :one"),
				// A key without an item has nothing to release: do not
				// create one. The types are checked so that a damaged item
				// fails the condition (and is reported) rather than the
				// request.
				ConditionExpression:      aws.String("attribute_type(#ls, :M) AND attribute_type(#lv, :N)"),
				ExpressionAttributeNames: map[string]string{"#ls": attrLeases, "#id": op.ID, "#lv": attrLeaseVersion},
				ExpressionAttributeValues: map[string]types.AttributeValue{
					":one": numAttr(1),
					":M":   &types.AttributeValueMemberS{Value: "M"},
					":N":   &types.AttributeValueMemberS{Value: "N"},
				},
			}, nil
		},
		lost: func(item map[string]types.AttributeValue) (bool, error) {
			if item == nil {
				return false, nil // no item: nothing to release
			}
			if _, _, err := parseLeaseItem(item); err != nil {
				return false, fmt.Errorf("dynamo: %s: %w", what, err)
			}
			return false, fmt.Errorf("dynamo: %s: %w: the item failed its type check", what, storage.ErrCorruptState)
		},
	})
}

// PutGauge implements [storage.GaugeStore] with one UpdateItem.
func (l *Leases) PutGauge(ctx context.Context, k storage.Key, g storage.Gauge, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return mapError("put gauge", err)
	}
	if math.IsNaN(g.Value) || math.IsInf(g.Value, 0) {
		return fmt.Errorf("dynamo: put gauge: %v is not a finite number", g.Value)
	}
	ctx, cancel := l.deadline(ctx)
	defer cancel()
	_, err := l.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                l.table,
		Key:                      keyAttr(leaseKey("#G/", k)),
		UpdateExpression:         aws.String("SET #gv = :v, #ga = :at, #ttl = :ttl"),
		ExpressionAttributeNames: map[string]string{"#gv": attrGaugeValue, "#ga": attrGaugeAt, "#ttl": AttrTTL},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":v":   &types.AttributeValueMemberN{Value: strconv.FormatFloat(g.Value, 'g', -1, 64)},
			":at":  numAttr(g.At),
			":ttl": l.ttlAttr(ttl),
		},
	}, l.optFns...)
	if err != nil {
		return mapError("put gauge", err)
	}
	return nil
}

// GetGauge implements [storage.GaugeStore] with a consistent GetItem.
func (l *Leases) GetGauge(ctx context.Context, k storage.Key) (storage.Gauge, bool, error) {
	if err := ctx.Err(); err != nil {
		return storage.Gauge{}, false, mapError("get gauge", err)
	}
	ctx, cancel := l.deadline(ctx)
	defer cancel()
	pk := leaseKey("#G/", k)
	out, err := l.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      l.table,
		Key:            keyAttr(pk),
		ConsistentRead: aws.Bool(true),
	}, l.optFns...)
	if err != nil {
		return storage.Gauge{}, false, mapError("get gauge", err)
	}
	if out.Item == nil {
		return storage.Gauge{}, false, nil
	}
	v, okV := out.Item[attrGaugeValue].(*types.AttributeValueMemberN)
	at, okA := out.Item[attrGaugeAt].(*types.AttributeValueMemberN)
	if !okV || !okA {
		return storage.Gauge{}, false, fmt.Errorf("dynamo: gauge %q: %w: missing or mistyped gv/ga", pk, storage.ErrCorruptState)
	}
	g := storage.Gauge{}
	if g.Value, err = strconv.ParseFloat(v.Value, 64); err != nil {
		return storage.Gauge{}, false, fmt.Errorf("dynamo: gauge %q: %w: gv: %w", pk, storage.ErrCorruptState, err)
	}
	if g.At, err = strconv.ParseInt(at.Value, 10, 64); err != nil {
		return storage.Gauge{}, false, fmt.Errorf("dynamo: gauge %q: %w: ga: %w", pk, storage.ErrCorruptState, err)
	}
	return g, true, nil
}

// parseLeaseItem reads a lease item's leases and version (nil and 0 for no
// item).
func parseLeaseItem(item map[string]types.AttributeValue) ([]storage.LeaseEntry, int64, error) {
	if item == nil {
		return nil, 0, nil
	}
	m, ok := item[attrLeases].(*types.AttributeValueMemberM)
	if !ok {
		return nil, 0, fmt.Errorf("%w: lease item without a %q map", storage.ErrCorruptState, attrLeases)
	}
	v, ok := item[attrLeaseVersion].(*types.AttributeValueMemberN)
	if !ok {
		return nil, 0, fmt.Errorf("%w: lease item without a %q number", storage.ErrCorruptState, attrLeaseVersion)
	}
	version, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: lease version: %w", storage.ErrCorruptState, err)
	}
	if len(m.Value) > 2*storage.MaxLeases {
		return nil, 0, fmt.Errorf("%w: %d leases in one item", storage.ErrCorruptState, len(m.Value))
	}
	entries := make([]storage.LeaseEntry, 0, len(m.Value)+1)
	for id, av := range m.Value {
		n, ok := av.(*types.AttributeValueMemberN)
		if !ok {
			return nil, 0, fmt.Errorf("%w: lease %q is not a number", storage.ErrCorruptState, id)
		}
		exp, err := strconv.ParseInt(n.Value, 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("%w: lease %q: %w", storage.ErrCorruptState, id, err)
		}
		entries = append(entries, storage.LeaseEntry{ID: id, Expires: exp})
	}
	return entries, version, nil
}

// leaseKey is the partition key of k under tag ("#L/" or "#G/").
func leaseKey(tag string, k storage.Key) string {
	const hex = "0123456789ABCDEF"
	b := []byte(tag)
	esc := func(s string) {
		for i := 0; i < len(s); i++ {
			c := s[i]
			if c > ' ' && c < 0x7f && c != '%' && c != '/' && c != '#' {
				b = append(b, c)
				continue
			}
			b = append(b, '%', hex[c>>4], hex[c&15])
		}
	}
	esc(k.Space)
	b = append(b, '/')
	esc(k.Name)
	if len(b) <= 160 {
		return string(b)
	}
	h := sha256.New()
	h.Write(strconv.AppendInt(nil, int64(len(k.Space)), 10))
	h.Write([]byte{':'})
	h.Write([]byte(k.Space))
	h.Write([]byte(k.Name))
	return tag + "#" + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// ttlAttr is the TTL attribute of state to be kept keep from now: Unix
// seconds, rounded up, plus a second.
func (l *Leases) ttlAttr(keep time.Duration) types.AttributeValue {
	now := l.cfg.Clock()
	exp := now.Add(keep)
	if keep < 0 || exp.Before(now) {
		exp = now.Add(100 * 365 * 24 * time.Hour)
	}
	sec := exp.Unix() + 1
	if exp.Nanosecond() > 0 {
		sec++
	}
	return numAttr(sec)
}
