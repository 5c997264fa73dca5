package dynamo

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter/storage"
)

const windowKind = "window"

// Sub-window counters are top-level Number attributes named by their index
// modulo slotModulus, in five base64url characters (30 bits): names are
// short (a full view of 61 counters stays well under 1 KB) and an index only
// aliases an older one 2^30 sub-windows later (12 days at the smallest
// sub-window of 1 ms), long after the old one has been removed.
const (
	slotBits    = 30
	slotModulus = 1 << slotBits
	slotChars   = 5
	slotAlpha   = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
)

const (
	// knownOld is how many sub-windows just behind the view and the horizon
	// every Add removes by name (cur-span-horizon, and the one before):
	// enough for a key with traffic in most sub-windows.
	knownOld = 2
	// maxRemove bounds the names removed by one request.
	maxRemove = 64
	// cleanupStale is the number of stale counters in an item (left by gaps
	// in traffic that knownOld does not cover) from which Add removes them
	// at once with a second request instead of at this process's next Add.
	cleanupStale = 8
)

// slotName is the attribute name of sub-window idx.
func slotName(idx int64) string {
	v := uint32(mod(idx, slotModulus))
	var b [slotChars]byte
	for i := slotChars - 1; i >= 0; i-- {
		b[i] = slotAlpha[v&63]
		v >>= 6
	}
	return string(b[:])
}

// parseSlot returns the slot number of a counter attribute name, or false
// for other names.
func parseSlot(name string) (int64, bool) {
	if len(name) != slotChars {
		return 0, false
	}
	var v int64
	for i := 0; i < slotChars; i++ {
		j := strings.IndexByte(slotAlpha, name[i])
		if j < 0 {
			return 0, false
		}
		v = v<<6 | int64(j)
	}
	return v, true
}

// windowState is what the store remembers of a window item: the names of
// stale counters it saw, to remove at its next Add.
type windowState struct {
	stale []string
}

// Positions of a counter relative to the writer's sub-window (position).
const (
	posLater = -1 // newer than cur
	posStale = -2 // older than the view and the horizon: removable
	posHeld  = -3 // older than the view, within the horizon: kept, not read
)

// position classifies slot relative to sub-window cur with a view of span:
// 0 <= j < span for sub-window cur-j, posLater for a sub-window newer than
// cur (never removed: a clock behind the others' never frees what they
// counted), posHeld for one a writer up to the horizon behind cur may still
// need, posStale for an older one. With 30-bit slots, "newer" means by less
// than 2^29 sub-windows. d is how many sub-windows slot is behind cur
// (negative: ahead).
func position(slot, cur int64, span int) (pos int, d int64) {
	d = mod(mod(cur, slotModulus)-slot, slotModulus)
	switch {
	case d < int64(span):
		return int(d), d
	case d >= slotModulus/2:
		return posLater, d - slotModulus
	case d < int64(span)+storage.Horizon(span):
		return posHeld, d
	}
	return posStale, d
}

// Add implements [storage.Counter]: one UpdateItem that adds n to the
// counter of sub-window cur, removes counters that are past every writer's
// view and horizon, sets the TTL and returns the whole item (ALL_NEW), from
// which the counts are read. A writer past the horizon (the item holds a
// counter more than storage.Horizon(span) sub-windows newer than cur) moves
// its add with a second UpdateItem (see moveBack). n == 0 is a consistent
// read.
func (s *Store) Add(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration) (storage.Counts, error) {
	return s.add(ctx, k, cur, span, n, ttl, 0)
}

// AddFenced implements [storage.Fencer]: Add whose UpdateItem also has
// the condition that the limit's fence attribute is absent or at most
// fence (docs/fence.md). A failed condition whose item shows a fence
// above it is answered ErrFenced, never retried.
func (s *Store) AddFenced(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration, fence int64) (storage.Counts, error) {
	return s.add(ctx, k, cur, span, n, ttl, fence)
}

