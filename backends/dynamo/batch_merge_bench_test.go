package dynamo_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// The prototype of the merged item (docs/benchmarks.md, "One item per key:
// DynamoDB"), kept as the reference the store's merged write (Store) is
// compared with: the limits of a batch that share a key (Key.Name)
// live in ONE item, updated by ONE UpdateItem whose expression is the union
// of what each limit's single-step method sends today, with each limit's
// attribute names prefixed by a short hash of its space and the conditions
// ANDed. The store does not implement it: this prototype writes what such a
// store would send for a warm, busy key with the three limits of
// threeLimits (a sliding window of 20 sub-windows or a packed one at 160
// slots, a GCRA token bucket, a fixed window) and decides on the item it
// gets back, checking every count against what the decisions so far added,
// so a wrong expression fails the benchmark.

const (
	// mergeStep is the time between two decisions of a run: one slot of a
	// packed 1-minute window at 160 slots, 8 decisions per sub-window of a
	// 20-sub-window one: traffic in every slot and sub-window.
	mergeStep = time.Minute / limiter.DefaultSlots
	// mergeWarm decisions are made before the clock starts: more than the
	// 2*160+2 slots after which a packed item is at its largest, and the
	// 42 sub-windows (view and horizon) of the sub-window item.
	mergeWarm = 400
	// mergeTTLFloor is the shared item's TTL (see the design sketch).
	mergeTTLFloor = 24 * time.Hour

	mergeSpan  = limiter.DefaultSubWindows + 1 // a sub-window Add's span
	mergeSub   = time.Minute / limiter.DefaultSubWindows
	mergeFixed = time.Hour
	mergeMax   = 1 << 40 // the bucket's MaxAmount, as threeLimits
	mergeSlots = limiter.DefaultSlots
)

// The limit spaces of threeLimits (and its packed variant), as the limiter
// names them.
const (
	spaceSub    = "sw:1099511627776:1m0s:20"
	spacePacked = "swp:32767:1m0s:160:4"
	spaceBucket = "tb:1099511627776:1h0m0s:1"
	spaceFixed  = "fw:1099511627776:1h0m0s"
)

// mergePrefix is the attribute-name prefix of a limit space in a shared
// item: two base64url characters (12 bits) of its SHA-256.
func mergePrefix(space string) string {
	sum := sha256.Sum256([]byte(space))
	return base64.RawURLEncoding.EncodeToString(sum[:2])[:2]
}

func mergeStamp(i int) time.Time { return base.Add(time.Duration(i) * mergeStep) }

func mergeFloorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// merged is one process deciding the three limits of one key with ONE
// UpdateItem per decision on one item.
type merged struct {
	client     *dynamodb.Client
	pk         string
	packed     bool // the window is packed (160 slots), else 20 sub-windows
	updatedNew bool // ReturnValues UPDATED_NEW, reads named with if_not_exists
	noCond     bool // send no ConditionExpression (what the conditions cost)
	// calls are the durations of the UpdateItem calls alone (SDK and
	// server, without building the request and judging the answer).
	calls    []time.Duration
	w, bk, f string
	// The bucket as last seen (GCRA: base, tat; see bucket.go).
	base, tat int64
	created   bool
	// stale: window counters past every writer's view and horizon that
	// the last response showed, removed by the next request (as Add and
	// AddPacked do).
	stale []string
	// What the decisions so far added, per sub-window (slot) and per
	// fixed window, to check the answers against.
	win, fix map[int64]int64
	// size is the item's size in the last ALL_NEW response, as DynamoDB
	// counts it (about).
	size int
}

func newMerged(b *testing.B, c *dynamodb.Client, key string, packed, updatedNew bool) *merged {
	m := &merged{client: c, pk: "#/" + key, packed: packed, updatedNew: updatedNew,
		w: mergePrefix(spaceSub), bk: mergePrefix(spaceBucket), f: mergePrefix(spaceFixed),
		win: map[int64]int64{}, fix: map[int64]int64{}}
	if packed {
		m.w = mergePrefix(spacePacked)
	}
	if m.w == m.bk || m.w == m.f || m.bk == m.f {
		b.Fatalf("prefixes collide: %q %q %q", m.w, m.bk, m.f)
	}
	return m
}

// mergedReq is one decision's UpdateItem, built up limit by limit.
type mergedReq struct {
	names            map[string]string
	values           map[string]types.AttributeValue
	add, set, remove []string
	cond             []string
}

func (q *mergedReq) name(ph, attr string) string { q.names[ph] = attr; return ph }

