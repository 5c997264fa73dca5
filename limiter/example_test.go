package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
)

// Smyte's example: a bucket of 2 refilled by 1 every 60 s ("RL.REDUCE
// TwoPerMin 2 60"). Times are the caller's, so the example runs on a fixed
// clock.
func ExampleTokenBucket() {
	store, _ := memory.New(memory.Config{})
	b, _ := limiter.NewTokenBucket(store, limiter.TokenBucketConfig{
		Name: "two-per-minute", MaxAmount: 2, RefillTime: time.Minute, RefillAmount: 1,
	})
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, at := range []time.Duration{0, 0, 0, 60 * time.Second} {
		d, _ := b.Allow(ctx, "user:42", t0.Add(at))
		fmt.Printf("t=%-3v allowed=%-5v remaining=%d retry-after=%v\n", at, d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// t=0s  allowed=true  remaining=1 retry-after=0s
	// t=0s  allowed=true  remaining=0 retry-after=0s
	// t=0s  allowed=false remaining=0 retry-after=1m0s
	// t=1m0s allowed=true  remaining=0 retry-after=0s
}

// ClassDojo's example: 100 requests per minute, all 100 used in the first
// 15 s. At 75 s one counter per minute allows 25 more; 30 s sub-windows allow
// 50.
func ExampleSlidingWindow() {
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, k := range []int{1, 2} {
		store, _ := memory.New(memory.Config{})
		w, _ := limiter.NewSlidingWindow(store, limiter.SlidingWindowConfig{
			Limit: 100, Window: time.Minute, SubWindows: k, Estimator: limiter.Interpolated,
		})
		for i := range 100 {
			w.Allow(ctx, "1.2.3.4:/api/widgets", t0.Add(time.Duration(i)*150*time.Millisecond))
		}
		allowed := 0
		for range 100 {
			if d, _ := w.Allow(ctx, "1.2.3.4:/api/widgets", t0.Add(75*time.Second)); d.Allowed {
				allowed++
			}
		}
		fmt.Printf("%d sub-window(s): %d more allowed at 75s\n", k, allowed)
	}
	// Output:
	// 1 sub-window(s): 25 more allowed at 75s
	// 2 sub-window(s): 50 more allowed at 75s
}

// Requests of different costs (bytes, tokens, rows) on a sliding window.
// A window given no MaxCost is packed and takes calls of cost up to
// limiter.PackedMaxCost (32); a larger cost is refused and takes nothing.
// Saying the largest cost with MaxCost keeps sub-window counters, which
// take any cost up to the limit.
func ExampleSlidingWindowConfig_maxCost() {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store, _ := memory.New(memory.Config{})

	w, _ := limiter.NewSlidingWindow(store, limiter.SlidingWindowConfig{Name: "kb-per-minute", Limit: 10000, Window: time.Minute})
	_, err := w.AllowN(ctx, "user:42", now, 500)
	fmt.Println(w.Config().Representation, w.Config().MaxCost, errors.Is(err, limiter.ErrInvalidCost))

	w, _ = limiter.NewSlidingWindow(store, limiter.SlidingWindowConfig{Name: "kb-per-minute", Limit: 10000, Window: time.Minute, MaxCost: 1000})
	d, err := w.AllowN(ctx, "user:42", now, 500)
	fmt.Println(w.Config().Representation, w.Config().MaxCost, d.Allowed, d.Remaining, err)
	// Output:
	// packed 32 true
	// subwindows 1000 true 9500 <nil>
}

// ClassDojo's minimum distance between requests: 100 per minute and 2 per
// second together. The third request in a second is denied by the
// per-second limit, and what the per-minute limit counted for it is given
// back.
func ExampleStack() {
	store, _ := memory.New(memory.Config{})
	perMinute, _ := limiter.NewFixedWindow(store, limiter.FixedWindowConfig{Name: "100/min", Limit: 100, Window: time.Minute})
	perSecond, _ := limiter.NewFixedWindow(store, limiter.FixedWindowConfig{Name: "2/s", Limit: 2, Window: time.Second})
	both, _ := limiter.NewStack(perMinute, perSecond)
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 3 {
		d, _ := both.Allow(ctx, "user:42", t0)
		fmt.Printf("allowed=%-5v by=%s remaining=%d\n", d.Allowed, d.Name, d.Remaining)
	}
	d, _ := perMinute.Allow(ctx, "user:42", t0)
	fmt.Println("per-minute remaining:", d.Remaining)
	// Output:
	// allowed=true  by=2/s remaining=1
	// allowed=true  by=2/s remaining=0
	// allowed=false by=2/s remaining=0
	// per-minute remaining: 97
}

// ExampleDecide checks two rules' limits for one request as one batch: a
// per-client bucket and a per-route window. The window denies the third
// request, so the bucket's token is given back; the fourth is denied by the
// deny cache, without asking the store.
func ExampleDecide() {
	store, _ := memory.New(memory.Config{})
	perClient, _ := limiter.NewTokenBucket(store, limiter.TokenBucketConfig{Name: "client", MaxAmount: 10, RefillTime: time.Minute})
	perRoute, _ := limiter.NewFixedWindow(store, limiter.FixedWindowConfig{Name: "route", Limit: 2, Window: time.Minute})
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ctx := context.Background()
	for i := range 4 {
		items := []limiter.Item{
			{Limit: perClient, Key: "client-42", N: 1},
			{Limit: perRoute, Key: "GET /pets", N: 1},
		}
		out := make([]limiter.Outcome, len(items))
		d, _ := limiter.Decide(ctx, now, items, out)
		fmt.Printf("request %d: allowed=%v by %s, client refunded=%v, cached=%v\n",
			i+1, out[d].Decision.Allowed, out[d].Decision.Name, out[0].Refunded, out[d].Cached)
	}
	left, _ := perClient.Get(ctx, "client-42", now)
	fmt.Println("client tokens left:", left.Remaining)
	// Output:
	// request 1: allowed=true by route, client refunded=false, cached=false
	// request 2: allowed=true by route, client refunded=false, cached=false
	// request 3: allowed=false by route, client refunded=true, cached=false
	// request 4: allowed=false by route, client refunded=false, cached=true
	// client tokens left: 8
}