// add is Add, fenced when fence > 0 and n > 0.
func (s *Store) add(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration, fence int64) (storage.Counts, error) {
	if span < 1 || span > storage.MaxSpan || n < 0 {
		return storage.Counts{}, fmt.Errorf("dynamo: bad window add (span %d, n %d)", span, n)
	}
	a, err := s.attrsOf(k)
	if err != nil {
		return storage.Counts{}, err
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	if err := s.waitRefunds(ctx, a.pk); err != nil {
		return storage.Counts{}, err
	}
	if n == 0 {
		s.counter.reads.Add(1)
		out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
			TableName: s.table, Key: keyAttr(a.pk), ConsistentRead: aws.Bool(true),
		}, s.optFns...)
		if err != nil {
			return storage.Counts{}, mapError("window read", err)
		}
		ic, err := decodeCounts(a, out.Item, cur, span)
		return ic.Counts, err
	}
	p := &windowAdd{s: s, a: a, cur: cur, span: span, n: n, ttl: ttl, fence: fence}
	err = s.writeOne(ctx, a.pk, p)
	return p.res.Counts, err
}

// windowAdd is a window's add as a part of a write (Add).
type windowAdd struct {
	s      *Store
	a      attrs
	cur    int64
	span   int
	n      int64
	ttl    time.Duration
	fence  int64 // Step.Fence: 0 for none
	shadow bool  // a Shadow step: never skipped
	res    storage.StepResult
}

func (p *windowAdd) next(_ context.Context, u *update) (bool, error) {
	cname := p.a.pre + slotName(p.cur)
	c := u.name(cname)
	u.add = append(u.add, c+" "+u.num(p.n))
	u.cond = append(u.cond, "(attribute_not_exists("+c+") OR attribute_type("+c+", "+u.typeN()+"))")
	if p.fence > 0 && !p.s.brokenFence {
		f := u.name(p.a.pre + attrFence)
		u.cond = append(u.cond, "(attribute_not_exists("+f+") OR "+f+" <= "+u.num(p.fence)+")")
	}
	u.keepTTL(p.ttl)
	u.allNew = true
	horizon := storage.Horizon(p.span)
	for i := int64(0); i < knownOld; i++ {
		u.removeAttr(p.a.pre + slotName(p.cur-int64(p.span)-horizon-i))
	}
	if v, ok := p.s.cache.get(p.a.cacheKey()); ok {
		removed := knownOld
		for _, name := range v.(windowState).stale {
			if slot, ok := parseSlot(name[len(p.a.pre):]); ok && removed < maxRemove {
				if pos, _ := position(slot, p.cur, p.span); pos == posStale && name != cname {
					u.removeAttr(name)
					removed++
				}
			}
		}
	}
	return true, nil
}

func (p *windowAdd) written(ctx context.Context, item map[string]types.AttributeValue) error {
	s, a := p.s, p.a
	ic, err := decodeCounts(a, item, p.cur, p.span)
	if err != nil {
		s.cache.remove(a.cacheKey())
		return err
	}
	if ic.ahead > storage.Horizon(p.span) {
		// Our clock is so far behind the newest writer's that counters
		// of our view may be gone: move the add to the oldest sub-window
		// of the newest writer's view, so it is counted, never free.
		ic = s.moveBack(ctx, a, p.cur, p.cur+ic.ahead-int64(p.span)+1, p.span, p.n)
	}
	switch {
	case len(ic.stale) == 0:
		s.cache.remove(a.cacheKey())
	case len(ic.stale) >= cleanupStale || ic.size > ItemBudget*3/4:
		s.cleanup(ctx, a, ic.stale)
	default:
		s.cache.put(a.cacheKey(), windowState{stale: ic.stale})
	}
	p.res.Counts = ic.Counts
	return nil
}