// mergedDecision is what one request asks and how to read its answer.
type mergedDecision struct {
	in   *dynamodb.UpdateItemInput
	op   storage.PackedOp // the packed window's op
	cur  int64            // the window's sub-window or slot
	fcur int64            // the fixed window's window
	lvl  int64            // the bucket's level (RefillAmount*k)
}

// build returns the UpdateItem of a decision stamped now. staleBase makes
// the bucket's condition fail (the state it remembers is not the item's).
func (m *merged) build(now time.Time, staleBase bool) mergedDecision {
	t := now.UnixNano()
	q := &mergedReq{names: map[string]string{"#x": dynamo.AttrTTL}, values: map[string]types.AttributeValue{
		":one": n("1"), ":N": str("N"),
		// The TTL from the wall clock, as the store's (stamps are
		// in the past: DynamoDB Local does delete expired items).
		":x": n(strconv.FormatInt(time.Now().Add(mergeTTLFloor).Unix()+1, 10)),
	}}
	q.set = append(q.set, "#x = :x")
	if m.packed || m.updatedNew {
		q.values[":z"] = n("0")
	}
	var d mergedDecision
	var reads []string // names the window reads besides its adds (UPDATED_NEW)

	// The window: ADD to the mergedCounter(s) of its sub-window or slot, REMOVE
	// the ones just behind the view and horizon by name and the stale
	// ones the last response showed; condition: each added counter is
	// absent or a Number (packed: a non-negative one).
	if m.packed {
		f := mergeFloorDiv(t, int64(mergeStep))
		d.cur = f
		d.op = storage.PackedPlan(f, mergeSlots, 1, mergeStep)
		added := map[string]bool{}
		for i, a := range d.op.Adds {
			ph := q.name("#a"+strconv.Itoa(i), m.w+dynamo.PackedName(a.Cell))
			added[q.names[ph]] = true
			vp := ":d" + strconv.Itoa(i)
			q.values[vp] = n(strconv.FormatUint(a.Delta, 10))
			q.add = append(q.add, ph+" "+vp)
			q.cond = append(q.cond, fmt.Sprintf("(attribute_not_exists(%s) OR (attribute_type(%s, :N) AND %s >= :z))", ph, ph, ph))
		}
		from := f&^3 - d.op.Keep
		for l := 1; l <= storage.PackedLevels; l++ {
			idx := from >> (2 * l)
			for i := int64(1); i <= 2; i++ {
				m.removeName(q, m.w+dynamo.PackedName(storage.PackedCell{Level: uint8(l), Index: idx - i}))
			}
		}
		for _, c := range d.op.Reads[:d.op.NReads] {
			if name := m.w + dynamo.PackedName(c); !added[name] {
				reads = append(reads, name)
			}
		}
	} else {
		cur := mergeFloorDiv(t, int64(mergeSub))
		d.cur = cur
		q.add = append(q.add, q.name("#wc", m.w+dynamo.SlotName(cur))+" :one")
		q.cond = append(q.cond, "(attribute_not_exists(#wc) OR attribute_type(#wc, :N))")
		for i := int64(0); i < 2; i++ {
			m.removeName(q, m.w+dynamo.SlotName(cur-2*mergeSpan-i))
		}
		for j := int64(-(mergeSpan - 1)); j <= mergeSpan-1; j++ { // the view and Later
			if j != 0 {
				reads = append(reads, m.w+dynamo.SlotName(cur+j))
			}
		}
	}
	for _, name := range m.stale {
		if len(q.remove) < 64 {
			m.removeName(q, name)
		}
	}
	if m.updatedNew {
		// Make the counters the window reads appear in UPDATED_NEW.
		for i, name := range reads {
			ph := q.name("#v"+strconv.Itoa(i), name)
			q.set = append(q.set, ph+" = if_not_exists("+ph+", :z)")
		}
	}

	// The bucket: a take on the state last seen (writeTake), or the
	// create of the first decision (writeCreate on its own attribute: the
	// item exists for the other limits).
	q.name("#bb", m.bk+"b")
	q.name("#bt", m.bk+"t")
	if !m.created {
		q.values[":nb"], q.values[":a"] = n(strconv.FormatInt(t, 10)), n(strconv.FormatInt(-(mergeMax-1), 10))
		q.set = append(q.set, "#bb = :nb", "#bt = :a")
		q.cond = append(q.cond, "attribute_not_exists(#bt)")
	} else {
		k := mergeFloorDiv(t-m.base, int64(time.Hour))
		d.lvl = k // RefillAmount 1
		b := m.base
		if staleBase {
			b--
		}
		q.values[":bb"], q.values[":blo"], q.values[":bhi"] = n(strconv.FormatInt(b, 10)), n(strconv.FormatInt(d.lvl-mergeMax, 10)), n(strconv.FormatInt(d.lvl-1, 10))
		q.set = append(q.set, "#bt = #bt + :one")
		q.cond = append(q.cond, "#bb = :bb AND #bt BETWEEN :blo AND :bhi")
	}

	// The fixed window: a window Add of span 1.
	d.fcur = mergeFloorDiv(t, int64(mergeFixed))
	q.add = append(q.add, q.name("#fc", m.f+dynamo.SlotName(d.fcur))+" :one")
	q.cond = append(q.cond, "(attribute_not_exists(#fc) OR attribute_type(#fc, :N))")
	for i := int64(0); i < 2; i++ {
		m.removeName(q, m.f+dynamo.SlotName(d.fcur-2-i))
	}

	expr := "ADD " + strings.Join(q.add, ", ") + " SET " + strings.Join(q.set, ", ")
	if len(q.remove) > 0 {
		expr += " REMOVE " + strings.Join(q.remove, ", ")
	}
	rv := types.ReturnValueAllNew
	if m.updatedNew {
		rv = types.ReturnValueUpdatedNew
	}
	d.in = &dynamodb.UpdateItemInput{
		TableName:                           aws.String(tableName),
		Key:                                 item{"pk": str(m.pk)},
		UpdateExpression:                    aws.String(expr),
		ConditionExpression:                 aws.String(strings.Join(q.cond, " AND ")),
		ExpressionAttributeNames:            q.names,
		ExpressionAttributeValues:           q.values,
		ReturnValues:                        rv,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	return d
}

func (m *merged) removeName(q *mergedReq, name string) {
	for _, ph := range q.remove {
		if q.names[ph] == name {
			return
		}
	}
	q.remove = append(q.remove, q.name("#r"+strconv.Itoa(len(q.remove)), name))
}

// decide makes decision i (stamped mergeStamp(i)): one UpdateItem, then
// the three judgements on the item it returns, each checked against what
// the decisions so far added.
func (m *merged) decide(ctx context.Context, i int) error {
	now := mergeStamp(i)
	d := m.build(now, false)
	if m.noCond && m.created {
		d.in.ConditionExpression = nil
		for _, k := range []string{":N", ":bb", ":blo", ":bhi", ":z"} {
			delete(d.in.ExpressionAttributeValues, k)
		}
		delete(d.in.ExpressionAttributeNames, "#bb")
	}
	t0 := time.Now()
	out, err := m.client.UpdateItem(ctx, d.in)
	m.calls = append(m.calls, time.Since(t0))
	if cf := (*types.ConditionalCheckFailedException)(nil); errors.As(err, &cf) {
		return fmt.Errorf("decision %d: %w\n%s\nif %s\nnames %v\nold item %v", i, err, aws.ToString(d.in.UpdateExpression), aws.ToString(d.in.ConditionExpression), d.in.ExpressionAttributeNames, cf.Item)
	}
	if err != nil {
		return err
	}
	m.win[d.cur]++
	m.fix[d.fcur]++
	return m.judge(now, d, out.Attributes)
}

func mergedCounter(it item, name string) (uint64, error) {
	av, ok := it[name]
	if !ok {
		return 0, nil
	}
	nv, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return 0, fmt.Errorf("%s: not a Number", name)
	}
	return strconv.ParseUint(nv.Value, 10, 64)
}

