package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// fakeBatcher is a fakeStore that also batches: Do answers every step
// through the single-step methods and counts the batches.
type fakeBatcher struct {
	fakeStore
	batches atomic.Int64
}

func (f *fakeBatcher) Do(ctx context.Context, steps []storage.Step, out []storage.StepResult) {
	f.batches.Add(1)
	for i := range steps {
		out[i] = storage.DoStep(ctx, &f.fakeStore, &steps[i])
	}
}

// decide decides one batch of a window and a bucket on s, for key "k".
func decide(t *testing.T, s *breaker.Store) error { return decideKey(t, s, "k") }

// decideKey decides one batch of a window and a bucket on s, for key.
func decideKey(t *testing.T, s *breaker.Store, key string) error {
	t.Helper()
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 10, Window: time.Minute, NoDenyCache: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 10, RefillTime: time.Second, NoDenyCache: true})
	if err != nil {
		t.Fatal(err)
	}
	items := []limiter.Item{{Limit: w, Key: key, N: 1}, {Limit: b, Key: key, N: 1}}
	out := make([]limiter.Outcome, len(items))
	_, err = limiter.Decide(context.Background(), time.Unix(1e9, 0), items, out)
	return err
}

// The breaker forwards a batch to a batching backend as one Do (wrapping
// must not cost the batch), and counts it as one call: N failed batches in
// a row open it, then a batch fails at once without reaching the backend.
func TestBatchForwarded(t *testing.T) {
	f := &fakeBatcher{}
	var fail atomic.Bool
	f.err = func() error {
		if fail.Load() {
			return down
		}
		return nil
	}
	s := wrapBatcher(t, f, breaker.Config{Failures: 3, OpenFor: time.Hour})
	if err := decide(t, s); err != nil {
		t.Fatal(err)
	}
	if got, calls := f.batches.Load(), f.calls.Load(); got != 1 || calls != 2 {
		t.Fatalf("one decision of 2 limits: %d batches, %d steps; want 1 batch of 2", got, calls)
	}

	fail.Store(true)
	for i := range 3 {
		if err := decideKey(t, s, fmt.Sprint("k", i)); !errors.Is(err, storage.ErrUnavailable) {
			t.Fatalf("failing batch %d: %v, want ErrUnavailable", i, err)
		}
	}
	if st := s.Breaker().Stats(); st.State != breaker.Open || st.Failures != 3 {
		t.Fatalf("after 3 failed batches: %+v, want open after 3 failures (one per batch)", st)
	}
	before := f.calls.Load()
	err := decide(t, s)
	if !errors.Is(err, storage.ErrBreakerOpen) || f.calls.Load() != before {
		t.Fatalf("batch on an open breaker: %v, %d calls reached the backend", err, f.calls.Load()-before)
	}
}

// A backend that does not batch gets the steps one by one through its
// single-step methods.
func TestBatchFallback(t *testing.T) {
	f := &fakeStore{}
	s := wrap(t, f, breaker.Config{})
	if err := decide(t, s); err != nil {
		t.Fatal(err)
	}
	if f.calls.Load() != 2 {
		t.Fatalf("%d calls, want 2", f.calls.Load())
	}
}

func wrapBatcher(t *testing.T, f *fakeBatcher, cfg breaker.Config) *breaker.Store {
	t.Helper()
	s, err := breaker.Wrap(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