func (p *windowAdd) lost(old map[string]types.AttributeValue) (bool, error) {
	p.s.cache.remove(p.a.cacheKey())
	if p.fence > 0 {
		// A fence above ours failed the condition, or would on a retry
		// (a fence never goes down): refused, not a lost race.
		if f, err := fenceOf(p.a, old); err != nil || f > p.fence {
			return false, cmp.Or(err, fmt.Errorf("dynamo: window %s: add fenced at %d, item's fence %d: %w", p.a.pk, p.fence, f, storage.ErrFenced))
		}
	}
	// Only a counter of the wrong type fails this part's condition.
	if _, err := decodeCounts(p.a, old, p.cur, p.span); err != nil {
		return false, err
	}
	name := p.a.pre + slotName(p.cur)
	if av, ok := old[name]; ok {
		if _, isN := av.(*types.AttributeValueMemberN); !isN {
			return false, corrupt(windowKind, p.a.pk, name, "not a Number")
		}
	}
	return true, nil
}

func (p *windowAdd) skip() bool {
	p.res.NotApplied = !p.shadow
	return p.res.NotApplied
}
func (p *windowAdd) result() storage.StepResult { return p.res }

// moveBack moves n from the counter of sub-window from to that of to, on
// condition that from still holds n, and returns the item as seen from to,
// with every newer counter in Later (a writer from past the horizon is
// judged against all of it). If the move fails (another writer removed the
// counter of from, or the request failed), what was added at from is
// counted nowhere a punctual writer reads, so the call must not be
// admitted: the counts returned then deny it (Later saturated, and the
// limiter judges a moved writer against Later).
func (s *Store) moveBack(ctx context.Context, a attrs, from, to int64, span int, n int64) itemCounts {
	s.counter.moves.Add(1)
	denied := itemCounts{Counts: storage.Counts{Later: 1<<63 - 1, Moved: true, At: from}}
	out, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       keyAttr(a.pk),
		UpdateExpression:          aws.String("ADD #a :m, #b :n"),
		ConditionExpression:       aws.String("#a >= :n AND (attribute_not_exists(#b) OR attribute_type(#b, :N))"),
		ExpressionAttributeNames:  map[string]string{"#a": a.pre + slotName(from), "#b": a.pre + slotName(to)},
		ExpressionAttributeValues: map[string]types.AttributeValue{":m": numAttr(-n), ":n": numAttr(n), ":N": &types.AttributeValueMemberS{Value: "N"}},
		ReturnValues:              types.ReturnValueAllNew,
	}, s.optFns...)
	if err != nil {
		return denied
	}
	ic, err := decodeCounts(a, out.Attributes, to, span)
	if err != nil {
		return denied
	}
	ic.Later = ic.laterAll
	ic.Moved, ic.At = true, to
	return ic
}

// cleanup removes stale counters (full attribute names) from an item at
// once. It is best effort: on failure the names are remembered for the
// next Add.
func (s *Store) cleanup(ctx context.Context, a attrs, stale []string) {
	s.counter.cleanups.Add(1)
	stale = stale[:min(len(stale), maxRemove)]
	names := map[string]string{"#k": AttrPK}
	var expr strings.Builder
	writeRemove(&expr, names, stale)
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyAttr(a.pk),
		UpdateExpression:         aws.String(expr.String()),
		ConditionExpression:      aws.String("attribute_exists(#k)"),
		ExpressionAttributeNames: names,
	}, s.optFns...)
	if _, lost := conditionFailed(err); err == nil || lost {
		s.cache.remove(a.cacheKey())
		return
	}
	s.cache.put(a.cacheKey(), windowState{stale: stale})
}

// itemCounts is a window item as seen from one sub-window.
type itemCounts struct {
	storage.Counts
	// stale lists the counters (full attribute names) older than the view
	// and the horizon.
	stale []string
	// ahead is how many sub-windows the newest non-zero counter is ahead
	// of cur (0 when none is).
	ahead int64
	// laterAll is the total of every counter newer than cur.
	laterAll int64
	// size is the whole item's size as DynamoDB counts it (about).
	size int
}

