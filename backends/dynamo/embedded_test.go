package dynamo_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// embedded is the embedded rules' limits (functions/authz/rules.yaml) as
// the policy builds them on a DynamoDB store: per-ip a sliding window of
// 600 a minute (Auto: packed, 160 slots) and a bucket of 50 refilled 1
// every 100 ms on the key "per-ip:<ip>", per-token a window of 1200 a
// minute on "per-token:<hash>". split puts each limit on its own key
// Name: one item and one UpdateItem per limit, the layout and cost before
// items were merged per key.
type embedded struct {
	ipWin, ipBucket, tokWin limiter.Limiter
	ip, tok                 string
	split                   bool
}

func newEmbedded(t testing.TB, s *dynamo.Store, split bool) *embedded {
	e := &embedded{split: split, ip: "per-ip:" + limitertest.Key(t), tok: "per-token:" + limitertest.Key(t)}
	var err1, err2, err3 error
	e.ipWin, err1 = limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "per-minute", Limit: 600, Window: time.Minute, MaxCost: 1})
	e.ipBucket, err2 = limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "burst", MaxAmount: 50, RefillTime: 100 * time.Millisecond})
	e.tokWin, err3 = limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1200, Window: time.Minute, MaxCost: 1})
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// items is one request's batch, with a token or without.
func (e *embedded) items(token bool) []limiter.Item {
	bucketKey := e.ip
	if e.split {
		bucketKey += "/burst"
	}
	its := []limiter.Item{{Limit: e.ipWin, Key: e.ip, N: 1}, {Limit: e.ipBucket, Key: bucketKey, N: 1}}
	if token {
		its = append(its, limiter.Item{Limit: e.tokWin, Key: e.tok, N: 1})
	}
	return its
}

// decide decides one request at now and returns whether it was allowed.
func (e *embedded) decide(t testing.TB, ctx context.Context, now time.Time, token bool) bool {
	t.Helper()
	items := e.items(token)
	out := make([]limiter.Outcome, len(items))
	i, err := limiter.Decide(ctx, now, items, out)
	if err != nil {
		t.Fatal(err)
	}
	for j := range out {
		if out[j].Err != nil {
			t.Fatalf("item %d: %v", j, out[j].Err)
		}
	}
	return i >= 0 && out[i].Decision.Allowed
}

