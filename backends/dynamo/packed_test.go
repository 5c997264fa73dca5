package dynamo_test

import (
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// The packed tests' geometry: the default resolution (160 slots) of 10 ms
// slots, a window of 1.6 s; level boundaries every 4, 16, 64 and 256
// slots.
const (
	pR   = limiter.DefaultSlots
	pLen = 10 * time.Millisecond
)

var pKeep = storage.PackedKeep(pR)

// pT0 is the first slot at or after base that starts a level-4 counter.
func pT0() int64 { return (base.UnixNano()/int64(pLen) + 255) &^ 255 }

// packedStore is a store with its packed ops on one key.
type packedStore struct {
	t  *testing.T
	r  int // resolution (slots per window)
	s  *dynamo.Store
	c  *dynamodb.Client
	k  storage.Key
	pk string
}

func newPacked(t *testing.T, s *dynamo.Store, c *dynamodb.Client) *packedStore {
	k := storage.Key{Space: "swp:test", Name: limitertest.Key(t)}
	return &packedStore{t: t, r: pR, s: s, c: c, k: k, pk: dynamo.ItemKey(k)}
}

func (p *packedStore) add(f, n int64) (storage.PackedOp, storage.PackedCounts) {
	p.t.Helper()
	op := storage.PackedPlan(f, p.r, n, pLen)
	c, err := p.s.AddPacked(testCtx(p.t), p.k, &op)
	if err != nil {
		p.t.Fatalf("add %d at slot %d: %v", n, f, err)
	}
	return op, c
}

func (p *packedStore) sub(f, n int64) {
	p.t.Helper()
	op := storage.PackedPlan(f, p.r, n, pLen)
	if err := p.s.SubPacked(testCtx(p.t), p.k, &op); err != nil {
		p.t.Fatalf("sub %d at slot %d: %v", n, f, err)
	}
}

// total is the count in the view of slot f (a read).
func (p *packedStore) total(f int64) int64 {
	p.t.Helper()
	op, c := p.add(f, 0)
	if c.Stale {
		p.t.Fatalf("a read at slot %d answered Stale", f)
	}
	return storage.PackedTotal(&op, p.r, &c)
}

// counters returns the item's counter attributes as decimal strings.
func (p *packedStore) counters() map[string]string {
	p.t.Helper()
	out := map[string]string{}
	for name, av := range get(p.t, p.c, p.pk) {
		if name == "pk" || name == "ttl" {
			continue
		}
		nv, ok := av.(*types.AttributeValueMemberN)
		if !ok {
			p.t.Fatalf("attribute %q is %T", name, av)
		}
		out[name] = nv.Value
	}
	return out
}

// set writes a counter's stored value directly.
func (p *packedStore) set(c storage.PackedCell, v string) {
	p.t.Helper()
	_, err := p.c.UpdateItem(testCtx(p.t), &dynamodb.UpdateItemInput{
		TableName: aws.String(tableName), Key: item{"pk": str(p.pk)},
		UpdateExpression:          aws.String("SET #c = :v"),
		ExpressionAttributeNames:  map[string]string{"#c": pName(c)},
		ExpressionAttributeValues: item{":v": n(v)},
	})
	if err != nil {
		p.t.Fatal(err)
	}
}

func cell(f int64, l int) storage.PackedCell {
	idx, _ := storage.PackedField(f, l)
	return storage.PackedCell{Level: uint8(l), Index: idx}
}

func fieldShift(f int64, l int) uint {
	_, fld := storage.PackedField(f, l)
	return uint(storage.PackedFieldBits * fld)
}

// The store's values: one Number attribute per (level, index) holding the
// sum of its packed deltas; reads see exactly the view; a refund subtracts
// exactly, never creates a counter, skips one that is gone and clamps a
// counter that holds less than the refund per field.
func TestPackedValues(t *testing.T) {
	s, _, c := newStore(t, dynamo.Config{})
	p := newPacked(t, s, c)
	t0 := pT0()
	if got := p.total(t0); got != 0 {
		t.Fatalf("a fresh key reads %d", got)
	}
	p.sub(t0, 1) // a refund on nothing creates nothing
	if it := get(t, c, p.pk); it != nil {
		t.Fatalf("a refund created %v", it)
	}
	_, cs := p.add(t0-1, 2)
	for l := 1; l <= storage.PackedLevels; l++ {
		want := uint64(2) << fieldShift(t0-1, l)
		if cs.Added[l-1] != want {
			t.Fatalf("level %d after the first add: %#x, want %#x", l, cs.Added[l-1], want)
		}
		if got := p.counters()[pName(cell(t0-1, l))]; got != strconv.FormatUint(want, 10) {
			t.Fatalf("level %d attribute holds %q, want %d", l, got, want)
		}
	}
	if got := len(p.counters()); got != storage.PackedLevels {
		t.Fatalf("the item holds %d counters after one add, want one per level", got)
	}
	p.add(t0-1, 3)
	p.add(t0, 7)
	for _, c := range []struct{ f, want int64 }{{t0, 12}, {t0 + 160, 7}, {t0 + 161, 0}, {t0 - 161, 5}} {
		if got := p.total(c.f); got != c.want {
			t.Fatalf("view of t0%+d holds %d, want %d", c.f-t0, got, c.want)
		}
	}
	p.sub(t0-1, 3)
	if got := p.total(t0); got != 9 {
		t.Fatalf("after a refund of 3: %d, want 9", got)
	}

	// A carry out of the top field: the stored number passes 2^64 (it does
	// not wrap), the store answers it modulo 2^64, as a wrapping counter
	// would, and the refund borrows it back exactly.
	f := t0 + 3*64 // field 3 of its level-4 counter
	top := cell(f, 4)
	p.set(top, strconv.FormatUint(65535<<48, 10))
	op, cs := p.add(f, 2)
	if got, want := cs.Added[3], uint64(1)<<48; got != want {
		t.Fatalf("level 4 after a carry out of the top field: %#x, want %#x", got, want)
	}
	want := new(big.Int).Lsh(big.NewInt(65537), 48).String()
	if got := p.counters()[pName(top)]; got != want {
		t.Fatalf("stored %s, want %s (no wrap in the item)", got, want)
	}
	if err := s.SubPacked(testCtx(t), p.k, &op); err != nil {
		t.Fatal(err)
	}
	if got := p.counters()[pName(top)]; got != strconv.FormatUint(65535<<48, 10) {
		t.Fatalf("after the refund: %s, want 65535<<48", got)
	}

	// A refund on counters that lost what it gives back (removed, or
	// removed and created again): the one that is gone stays gone, one
	// that holds less is taken down field by field, the others exactly.
	g := t0 + 16*5 + 4*2 + 1 // fields 1 at level 2 and 2 at level 3
	p.add(g, 4)
	if _, err := c.UpdateItem(testCtx(t), &dynamodb.UpdateItemInput{
		TableName: aws.String(tableName), Key: item{"pk": str(p.pk)},
		UpdateExpression:         aws.String("REMOVE #c"),
		ExpressionAttributeNames: map[string]string{"#c": pName(cell(g, 1))},
	}); err != nil {
		t.Fatal(err)
	}
	low := uint64(9) << (fieldShift(g, 2) - 16) // field 0 of level 2
	p.set(cell(g, 2), strconv.FormatUint(low|1<<fieldShift(g, 2), 10))
	before3, _ := strconv.ParseUint(p.counters()[pName(cell(g, 3))], 10, 64)
	p.sub(g, 4)
	after := p.counters()
	if v, ok := after[pName(cell(g, 1))]; ok {
		t.Fatalf("a refund created the removed level-1 counter again (%s)", v)
	}
	if got := after[pName(cell(g, 2))]; got != strconv.FormatUint(low, 10) {
		t.Fatalf("level 2 after a refund of 4 on a field of 1: %s, want %d (the field at 0, the others kept)", got, low)
	}
	if got := after[pName(cell(g, 3))]; got != strconv.FormatUint(before3-4<<fieldShift(g, 3), 10) {
		t.Fatalf("level 3 after the refund: %s, want %d", got, before3-4<<fieldShift(g, 3))
	}
}

// numberSize is DynamoDB's size of a number: one byte per two significant
// digits, plus one.
func numberSize(v string) int {
	digits := []byte{}
	for i := 0; i < len(v); i++ {
		if v[i] >= '0' && v[i] <= '9' {
			digits = append(digits, v[i])
		}
	}
	for len(digits) > 1 && digits[0] == '0' {
		digits = digits[1:]
	}
	for len(digits) > 1 && digits[len(digits)-1] == '0' {
		digits = digits[:len(digits)-1]
	}
	return (len(digits)+1)/2 + 1
}

// packedItemSize is the item's size as DynamoDB counts it: names plus
// values (a number: its significant digits, two per byte, plus one).
func packedItemSize(it item) int {
	size := 0
	for name, av := range it {
		size += len(name)
		switch v := av.(type) {
		case *types.AttributeValueMemberN:
			size += numberSize(v.Value)
		case *types.AttributeValueMemberS:
			size += len(v.Value)
		}
	}
	return size
}

// Steady traffic: after each add the item holds exactly the counters that
// cover a slot with traffic in [keep bound, newest] (the keep bound is
// 4*floor(newest/4) - Keep), every older one removed by the add itself,
// with no extra request. The largest item is logged: at the default 160
// slots with traffic in every slot it passes 1 KB (2 WCU) and stays under
// 2 KB; at 64 slots it stays under 1 KB. The cases (keys of their own,
// one request at a time each) run in parallel, with each other and with
// TestLeaseRingMatchesMemory (one call at a time too). Three more run
// with SLUICE_LONG=1 (docs/testing.md): the same removals at sizes
// between those of the others (every slot with small counts, every
// second slot, 96 slots).
func TestPackedRemoval(t *testing.T) {
	t.Parallel()
	type removalCase struct {
		r, every int
		perSlot  int64
		limit    int // bytes
	}
	cases := []removalCase{{pR, 1, 50, 2048}, {pR, 8, 1, 1024}, {64, 1, 50, 1024}}
	if testserver.Long() {
		cases = append(cases, removalCase{pR, 1, 1, 2048}, removalCase{pR, 2, 1, 2048}, removalCase{96, 1, 1, 1400})
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("r=%d/every=%d/n=%d", c.r, c.every, c.perSlot), func(t *testing.T) {
			t.Parallel()
			s, r, dc := newStore(t, dynamo.Config{})
			r.consumed = true
			p := newPacked(t, s, dc)
			p.r = c.r
			keep := storage.PackedKeep(c.r)
			t0 := pT0()
			largest, counters, maxWCU := 0, 0, 0.0
			for f := t0; f < t0+3*int64(c.r)+40; f += int64(c.every) {
				w0 := r.wcuMilli.Load()
				p.add(f, c.perSlot)
				maxWCU = max(maxWCU, float64(r.wcuMilli.Load()-w0)/1000)
				from := f&^3 - keep
				want := map[string]bool{}
				for g := max(t0, from-256); g <= f; g++ {
					if (g-t0)%int64(c.every) == 0 {
						for l := 1; l <= storage.PackedLevels; l++ {
							if x := cell(g, l); x.Last() >= from {
								want[pName(x)] = true
							}
						}
					}
				}
				it := get(t, dc, p.pk)
				got := map[string]bool{}
				for name := range it {
					if name != "pk" && name != "ttl" {
						got[name] = true
					}
				}
				if len(got) != len(want) {
					t.Fatalf("after an add at t0%+d the item holds %d counters, want %d", f-t0, len(got), len(want))
				}
				for name := range want {
					if !got[name] {
						t.Fatalf("after an add at t0%+d the item lacks %q", f-t0, name)
					}
				}
				if sz := packedItemSize(it); sz > largest {
					largest, counters = sz, len(got)
				}
			}
			if st := s.Stats(); st.Cleanups != 0 || st.PackedStale != 0 {
				t.Fatalf("steady traffic made extra requests: %+v", st)
			}
			t.Logf("r=%d, traffic every %d slots, %d per add: largest item %d bytes (%d counters, key %d bytes), largest write %.0f WCU",
				c.r, c.every, c.perSlot, largest, counters, len(p.pk), maxWCU)
			if largest > c.limit {
				t.Fatalf("largest item %d bytes, want at most %d", largest, c.limit)
			}
		})
	}
}

