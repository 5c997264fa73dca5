package dynamo

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// One item per key name: every limit whose key has the same Name keeps its
// state in the item of that Name, in attributes whose names start with a
// short prefix of its Space (see the package documentation). A write to
// the item is one UpdateItem whose expression is the union of the parts of
// the limits it updates (one part for a single-step call, several for a
// batch), so that a single-step call and a batch read and write the same
// attributes.

// prefixChars is the length of a limit's attribute prefix: two base64url
// characters (12 bits) of the SHA-256 of its Space.
const prefixChars = 2

// maxPrefixes bounds the spaces whose prefixes a store remembers (a
// memo: the prefix is recomputed past it).
const maxPrefixes = 4096

// maxItemsChecked bounds the items whose spaces a store remembers to
// check prefixes against (least recently used forgotten first).
const maxItemsChecked = 4096

// spacePrefix computes the attribute prefix of a space.
func spacePrefix(space string) string {
	sum := sha256.Sum256([]byte(space))
	return base64.RawURLEncoding.EncodeToString(sum[:3])[:prefixChars]
}

// prefixes gives the attribute prefix of each space and refuses two
// spaces with the same prefix on one item (their attributes would mix).
// Two spaces on different items never mix, whatever their prefixes: a
// process may serve any number of spaces (a regional share's bucket is a
// new space at every share size, on a new item), so the check is per
// item, over the spaces this store wrote or read there while it
// remembers the item (the maxItemsChecked most recently used): limits
// of one rule share their items and are seen together at once.
type prefixes struct {
	mu      sync.Mutex
	bySpace map[string]string
	items   *cache // item key -> []spaceAt, the spaces seen on it
}

// spaceAt is a space and its attribute prefix.
type spaceAt struct{ space, pre string }

// prefix returns the attribute prefix of space on the item pk, or an
// error wrapping limiter.ErrInvalidConfig when another space this store
// served on that item has the same one.
func (p *prefixes) prefix(pk, space string) (string, error) {
	p.mu.Lock()
	pre, ok := p.bySpace[space]
	if !ok {
		pre = spacePrefix(space)
		if p.bySpace == nil {
			p.bySpace, p.items = map[string]string{}, newCache(maxItemsChecked)
		}
		if len(p.bySpace) < maxPrefixes {
			p.bySpace[space] = pre
		}
	}
	items := p.items
	p.mu.Unlock()
	var other string
	items.update(pk, func(v any) any {
		seen, _ := v.([]spaceAt)
		for _, sp := range seen {
			if sp.space == space {
				return v
			}
			if other == "" && sp.pre == pre {
				other = sp.space
			}
		}
		if other != "" {
			return v
		}
		return append(slices.Clip(seen), spaceAt{space, pre}) // a new slice: values are immutable once stored
	})
	if other != "" {
		return "", fmt.Errorf("%w: dynamo: limits %q and %q have the same attribute prefix %q and cannot share an item: change one limit's parameters",
			limiter.ErrInvalidConfig, other, space, pre)
	}
	return pre, nil
}

// update is one UpdateItem being built from the parts of the limits it
// writes: placeholders are numbered across parts, the ttl attribute is
// set once (to the longest any part asks).
type update struct {
	names                       map[string]string // placeholder -> attribute
	byAttr                      map[string]string // attribute -> placeholder
	values                      map[string]types.AttributeValue
	add, set, remove, del, cond []string
	ttl                         time.Duration
	setTTL                      bool
	allNew                      bool
}

func newUpdate() *update {
	return &update{names: map[string]string{}, byAttr: map[string]string{}, values: map[string]types.AttributeValue{}}
}

// name returns the placeholder of attribute attr.
func (u *update) name(attr string) string {
	if ph, ok := u.byAttr[attr]; ok {
		return ph
	}
	ph := "#" + strconv.Itoa(len(u.names))
	u.names[ph], u.byAttr[attr] = attr, ph
	return ph
}

// value returns a placeholder for av.
func (u *update) value(av types.AttributeValue) string {
	vp := ":" + strconv.Itoa(len(u.values))
	u.values[vp] = av
	return vp
}

// num returns a placeholder for the number v.
func (u *update) num(v int64) string { return u.value(numAttr(v)) }

// numSet returns a placeholder for the number set of vs (not empty).
func (u *update) numSet(vs ...int64) string {
	ns := make([]string, len(vs))
	for i, v := range vs {
		ns[i] = strconv.FormatInt(v, 10)
	}
	return u.value(&types.AttributeValueMemberNS{Value: ns})
}

// typeN is the placeholder of the string "N" (attribute_type checks).
func (u *update) typeN() string {
	if _, ok := u.values[":N"]; !ok {
		u.values[":N"] = &types.AttributeValueMemberS{Value: "N"}
	}
	return ":N"
}

