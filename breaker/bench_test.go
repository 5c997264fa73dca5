package breaker_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// hangs is a backend that never answers: each call waits for its context's
// deadline, as a stalled server does.
func hangs() *fakeStore {
	return &fakeStore{
		block: func(ctx context.Context) { <-ctx.Done() },
		err:   func() error { return storage.ErrUnavailable },
	}
}

// BenchmarkDecisionOutage is a token-bucket decision under a 250 ms
// deadline on a backend that never answers, with the breaker open: it
// answers at once with ErrUnavailable (the rule's fail mode then decides),
// instead of waiting the deadline (compare BenchmarkDecisionOutageNoBreaker).
func BenchmarkDecisionOutage(b *testing.B) {
	s, err := breaker.Wrap(hangs(), breaker.Config{Failures: 1, OpenFor: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	benchOutage(b, s, true)
}

// BenchmarkDecisionOutageNoBreaker is the same decision without a breaker:
// every decision waits for the deadline (set to 5 ms here to keep the
// benchmark short; 250 ms in the authorizer).
func BenchmarkDecisionOutageNoBreaker(b *testing.B) {
	benchOutage(b, hangs(), false)
}

func benchOutage(b *testing.B, store storage.BucketStore, open bool) {
	tb, err := limiter.NewTokenBucket(store, limiter.TokenBucketConfig{MaxAmount: 100, RefillTime: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	deadline := 250 * time.Millisecond
	if !open {
		deadline = 5 * time.Millisecond
	}
	now := time.Unix(1e9, 0)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	tb.AllowN(ctx, "k", now, 1) // opens the breaker
	cancel()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			_, err := tb.AllowN(ctx, "k", now, 1)
			cancel()
			if err == nil {
				b.Fatal("a decision succeeded on a backend that never answers")
			}
		}
	})
}

// BenchmarkClosed is the breaker's cost on a healthy backend (a fake that
// answers at once): one lock and one errors.Is chain per call.
func BenchmarkClosed(b *testing.B) {
	s, err := breaker.Wrap(&fakeStore{}, breaker.Config{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.UpdateBucket(ctx, key, storage.BucketOp{}, time.Minute)
		}
	})
}