// A writer past the horizon answers Stale and changes nothing (the
// counters it created again are removed, the others get their values
// back); one exactly at the horizon is exact. A store that does not answer
// Stale admits a writer whose view it has lost: more than the limit in one
// window.
func TestPackedStale(t *testing.T) {
	s, _, c := newStore(t, dynamo.Config{})
	p := newPacked(t, s, c)
	t0 := pT0()
	for f := t0; f <= t0+400; f += 3 {
		p.add(f, 1)
	}
	newest := t0 + 399
	before := p.counters()
	for _, late := range []int64{newest - pKeep - 4, newest - 200, newest - 170, t0 - 500} {
		op, cs := p.add(late, 1)
		if !cs.Stale || cs.Added != ([storage.PackedLevels]uint64{}) {
			t.Fatalf("a writer %d slots behind the newest: %+v, want Stale and nothing added", newest-late, cs)
		}
		if after := p.counters(); !mapsEqual(after, before) {
			t.Fatalf("a Stale add (%d behind, naming %v) changed the item:\nbefore %v\nafter  %v", newest-late, op.Adds, before, after)
		}
	}
	if got := s.Stats().PackedStale; got != 4 {
		t.Fatalf("Stats.PackedStale %d, want 4", got)
	}
	// Reads past the horizon are Stale too.
	op := storage.PackedPlan(newest-200, pR, 0, pLen)
	if cs, err := s.AddPacked(testCtx(t), p.k, &op); err != nil || !cs.Stale {
		t.Fatalf("a read past the horizon: %+v, %v", cs, err)
	}
	// Exactly at the horizon (161 behind): never Stale, its view exact.
	h := newest - storage.PackedHorizon(pR)
	want := int64(0)
	for f := t0; f <= t0+400; f += 3 {
		if f >= h-pR && f <= (h+pR)|63 {
			want++
		}
	}
	op, cs := p.add(h, 1)
	if cs.Stale {
		t.Fatal("a writer at the horizon answered Stale")
	}
	if got := storage.PackedTotal(&op, pR, &cs); got != want+1 {
		t.Fatalf("a writer at the horizon reads %d, want %d", got, want+1)
	}

	for _, broken := range []bool{false, true} {
		s, _, _ := newStore(t, dynamo.Config{})
		if broken {
			dynamo.BreakPacked(s, 0, true)
		}
		w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 3, Window: pR * pLen, Representation: limiter.Packed, NoDenyCache: true})
		if err != nil {
			t.Fatal(err)
		}
		key := limitertest.Key(t)
		at := func(f int64) time.Time { return time.Unix(0, f*int64(pLen)) }
		if d, err := w.AllowN(testCtx(t), key, at(t0), 3); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
		if d, err := w.Allow(testCtx(t), key, at(t0+600)); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
		// Slots t0 and t0+1 are in one window: a fourth unit there is over
		// the limit.
		d, err := w.Allow(testCtx(t), key, at(t0+1))
		if err != nil {
			t.Fatal(err)
		}
		if !broken && d.Allowed {
			t.Fatalf("a writer past the horizon, next to 3 units of a limit of 3, was allowed: %+v", d)
		}
		if broken && !d.Allowed {
			t.Fatalf("the broken store (no Stale) denied the late writer: this test proves nothing")
		}
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// One request per decision, counted at the wire: an allowed decision,
// punctual or late within the horizon, is one UpdateItem; a denied one is
// its UpdateItem and the refund of its own take (sent without waiting); a
// refund is one UpdateItem; a writer past the horizon two (its add and the
// undo). No read.
func TestPackedOneRequest(t *testing.T) {
	wire := newWireCounter(t, sharedEndpoint(t))
	s, err := dynamo.New(newClient(wire.srv.URL), dynamo.Config{Table: tableName})
	if err != nil {
		t.Fatal(err)
	}
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 5, Window: pR * pLen, Representation: limiter.Packed, NoDenyCache: true})
	if err != nil {
		t.Fatal(err)
	}
	key := limitertest.Key(t)
	t0 := pT0()
	at := func(f int64) time.Time { return time.Unix(0, f*int64(pLen)+3) }
	step := func(what string, f int64, allowed bool, requests int64) {
		t.Helper()
		before, fails := wire.total.Load(), wire.failed.Load()
		d, err := w.Allow(testCtx(t), key, at(f))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if err := s.WaitRefunds(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		if d.Allowed != allowed {
			t.Fatalf("%s: %+v, want allowed=%v", what, d, allowed)
		}
		if got := wire.total.Load() - before; got != requests || wire.failed.Load() != fails {
			t.Fatalf("%s: %d requests (%d failed conditions), want %d", what, got, wire.failed.Load()-fails, requests)
		}
	}
	step("first", t0+100, true, 1)
	step("second", t0+110, true, 1)
	step("newer", t0+200, true, 1)
	step("late within the horizon", t0+150, true, 1)
	step("later", t0+201, true, 1)
	step("at the limit", t0+201, false, 2)
	before := wire.total.Load()
	if err := w.Refund(testCtx(t), key, at(t0+200), 1); err != nil {
		t.Fatal(err)
	}
	if got := wire.total.Load() - before; got != 1 {
		t.Fatalf("a refund: %d requests, want 1", got)
	}
	step("past the horizon", t0+30, false, 2)
	if wire.get.Load() != 0 {
		t.Fatalf("%d reads", wire.get.Load())
	}
	if st := s.Stats(); st.PackedStale != 1 || st.LostRefunds != 0 {
		t.Fatalf("%+v, want one Stale add", st)
	}
}

