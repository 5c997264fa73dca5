package limitertest

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

func testTokenBucket(t *testing.T, s Store) {
	testTokenBucketSmyte(t, s)
	testTokenBucketStripe(t, s)
	testTokenBucketEdges(t, s)
}

// testTokenBucketSmyte: Smyte's examples, refill steps and strict mode.
func testTokenBucketSmyte(t *testing.T, s Store) {
	// Smyte: "RL.REDUCE TwoPerMin 2 60" three times: 2, 1, then blocked;
	// refills arrive one at a time every refill time.
	t.Run("Smyte", func(t *testing.T) {
		b := bucket(t, s, limiter.TokenBucketConfig{Name: "two-per-min", MaxAmount: 2, RefillTime: time.Minute, RefillAmount: 1})
		runSteps(t, b, Key(t), []step{
			{at: 0, allowed: true, remaining: 1},
			{at: 0, allowed: true, remaining: 0},
			{at: 0, allowed: false, remaining: 0, retry: time.Minute},
			{at: 59 * time.Second, allowed: false, remaining: 0, retry: time.Second},
			{at: 60 * time.Second, allowed: true, remaining: 0},
			{at: 60 * time.Second, allowed: false, remaining: 0, retry: time.Minute},
			{at: 180 * time.Second, allowed: true, remaining: 1},
			{at: 180 * time.Second, allowed: true, remaining: 0},
		})
	})
	t.Run("RefillSteps", func(t *testing.T) {
		b := bucket(t, s, limiter.TokenBucketConfig{MaxAmount: 10, RefillTime: 10 * time.Second, RefillAmount: 3})
		key := Key(t)
		if d := allow(t, b, key, Base, 10); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("taking all 10: %+v", d)
		}
		for _, c := range []struct {
			at   time.Duration
			want int64
		}{{9 * time.Second, 0}, {10 * time.Second, 3}, {19 * time.Second, 3}, {25 * time.Second, 6}, {30 * time.Second, 9}, {40 * time.Second, 10}, {400 * time.Second, 10}} {
			d, err := b.Get(ctx(t), key, Base.Add(c.at))
			if err != nil {
				t.Fatal(err)
			}
			if d.Remaining != c.want || d.Allowed != (c.want > 0) {
				t.Fatalf("Get at %v: remaining %d allowed %v, want %d tokens", c.at, d.Remaining, d.Allowed, c.want)
			}
		}
	})
	// Strict mode: a client that keeps trying stays blocked.
	t.Run("Strict", func(t *testing.T) {
		b := bucket(t, s, limiter.TokenBucketConfig{Name: "strict", MaxAmount: 2, RefillTime: time.Minute, Strict: true})
		runSteps(t, b, Key(t), []step{
			{at: 0, allowed: true, remaining: 1},
			{at: 0, allowed: true, remaining: 0},
			{at: 30 * time.Second, allowed: false, remaining: 0, retry: time.Minute},
			{at: 80 * time.Second, allowed: false, remaining: 0, retry: time.Minute},
			{at: 130 * time.Second, allowed: false, remaining: 0, retry: time.Minute},
			{at: 190 * time.Second, allowed: true, remaining: 0},
		})
		lax := bucket(t, s, limiter.TokenBucketConfig{Name: "lax", MaxAmount: 2, RefillTime: time.Minute})
		runSteps(t, lax, Key(t), []step{
			{at: 0, allowed: true, remaining: 1},
			{at: 0, allowed: true, remaining: 0},
			{at: 30 * time.Second, allowed: false, remaining: 0, retry: 30 * time.Second},
			{at: 80 * time.Second, allowed: true, remaining: 0},
		})
	})
}

