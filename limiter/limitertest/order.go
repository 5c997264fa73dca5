package limitertest

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// testOutOfOrder: requests that reach the store in another order than their
// stamps, as they do under real concurrency (a request is stamped before it
// travels). Within the horizon (storage.Horizon) every algorithm decides
// exactly as on its stamps; past it, what a late writer takes is counted,
// never free; refunds land on the counter they were taken from even after
// the window rolled.
func testOutOfOrder(t *testing.T, s Store) {
	testNewerThenOlder(t, s)
	testPastHorizon(t, s)
	testRefundAfterRoll(t, s)
	testSlippedWrite(t, s)
}

// testNewerThenOlder: within the horizon, a writer whose stamp is older
// than the newest decides as on its stamp.
func testNewerThenOlder(t *testing.T, s Store) {
	ms := time.Millisecond
	// Fixed window, limit 2 per second: 0.9 s arrives after 1.1 s, when
	// [0, 1 s) already holds 2.
	t.Run("FixedNewerThenOlder", func(t *testing.T) {
		w := fixed(t, s, limiter.FixedWindowConfig{Limit: 2, Window: time.Second})
		runSteps(t, w, Key(t), []step{
			{at: 500 * ms, allowed: true, remaining: 1},
			{at: 500 * ms, allowed: true, remaining: 0},
			{at: 600 * ms, allowed: false},
			{at: 1100 * ms, allowed: true, remaining: 1},
			{at: 900 * ms, allowed: false},
			{at: 1200 * ms, allowed: true, remaining: 0},
		})
	})
	// Sliding window, limit 2, 20 sub-windows of 50 ms: 1010 ms arrives
	// after 1051 ms; (10 ms, 1010 ms] already holds the two at 40 ms.
	t.Run("SlidingNewerThenOlder", func(t *testing.T) {
		w := sliding(t, s, limiter.SlidingWindowConfig{Limit: 2, Window: time.Second, SubWindows: 20})
		runSteps(t, w, Key(t), []step{
			{at: 40 * ms, allowed: true, remaining: 1},
			{at: 40 * ms, allowed: true, remaining: 0},
			{at: 1051 * ms, allowed: true, remaining: 1},
			{at: 1010 * ms, allowed: false},
		})
	})
	// A late writer a whole window (plus a sub-window, the horizon) behind
	// the newest still sees its own sub-windows.
	t.Run("SlidingAtTheHorizon", func(t *testing.T) {
		w := sliding(t, s, limiter.SlidingWindowConfig{Limit: 3, Window: time.Second, SubWindows: 10})
		key := Key(t)
		runSteps(t, w, key, []step{
			{at: 0, n: 3, allowed: true, remaining: 0},
			{at: 2150 * ms, allowed: true, remaining: 2}, // sub-window 21
			{at: 1100 * ms, allowed: true, remaining: 1}, // sub-window 11, 10 behind: its view 1..11 is empty, 21 is in Later
			{at: 1050 * ms, allowed: false},              // sub-window 10, 11 behind (the horizon): its view 0..10 holds 3
		})
	})
	t.Run("LogNewerThenOlder", func(t *testing.T) {
		l := slidingLog(t, s, limiter.SlidingLogConfig{Limit: 2, Window: time.Second})
		runSteps(t, l, Key(t), []step{
			{at: 500 * ms, allowed: true, remaining: 1},
			{at: 500 * ms, allowed: true, remaining: 0},
			{at: 1600 * ms, allowed: true, remaining: 1},
			{at: 900 * ms, allowed: false},                      // (-100 ms, 900 ms] holds the two at 500 ms
			{at: 1550 * ms, allowed: true, remaining: 0},        // (600 ms, 1600 ms] holds 2 with it
			{at: 1550 * ms, allowed: false},                     // and would hold 3
			{at: 2550 * ms, n: 2, allowed: false, remaining: 1}, // (1600 ms, 2600 ms] would hold 3
			{at: 2600 * ms, n: 2, allowed: true, remaining: 0},  // the two at 1550 and 1600 ms are out
		})
	})
	// A bucket that refilled for a newer writer gives a late one nothing
	// more: a clock behind the last refill refills nothing.
	t.Run("BucketNewerThenOlder", func(t *testing.T) {
		b := bucket(t, s, limiter.TokenBucketConfig{MaxAmount: 2, RefillTime: time.Second})
		if atStamp(s) {
			// At its own stamp the late op sees one refill, which the
			// newer op took: denied, and the token of 12 s is still there.
			runSteps(t, b, Key(t), []step{
				{at: 10 * time.Second, n: 2, allowed: true, remaining: 0},
				{at: 12500 * ms, allowed: true, remaining: 1},
				{at: 11 * time.Second, allowed: false, remaining: 0, retry: time.Second},
				{at: 12900 * ms, allowed: true, remaining: 0},
				{at: 12900 * ms, allowed: false, remaining: 0, retry: 100 * ms},
				{at: 13 * time.Second, allowed: true, remaining: 0},
			})
			return
		}
		runSteps(t, b, Key(t), []step{
			{at: 10 * time.Second, n: 2, allowed: true, remaining: 0},
			{at: 12500 * ms, allowed: true, remaining: 1}, // two refills, at 11 s and 12 s
			{at: 11 * time.Second, allowed: true, remaining: 0},
			{at: 11 * time.Second, allowed: false},
			{at: 12900 * ms, allowed: false},
			{at: 13 * time.Second, allowed: true, remaining: 0},
		})
	})
}

