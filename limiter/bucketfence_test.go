package limiter_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

func fenceBucket(t *testing.T, s storage.BucketStore, max int64, leases bool) *limiter.TokenBucket {
	t.Helper()
	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: max, RefillTime: time.Hour, Leases: leases})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func bucketTokens(t *testing.T, b *limiter.TokenBucket, key string, at time.Time) int64 {
	t.Helper()
	d, err := b.Get(context.Background(), key, at)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// A fenced bucket item below the key's fence takes nothing: Decide
// returns an error wrapping storage.ErrFenced (also in the item's
// Outcome.Err), its Fail does not decide it, and what the batch's other
// items took is given back. At or above the fence, or unfenced, it
// passes; the fence never goes down; a fenced refusal caches no denial.
func TestBucketFenceDecide(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	b, other := fenceBucket(t, s, 100, false), capWindow(t, 100, false)
	at := time.Unix(1000, 0)
	allow := limiter.Decision{Allowed: true}
	if _, err := decideFenced(ctx, at, limiter.Item{Limit: b, Key: "k", N: 1, Fence: 1}); err != nil {
		t.Fatalf("fenced on a key without a fence: %v", err)
	}
	if err := b.RaiseFence(ctx, "k", 5); err != nil {
		t.Fatal(err)
	}
	out, err := decideFenced(ctx, at, limiter.Item{Limit: other, Key: "k", N: 3}, limiter.Item{Limit: b, Key: "k", N: 1, Fence: 3, Fail: &allow})
	if !errors.Is(err, storage.ErrFenced) || !errors.Is(out[1].Err, storage.ErrFenced) || out[1].Failed || out[1].Decision.Allowed {
		t.Fatalf("fenced below the key's fence: err %v, outcome %+v; want ErrFenced, not Failed, not allowed", err, out[1])
	}
	if !out[0].Refunded || peekRemaining(t, other, "k", at) != 100 || bucketTokens(t, b, "k", at) != 99 {
		t.Errorf("the batch's other take was not given back (%+v), or the fenced one taken: remaining %d and %d, want 100 and 99",
			out[0], peekRemaining(t, other, "k", at), bucketTokens(t, b, "k", at))
	}
	for _, f := range []int64{5, 6, 0} {
		if out, err := decideFenced(ctx, at, limiter.Item{Limit: b, Key: "k", N: 1, Fence: f}); err != nil || !out[0].Decision.Allowed {
			t.Errorf("fence %d against 5: %v %+v, want allowed", f, err, out[0])
		}
	}
	if err := b.RaiseFence(ctx, "k", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := decideFenced(ctx, at, limiter.Item{Limit: b, Key: "k", N: 1, Fence: 4}); !errors.Is(err, storage.ErrFenced) {
		t.Errorf("fence 4 after a raise to 2 over 5: %v, want ErrFenced (a raise never lowers)", err)
	}
	// An emptied bucket: the fenced refusal is not a denial, and caches none.
	if _, err := decideFenced(ctx, at, limiter.Item{Limit: b, Key: "k", N: 96, Fence: 5}); err != nil {
		t.Fatal(err)
	}
	if err := b.RaiseFence(ctx, "k", 9); err != nil {
		t.Fatal(err)
	}
	if _, err := decideFenced(ctx, at, limiter.Item{Limit: b, Key: "k", N: 1, Fence: 5}); !errors.Is(err, storage.ErrFenced) {
		t.Fatalf("fence 5 after a raise to 9: %v, want ErrFenced", err)
	}
	if out, err := decideFenced(ctx, at, limiter.Item{Limit: b, Key: "k", N: 1, Fence: 9}); err != nil || out[0].Decision.Allowed || out[0].Cached {
		t.Errorf("fence 9 on an empty bucket: %v %+v, want denied by the store, not cached", err, out[0])
	}
	// A refund is never fenced.
	if err := b.Refund(ctx, "k", at, 3); err != nil || bucketTokens(t, b, "k", at) != 3 {
		t.Errorf("refund after the raise: %v, %d tokens, want 3", err, bucketTokens(t, b, "k", at))
	}
}

// bucketFenceRecorder is the memory store, recording its fenced bucket
// lease takes and the fenced takes that landed below the raised fence.
type bucketFenceRecorder struct {
	*memory.Store
	mu                        sync.Mutex
	raised                    int64
	leaseTakes, refusedLeases int
	landedBelow               int
}

func (r *bucketFenceRecorder) UpdateBucketFenced(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration, fence int64) (storage.Decision, error) {
	r.mu.Lock()
	raised := r.raised
	r.mu.Unlock()
	d, err := r.Store.UpdateBucketFenced(ctx, k, op, ttl, fence)
	r.mu.Lock()
	defer r.mu.Unlock()
	if op.Mode == storage.ModeLease {
		r.leaseTakes++
		if errors.Is(err, storage.ErrFenced) {
			r.refusedLeases++
		}
	}
	if err == nil && op.Take() && fence < raised {
		r.landedBelow++
	}
	return d, err
}

func (r *bucketFenceRecorder) RaiseFence(ctx context.Context, k storage.Key, f int64, ttl time.Duration) error {
	err := r.Store.RaiseFence(ctx, k, f, ttl)
	r.mu.Lock()
	r.raised = max(r.raised, f)
	r.mu.Unlock()
	return err
}

// A hot bucket key's lease takes carry the item's fence: after the fence
// rose, the calls with the old fence are answered from the leases taken
// before while they last, and every lease take after is refused.
func TestBucketFenceLeaseTake(t *testing.T) {
	ctx := context.Background()
	rec := &bucketFenceRecorder{Store: newStore(t)}
	b := fenceBucket(t, rec, 1<<30, true)
	start := time.Unix(2000, 0)
	fenced, leased := 0, 0
	for i := range 1500 {
		at := start.Add(time.Duration(i) * time.Millisecond)
		if i == 1050 {
			if err := b.RaiseFence(ctx, "k", 2); err != nil {
				t.Fatal(err)
			}
		}
		out, err := decideFenced(ctx, at, limiter.Item{Limit: b, Key: "k", N: 1, Fence: 1})
		switch {
		case i >= 1050 && errors.Is(err, storage.ErrFenced):
			fenced++
		case err != nil:
			t.Fatalf("call %d: %v", i, err)
		case i >= 1050 && out[0].Leased:
			leased++
		}
	}
	before := rec.leaseTakes - rec.refusedLeases
	t.Logf("lease takes %d (%d refused), after the raise: %d calls fenced, %d answered from a lease", rec.leaseTakes, rec.refusedLeases, fenced, leased)
	if before == 0 || rec.refusedLeases == 0 || rec.landedBelow > 0 {
		t.Errorf("lease takes %d landed, %d refused after the raise; %d fenced takes below the fence landed: want some, some, none",
			before, rec.refusedLeases, rec.landedBelow)
	}
	if out, err := decideFenced(ctx, start.Add(1500*time.Millisecond), limiter.Item{Limit: b, Key: "k", N: 1, Fence: 2}); err != nil || !out[0].Decision.Allowed {
		t.Errorf("a call with the new fence: %v %+v, want allowed", err, out[0])
	}
}
