package limiter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/storage"
)

// throttleNext is a memory store that refuses, for capacity, the next
// `pending` store steps of its hot key (as DynamoDB's partition refuses a
// hot key's writes past its cap), and serves everything else.
type throttleNext struct {
	*memory.Store
	hot     string
	mu      sync.Mutex
	pending int
}

func (s *throttleNext) Do(ctx context.Context, steps []storage.Step, res []storage.StepResult) {
	for i := range steps {
		if steps[i].Key.Name == s.hot && s.refuse() {
			res[i] = storage.StepResult{Err: fmt.Errorf("test store: throughput exceeded: %w", storage.ErrThrottled)}
			continue
		}
		res[i] = storage.DoStep(ctx, s.Store, &steps[i])
	}
}

// refuse reports whether the hot key's step is refused (one of pending).
func (s *throttleNext) refuse() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending > 0 {
		s.pending--
		return true
	}
	return false
}

// throttleMore refuses the hot key's next n steps.
func (s *throttleNext) throttleMore(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = n
}

// throttleRun is one process deciding a hot key far under its limit
// (the hot-key lease test's: 5,000 a second, this process 62.5 a
// second), whose store throttles the key's first 3 store steps (a
// partition's storm at a run's start), then, after a second, 15 calls
// that queued behind a stall answered back to back whose first store
// step is throttled. It returns the decisions, the units admitted, and
// the denials by throttle and by the deny cache.
func throttleRun(t *testing.T, alg string, leases bool) (calls, admitted, throttledN, cached int) {
	t.Helper()
	s := &throttleNext{Store: throttleStore(t), hot: "hot", pending: 3}
	l := throttleLimiter(t, alg, s, leases)
	ctx := context.Background()
	stamps, backlog := throttleStamps()
	out := make([]Outcome, 1)
	for i, now := range stamps {
		if i == backlog {
			s.throttleMore(1)
		}
		if _, err := Decide(ctx, now, []Item{{Limit: l, Key: "hot", N: 1}}, out); err != nil {
			t.Fatal(err)
		}
		switch o := out[0]; {
		case o.Throttled:
			throttledN++
		case o.Cached:
			cached++
		case o.Decision.Allowed:
			admitted++
		}
	}
	return len(stamps), admitted, throttledN, cached
}

func throttleStore(t *testing.T) *memory.Store {
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return mem
}

func throttleLimiter(t *testing.T, alg string, s storage.Store, leases bool) Limiter {
	var l Limiter
	var err error
	switch alg {
	case "bucket":
		l, err = NewTokenBucket(s, TokenBucketConfig{Name: "b", MaxAmount: 5000, RefillTime: time.Millisecond, RefillAmount: 5, Leases: leases})
	default:
		l, err = NewSlidingWindow(s, SlidingWindowConfig{Name: "w", Limit: 300000, Window: time.Minute, Leases: leases})
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// throttleStamps are throttleRun's decisions' stamps: a second at 62.5
// a second, a stall of 240 ms, 15 calls 50 us apart from the index
// backlog on, and half a second at the pace again.
func throttleStamps() (stamps []time.Time, backlog int) {
	t0 := time.Unix(1e9, 0)
	for i := range 63 {
		stamps = append(stamps, t0.Add(time.Duration(i)*16*time.Millisecond))
	}
	backlog = len(stamps)
	stall := t0.Add(time.Second + 240*time.Millisecond)
	for i := range 15 {
		stamps = append(stamps, stall.Add(time.Duration(i)*50*time.Microsecond))
	}
	for i := range 30 {
		stamps = append(stamps, stall.Add(time.Duration(i+1)*16*time.Millisecond))
	}
	return stamps, backlog
}

// throttleExact is what the limit without leases admits on the same
// stamps on a store that throttles nothing.
func throttleExact(t *testing.T, alg string) int {
	l := throttleLimiter(t, alg, throttleStore(t), false)
	stamps, _ := throttleStamps()
	n := 0
	for _, now := range stamps {
		d, err := l.AllowN(context.Background(), "hot", now, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			n++
		}
	}
	return n
}

// A throttle denies its own decision only: far under the limit, every
// decision that was not itself throttled is admitted (exact admits them
// all), with and without leases, for a window and a bucket: the calls
// after a throttle wait for the key's backoff (in a synctest bubble: its
// clock) and are then decided by the store or a lease. Remembering a
// throttled denial in the deny cache (brokenThrottleCache, as before)
// denies the key's next decisions for ThrottledRetryAfter: the calls
// after the start's throttles, and a whole backlog after one throttle.
func TestThrottleDeniesItsOwnDecision(t *testing.T) {
	for _, alg := range []string{"window", "bucket"} {
		for _, leases := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/leases=%v", alg, leases), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { throttleBacklog(t, alg, leases) })
			})
		}
	}
}