// keepTTL asks that the item live at least ttl from now.
func (u *update) keepTTL(ttl time.Duration) {
	u.ttl, u.setTTL = max(u.ttl, ttl), true
}

// dropConds drops the conditions from the n-th on and the values only
// they used (a broken store, for tests).
func (u *update) dropConds(n int) {
	dropped := strings.Join(u.cond[n:], " ")
	u.cond = u.cond[:n]
	used := strings.Join(slices.Concat(u.add, u.set, u.del, u.remove, u.cond), " ")
	for vp := range u.values {
		if strings.Contains(dropped, vp) && !containsToken(used, vp) {
			delete(u.values, vp)
		}
	}
	// A name only the dropped conditions used stays in a condition that
	// always holds (DynamoDB refuses an unused name; removing it would
	// give its placeholder to the next name).
	for _, np := range slices.Sorted(maps.Keys(u.names)) {
		if containsToken(dropped, np) && !containsToken(used, np) {
			u.cond = append(u.cond, "(attribute_exists("+np+") OR attribute_not_exists("+np+"))")
		}
	}
}

// containsToken reports whether the placeholder vp occurs in expr as a
// whole token (":1" is not in ":12").
func containsToken(expr, vp string) bool {
	for i := 0; ; {
		j := strings.Index(expr[i:], vp)
		if j < 0 {
			return false
		}
		end := i + j + len(vp)
		if end == len(expr) || expr[end] < '0' || expr[end] > '9' {
			return true
		}
		i = end
	}
}

// removeAttr removes attr (once).
func (u *update) removeAttr(attr string) {
	if _, ok := u.byAttr[attr]; ok {
		return
	}
	u.remove = append(u.remove, u.name(attr))
}

// input is the UpdateItem of u on item pk.
func (s *Store) input(pk string, u *update) *dynamodb.UpdateItemInput {
	if u.setTTL {
		u.set = append(u.set, u.name(AttrTTL)+" = "+u.value(s.ttlValue(s.itemTTL(u.ttl))))
	}
	var expr strings.Builder
	for _, c := range []struct {
		verb  string
		parts []string
	}{{"ADD", u.add}, {"SET", u.set}, {"REMOVE", u.remove}, {"DELETE", u.del}} {
		if len(c.parts) == 0 {
			continue
		}
		if expr.Len() > 0 {
			expr.WriteByte(' ')
		}
		expr.WriteString(c.verb + " " + strings.Join(c.parts, ", "))
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyAttr(pk),
		UpdateExpression:         aws.String(expr.String()),
		ExpressionAttributeNames: u.names,
	}
	if len(u.cond) > 0 {
		in.ConditionExpression = aws.String(strings.Join(u.cond, " AND "))
	}
	if len(u.values) > 0 {
		in.ExpressionAttributeValues = u.values
	}
	if u.allNew {
		in.ReturnValues = types.ReturnValueAllNew
	}
	return in
}

// itemTTL is the lifetime a write gives the item: the longest of what its
// parts ask and of what any limit asked of this store so far, so that a
// write of a short-lived limit does not cut the life of a longer one's
// state in the same item.
func (s *Store) itemTTL(ttl time.Duration) time.Duration {
	for {
		old := s.longestTTL.Load()
		if int64(ttl) <= old {
			return time.Duration(old)
		}
		if s.longestTTL.CompareAndSwap(old, int64(ttl)) {
			return ttl
		}
	}
}

// part is one limit's share of a write to an item: what a single-step
// method sends, as clauses of a shared UpdateItem.
type part interface {
	// next adds this attempt's clauses to u, computed from the state last
	// seen, or reports that there is nothing to write (the part's answer
	// is final). It may read first (a GetItem). Its error ends the part.
	next(ctx context.Context, u *update) (write bool, err error)
	// written gets the item after a successful write (ALL_NEW; nil when
	// no part asked for it) and makes the part's answer; it may send
	// follow-up requests (a late window writer's move, a cleanup).
	written(ctx context.Context, item map[string]types.AttributeValue) error
	// lost gets the item returned by a failed condition (ALL_OLD; nil: no
	// item): the part takes it as the state last seen and returns true to
	// write again, or false to end with err (nil: done, nothing to write).
	// The condition that failed may be another part's.
	lost(old map[string]types.AttributeValue) (retry bool, err error)
	// result is the part's answer.
	result() storage.StepResult
}

// denier is a part that may be decided by the store alone: a bucket or
// log take whose denial denies the caller's batch.
type denier interface {
	// denied reports that the part finished with a denial that denies the
	// batch (a take that is not Shadow, denied on the server's state).
	denied() bool
}