// TestHistoryPacked runs the history checker on the packed sliding window
// (limitertest.PackedScenario: arrivals reordered across slot and level
// boundaries) on DynamoDB Local, with the limit lowered so that its
// requests reach it (see historyScenarios), by 16 goroutines: with 64,
// under load most calls queued past the horizon (answered Stale, they
// check nothing). TestHistoryFailsBrokenPacked shows the checker fails a
// broken store.
func TestHistoryPacked(t *testing.T) {
	if testing.Short() {
		t.Skip("the history checker takes seconds")
	}
	r := &requests{}
	s, err := dynamo.New(newClient(sharedEndpoint(t), r.middleware, narrow), dynamo.Config{Table: tableName})
	if err != nil {
		t.Fatal(err)
	}
	limitertest.RunHistory(t, s, limitertest.HistoryOptions{Scenarios: []limitertest.Scenario{packedScenario()}, Workers: packedWorkers})
	st := s.Stats()
	t.Logf("%d requests (%d failed); %d Stale, %d cleanups, %d conflicts", r.load(), r.failed.Load(), st.PackedStale, st.Cleanups, st.Conflicts)
}

// packedWorkers is how many goroutines the packed history runs use: only a
// late writer within the horizon, on a window at its limit, checks the
// packed protocol, and 64 queued past the horizon under load.
const packedWorkers = 16

