package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// fakePacked is a fakeStore that also implements storage.PackedCounter.
type fakePacked struct {
	fakeStore
	added, subbed int
}

// AddPacked answers as a fresh key: each counter added to holds its
// delta.
func (f *fakePacked) AddPacked(ctx context.Context, _ storage.Key, op *storage.PackedOp) (storage.PackedCounts, error) {
	f.added++
	var c storage.PackedCounts
	for i, a := range op.Adds {
		c.Added[i] = a.Delta
	}
	return c, f.answer(ctx)
}

func (f *fakePacked) SubPacked(ctx context.Context, _ storage.Key, _ *storage.PackedOp) error {
	f.subbed++
	return f.answer(ctx)
}

// A packed window on a wrapped backend that implements PackedCounter (the
// DynamoDB store) is served through the breaker: its calls reach the
// backend, and failures count like the other methods' (3 in a row open
// it; then a call fails at once without reaching the backend).
func TestPackedForwarded(t *testing.T) {
	f := &fakePacked{}
	s, err := breaker.Wrap(f, breaker.Config{Failures: 3, OpenFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 10, Window: time.Minute, Representation: limiter.Packed, NoDenyCache: true})
	if err != nil {
		t.Fatalf("a packed window on a wrapped PackedCounter: %v", err)
	}
	ctx := context.Background()
	now := time.Unix(1e9, 0)
	if d, err := w.Allow(ctx, "k", now); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	if err := w.Refund(ctx, "k", now, 1); err != nil {
		t.Fatal(err)
	}
	if f.added != 1 || f.subbed != 1 {
		t.Fatalf("the backend got %d AddPacked and %d SubPacked, want 1 and 1", f.added, f.subbed)
	}
	f.err = func() error { return down }
	op := storage.PackedPlan(1000, limiter.DefaultSlots, 1, time.Millisecond)
	for i := range 3 {
		var err error
		k := storage.Key{Space: key.Space, Name: fmt.Sprint(key.Name, i)} // failures on distinct keys
		if i%2 == 0 {
			_, err = s.AddPacked(ctx, k, &op)
		} else {
			err = s.SubPacked(ctx, k, &op)
		}
		if !errors.Is(err, storage.ErrUnavailable) {
			t.Fatalf("failing call %d: %v", i, err)
		}
	}
	if st := s.Breaker().Stats(); st.State != breaker.Open {
		t.Fatalf("after 3 failed packed calls: %+v, want open", st)
	}
	before := f.calls.Load()
	if _, err := s.AddPacked(ctx, key, &op); !errors.Is(err, storage.ErrBreakerOpen) || f.calls.Load() != before {
		t.Fatalf("AddPacked on an open breaker: %v, %d calls reached the backend", err, f.calls.Load()-before)
	}
}

// A wrapped backend without PackedCounter: the packed calls fail with
// ErrInvalidConfig, without reaching the backend or counting in the
// breaker.
func TestPackedNotImplemented(t *testing.T) {
	f := &fakeStore{}
	s := wrap(t, f, breaker.Config{Failures: 1, OpenFor: time.Hour})
	op := storage.PackedPlan(1000, limiter.DefaultSlots, 1, time.Millisecond)
	for range 3 {
		if _, err := s.AddPacked(context.Background(), key, &op); !errors.Is(err, limiter.ErrInvalidConfig) {
			t.Fatalf("AddPacked: %v, want ErrInvalidConfig", err)
		}
		if err := s.SubPacked(context.Background(), key, &op); !errors.Is(err, limiter.ErrInvalidConfig) {
			t.Fatalf("SubPacked: %v, want ErrInvalidConfig", err)
		}
	}
	if f.calls.Load() != 0 || s.Breaker().State() != breaker.Closed {
		t.Fatalf("%d calls reached the backend, breaker %v", f.calls.Load(), s.Breaker().State())
	}
}