// decodeCounts reads the window's counters (a's attributes) of item as
// seen from sub-window cur: Counts.Later totals the storage.Ahead(span)
// sub-windows after cur.
func decodeCounts(a attrs, item map[string]types.AttributeValue, cur int64, span int) (ic itemCounts, err error) {
	ahead := storage.Ahead(span)
	for name, av := range item {
		ic.size += len(name) + valueSize(av)
		short, ok := a.own(name)
		if !ok {
			continue
		}
		slot, ok := parseSlot(short)
		if !ok {
			continue
		}
		v, err := slotCount(a.pk, name, av)
		if err != nil {
			return ic, err
		}
		switch pos, d := position(slot, cur, span); pos {
		case posLater:
			ic.laterAll = satAdd(ic.laterAll, v)
			if -d <= ahead {
				ic.Later = satAdd(ic.Later, v)
			}
			if v > 0 {
				ic.ahead = max(ic.ahead, -d)
			}
		case posStale:
			ic.stale = append(ic.stale, name)
		case posHeld:
		default:
			ic.C[pos] += v
		}
	}
	return ic, nil
}

// slotCount reads the count of the counter attribute name, or an error
// wrapping storage.ErrCorruptState when it is not a non-negative Number.
func slotCount(pk, name string, av types.AttributeValue) (int64, error) {
	nv, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return 0, corrupt(windowKind, pk, name, "want a Number, got %s", typeName(av))
	}
	v, err := strconv.ParseInt(nv.Value, 10, 64)
	if err != nil || v < 0 {
		return 0, corrupt(windowKind, pk, name, "want a count, got %q", nv.Value)
	}
	return v, nil
}

// satAdd adds counts, saturating instead of overflowing.
func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return 1<<63 - 1
}

// Sub implements [storage.Counter]: one UpdateItem that subtracts n from
// the counter of sub-window idx on condition that it holds at least n. When
// it holds less, the counter is set to zero with a condition on the value
// the failed write returned, so it never goes below zero.
func (s *Store) Sub(ctx context.Context, k storage.Key, idx int64, n int64) error {
	if n < 0 {
		return fmt.Errorf("dynamo: bad window sub (n %d)", n)
	}
	if n == 0 {
		return nil
	}
	a, err := s.attrsOf(k)
	if err != nil {
		return err
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	return s.writeOne(ctx, a.pk, &windowSub{a: a, name: a.pre + slotName(idx), n: n, take: n})
}

// windowSub is a window's refund as a part of a write (Sub).
type windowSub struct {
	a       attrs
	name    string
	n, take int64
	exact   bool // take is what the counter holds: condition on = take
}

func (p *windowSub) next(_ context.Context, u *update) (bool, error) {
	c, t := u.name(p.name), u.num(p.take)
	u.add = append(u.add, c+" "+u.num(-p.take))
	if p.exact {
		u.cond = append(u.cond, c+" = "+t)
	} else {
		u.cond = append(u.cond, c+" >= "+t)
	}
	return true, nil
}

func (p *windowSub) written(context.Context, map[string]types.AttributeValue) error { return nil }

func (p *windowSub) lost(old map[string]types.AttributeValue) (bool, error) {
	av, ok := old[p.name]
	if !ok {
		return false, nil // nothing counted there (expired, or never written)
	}
	v, err := slotCount(p.a.pk, p.name, av)
	if err != nil {
		return false, err
	}
	if v == 0 {
		return false, nil
	}
	// Take what is there, on condition that it is still there.
	p.take = min(p.n, v)
	p.exact = p.take < p.n
	return true, nil
}

func (p *windowSub) result() storage.StepResult { return storage.StepResult{} }

// valueSize is the size DynamoDB counts for a value (roughly, for the
// document types).
func valueSize(av types.AttributeValue) int {
	switch v := av.(type) {
	case *types.AttributeValueMemberN:
		return len(v.Value)/2 + 1
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberB:
		return len(v.Value)
	}
	return 8
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// writeRemove appends "REMOVE #r0, #r1, ..." for the attribute names to
// expr, registering the placeholders in names.
func writeRemove(expr *strings.Builder, names map[string]string, attrs []string) {
	expr.WriteString("REMOVE ")
	for i, name := range attrs {
		ph := "#r" + strconv.Itoa(i)
		names[ph] = name
		if i > 0 {
			expr.WriteString(", ")
		}
		expr.WriteString(ph)
	}
}
