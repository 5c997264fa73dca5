package dynamo_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestFence runs the fence conformance suite (limitertest.RunFence) on
// DynamoDB Local, through the batch path too, merged writes included.
func TestFence(t *testing.T) {
	s, _, _ := newStore(t, dynamo.Config{})
	limitertest.RunFence(t, s)
}

// TestFenceHistory: 16 goroutines add to a window's counters, and take
// from a bucket (through its lease ring's writes and through its plain
// writes), with the old fence, arrivals reordered, while the fence is
// raised: none lands after RaiseFence returned, and every one answered
// nil is counted (limitertest.CheckFenceHistories); on a store whose
// fenced writes have no condition on the fence (dynamo.BreakFence) each
// history fails.
func TestFenceHistory(t *testing.T) {
	stores := map[limitertest.Store]*requests{}
	var mu sync.Mutex
	newFenced := func(t *testing.T) limitertest.Store {
		// A take past the store's timeout has an unknown outcome, which
		// ends a history (it can be neither counted nor left out): a
		// fresh-clone make test at loads of 12-15 ended the broken
		// bucket history so, one take past the default 1 s. The
		// histories are about the fence, not latency: 10 s, the
		// limitertest ops' bound.
		s, r, _ := newStore(t, dynamo.Config{Timeout: 10 * time.Second})
		mu.Lock()
		defer mu.Unlock()
		stores[s] = r
		return s
	}
	logf := func(s limitertest.Store) string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("%d requests, %d conflicts", stores[s].load(), s.(*dynamo.Store).Stats().Conflicts)
	}
	limitertest.CheckFenceHistories(t, newFenced, func(s limitertest.Store) { dynamo.BreakFence(s.(*dynamo.Store)) },
		limitertest.FenceHistoryOptions{Duration: 2 * time.Second}, logf)
}

// TestFenceWire measures at the cap proxy what a fenced add costs: as
// many requests and write units as an unfenced one (one UpdateItem, one
// unit, on a small item), and a refused one one request.
func TestFenceWire(t *testing.T) {
	checkFenceWire(t, "adds", "fw", true, func(k storage.Key, fence int64) storage.Step {
		return storage.Step{Kind: storage.StepAdd, Key: k, Idx: 100, Span: 3, N: 1, TTL: time.Minute, Fence: fence}
	})
}

// TestBucketFenceWire measures at the cap proxy what a fenced bucket take
// costs: as many requests and write units as an unfenced one, and a
// refused one one request.
func TestBucketFenceWire(t *testing.T) {
	now := time.Now().UnixNano()
	checkFenceWire(t, "takes", "bfw", false, func(k storage.Key, fence int64) storage.Step {
		op := storage.BucketOp{MaxAmount: 1000, RefillTime: time.Hour, RefillAmount: 1, Now: now, N: 1}
		return storage.Step{Kind: storage.StepBucket, Key: k, Bucket: op, TTL: time.Minute, Fence: fence}
	})
}

