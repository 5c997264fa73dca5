package memory_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
)

// The algorithms on the in-process store with a fixed now. Limits are large
// enough that every decision in the loop is an allow (the common path).
// Serial runs measure one decision on one core; Parallel runs use every
// GOMAXPROCS goroutine on one hot key.

// logLimit: the sliding log is for small limits; its cost grows with it.
const logLimit = 100

var benchNow = time.Date(2026, 3, 1, 0, 0, 30, 0, time.UTC)

func benchLimiters(b *testing.B) map[string]limiter.Limiter {
	s := newStore(b, memory.Config{})
	const big = 1 << 40
	tb, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "tb", MaxAmount: big, RefillTime: time.Second, RefillAmount: 100})
	must(b, err)
	swb, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "swb", Limit: big, Window: time.Minute})
	must(b, err)
	swi, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "swi", Limit: big, Window: time.Minute, Estimator: limiter.Interpolated})
	must(b, err)
	fw, err := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "fw", Limit: big, Window: time.Minute})
	must(b, err)
	sl, err := limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Name: "sl", Limit: logLimit, Window: time.Minute})
	must(b, err)
	st, err := limiter.NewStack(fw, tb)
	must(b, err)
	return map[string]limiter.Limiter{
		"TokenBucket": tb, "SlidingWindow/Bounded/k=20": swb, "SlidingWindow/Interpolated/k=20": swi,
		"FixedWindow": fw, "SlidingLog": sl, "Stack/FixedWindow+TokenBucket": st,
	}
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

func BenchmarkDecision(b *testing.B) {
	ctx := context.Background()
	for name, l := range benchLimiters(b) {
		b.Run(name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			now := benchNow
			for i := 0; b.Loop(); i++ {
				if name == "SlidingLog" {
					// The log admits logLimit per window: walk time so
					// that it stays in its steady state (allowing).
					now = now.Add(time.Minute / logLimit)
				}
				if _, err := l.AllowN(ctx, "hot-key", now, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := l.AllowN(ctx, "hot-key", benchNow, 1); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkManyKeys spreads decisions over 10,000 keys (map and LRU work).
func BenchmarkManyKeys(b *testing.B) {
	ctx := context.Background()
	s := newStore(b, memory.Config{})
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1 << 40, Window: time.Minute})
	must(b, err)
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := w.AllowN(ctx, keys[i%len(keys)], benchNow, 1); err != nil {
			b.Fatal(err)
		}
	}
}