// testPastHorizon: past the horizon, what a late writer takes is counted.
func testPastHorizon(t *testing.T, s Store) {
	ms := time.Millisecond
	// Past the horizon a store either still holds the late writer's view
	// (and decides on it) or counts the late units where the newest writer
	// sees them: either way the late writer and the newest one together
	// never take more than the limit.
	pastHorizon := pastHorizonCheck
	t.Run("FixedPastHorizon", func(t *testing.T) {
		pastHorizon(t, fixed(t, s, limiter.FixedWindowConfig{Limit: 2, Window: time.Second}), 500*ms, 5500*ms)
	})
	t.Run("SlidingPastHorizon", func(t *testing.T) {
		pastHorizon(t, sliding(t, s, limiter.SlidingWindowConfig{Limit: 2, Window: time.Second, SubWindows: 10}), 500*ms, 5500*ms)
	})
	t.Run("LogPastHorizon", func(t *testing.T) {
		pastHorizon(t, slidingLog(t, s, limiter.SlidingLogConfig{Limit: 2, Window: time.Second}), 500*ms, 5500*ms)
	})
	t.Run("LateWriters", func(t *testing.T) { LateWriters(t, s) })
}

// testRefundAfterRoll: a refund lands on the counter it was taken from.
func testRefundAfterRoll(t *testing.T, s Store) {
	ms := time.Millisecond
	// A refund that arrives after the window rolled goes back to the
	// counter it was taken from, not to the new window.
	t.Run("FixedRefundAfterRoll", func(t *testing.T) {
		w := fixed(t, s, limiter.FixedWindowConfig{Limit: 2, Window: time.Second})
		key := Key(t)
		runSteps(t, w, key, []step{
			{at: 500 * ms, allowed: true, remaining: 1},
			{at: 1100 * ms, allowed: true, remaining: 1},
		})
		if err := w.Refund(ctx(t), key, Base.Add(500*ms), 1); err != nil {
			t.Fatal(err)
		}
		runSteps(t, w, key, []step{
			{at: 900 * ms, n: 2, allowed: true, remaining: 0},
			{at: 1200 * ms, allowed: true, remaining: 0},
			{at: 1300 * ms, allowed: false},
		})
	})
	t.Run("SlidingRefundAfterRoll", func(t *testing.T) {
		w := sliding(t, s, limiter.SlidingWindowConfig{Limit: 3, Window: time.Second, SubWindows: 10})
		key := Key(t)
		runSteps(t, w, key, []step{
			{at: 0, allowed: true, remaining: 2},
			{at: 1500 * ms, allowed: true, remaining: 2},
		})
		if err := w.Refund(ctx(t), key, Base, 1); err != nil {
			t.Fatal(err)
		}
		runSteps(t, w, key, []step{
			{at: 900 * ms, n: 3, allowed: false}, // (-100, 900] is empty, but (500, 1500] would hold 4
			{at: 900 * ms, n: 2, allowed: true, remaining: 0},
			{at: 1500 * ms, allowed: false},
		})
	})
}