// testTokenBucketStripe: Stripe's example and caller timestamps.
func testTokenBucketStripe(t *testing.T, s Store) {
	// Stripe's request rate limiter test: replenish 100/s, capacity 500.
	t.Run("Stripe", func(t *testing.T) {
		b := bucket(t, s, limiter.TokenBucketConfig{MaxAmount: 500, RefillTime: time.Second, RefillAmount: 100})
		key := Key(t)
		if n := countAllowed(t, b, key, Base, 500); n != 500 {
			t.Fatalf("burst of 500: %d allowed", n)
		}
		if allow(t, b, key, Base, 1).Allowed {
			t.Fatal("501st request of the burst allowed")
		}
		if n := countAllowed(t, b, key, Base.Add(time.Second), 100); n != 100 {
			t.Fatalf("one second later: %d of 100 allowed", n)
		}
		if allow(t, b, key, Base.Add(time.Second), 1).Allowed {
			t.Fatal("101st request one second later allowed")
		}
	})
	// Caller timestamps: replaying historical events.
	t.Run("CallerTimestamps", func(t *testing.T) {
		b := bucket(t, s, limiter.TokenBucketConfig{MaxAmount: 3, RefillTime: time.Hour})
		past := time.Date(2015, 6, 1, 12, 0, 0, 0, time.UTC)
		key := Key(t)
		for i, c := range []struct {
			at   time.Duration
			want bool
		}{{0, true}, {time.Minute, true}, {2 * time.Minute, true}, {3 * time.Minute, false}, {61 * time.Minute, true}, {62 * time.Minute, false}} {
			if d := allow(t, b, key, past.Add(c.at), 1); d.Allowed != c.want {
				t.Fatalf("event %d at %v: allowed=%v, want %v", i, c.at, d.Allowed, c.want)
			}
		}
	})
}

// testTokenBucketEdges: a clock going backwards, refunds, the parameters
// in the key, expiry.
func testTokenBucketEdges(t *testing.T, s Store) {
	t.Run("Backwards", func(t *testing.T) {
		for _, strict := range []bool{false, true} {
			b := bucket(t, s, limiter.TokenBucketConfig{MaxAmount: 2, RefillTime: time.Minute, Strict: strict})
			steps := []step{
				{at: 100 * time.Second, allowed: true, remaining: 1},
				{at: 100 * time.Second, allowed: true, remaining: 0},
				// A clock behind the last update neither refills nor,
				// in strict mode, moves the refill timer.
				{at: 40 * time.Second, allowed: false, remaining: 0, retry: 120 * time.Second},
				{at: 100*time.Second - time.Hour, allowed: false, remaining: 0},
			}
			if !strict {
				steps = append(steps, step{at: 159 * time.Second, allowed: false, remaining: 0, retry: time.Second})
			}
			steps = append(steps,
				step{at: 160 * time.Second, allowed: true, remaining: 0},
				step{at: 100 * time.Second, allowed: false, remaining: 0})
			runSteps(t, b, Key(t), steps)
		}
	})
	t.Run("Refund", func(t *testing.T) {
		b := bucket(t, s, limiter.TokenBucketConfig{MaxAmount: 3, RefillTime: time.Hour})
		key := Key(t)
		runSteps(t, b, key, []step{{n: 3, allowed: true, remaining: 0}, {allowed: false}})
		if err := b.Refund(ctx(t), key, Base, 1); err != nil {
			t.Fatal(err)
		}
		runSteps(t, b, key, []step{{allowed: true, remaining: 0}, {allowed: false}})
		// A refund never fills a bucket above its capacity.
		fresh := Key(t)
		if err := b.Refund(ctx(t), fresh, Base, 3); err != nil {
			t.Fatal(err)
		}
		if d, err := b.Get(ctx(t), fresh, Base); err != nil || d.Remaining != 3 {
			t.Fatalf("refund to a full bucket: %+v, %v", d, err)
		}
	})
	t.Run("ParametersInKey", func(t *testing.T) {
		one := bucket(t, s, limiter.TokenBucketConfig{MaxAmount: 1, RefillTime: time.Hour})
		two := bucket(t, s, limiter.TokenBucketConfig{MaxAmount: 2, RefillTime: time.Hour})
		key := Key(t)
		runSteps(t, one, key, []step{{allowed: true}, {allowed: false}})
		runSteps(t, two, key, []step{{allowed: true, remaining: 1}, {allowed: true}})
	})
	t.Run("Expiry", func(t *testing.T) {
		// A bucket idle for longer than its refill-from-empty time is full
		// again, whether or not the store still holds it.
		b := bucket(t, s, limiter.TokenBucketConfig{MaxAmount: 5, RefillTime: time.Second})
		key := Key(t)
		runSteps(t, b, key, []step{{n: 5, allowed: true}, {allowed: false}})
		runSteps(t, b, key, []step{{at: 24 * time.Hour, n: 5, allowed: true}})
	})
}