func throttleBacklog(t *testing.T, alg string, leases bool) {
	exact := throttleExact(t, alg)
	calls, admitted, thr, cached := throttleRun(t, alg, leases)
	brokenThrottleCache = true
	_, bAdmitted, bThr, bCached := throttleRun(t, alg, leases)
	brokenThrottleCache = false
	t.Logf("%d decisions, exact admits %d: %d admitted, %d throttled, %d denied by the deny cache; remembering throttles: %d admitted, %d throttled, %d denied by the deny cache",
		calls, exact, admitted, thr, cached, bAdmitted, bThr, bCached)
	if thr != 4 {
		t.Errorf("%d decisions throttled, want the 4 the store refused", thr)
	}
	if cached != 0 || admitted != exact-thr {
		t.Errorf("admitted %d of exact's %d with %d throttled, %d denied by the deny cache: want all but the throttled", admitted, exact, thr, cached)
	}
	// The check above sees the old behaviour.
	if bCached == 0 || bAdmitted == exact-bThr {
		t.Errorf("remembering throttles: admitted %d of exact's %d with %d throttled, %d cached: the check above would not see it", bAdmitted, exact, bThr, bCached)
	}
}

// throttleSpell is a memory store that refuses, for capacity, every store
// step of its hot key until off (a partition past its cap for a while),
// each step taking latency, and counts the hot key's steps: those sent
// before off, and the most in flight at once among those sent after
// quiet (when the first throttle has come back and every step sent
// before it has ended).
type throttleSpell struct {
	*memory.Store
	hot            string
	latency        time.Duration
	off, quiet     time.Time
	mu             sync.Mutex
	sent, inFlight int
	most           int
}

func (s *throttleSpell) Do(ctx context.Context, steps []storage.Step, res []storage.StepResult) {
	hot := 0
	for i := range steps {
		if steps[i].Key.Name == s.hot {
			hot++
		}
	}
	now := time.Now()
	s.mu.Lock()
	if now.Before(s.off) {
		s.sent += hot
	}
	s.inFlight += hot
	if !now.Before(s.quiet) && now.Before(s.off) {
		s.most = max(s.most, s.inFlight)
	}
	s.mu.Unlock()
	time.Sleep(s.latency)
	for i := range steps {
		if steps[i].Key.Name == s.hot && now.Before(s.off) {
			res[i] = storage.StepResult{Err: fmt.Errorf("test store: throughput exceeded: %w", storage.ErrThrottled)}
			continue
		}
		res[i] = storage.DoStep(ctx, s.Store, &steps[i])
	}
	s.mu.Lock()
	s.inFlight -= hot
	s.mu.Unlock()
}

// spellResult is what a throttle spell's callers got.
type spellResult struct {
	sent, most                 int
	decisions, admitted, thr   int
	cached, failed, lateDenied int
}

// spellCallers and spellSpell: the callers of one process deciding the hot
// key at once, and how long the store throttles it.
const (
	spellCallers = 16
	spellSpell   = 500 * time.Millisecond
	spellLatency = 2 * time.Millisecond
)