// skippable is a part that takes units the caller gives back when its
// batch is denied: when another part of the same write is denied
// (denier), it is not sent (StepResult.NotApplied).
type skippable interface {
	// skip marks the part not applied, or reports false when it must be
	// sent all the same (a Shadow step's take).
	skip() bool
}

// writeItem writes the parts to item pk in the package's conditional-write
// loop ([writer.conditional]): one UpdateItem with every part's clauses,
// each part's conditions ANDed; on a failed condition every part takes the
// item returned as its state and the write is tried again with the parts
// still to write. When a part is denied on the store's state (a take that
// denies the batch), the takes of the other parts that have not been
// written are not sent (skippable) when there are several. Each part's
// answer or error is in the part.
func (s *Store) writeItem(ctx context.Context, pk string, ps []part, errs []error) {
	what := "item " + pk
	active := make([]bool, len(ps))
	for i := range active {
		active[i] = true
	}
	in := make([]int, 0, len(ps))
	w := s.writer()
	for lost := 0; ; {
		var u *update
		if u, in = nextWrite(ctx, ps, active, errs, in[:0]); len(in) == 0 {
			return
		}
		req := s.input(pk, u)
		req.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
		out, err := w.client.UpdateItem(ctx, req, w.optFns...)
		if err == nil {
			for _, i := range in {
				errs[i] = ps[i].written(ctx, out.Attributes)
			}
			return
		}
		old, failed := conditionFailed(err)
		if !failed {
			err = mapError(what, err)
			for _, i := range in {
				errs[i] = err
			}
			return
		}
		if !lostTo(old, ps, in, active, errs) {
			return
		}
		if w.lost != nil {
			w.lost.Add(1)
		}
		lost++
		if err := w.backoff(ctx, what, lost); err != nil {
			for i := range ps {
				if active[i] {
					errs[i] = err
				}
			}
			return
		}
	}
}

// nextWrite builds the update of the active parts (each part's clauses,
// its conditions ANDed) and appends to in the parts it writes. A part
// with nothing to write is no longer active; when one of them is denied
// on the store's state and the write has several parts, the takes not
// written yet are not sent (skippable).
func nextWrite(ctx context.Context, ps []part, active []bool, errs []error, in []int) (*update, []int) {
	u := newUpdate()
	denied := false
	for i, p := range ps {
		if !active[i] {
			continue
		}
		write, err := p.next(ctx, u)
		switch {
		case err != nil:
			errs[i], active[i] = err, false
		case !write:
			active[i] = false
			if d, ok := p.(denier); ok && d.denied() {
				denied = true
			}
		default:
			in = append(in, i)
		}
	}
	if !denied || len(ps) <= 1 {
		return u, in
	}
	// The batch is denied: the takes not written yet need not be (Decide
	// would give them back).
	kept := in[:0]
	for _, i := range in {
		if sk, ok := ps[i].(skippable); ok && sk.skip() {
			active[i] = false
			continue
		}
		kept = append(kept, i)
	}
	if len(kept) < len(in) {
		// Clauses of skipped parts are in u: build it again.
		in = kept
		u = newUpdate()
		for _, i := range in {
			if _, err := ps[i].next(ctx, u); err != nil {
				errs[i], active[i] = err, false
			}
		}
	}
	return u, in
}

// lostTo hands old, the item a failed condition returned, to the parts
// written (in), and reports whether any is to be tried again; the others
// are done, with their error.
func lostTo(old map[string]types.AttributeValue, ps []part, in []int, active []bool, errs []error) (retry bool) {
	for _, i := range in {
		r, err := ps[i].lost(old)
		if !r {
			errs[i], active[i] = err, false
		}
		retry = retry || r
	}
	return retry
}

// writeOne writes one part (a single-step call) and returns its error.
func (s *Store) writeOne(ctx context.Context, pk string, p part) error {
	var errs [1]error
	s.writeItem(ctx, pk, []part{p}, errs[:])
	return errs[0]
}

// attrs is the part of an item that belongs to one limit: its attributes
// are those whose names start with pre.
type attrs struct {
	pk, pre string
}

// own reports whether name is one of the limit's attributes, and returns
// it without the prefix.
func (a attrs) own(name string) (string, bool) {
	if len(name) <= len(a.pre) || name[:len(a.pre)] != a.pre {
		return "", false
	}
	return name[len(a.pre):], true
}

// cacheKey is the key of the limit's remembered state.
func (a attrs) cacheKey() string { return a.pk + "\x00" + a.pre }

// itemSize is the size of item as DynamoDB counts it (about).
func itemSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, av := range item {
		n += len(name) + valueSize(av)
	}
	return n
}
