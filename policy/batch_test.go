package policy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/storage"
)

// countingStore counts the store requests of a memory store: Adds and Subs
// of windows, bucket updates.
type countingStore struct {
	*memory.Store
	adds, subs, buckets atomic.Int64
}

func (c *countingStore) Add(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration) (storage.Counts, error) {
	c.adds.Add(1)
	return c.Store.Add(ctx, k, cur, span, n, ttl)
}

func (c *countingStore) Sub(ctx context.Context, k storage.Key, idx, n int64) error {
	c.subs.Add(1)
	return c.Store.Sub(ctx, k, idx, n)
}

func (c *countingStore) UpdateBucket(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration) (storage.Decision, error) {
	c.buckets.Add(1)
	return c.Store.UpdateBucket(ctx, k, op, ttl)
}

func (c *countingStore) requests() int64 { return c.adds.Load() + c.subs.Load() + c.buckets.Load() }

const twoRules = `
rules:
  - name: per-ip
    key: "{ip}"
    limits:
      - {algorithm: sliding_window, limit: 100, window: 1m}
      - {algorithm: token_bucket, max_amount: 50, refill_time: 1s}
  - name: tight
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 2, window: 1m}]
`

func newCounting(t *testing.T) *countingStore {
	t.Helper()
	m, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &countingStore{Store: m}
}

// TestDenyCache checks the deny cache through Evaluate: once the store
// denies a key, the same key is denied with reason "cache" and no store
// request, the other rules are skipped (nothing taken), until RetryAfter.
func TestDenyCache(t *testing.T) {
	cs := newCounting(t)
	// Without capacity leases: the same stamps again and again make the
	// keys hot, and a lease's return is a store request of its own.
	p := mustLoad(t, twoRules, Options{Stores: map[string]storage.Store{"memory": cs}, NoLeases: true})
	r := get("192.0.2.7", "/")
	for i := range 2 {
		if res := p.Evaluate(t.Context(), r, t0); res.Outcome != Allow || res.Reason != ReasonLimit {
			t.Fatalf("request %d: %v (%s)", i, res.Outcome, res.Reason)
		}
	}
	res := p.Evaluate(t.Context(), r, t0)
	if res.Outcome != Deny || res.Rule != "tight" || res.Reason != ReasonLimit {
		t.Fatalf("third: %v by %q (%s)", res.Outcome, res.Rule, res.Reason)
	}
	if !res.Evals[0].Refunded {
		t.Errorf("per-ip not refunded on the store's denial: %+v", res.Evals[0])
	}
	retry := res.Decision.RetryAfter
	before := cs.requests()
	for i := range 100 {
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		res = p.Evaluate(t.Context(), r, at)
		if res.Outcome != Deny || res.Reason != ReasonCache || res.Rule != "tight" || !res.Evals[1].Cached {
			t.Fatalf("cached %d: %v by %q (%s) %+v", i, res.Outcome, res.Rule, res.Reason, res.Evals[1])
		}
		if res.Evals[0].Outcome != Skipped {
			t.Fatalf("cached %d: per-ip %v, want skipped", i, res.Evals[0].Outcome)
		}
		if want := retry - time.Duration(i)*100*time.Millisecond; res.Decision.RetryAfter != want {
			t.Fatalf("cached %d: RetryAfter %v, want %v", i, res.Decision.RetryAfter, want)
		}
	}
	if got := cs.requests() - before; got != 0 {
		t.Errorf("%d store requests for 100 cached denials, want 0", got)
	}
	// The window rolls: the store is asked again and allows.
	res = p.Evaluate(t.Context(), r, t0.Add(retry))
	if res.Outcome != Allow || res.Reason != ReasonLimit {
		t.Fatalf("after RetryAfter: %v (%s)", res.Outcome, res.Reason)
	}
	if cs.requests() == before {
		t.Error("no store request after RetryAfter")
	}
	// Another key is not affected.
	if res := p.Evaluate(t.Context(), get("192.0.2.8", "/"), t0); res.Outcome != Allow {
		t.Fatalf("another key: %v", res.Outcome)
	}

	// Switched off, every denial reaches the store.
	cs = newCounting(t)
	p = mustLoad(t, twoRules, Options{Stores: map[string]storage.Store{"memory": cs}, NoDenyCache: true})
	for range 3 {
		p.Evaluate(t.Context(), r, t0)
	}
	before = cs.requests()
	res = p.Evaluate(t.Context(), r, t0)
	if res.Outcome != Deny || res.Reason != ReasonLimit || cs.requests() == before {
		t.Fatalf("cache off: %v (%s), %d store requests", res.Outcome, res.Reason, cs.requests()-before)
	}
}

// TestOneBatchReasons checks the reasons of the batch path: fail-open and
// fail-closed name themselves, and an allowed request says "limit".
func TestOneBatchReasons(t *testing.T) {
	stores := memStores(t)
	stores["down"] = &failing{err: storage.ErrUnavailable}
	p := mustLoad(t, `
rules:
  - name: open
    match: {paths: ["/open"]}
    key: "{ip}"
    limits: [{algorithm: sliding_window, limit: 5, window: 1m, backend: down}]
    fail: open
  - name: closed
    match: {paths: ["/closed"]}
    key: "{ip}"
    limits: [{algorithm: token_bucket, max_amount: 5, refill_time: 1s, backend: down}]
    fail: closed
`, Options{Stores: stores})
	if res := p.Evaluate(t.Context(), get("192.0.2.1", "/open"), t0); res.Outcome != Allow || res.Reason != ReasonFailOpen {
		t.Errorf("fail open: %v (%s)", res.Outcome, res.Reason)
	}
	if res := p.Evaluate(t.Context(), get("192.0.2.1", "/closed"), t0); res.Outcome != Deny || res.Reason != ReasonFailClosed {
		t.Errorf("fail closed: %v (%s)", res.Outcome, res.Reason)
	}
	if res := p.Evaluate(t.Context(), get("192.0.2.1", "/none"), t0); res.Outcome != Allow || res.Reason != ReasonNone {
		t.Errorf("no rule: %v (%s)", res.Outcome, res.Reason)
	}
}