// throttleSpellRun has spellCallers goroutines of one process decide the
// hot key every 5 ms for a second, each decision with a deadline of a
// second, while the store throttles the key for the first spellSpell.
func throttleSpellRun(t *testing.T, alg string, leases bool) spellResult {
	t.Helper()
	begin := time.Now()
	s := &throttleSpell{Store: throttleStore(t), hot: "hot", latency: spellLatency, off: begin.Add(spellSpell), quiet: begin.Add(2 * spellLatency)}
	l := throttleLimiter(t, alg, s, leases)
	var (
		mu sync.Mutex
		r  spellResult
		wg sync.WaitGroup
	)
	for range spellCallers {
		wg.Go(func() {
			for time.Since(begin) < time.Second {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				var out [1]Outcome
				_, err := Decide(ctx, time.Now(), []Item{{Limit: l, Key: "hot", N: 1}}, out[:])
				cancel()
				mu.Lock()
				r.decisions++
				switch o := out[0]; {
				case err != nil:
					r.failed++
					t.Logf("failed: %v", err)
				case o.Throttled:
					r.thr++
				case o.Cached:
					r.cached++
				case o.Decision.Allowed:
					r.admitted++
				}
				if !out[0].Decision.Allowed && time.Since(begin) > spellSpell+2*ThrottledRetryAfter {
					r.lateDenied++
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	r.sent, r.most = s.sent, s.most
	return r
}

// While its store throttles a key, a process sends it at most one store
// request at a time, about one per ThrottledRetryAfter after the first
// throttle: spellCallers goroutines deciding the key every 5 ms through a
// spell of 500 ms send at most spellCallers (before the first throttle
// comes back) and one per backoff after, and once the spell is over
// every decision is admitted (the limit is far). Without a backoff
// (brokenNoBackoff: a throttle neither remembered nor waited for) every
// decision is a request; remembering the throttle in the deny cache
// (brokenThrottleCache, as before) sends every caller's next decision at
// once when its RetryAfter ends. Counted at the store, in a synctest
// bubble.
func TestThrottleBackoffBounded(t *testing.T) {
	for _, alg := range []string{"window", "bucket"} {
		for _, leases := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/leases=%v", alg, leases), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { throttleBounded(t, alg, leases) })
			})
		}
	}
}

func throttleBounded(t *testing.T, alg string, leases bool) {
	r := throttleSpellRun(t, alg, leases)
	brokenNoBackoff = true
	none := throttleSpellRun(t, alg, leases)
	brokenNoBackoff = false
	brokenThrottleCache = true
	cache := throttleSpellRun(t, alg, leases)
	brokenThrottleCache = false
	for _, c := range []struct {
		name string
		r    spellResult
	}{{"backoff", r}, {"no backoff", none}, {"throttles cached", cache}} {
		t.Logf("%s: %d requests of the key during the spell, at most %d in flight after the first throttle; %d decisions: %d admitted, %d throttled, %d denied by the deny cache, %d failed, %d denied after the spell",
			c.name, c.r.sent, c.r.most, c.r.decisions, c.r.admitted, c.r.thr, c.r.cached, c.r.failed, c.r.lateDenied)
	}
	bound := spellCallers + int(spellSpell/ThrottledRetryAfter) + 1
	if r.sent > bound || r.most > 1 {
		t.Errorf("%d requests during the spell (bound %d), %d in flight at once after the first throttle (want 1)", r.sent, bound, r.most)
	}
	if r.failed != 0 || r.cached != 0 || r.lateDenied != 0 {
		t.Errorf("%d failed, %d denied by the deny cache, %d denied after the spell: want none", r.failed, r.cached, r.lateDenied)
	}
	// The checks above see the variants.
	if none.sent <= bound {
		t.Errorf("no backoff: %d requests during the spell, within the bound %d: the check would not see it", none.sent, bound)
	}
	if cache.most <= 1 && cache.cached == 0 {
		t.Errorf("throttles cached: %d in flight at once, %d denied by the deny cache: the checks would not see it", cache.most, cache.cached)
	}
}
