package limiter

import (
	"context"
	"fmt"
	"testing"
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
	pending int
}

func (s *throttleNext) Do(ctx context.Context, steps []storage.Step, res []storage.StepResult) {
	for i := range steps {
		if steps[i].Key.Name == s.hot && s.pending > 0 {
			s.pending--
			res[i] = storage.StepResult{Err: fmt.Errorf("test store: throughput exceeded: %w", storage.ErrThrottled)}
			continue
		}
		res[i] = storage.DoStep(ctx, s.Store, &steps[i])
	}
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
			s.pending = 1
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
// all), with and without leases, for a window and a bucket. Remembering
// a throttled denial in the deny cache (brokenThrottleCache, as before)
// denies the key's next decisions for ThrottledRetryAfter: the calls
// after the start's throttles, and a whole backlog after one throttle.
func TestThrottleDeniesItsOwnDecision(t *testing.T) {
	for _, alg := range []string{"window", "bucket"} {
		for _, leases := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/leases=%v", alg, leases), func(t *testing.T) {
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
			})
		}
	}
}