// packedScenario is limitertest.PackedScenario with a limit DynamoDB Local
// reaches under packedWorkers goroutines, and delays up to 200 ms (80
// slots, half the horizon): late writers reach deep into the horizon,
// where a store that removes what they need loses the oldest slots of
// their views.
func packedScenario() limitertest.Scenario {
	sc := limitertest.PackedScenario()
	c := *sc.Sliding
	c.Limit = 30
	sc.Sliding = &c
	sc.MaxDelay = 200 * time.Millisecond
	return sc
}

// TestHistoryFailsBrokenPacked shows the checker fails a DynamoDB store
// that removes counters a window too early (it keeps only the newest
// writer's view, as the window item did at a7cc8dc): a late writer within
// the horizon then misses the oldest slots of its view. Only a late writer
// within the horizon, on a window at its limit, exposes it, so the test
// makes those calls itself, in that order (lateWriterHistory), rather than
// waiting for random delays to make them: runs of 16 goroutines on the
// wall clock caught the broken store on 15 of 16 seeds alone but 2 of
// about 42 at loads above 23, where DynamoDB Local answered too few calls,
// too late. The correct store passes the same history.
func TestHistoryFailsBrokenPacked(t *testing.T) {
	if testing.Short() {
		t.Skip("needs DynamoDB Local")
	}
	cfg := *packedScenario().Sliding
	cfg.NoDenyCache = true
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "correct", true: "early"}[broken], func(t *testing.T) {
			s, _, _ := newStore(t, dynamo.Config{})
			if broken {
				dynamo.BreakPacked(s, pR, false)
			}
			calls := lateWriterHistory(t, s, cfg)
			v := limitertest.CheckTrailingWindow(calls, cfg.Limit, cfg.Window)
			t.Logf("%d calls, %d windows over the limit", len(calls), len(v))
			switch {
			case broken && len(v) == 0:
				t.Fatalf("the checker passed a store that removes counters a window early")
			case !broken && len(v) > 0:
				t.Fatalf("the correct store over the limit: %v", v[0])
			case broken:
				t.Logf("as expected, first: %v", v[0])
			}
		})
	}
}

