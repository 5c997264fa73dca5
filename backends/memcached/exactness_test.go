package memcached_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/limiter"
)

const workers = 64

// base is a whole hour, so sub-window arithmetic is exact.
var base = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

// storm runs workers goroutines, started together, each calling decide
// tries times, and returns how many decisions allowed. Any error fails the
// test.
func storm(t *testing.T, tries int, decide func(worker, try int) (bool, error)) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range tries {
				ok, err := decide(w, i)
				if err != nil {
					errs <- err
					return
				}
				if ok {
					allowed.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return allowed.Load()
}

func allowAt(l limiter.Limiter, key string, at time.Time) func(int, int) (bool, error) {
	return func(int, int) (bool, error) {
		d, err := l.AllowN(context.Background(), key, at, 1)
		return d.Allowed, err
	}
}

// topUp makes sequential requests until one is denied and returns how many
// were allowed.
func topUp(t *testing.T, l limiter.Limiter, key string, at time.Time) int64 {
	t.Helper()
	var n int64
	for {
		d, err := l.AllowN(context.Background(), key, at, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			return n
		}
		n++
	}
}

func TestExactnessHotKey(t *testing.T) {
	s := newStore(t, memcached.Config{})
	const limit = 100
	fw, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: limit, Window: time.Minute})
	sw, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: limit, Window: time.Minute, SubWindows: 12})
	tb, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: limit, RefillTime: time.Hour})
	sl, _ := limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Limit: limit, Window: time.Minute})
	for _, c := range []struct {
		name string
		l    limiter.Limiter
		// exact algorithms allow exactly the limit under contention; the
		// windows may allow less while refunds of denials are in flight,
		// and are topped up to exactly the limit afterwards.
		exact bool
	}{
		{"FixedWindow", fw, false},
		{"SlidingBounded", sw, false},
		{"TokenBucket", tb, true},
		{"SlidingLog", sl, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := limitertestKey(t)
			at := base.Add(17 * time.Second)
			n := storm(t, 5, allowAt(c.l, key, at))
			t.Logf("%d of %d allowed under contention", n, workers*5)
			if n > limit || (c.exact && n != limit) || n == 0 {
				t.Fatalf("%d allowed by %d goroutines on one key, limit %d", n, workers, limit)
			}
			if n += topUp(t, c.l, key, at); n != limit {
				t.Fatalf("%d allowed in all, want exactly %d", n, limit)
			}
		})
	}
}

// TestExactnessAcrossSubWindows: the goroutines move through the
// sub-windows of a bounded sliding window together (a barrier between
// sub-windows, as with synchronized clocks and sub-windows much longer than
// a round trip). No window-length interval ever gets more than the limit.
func TestExactnessAcrossSubWindows(t *testing.T) {
	s := newStore(t, memcached.Config{})
	const limit, k = 50, 4
	sub := 15 * time.Second
	sw, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: limit, Window: k * sub, SubWindows: k})
	fw, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: limit, Window: sub})
	for _, c := range []struct {
		name string
		l    limiter.Limiter
		span int // sub-windows a window-length interval can touch
	}{{"SlidingBounded", sw, k + 1}, {"FixedWindow", fw, 1}} {
		t.Run(c.name, func(t *testing.T) {
			key := limitertestKey(t)
			const subWindows = 12
			per := make([]int64, subWindows)
			for i := range subWindows {
				// Traffic in bursts, heavier every third sub-window.
				tries := 1
				if i%3 == 0 {
					tries = 3
				}
				at := base.Add(time.Duration(i)*sub + time.Second)
				per[i] = storm(t, tries, allowAt(c.l, key, at))
			}
			t.Logf("allowed per sub-window: %v", per)
			for i := range per {
				var sum int64
				for j := max(0, i-c.span+1); j <= i; j++ {
					sum += per[j]
				}
				if sum > limit {
					t.Fatalf("%d allowed in sub-windows %d..%d, limit %d", sum, max(0, i-c.span+1), i, limit)
				}
			}
		})
	}
}

// TestBoundaryRace: half the goroutines decide at the end of sub-window i,
// half at the start of i+1, all at once. The two sub-windows together never
// allow more than the limit: each decision's reads run after its increment
// on the server, so of two racing decisions at least one sees the other.
func TestBoundaryRace(t *testing.T) {
	const limit, k = 40, 4
	sub := 15 * time.Second
	for _, proxy := range []bool{false, true} {
		t.Run(fmt.Sprintf("Proxy=%v", proxy), func(t *testing.T) {
			s := newStore(t, memcached.Config{Proxy: proxy})
			sw, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: limit, Window: k * sub, SubWindows: k})
			for round := range 10 {
				key := limitertestKey(t)
				var a, b atomic.Int64
				storm(t, 2, func(w, _ int) (bool, error) {
					at, n := base.Add(sub-time.Millisecond), &a
					if w%2 == 1 {
						at, n = base.Add(sub), &b
					}
					d, err := sw.Allow(context.Background(), key, at)
					if d.Allowed {
						n.Add(1)
					}
					return d.Allowed, err
				})
				if a.Load()+b.Load() > limit {
					t.Fatalf("round %d: %d allowed in sub-window i and %d in i+1, limit %d over both", round, a.Load(), b.Load(), limit)
				}
			}
		})
	}
}

// TestExactnessRealClock: 64 goroutines decide on one key with the wall
// clock for a few seconds, across sub-window boundaries, some decisions in
// one round trip and some (near boundaries) in two. The bounded sliding
// window never allows more than its limit in any window-length interval.
func TestExactnessRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	const timeout = 300 * time.Millisecond
	s := newStore(t, memcached.Config{Timeout: timeout})
	const limit, k = 300, 4
	sub := time.Second
	window := k * sub
	sw, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: limit, Window: window, SubWindows: k})
	key := limitertestKey(t)
	var mu sync.Mutex
	var allowed []time.Time
	var failed atomic.Int64
	end := time.Now().Add(2*window + sub/2)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				now := time.Now()
				d, err := sw.Allow(context.Background(), key, now)
				switch {
				case err != nil:
					// A failed call is not admitted; its incr may still
					// land, which only makes the window stricter.
					failed.Add(1)
				case d.Allowed:
					mu.Lock()
					allowed = append(allowed, now)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(allowed, time.Time.Compare)
	worst, lo := 0, 0
	for hi, at := range allowed {
		for allowed[lo].Before(at.Add(-window)) {
			lo++
		}
		worst = max(worst, hi-lo+1)
	}
	t.Logf("%d allowed, %d failed calls; at most %d in any %v (limit %d)", len(allowed), failed.Load(), worst, window, limit)
	if worst > limit {
		t.Fatalf("%d allowed within %v, limit %d", worst, window, limit)
	}
}