func (m *merged) judge(now time.Time, d mergedDecision, it item) error {
	// The window: the estimate from the counters returned must be what
	// the decisions so far added in view (Bounded: every counter in view
	// in full), and within the limit.
	var got, want int64
	if m.packed {
		var c storage.PackedCounts
		var err error
		for l, a := range d.op.Adds {
			if c.Added[l], err = mergedCounter(it, m.w+dynamo.PackedName(a.Cell)); err != nil {
				return err
			}
		}
		for j, r := range d.op.Reads[:d.op.NReads] {
			if c.Read[j], err = mergedCounter(it, m.w+dynamo.PackedName(r)); err != nil {
				return err
			}
		}
		got = storage.PackedTotal(&d.op, mergeSlots, &c)
		for s := d.cur - mergeSlots; s <= d.cur+mergeSlots; s++ {
			want += m.win[s]
		}
		if a := storage.FieldOf(c.Added[0], int(d.cur&3)); a != uint64(m.win[d.cur]) {
			return fmt.Errorf("packed: slot %d holds %d, want %d", d.cur, a, m.win[d.cur])
		}
		if got > limiter.MaxPackedLimit {
			return fmt.Errorf("packed: denied at %d", got)
		}
	} else {
		for j := d.cur - (mergeSpan - 1); j <= d.cur+mergeSpan-1; j++ {
			v, err := mergedCounter(it, m.w+dynamo.SlotName(j))
			if err != nil {
				return err
			}
			got += int64(v)
			want += m.win[j]
		}
	}
	if got != want {
		return fmt.Errorf("window: the item holds %d in view, the decisions added %d", got, want)
	}
	// The bucket: tat is one more than last seen; tokens = level - tat.
	tv, ok := it[m.bk+"t"].(*types.AttributeValueMemberN)
	if !ok {
		return fmt.Errorf("bucket: no tat in %v", it)
	}
	tat, err := strconv.ParseInt(tv.Value, 10, 64)
	if err != nil {
		return err
	}
	switch {
	case !m.created:
		m.created, m.base = true, now.UnixNano()
	case tat != m.tat+1:
		return fmt.Errorf("bucket: tat %d after a take from %d", tat, m.tat)
	case d.lvl-tat < 0:
		return fmt.Errorf("bucket: %d tokens after an allowed take", d.lvl-tat)
	}
	m.tat = tat
	// The fixed window.
	fc, err := mergedCounter(it, m.f+dynamo.SlotName(d.fcur))
	if err != nil {
		return err
	}
	if int64(fc) != m.fix[d.fcur] {
		return fmt.Errorf("fixed window: %d counted, want %d", fc, m.fix[d.fcur])
	}
	if m.updatedNew {
		return nil
	}
	// The whole item: remember the window counters past every writer's
	// view and horizon, for the next request to remove.
	m.size = itemSize(it)
	m.stale = m.stale[:0]
	for name := range it {
		if !strings.HasPrefix(name, m.w) || len(name) != len(m.w)+5 {
			continue
		}
		if !m.live(name, d.cur) {
			m.stale = append(m.stale, name)
		}
	}
	return nil
}