// checkFenceWire sends 20 steps (step with the key and a fence) unfenced
// on one key, then with fence 5 and fence 4 on a key whose fence was
// raised to 5, and compares their requests (at the cap proxy, and as the
// client sent them: retries included) and capacity units: a fenced step
// costs what an unfenced one does (with oneEach, exactly one request), a
// refused one exactly one request and one write unit (a failed condition
// is billed as a write), nothing read. The steps' answers are checked
// after their costs, so that a refused step that costs more (a retry, an
// extra read) fails the cost comparison whatever it was answered. ops
// names the steps, space the keys' spaces.
func checkFenceWire(t *testing.T, ops, space string, oneEach bool, step func(k storage.Key, fence int64) storage.Step) {
	t.Helper()
	proxy := testserver.DynamoDBCap(t)
	if proxy == nil {
		t.Skip("the cap proxy is off")
	}
	s, r, _ := newStore(t, dynamo.Config{})
	ctx := testCtx(t)
	const n = 20
	name := space + "-wire-" + time.Now().Format("150405.000000")
	plain, fenced := storage.Key{Space: space + "-plain", Name: name + "-p"}, storage.Key{Space: space + "-fenced", Name: name + "-f"}
	if err := s.RaiseFence(ctx, fenced, 5, time.Minute); err != nil {
		t.Fatal(err)
	}
	raise := proxy.KeyStats(tableName, dynamo.ItemKey(fenced))
	// answers counts a series' answers: nil, ErrFenced, anything else
	// (the first kept).
	type answers struct {
		ok, fenced, other int
		first             error
	}
	cost := func(k storage.Key, fence int64) (testserver.CapCounts, int64, answers) {
		before, req := proxy.KeyStats(tableName, dynamo.ItemKey(k)), r.load()
		var a answers
		for range n {
			var out [1]storage.StepResult
			s.Do(ctx, []storage.Step{step(k, fence)}, out[:])
			switch err := out[0].Err; {
			case err == nil:
				a.ok++
			case errors.Is(err, storage.ErrFenced):
				a.fenced++
			default:
				a.other++
				a.first = cmp.Or(a.first, err)
			}
		}
		after := proxy.KeyStats(tableName, dynamo.ItemKey(k))
		return testserver.CapCounts{Requests: after.Requests - before.Requests, WriteUnits: after.WriteUnits - before.WriteUnits,
			ReadUnits: after.ReadUnits - before.ReadUnits}, r.load() - req, a
	}
	p, preq, pa := cost(plain, 0)
	f, freq, fa := cost(fenced, 5)
	x, xreq, xa := cost(fenced, 4)
	t.Logf("%d %s: unfenced %d requests (%d sent) %.1f WCU %.1f RCU; fenced %d (%d) %.1f WCU %.1f RCU; refused %d (%d) %.1f WCU %.1f RCU; the raise %d request %.1f WCU",
		n, ops, p.Requests, preq, p.WriteUnits, p.ReadUnits, f.Requests, freq, f.WriteUnits, f.ReadUnits, x.Requests, xreq, x.WriteUnits, x.ReadUnits,
		raise.Requests, raise.WriteUnits)
	want, wantSent := p.Requests, preq
	if oneEach {
		want, wantSent = n, n
	}
	if f.Requests != want || freq != wantSent || f.WriteUnits != p.WriteUnits || f.ReadUnits != p.ReadUnits {
		t.Errorf("fenced %s cost %d requests (%d sent) %.1f WCU %.1f RCU: want what unfenced ones cost, %d (%d) %.1f WCU %.1f RCU",
			ops, f.Requests, freq, f.WriteUnits, f.ReadUnits, want, wantSent, p.WriteUnits, p.ReadUnits)
	}
	if x.Requests != n || xreq != n || x.WriteUnits != n || x.ReadUnits != 0 {
		t.Errorf("%d refused %s cost %d requests (%d sent) %.1f WCU %.1f RCU: want one request and one write unit each, %d (%d) %d.0 WCU 0.0 RCU",
			n, ops, x.Requests, xreq, x.WriteUnits, x.ReadUnits, n, n, n)
	}
	for _, c := range []struct {
		what string
		a    answers
		want answers
	}{{"unfenced", pa, answers{ok: n}}, {"fenced", fa, answers{ok: n}}, {"refused", xa, answers{fenced: n}}} {
		if c.a.ok != c.want.ok || c.a.fenced != c.want.fenced || c.a.other != 0 {
			t.Errorf("%s %s answered: %d nil, %d ErrFenced, %d other (first: %v); want %d nil, %d ErrFenced",
				c.what, ops, c.a.ok, c.a.fenced, c.a.other, c.a.first, c.want.ok, c.want.fenced)
		}
	}
}

// TestFenceDecide: a window (sub-window counters) and a token bucket on
// DynamoDB decide a fenced item through the store's batch path: below the
// raised fence Decide returns ErrFenced and nothing is taken (Peek, Get),
// at it the item is decided.
func TestFenceDecide(t *testing.T) {
	s, _, _ := newStore(t, dynamo.Config{})
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "fence", Limit: 100, Window: time.Minute, Representation: limiter.SubWindowCounters})
	if err != nil {
		t.Fatal(err)
	}
	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "bfence", MaxAmount: 100, RefillTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		limit interface {
			limiter.Limiter
			RaiseFence(ctx context.Context, key string, f int64) error
		}
		left func(ctx context.Context, key string, now time.Time) (limiter.Decision, error)
	}{
		{"window", w, w.Peek},
		{"bucket", b, b.Get},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, key, now := testCtx(t), c.name+"-fence-decide-"+time.Now().Format("150405.000000"), time.Now()
			decide := func(fence int64) error {
				var out [1]limiter.Outcome
				_, err := limiter.Decide(ctx, now, []limiter.Item{{Limit: c.limit, Key: key, N: 10, Fence: fence}}, out[:])
				if err == nil && !out[0].Decision.Allowed {
					err = errors.New("denied")
				}
				return err
			}
			if err := decide(1); err != nil {
				t.Fatal(err)
			}
			if err := c.limit.RaiseFence(ctx, key, 2); err != nil {
				t.Fatal(err)
			}
			if err := decide(1); !errors.Is(err, storage.ErrFenced) {
				t.Errorf("fence 1 after a raise to 2: %v, want ErrFenced", err)
			}
			if err := decide(2); err != nil {
				t.Errorf("fence 2: %v", err)
			}
			if d, err := c.left(ctx, key, now); err != nil || d.Remaining != 80 {
				t.Errorf("left: %v remaining %d, want 80 (two takes of 10, the fenced one not)", err, d.Remaining)
			}
		})
	}
}

// TestBucketFence runs the bucket fence conformance suite
// (limitertest.RunBucketFence) on DynamoDB Local: plain and lease takes
// (the lease ring's writes) fenced, reads, refunds and returns not,
// through the batch path and merged writes too.
func TestBucketFence(t *testing.T) {
	s, _, _ := newStore(t, dynamo.Config{})
	limitertest.RunBucketFence(t, s)
}