// testSlippedWrite: a denial's refund after another writer's add that
// rolled the window.
func testSlippedWrite(t *testing.T, s Store) {
	ms := time.Millisecond
	// A lost race between two steps of a store: another writer's newer add
	// slips in between a denial's add and its refund, and rolls the
	// window. The refund still lands on the denial's own counter.
	t.Run("DenialRefundAfterSlippedWrite", func(t *testing.T) {
		for _, c := range []struct {
			name string
			make func(storage.Counter) limiter.Limiter
			slip time.Duration // the slipped writer's time
			span int
			sub  time.Duration
		}{
			{"fixed", func(c storage.Counter) limiter.Limiter {
				return must[*limiter.FixedWindow](t)(limiter.NewFixedWindow(c, limiter.FixedWindowConfig{Limit: 2, Window: time.Second}))
			}, 1500 * ms, 1, time.Second},
			{"sliding", func(c storage.Counter) limiter.Limiter {
				return must[*limiter.SlidingWindow](t)(limiter.NewSlidingWindow(c, leaseWindow(limiter.SlidingWindowConfig{Limit: 2, Window: time.Second, SubWindows: 10})))
			}, 1150 * ms, 11, 100 * time.Millisecond},
		} {
			t.Run(c.name, func(t *testing.T) {
				key := Key(t)
				hook := &slipCounter{Counter: s}
				l := c.make(hook)
				runSteps(t, l, key, []step{
					{at: 50 * ms, allowed: true, remaining: 1},
					{at: 50 * ms, allowed: true, remaining: 0},
				})
				hook.slip = func(k storage.Key) {
					cur := Base.Add(c.slip).UnixNano() / int64(c.sub)
					if _, err := s.Add(ctx(t), k, cur, c.span, 1, time.Hour); err != nil {
						t.Errorf("slipped add: %v", err)
					}
				}
				runSteps(t, l, key, []step{{at: 50 * ms, allowed: false}})
				if !hook.slipped {
					t.Fatal("the denial sent no refund")
				}
				// The counter of 50 ms holds 2, not 3, and the slipped
				// writer's holds 1.
				idx := Base.Add(50*ms).UnixNano() / int64(c.sub)
				got, err := s.Add(ctx(t), hook.key, idx, c.span, 0, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				if got.C[0] != 2 {
					t.Fatalf("the denied request's counter holds %d after its refund, want 2", got.C[0])
				}
				slipIdx := Base.Add(c.slip).UnixNano() / int64(c.sub)
				if got, err = s.Add(ctx(t), hook.key, slipIdx, c.span, 0, time.Hour); err != nil {
					t.Fatal(err)
				}
				if got.C[0] != 1 {
					t.Fatalf("the slipped writer's counter holds %d after the refund, want 1", got.C[0])
				}
			})
		}
	})
}

// slipCounter runs slip (once) before the first Sub it forwards: another
// writer's add between a store's two steps.
type slipCounter struct {
	storage.Counter
	slip    func(storage.Key)
	slipped bool
	key     storage.Key
}

func (c *slipCounter) Add(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration) (storage.Counts, error) {
	c.key = k
	return c.Counter.Add(ctx, k, cur, span, n, ttl)
}

func (c *slipCounter) Sub(ctx context.Context, k storage.Key, idx int64, n int64) error {
	if c.slip != nil && !c.slipped {
		c.slipped = true
		c.slip(k)
	}
	return c.Counter.Sub(ctx, k, idx, n)
}

// pastHorizonCheck: a late writer fills its window, the newest writer
// takes one of two; then late and newest together get exactly one more.
func pastHorizonCheck(t *testing.T, l limiter.Limiter, late, newest time.Duration) {
	t.Helper()
	key := Key(t)
	runSteps(t, l, key, []step{
		{at: late, allowed: true, remaining: 1},
		{at: late, allowed: true, remaining: 0},
		{at: newest, allowed: true, remaining: 1},
	})
	n := 0
	for _, at := range []time.Duration{late, newest, late, newest} {
		if allow(t, l, key, Base.Add(at), 1).Allowed {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d more allowed after the late writer's window was full and the newest's had 1 left, want 1", n)
	}
}

// LateWriters is the conformance sequence of writers more than a window
// behind the newest (past the horizon), for the fixed and the sliding
// window, limit 2: window N takes 2, window N+2 takes 2, then three calls
// stamped in N and one in N+2 arrive. Whatever window a store charges a
// late writer to (its own, full; or the newest writer's, full), none of
// the four may be admitted. It is part of [Run]; a backend runs it again
// on a store whose second step for such a writer fails (DynamoDB moves the
// late add with a second request, and another writer may remove the
// counter in between): the call must still not be admitted.
func LateWriters(t *testing.T, s storage.Counter) {
	ms := time.Millisecond
	for _, c := range []struct {
		name string
		make func() limiter.Limiter
	}{
		{"Fixed", func() limiter.Limiter {
			return must[*limiter.FixedWindow](t)(limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 2, Window: time.Second, NoDenyCache: true}))
		}},
		{"Sliding", func() limiter.Limiter {
			return must[*limiter.SlidingWindow](t)(limiter.NewSlidingWindow(s, leaseWindow(limiter.SlidingWindowConfig{Limit: 2, Window: time.Second, SubWindows: 10, NoDenyCache: true})))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, key := c.make(), Key(t)
			runSteps(t, l, key, []step{
				{at: 100 * ms, allowed: true, remaining: 1},
				{at: 200 * ms, allowed: true, remaining: 0},
				{at: 2100 * ms, allowed: true, remaining: 1},
				{at: 2200 * ms, allowed: true, remaining: 0},
			})
			for i, at := range []time.Duration{300 * ms, 400 * ms, 500 * ms, 2300 * ms} {
				if d := allow(t, l, key, Base.Add(at), 1); d.Allowed {
					t.Fatalf("late call %d (at %v, after 2 at 100-200 ms and 2 at 2100-2200 ms, limit 2): admitted: %+v", i, at, d)
				}
			}
		})
	}
}