// The embedded rules cost one write per key per request, counted at the
// client's wire (every HTTP request the SDK sends) with the write units
// DynamoDB Local reports: an allowed request 1 UpdateItem without a token
// and 2 with one (distinct keys); a request the bucket denies 1 (the
// failed conditional write: the windows' takes are not sent); one a
// window denies 1 and 1 refund for the key's limits together. Write units:
// 1 per write while the per-ip item is under 1 KB (a client with traffic
// in a minority of the window's 160 slots), 2 once it has traffic in
// every slot (the packed window alone holds about 114 counters, 1.9 KB).
func TestWriteUnitsEmbeddedRules(t *testing.T) {
	s, r, c := newStore(t, dynamo.Config{WaitRefunds: true})
	r.consumed = true
	ctx := testCtx(t)
	// Write units are also counted where DynamoDB bills them: at the
	// shared cap proxy in front of Local (testserver.CapProxy), which also
	// bills the failed conditional write that Local reports nothing for.
	proxy := testserver.DynamoDBCap(t)
	if proxy == nil {
		t.Skip("the cap proxy is off (SLUICE_TEST_DYNAMODB_CAP=off): write units are counted there")
	}
	var keys []string // the items of the current measure, by pk
	proxyWU := func() float64 {
		var sum float64
		for _, pk := range keys {
			sum += proxy.KeyStats(tableName, pk).WriteUnits
		}
		return sum
	}
	type cost struct {
		reqs, wcuMilli int64
		fails          int64   // attempts that failed (lost races), each retried
		wu             float64 // at the proxy
	}
	measure := func(f func()) cost {
		r0, w0, f0, p0 := r.total.Load(), r.wcuMilli.Load(), r.failed.Load(), proxyWU()
		f()
		return cost{r.total.Load() - r0, r.wcuMilli.Load() - w0, r.failed.Load() - f0, proxyWU() - p0}
	}
	useKeys := func(e *embedded) {
		keys = []string{dynamo.ItemKey(storage.Key{Name: e.ip}), dynamo.ItemKey(storage.Key{Name: e.tok})}
	}
	per := func(c cost, n int) string {
		return fmt.Sprintf("%.2f requests, %.2f WCU (Local), %.2f WCU (proxy)", float64(c.reqs)/float64(n), float64(c.wcuMilli)/1000/float64(n), c.wu/float64(n))
	}
	e := newEmbedded(t, s, false)
	useKeys(e)
	// A light client: a request every 2 s.
	const light = 30
	got := measure(func() {
		for i := range light {
			if !e.decide(t, ctx, base.Add(time.Duration(i)*2*time.Second), i%2 == 1) {
				t.Fatalf("request %d denied", i)
			}
		}
	})
	t.Logf("allowed, light client (half with a token): %s per request; per-ip item %d bytes", per(got, light), itemSize(get(t, c, dynamo.ItemKey(storage.Key{Name: e.ip}))))
	if want := int64(light + light/2); got.reqs != want || got.wcuMilli != 1000*want || got.wu != float64(want) {
		t.Errorf("%d requests for %d WCU (Local), %.1f WCU (proxy), want %d and %d (1 without a token, 2 with one)", got.reqs, got.wcuMilli/1000, got.wu, want, want)
	}

	// The bucket denies: 50 more at one stamp, then one denied (the
	// next ones the deny cache answers, without a request).
	at := base.Add(time.Hour)
	for range 50 {
		e.decide(t, ctx, at, false)
	}
	got = measure(func() {
		if e.decide(t, ctx, at, false) {
			t.Fatal("allowed past the bucket")
		}
	})
	t.Logf("denied by the bucket: %s (the failed conditional write; DynamoDB bills 1 WCU for it, Local reports none)", per(got, 1))
	if got.reqs != 1 || got.wu != 1 {
		t.Errorf("%d requests, %.1f WCU at the proxy for a denial by the bucket, want 1 and 1 (the failed condition is billed)", got.reqs, got.wu)
	}

	// A busy client: a request every 375 ms (one per packed slot) for 3
	// windows: the per-ip item at its largest.
	e2 := newEmbedded(t, s, false)
	useKeys(e2)
	for i := range 2 * limiter.DefaultSlots {
		e2.decide(t, ctx, base.Add(time.Duration(i)*375*time.Millisecond), false)
	}
	const busy = 100
	got = measure(func() {
		for i := range busy {
			e2.decide(t, ctx, base.Add(time.Duration(2*limiter.DefaultSlots+i)*375*time.Millisecond), false)
		}
	})
	t.Logf("allowed, busy client (a request every slot): %s per request; per-ip item %d bytes", per(got, busy), itemSize(get(t, c, dynamo.ItemKey(storage.Key{Name: e2.ip}))))
	// One request per decision, and one more for each attempt that failed
	// (a lost race, retried: seen 2 in 100 once under heavy load), which
	// DynamoDB bills at the item's size (2 WCU here) and Local reports
	// as nothing.
	local := float64(got.wcuMilli) / 1000
	if got.reqs-got.fails != busy || got.wu < local || got.wu > local+2*float64(got.fails) {
		t.Errorf("%d requests (%d failed attempts) for %d decisions, want one each; %.1f WCU at the proxy, %.1f reported by Local, want the same plus at most 2 per failed attempt",
			got.reqs, got.fails, busy, got.wu, local)
	}

	// A window denies: a window of 3 beside the bucket, same shape.
	w3, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "w3", Limit: 3, Window: time.Minute, MaxCost: 1, NoDenyCache: true})
	e3 := newEmbedded(t, s, false)
	e3.ipWin = w3
	useKeys(e3)
	for i := range 3 {
		e3.decide(t, ctx, base.Add(time.Duration(i)*time.Second), false)
	}
	got = measure(func() {
		if e3.decide(t, ctx, base.Add(4*time.Second), false) {
			t.Fatal("allowed past the window")
		}
	})
	t.Logf("denied by the window: %s (the take, and one refund for the window and the bucket)", per(got, 1))
	if got.reqs != 2 || got.wcuMilli != 2000 || got.wu != 2 {
		t.Errorf("%d requests for %.1f WCU (Local), %.1f WCU (proxy), want 2 and 2", got.reqs, float64(got.wcuMilli)/1000, got.wu)
	}
}

// BenchmarkEmbeddedRules: one allowed request with the embedded rules
// (with a token: the per-ip item and the per-token item), each iteration
// alternating with one raw UpdateItem; p50 of each and their ratio.
// Merged keeps the per-ip window and bucket in one item (one UpdateItem
// per key, two in parallel); Split puts each limit in its own item (three
// UpdateItems in parallel: the design before). Requests and write units
// (ReturnConsumedCapacity) per decision. A request every 375 ms of stamps
// (every packed slot), after 400 of warm-up.
func BenchmarkEmbeddedRules(b *testing.B) {
	for _, mode := range []string{"Merged", "Split"} {
		for _, token := range []bool{false, true} {
			name := mode + "/NoToken"
			if token {
				name = mode + "/Token"
			}
			b.Run(name, func(b *testing.B) {
				s, r, client := newStore(b, dynamo.Config{})
				r.consumed = true
				e := newEmbedded(b, s, mode == "Split")
				ctx := context.Background()
				rawKey := limitertest.Key(b)
				stamp := func(i int) time.Time { return base.Add(time.Duration(i) * 375 * time.Millisecond) }
				for i := range 400 {
					e.decide(b, ctx, stamp(i), token)
					if err := rawUpdate(ctx, client, rawKey); err != nil {
						b.Fatal(err)
					}
				}
				var reqs, wcuMilli int64
				dec, raw := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := range b.N {
					r0, w0 := r.total.Load(), r.wcuMilli.Load()
					t0 := time.Now()
					if !e.decide(b, ctx, stamp(400+i), token) {
						b.Fatal("denied")
					}
					t1 := time.Now()
					reqs, wcuMilli = reqs+r.total.Load()-r0, wcuMilli+r.wcuMilli.Load()-w0
					if err := rawUpdate(ctx, client, rawKey); err != nil {
						b.Fatal(err)
					}
					dec, raw = append(dec, t1.Sub(t0)), append(raw, time.Since(t1))
				}
				b.StopTimer()
				reportP50(b, "decision", dec, raw)
				b.ReportMetric(float64(reqs)/float64(b.N), "requests/decision")
				b.ReportMetric(float64(wcuMilli)/1000/float64(b.N), "wcu/decision")
			})
		}
	}
}
