package breaker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// wrapMemory is a memory store behind a breaker.
func wrapMemory(t *testing.T) *breaker.Store {
	t.Helper()
	m, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := breaker.Wrap(m, breaker.Config{Name: "fence"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestFence: the breaker passes a fencing backend's fence through (the
// conformance suite, limitertest.RunFence, on a memory store behind it):
// the wiring wraps every store in a breaker, and a window's shares take
// effect at the fence only where the store fences.
func TestFence(t *testing.T) {
	limitertest.RunFence(t, wrapMemory(t))
}

// TestFenceHistory: the fence histories (limitertest.CheckFenceHistories:
// a window's, a bucket's with and without leases) through the breaker: no
// take with the old fence lands after RaiseFence returned.
func TestFenceHistory(t *testing.T) {
	limitertest.CheckFenceHistories(t, func(t *testing.T) limitertest.Store { return wrapMemory(t) }, nil, limitertest.FenceHistoryOptions{}, nil)
}

// TestBucketFence: the breaker passes a fencing backend's bucket fence
// through (limitertest.RunBucketFence on a memory store behind it).
func TestBucketFence(t *testing.T) {
	limitertest.RunBucketFence(t, wrapMemory(t))
}

// TestFenceRefusals: refused takes are the store's answers, not failures:
// more of them in a row, from more keys, than the breaker's Failures
// leave it closed. On a backend that does not fence, the breaker's
// AddFenced, UpdateBucketFenced and RaiseFence fail with storage.ErrUnsupported without
// reaching it.
func TestFenceRefusals(t *testing.T) {
	s := wrapMemory(t)
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1000, Window: time.Minute, NoDenyCache: true, Representation: limiter.SubWindowCounters})
	if err != nil {
		t.Fatal(err)
	}
	ctx, now := context.Background(), time.Now()
	refused := 0
	for i := range 3 * breaker.DefaultFailures {
		key := string(rune('a' + i%8))
		if err := w.RaiseFence(ctx, key, 2); err != nil {
			t.Fatal(err)
		}
		var out [1]limiter.Outcome
		_, err := limiter.Decide(ctx, now, []limiter.Item{{Limit: w, Key: key, N: 1, Fence: 1}}, out[:])
		if errors.Is(err, storage.ErrFenced) {
			refused++
		}
	}
	if refused != 3*breaker.DefaultFailures || s.Breaker().State() != breaker.Closed {
		t.Errorf("%d of %d fenced takes refused, breaker %v: want all, closed", refused, 3*breaker.DefaultFailures, s.Breaker().State())
	}

	f := &fakeStore{}
	nf := wrap(t, f, breaker.Config{})
	k := storage.Key{Space: "s", Name: "k"}
	if _, err := nf.AddFenced(ctx, k, 0, 1, 1, time.Minute, 1); !errors.Is(err, storage.ErrUnsupported) {
		t.Errorf("AddFenced on a backend without a fence: %v, want storage.ErrUnsupported", err)
	}
	if _, err := nf.UpdateBucketFenced(ctx, k, storage.BucketOp{MaxAmount: 1, RefillTime: time.Second, RefillAmount: 1, N: 1}, time.Minute, 1); !errors.Is(err, storage.ErrUnsupported) {
		t.Errorf("UpdateBucketFenced on a backend without a fence: %v, want storage.ErrUnsupported", err)
	}
	if err := nf.RaiseFence(ctx, k, 1, time.Minute); !errors.Is(err, storage.ErrUnsupported) {
		t.Errorf("RaiseFence on a backend without a fence: %v, want storage.ErrUnsupported", err)
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("%d calls reached a backend that does not fence", n)
	}

	// A batching backend whose Do does not know the fence (memcached's
	// buckets): its fenced takes are refused before it, the rest sent.
	blind := &fenceBlindBatcher{}
	nb, err := breaker.Wrap(blind, breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	op := storage.BucketOp{MaxAmount: 10, RefillTime: time.Second, RefillAmount: 1, N: 1}
	steps := []storage.Step{
		{Kind: storage.StepBucket, Key: k, Bucket: op, TTL: time.Minute, Fence: 1},
		{Kind: storage.StepBucket, Key: k, Bucket: op, TTL: time.Minute},
		{Kind: storage.StepAdd, Key: k, Idx: 1, Span: 1, N: 1, TTL: time.Minute, Fence: 1},
	}
	out := make([]storage.StepResult, len(steps))
	nb.Do(ctx, steps, out)
	if !errors.Is(out[0].Err, storage.ErrUnsupported) || out[1].Err != nil || !out[1].Decision.Allowed || !errors.Is(out[2].Err, storage.ErrUnsupported) || blind.calls.Load() != 1 {
		t.Errorf("fenced takes through a backend that does not fence: errors %v, %v, %v (allowed %v), %d steps reached it; want the fenced ones refused, the other sent",
			out[0].Err, out[1].Err, out[2].Err, out[1].Decision.Allowed, blind.calls.Load())
	}
}

// fenceBlindBatcher is a batching store whose Do ignores Step.Fence.
type fenceBlindBatcher struct{ fakeStore }

func (f *fenceBlindBatcher) Do(ctx context.Context, steps []storage.Step, out []storage.StepResult) {
	for i := range steps {
		out[i] = storage.StepResult{Decision: storage.Decision{Allowed: true}, Err: f.answer(ctx)}
	}
}