// live reports whether the window counter name may still be read by a
// writer within the horizon of sub-window (slot) cur, the newest of this
// run. It parses the name (five base64url characters of a 30-bit value,
// see window.go and packed.go), as the store's decoders do.
func (m *merged) live(name string, cur int64) bool {
	const alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	var v int64
	for i := len(m.w); i < len(name); i++ {
		j := strings.IndexByte(alpha, name[i])
		if j < 0 {
			return true // not a counter: not ours to remove
		}
		v = v<<6 | int64(j)
	}
	// within reports whether x is in [lo, hi] modulo 2^bits.
	within := func(x, lo, hi int64, bits uint) bool {
		mod := int64(1) << bits
		return ((x-lo)%mod+mod)%mod <= hi-lo
	}
	if !m.packed {
		return within(v, cur-2*mergeSpan+1, cur+mergeSpan, 30)
	}
	l := int(v>>28) + 1
	from := cur&^3 - storage.PackedKeep(mergeSlots)
	return within(v&(1<<28-1), from>>(2*l), (cur+mergeSlots)>>(2*l), 28)
}

// failBucket sends decision i with a bucket state that is not the item's:
// the ANDed condition must fail, the item returned (ALL_OLD) must show
// which limit failed (the bucket alone), and neither window's add may
// have happened.
func (m *merged) failBucket(ctx context.Context, i int) error {
	d := m.build(mergeStamp(i), true)
	_, err := m.client.UpdateItem(ctx, d.in)
	var cf *types.ConditionalCheckFailedException
	if !errors.As(err, &cf) {
		return fmt.Errorf("a stale bucket state: want a failed condition, got %v", err)
	}
	old := cf.Item
	// Client side: each limit's own condition on the old item.
	bucketOK := false
	if bv, ok := old[m.bk+"b"].(*types.AttributeValueMemberN); ok {
		bucketOK = bv.Value == strconv.FormatInt(m.base-1, 10)
	}
	windowOK := true
	for _, name := range d.in.ExpressionAttributeNames {
		if av, ok := old[name]; ok && strings.HasPrefix(name, m.w) {
			if _, isN := av.(*types.AttributeValueMemberN); !isN {
				windowOK = false
			}
		}
	}
	if bucketOK || !windowOK {
		return fmt.Errorf("the failed condition is not the bucket's (bucket %v, windows %v)", bucketOK, windowOK)
	}
	after, err := m.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(tableName), Key: item{"pk": str(m.pk)}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return err
	}
	for _, name := range d.in.ExpressionAttributeNames {
		a, _ := mergedCounter(old, name)
		b, _ := mergedCounter(after.Item, name)
		if (strings.HasPrefix(name, m.w) || strings.HasPrefix(name, m.f)) && a != b {
			return fmt.Errorf("%s changed by a write whose condition failed: %d -> %d", name, a, b)
		}
	}
	return nil
}