func testSlidingWindow(t *testing.T, s Store) {
	testSlidingWindowArticles(t, s)
	testSlidingWindowBounded(t, s)
	testSlidingWindowEdges(t, s)
}

// testSlidingWindowArticles: ClassDojo's and Criteo's worked examples.
func testSlidingWindowArticles(t *testing.T, s Store) {
	classDojo := func(t *testing.T, k int, burstAt func(i int) time.Duration) (*limiter.SlidingWindow, string) {
		w := sliding(t, s, limiter.SlidingWindowConfig{Name: "per-minute", Limit: 100, Window: time.Minute, SubWindows: k, Estimator: limiter.Interpolated})
		key := Key(t)
		for i := range 100 {
			if d := allow(t, w, key, Base.Add(burstAt(i)), 1); !d.Allowed {
				t.Fatalf("request %d of the first 100 denied: %+v", i, d)
			}
		}
		return w, key
	}
	first15s := func(i int) time.Duration { return time.Duration(i) * 150 * time.Millisecond }
	at594 := func(int) time.Duration { return 59400 * time.Millisecond }
	// ClassDojo: 100 requests in the first 15 s of a 100/min limit; at 75 s
	// one counter per minute allows 25 more, 30 s sub-windows allow 50.
	t.Run("ClassDojo/SingleCounter", func(t *testing.T) {
		w, key := classDojo(t, 1, first15s)
		if n := countAllowed(t, w, key, Base.Add(75*time.Second), 40); n != 25 {
			t.Fatalf("at 75s: %d allowed, want 25", n)
		}
		// The next request waits until the weight of the old minute drops
		// to 74/100: 0.6 s later.
		if d := allow(t, w, key, Base.Add(75*time.Second), 1); d.Allowed || d.RetryAfter != 600*time.Millisecond {
			t.Fatalf("after the 25: %+v, want denied with RetryAfter 600ms", d)
		}
	})
	t.Run("ClassDojo/ThirtySecondSubWindows", func(t *testing.T) {
		w, key := classDojo(t, 2, first15s)
		if n := countAllowed(t, w, key, Base.Add(75*time.Second), 60); n != 50 {
			t.Fatalf("at 75s: %d allowed, want 50", n)
		}
	})
	// With the 100 requests at 59.4 s, a single counter still allows 25 at
	// 75 s (16 s later), but 30 s sub-windows keep blocking.
	t.Run("ClassDojo/LateBurst", func(t *testing.T) {
		w, key := classDojo(t, 1, at594)
		if n := countAllowed(t, w, key, Base.Add(75*time.Second), 40); n != 25 {
			t.Fatalf("single counter at 75s: %d allowed, want 25", n)
		}
		w, key = classDojo(t, 2, at594)
		if n := countAllowed(t, w, key, Base.Add(75*time.Second), 10); n != 0 {
			t.Fatalf("30s sub-windows at 75s: %d allowed, want 0", n)
		}
	})
	// Criteo: a call at 00:01:43 weights the 00:00 counter by 17/60.
	t.Run("Criteo", func(t *testing.T) {
		w := sliding(t, s, limiter.SlidingWindowConfig{Limit: 100, Window: time.Minute, SubWindows: 1, Estimator: limiter.Interpolated})
		key := Key(t)
		for i := range 60 {
			allow(t, w, key, Base.Add(time.Duration(i)*time.Second), 1)
		}
		// 60 * 17/60 = 17 counted from 00:00, plus this call.
		d := allow(t, w, key, Base.Add(time.Minute+43*time.Second), 1)
		if !d.Allowed || d.Remaining != 100-17-1 {
			t.Fatalf("at 00:01:43: %+v, want allowed with %d remaining", d, 100-17-1)
		}
		if n := countAllowed(t, w, key, Base.Add(time.Minute+43*time.Second), 100); n != 82 {
			t.Fatalf("at 00:01:43: %d more allowed, want 82", n)
		}
	})
}

