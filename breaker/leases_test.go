package breaker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// fakeShed is a shed store answering every call with err.
type fakeShed struct {
	calls int
	err   error
}

func (f *fakeShed) AcquireLease(context.Context, storage.Key, storage.LeaseOp) (storage.Decision, error) {
	f.calls++
	return storage.Decision{Allowed: true}, f.err
}
func (f *fakeShed) ReleaseLease(context.Context, storage.Key, storage.ReleaseOp) error {
	f.calls++
	return f.err
}
func (f *fakeShed) PutGauge(context.Context, storage.Key, storage.Gauge, time.Duration) error {
	f.calls++
	return f.err
}
func (f *fakeShed) GetGauge(context.Context, storage.Key) (storage.Gauge, bool, error) {
	f.calls++
	return storage.Gauge{}, false, f.err
}

// The shed store shares the counter store's breaker: failures of either
// open it for both.
func TestLeasesShareTheBreaker(t *testing.T) {
	f := &fakeStore{err: func() error { return down }}
	s := wrap(t, f, breaker.Config{Failures: 4, OpenFor: time.Hour})
	sh := &fakeShed{err: down}
	l, err := breaker.WrapLeases(sh, s.Breaker())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	call(s, 0)
	call(s, 1)
	l.AcquireLease(ctx, key, storage.LeaseOp{})
	l.GetGauge(ctx, key)
	if s.Breaker().State() != breaker.Open {
		t.Fatalf("state %v after 4 failures of the two stores", s.Breaker().State())
	}
	calls := sh.calls
	_, err1 := l.AcquireLease(ctx, key, storage.LeaseOp{})
	err2 := l.ReleaseLease(ctx, key, storage.ReleaseOp{})
	err3 := l.PutGauge(ctx, key, storage.Gauge{}, time.Minute)
	_, _, err4 := l.GetGauge(ctx, key)
	for i, err := range []error{err1, err2, err3, err4} {
		if !errors.Is(err, breaker.ErrOpen) || !errors.Is(err, storage.ErrUnavailable) {
			t.Errorf("call %d with the breaker open: %v", i, err)
		}
	}
	if sh.calls != calls {
		t.Errorf("the shed store got %d calls with the breaker open", sh.calls-calls)
	}
	if _, err := breaker.WrapLeases(nil, s.Breaker()); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Errorf("nil store: %v", err)
	}
}