// BenchmarkMergedItem: one allowed decision of three limits on a warm,
// busy key (threeLimits; a decision every 375 ms of stamps, so every slot
// and sub-window has traffic and the items are at their steady size), each
// iteration alternating with one raw UpdateItem; p50 of each and their
// ratio (target: at most 1.2), requests and write units
// (ReturnConsumedCapacity=TOTAL) per decision. Parallel is the store's Do
// on three keys (one item per limit, three UpdateItems at once: the
// design before items were merged); Store is the store's Do on one key
// (its merged write); AllNew is the merged
// prototype (one item, one UpdateItem, ReturnValues ALL_NEW); UpdatedNew
// the same with UPDATED_NEW and the counters the window reads named with
// SET #r = if_not_exists(#r, :z) so that they appear in it. SubWindows: the
// window has 20 sub-windows; Packed: 160 slots (the default
// representation), its item at its full size.
func BenchmarkMergedItem(b *testing.B) {
	for _, win := range []string{"SubWindows", "Packed"} {
		for _, mode := range []string{"Parallel", "Store", "AllNew", "UpdatedNew", "AllNewNoCondition"} {
			b.Run(win+"/"+mode, func(b *testing.B) { benchMerged(b, win == "Packed", mode) })
		}
	}
}

func benchMerged(b *testing.B, packed bool, mode string) {
	s, r, client := newStore(b, dynamo.Config{})
	r.consumed = true
	ctx := context.Background()
	rawKey := limitertest.Key(b)
	var decide func(i int) error
	var m *merged
	if mode == "Parallel" || mode == "Store" {
		items := threeLimits(b, s)
		if packed {
			items[0].Limit = mustB(limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "w", Limit: limiter.MaxPackedLimit, Window: time.Minute, Representation: limiter.Packed}))(b)
		}
		if mode == "Parallel" {
			// One key (item) per limit: three UpdateItems at once.
			for i := range items {
				items[i].Key += "/" + strconv.Itoa(i)
			}
		}
		out := make([]limiter.Outcome, len(items))
		decide = func(i int) error {
			if _, err := limiter.Decide(ctx, mergeStamp(i), items, out); err != nil {
				return err
			}
			for j := range out {
				if !out[j].Decision.Allowed || out[j].Err != nil {
					return fmt.Errorf("limit %d: %+v", j, out[j])
				}
			}
			return nil
		}
	} else {
		m = newMerged(b, client, limitertest.Key(b), packed, mode == "UpdatedNew")
		m.noCond = mode == "AllNewNoCondition"
		decide = func(i int) error { return m.decide(ctx, i) }
	}
	for i := range mergeWarm {
		if err := decide(i); err != nil {
			b.Fatal(err)
		}
		if err := rawUpdate(ctx, client, rawKey); err != nil {
			b.Fatal(err)
		}
	}
	var reqs, wcuMilli int64
	if m != nil {
		m.calls = m.calls[:0]
	}
	dec, raw := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		r0, w0 := r.total.Load(), r.wcuMilli.Load()
		t0 := time.Now()
		if err := decide(mergeWarm + i); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		reqs, wcuMilli = reqs+r.total.Load()-r0, wcuMilli+r.wcuMilli.Load()-w0
		if err := rawUpdate(ctx, client, rawKey); err != nil {
			b.Fatal(err)
		}
		dec, raw = append(dec, t1.Sub(t0)), append(raw, time.Since(t1))
	}
	b.StopTimer()
	if m != nil {
		if err := m.failBucket(ctx, mergeWarm+b.N); err != nil {
			b.Fatal(err)
		}
		if !m.updatedNew {
			b.ReportMetric(float64(m.size), "item-bytes")
		}
		b.ReportMetric(float64(p50(m.calls[:b.N]).Microseconds())/1000, "p50-updateitem-ms")
	}
	reportP50(b, "decision", dec, raw)
	b.ReportMetric(float64(reqs)/float64(b.N), "requests/decision")
	b.ReportMetric(float64(wcuMilli)/1000/float64(b.N), "wcu/decision")
}