// testSlidingWindowBounded: the bounded estimator never overshoots;
// retry-after; counting denied requests.
func testSlidingWindowBounded(t *testing.T, s Store) {
	t.Run("BoundedNeverOvershoots", func(t *testing.T) {
		const limit, window = 10, 10 * time.Second
		for _, k := range []int{1, 2, 5} {
			w := sliding(t, s, limiter.SlidingWindowConfig{Limit: limit, Window: window, SubWindows: k, Estimator: limiter.Bounded})
			key := Key(t)
			var allowed []time.Duration
			for _, at := range burstyTrace(rand.New(rand.NewPCG(uint64(k), 7)), 300, time.Minute) {
				if allow(t, w, key, Base.Add(at), 1).Allowed {
					allowed = append(allowed, at)
				}
			}
			if len(allowed) == 0 {
				t.Fatalf("k=%d: nothing allowed", k)
			}
			for i, at := range allowed {
				in := 0
				for _, b := range allowed[:i+1] {
					if b >= at-window {
						in++
					}
				}
				if in > limit {
					t.Fatalf("k=%d: %d allowed in [%v, %v], limit %d", k, in, at-window, at, limit)
				}
			}
		}
	})
	t.Run("RetryAfter", func(t *testing.T) {
		w := sliding(t, s, limiter.SlidingWindowConfig{Limit: 5, Window: 10 * time.Second, SubWindows: 2})
		runSteps(t, w, Key(t), []step{
			{n: 5, allowed: true, remaining: 0},
			// The 5 leave the bounded view when sub-window [0,5s) does, at 15 s.
			{at: time.Second, allowed: false, retry: 14 * time.Second},
			{at: 14 * time.Second, allowed: false, retry: time.Second},
			{at: 15 * time.Second, allowed: true, remaining: 4},
		})
	})
	t.Run("CountDenied", func(t *testing.T) {
		for _, c := range []struct {
			countDenied bool
			want        int
		}{{false, 5}, {true, 0}} {
			w := sliding(t, s, limiter.SlidingWindowConfig{Limit: 10, Window: time.Minute, SubWindows: 1, Estimator: limiter.Interpolated, CountDenied: c.countDenied})
			key := Key(t)
			if n := countAllowed(t, w, key, Base, 20); n != 10 {
				t.Fatalf("count denied %v: %d of 20 allowed, want 10", c.countDenied, n)
			}
			// Half way through the next minute the first weighs 1/2.
			if n := countAllowed(t, w, key, Base.Add(90*time.Second), 10); n != c.want {
				t.Fatalf("count denied %v: at 90s %d allowed, want %d", c.countDenied, n, c.want)
			}
		}
	})
}

// testSlidingWindowEdges: refunds, a clock behind another, expiry.
func testSlidingWindowEdges(t *testing.T, s Store) {
	t.Run("Refund", func(t *testing.T) {
		w := sliding(t, s, limiter.SlidingWindowConfig{Limit: 5, Window: 10 * time.Second, SubWindows: 2})
		key := Key(t)
		if n := countAllowed(t, w, key, Base, 6); n != 5 {
			t.Fatalf("%d of 6 allowed", n)
		}
		if err := w.Refund(ctx(t), key, Base, 2); err != nil {
			t.Fatal(err)
		}
		if n := countAllowed(t, w, key, Base, 3); n != 2 {
			t.Fatalf("after refunding 2: %d allowed", n)
		}
	})
	// A writer whose clock is one sub-window behind another's still sees
	// the other's traffic.
	t.Run("Backwards", func(t *testing.T) {
		for _, e := range []limiter.Estimator{limiter.Bounded, limiter.Interpolated} {
			w := sliding(t, s, limiter.SlidingWindowConfig{Limit: 5, Window: time.Minute, SubWindows: 6, Estimator: e})
			key := Key(t)
			if n := countAllowed(t, w, key, Base.Add(125*time.Second), 5); n != 5 {
				t.Fatalf("%v: %d of 5 allowed", e, n)
			}
			for _, at := range []time.Duration{124 * time.Second, 115 * time.Second} {
				if d := allow(t, w, key, Base.Add(at), 1); d.Allowed {
					t.Fatalf("%v: clock back to %v unblocked the key: %+v", e, at, d)
				}
			}
		}
	})
	t.Run("Expiry", func(t *testing.T) {
		w := sliding(t, s, limiter.SlidingWindowConfig{Limit: 5, Window: 10 * time.Second, SubWindows: 2})
		key := Key(t)
		countAllowed(t, w, key, Base, 5)
		if n := countAllowed(t, w, key, Base.Add(time.Hour), 6); n != 5 {
			t.Fatalf("an hour later: %d allowed, want a fresh 5", n)
		}
	})
}

