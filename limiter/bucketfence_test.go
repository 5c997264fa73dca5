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