// lateWriterHistory makes, on one new key per late writer, the calls that
// expose a store that loses a late writer's oldest slots, through a
// packed sliding window of cfg (160 slots), and returns them as a
// history. In slots from t0, the start of a level-4 counter (256 slots):
// the limit admitted at 240; newest writers every 4 slots from 400 to 420
// (an add removes counters behind its keep bound: 420 - 321 for a correct
// store, which keeps level-4 counter 0; a broken one's 420 - 161 reaches
// past it); then a late writer at 260 to 380, within the horizon (161) of
// the newest, whose view holds slot 240, read in level-4 counter 0: it
// must be denied.
func lateWriterHistory(t *testing.T, s *dynamo.Store, cfg limiter.SlidingWindowConfig) []limitertest.Call {
	t.Helper()
	w, err := limiter.NewSlidingWindow(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r := w.Config().Slots; r != pR {
		t.Fatalf("%d slots, want %d", r, pR)
	}
	slot := cfg.Window / pR
	t0 := time.Now().Truncate(256 * slot)
	var calls []limitertest.Call
	allow := func(key string, at int64) {
		t.Helper()
		stamp := t0.Add(time.Duration(at) * slot)
		d, err := w.AllowN(testCtx(t), key, stamp, 1)
		if err != nil {
			t.Fatalf("%s at slot %d: %v", key, at, err)
		}
		calls = append(calls, limitertest.Call{Key: key, Stamp: stamp, Cost: 1, Allowed: d.Allowed, Remaining: d.Remaining})
	}
	for _, late := range []int64{260, 300, 340, 380} {
		key := limitertest.Key(t)
		for range cfg.Limit {
			allow(key, 240)
		}
		for at := int64(400); at <= 420; at += 4 {
			allow(key, at)
		}
		allow(key, late)
	}
	return calls
}

// A damaged counter (not a Number, or not a count) gives an error wrapping
// ErrCorruptState that names it, whether the op adds to it or only reads
// it, and the item is left as it was.
func TestPackedCorrupt(t *testing.T) {
	s, _, c := newStore(t, dynamo.Config{})
	t0 := pT0()
	f := t0 + 100
	op := storage.PackedPlan(f, pR, 1, pLen)
	added := pName(op.Adds[1].Cell)
	var read string
	for _, r := range op.Reads[:op.NReads] {
		if r != op.Adds[0].Cell && r != op.Adds[1].Cell && r != op.Adds[2].Cell && r != op.Adds[3].Cell {
			read = pName(r)
			break
		}
	}
	if read == "" {
		t.Fatal("the op reads only counters it adds to")
	}
	for _, tc := range []struct {
		name, attr string
		v          types.AttributeValue
		want       string
	}{
		{"added counter a string", added, str("7"), "want a Number, got a String"},
		{"read counter a string", read, str("7"), "want a Number, got a String"},
		{"added counter negative", added, n("-5"), "want a count"},
		{"read counter fractional", read, n("2.5"), "want a count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPacked(t, s, c)
			put(t, c, p.pk, item{tc.attr: tc.v})
			before := get(t, c, p.pk)
			_, err := s.AddPacked(testCtx(t), p.k, &op)
			if !errors.Is(err, storage.ErrCorruptState) || !strings.Contains(err.Error(), tc.attr) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v; want ErrCorruptState naming %q: %s", err, tc.attr, tc.want)
			}
			if after := get(t, c, p.pk); !reflect.DeepEqual(after[tc.attr], before[tc.attr]) {
				t.Fatalf("the damaged attribute changed from %v to %v", before[tc.attr], after[tc.attr])
			}
		})
	}
}

// pName is the attribute name of counter c of newPacked's window.
func pName(c storage.PackedCell) string { return dynamo.Attr("swp:test", dynamo.PackedName(c)) }