// burstyTrace returns n request times in [0, span): on/off bursts.
func burstyTrace(r *rand.Rand, n int, span time.Duration) []time.Duration {
	out := make([]time.Duration, 0, n)
	at := time.Duration(0)
	for len(out) < n && at < span {
		burst := 1 + r.IntN(30)
		gap := time.Duration(r.IntN(200)) * time.Millisecond
		for range burst {
			out = append(out, at)
			at += gap
		}
		at += time.Duration(r.IntN(5000)) * time.Millisecond
	}
	return out
}

func testFixedWindow(t *testing.T, s Store) {
	w := fixed(t, s, limiter.FixedWindowConfig{Name: "fixed", Limit: 5, Window: time.Minute})
	runSteps(t, w, Key(t), []step{
		{at: 10 * time.Second, allowed: true, remaining: 4},
		{at: 10 * time.Second, n: 4, allowed: true, remaining: 0},
		{at: 10 * time.Second, allowed: false, retry: 50 * time.Second},
		{at: 59 * time.Second, allowed: false, retry: time.Second},
		{at: 60 * time.Second, allowed: true, remaining: 4},
		// The fixed window's known flaw: 5 at 0:59 and 5 at 1:00.
		{at: 60 * time.Second, n: 4, allowed: true, remaining: 0},
		{at: 150 * time.Second, n: 5, allowed: true, remaining: 0},
	})
}

func testSlidingLog(t *testing.T, s Store) {
	l := slidingLog(t, s, limiter.SlidingLogConfig{Name: "log", Limit: 3, Window: 10 * time.Second})
	key := Key(t)
	runSteps(t, l, key, []step{
		{at: 0, allowed: true, remaining: 2},
		{at: time.Second, allowed: true, remaining: 1},
		{at: 2 * time.Second, allowed: true, remaining: 0},
		{at: 3 * time.Second, allowed: false, retry: 7 * time.Second},
		{at: 10 * time.Second, allowed: true, remaining: 0},
		{at: 10 * time.Second, allowed: false, retry: time.Second},
		// Clock back: entries after now still count.
		{at: 5 * time.Second, allowed: false},
		{at: 12 * time.Second, allowed: true, remaining: 1},
	})
	if err := l.Refund(ctx(t), key, Base.Add(12*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	runSteps(t, l, key, []step{{at: 12 * time.Second, n: 2, allowed: true, remaining: 0}})
	// Idle for longer than the window: a fresh log.
	runSteps(t, l, key, []step{{at: time.Hour, n: 3, allowed: true, remaining: 0}})
}

func testStack(t *testing.T, s Store) {
	// ClassDojo's minimum distance: 100 per minute and 2 per second. At 3
	// requests a second, the per-second limit denies one each second, which
	// is refunded to the per-minute limit; so exactly 100 pass, 2 a second
	// for 50 seconds, and then the per-minute limit denies.
	perMinute := fixed(t, s, limiter.FixedWindowConfig{Name: "per-minute", Limit: 100, Window: time.Minute})
	perSecond := fixed(t, s, limiter.FixedWindowConfig{Name: "per-second", Limit: 2, Window: time.Second})
	st, err := limiter.NewStack(perMinute, perSecond)
	if err != nil {
		t.Fatal(err)
	}
	key := Key(t)
	allowed := 0
	for sec := range 60 {
		for i := range 3 {
			d := allow(t, st, key, Base.Add(time.Duration(sec)*time.Second+time.Duration(i)*time.Millisecond), 1)
			if d.Allowed {
				allowed++
				continue
			}
			want := "per-second"
			if allowed == 100 {
				want = "per-minute"
			}
			if d.Name != want {
				t.Fatalf("second %d request %d denied by %q, want %q", sec, i, d.Name, want)
			}
		}
	}
	if allowed != 100 {
		t.Fatalf("%d allowed in a minute, want 100", allowed)
	}
	// Allowed decisions report the tightest limit.
	d := allow(t, st, Key(t), Base, 1)
	if !d.Allowed || d.Name != "per-second" || d.Remaining != 1 {
		t.Fatalf("first request: %+v, want allowed by per-second with 1 remaining", d)
	}
}
