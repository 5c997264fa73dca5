package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

func capWindow(t *testing.T, limit int64, leases bool) *limiter.SlidingWindow {
	t.Helper()
	w, err := limiter.NewSlidingWindow(newStore(t), limiter.SlidingWindowConfig{Name: "w", Limit: limit, Window: time.Second, SubWindows: 10,
		Representation: limiter.SubWindowCounters, Leases: leases})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func decideCapped(t *testing.T, l limiter.Limiter, at time.Time, cap int64) limiter.Outcome {
	t.Helper()
	var out [1]limiter.Outcome
	if _, err := limiter.Decide(context.Background(), at, []limiter.Item{{Limit: l, Key: "k", N: 1, Cap: cap}}, out[:]); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// A capped decision is judged against the cap on the window's own
// counters: 10 of a cap of 10 pass, the 11th is denied with the cap as
// its Limit; a higher cap is not answered from that cached denial; an
// uncapped decision sees the whole limit, less what the capped ones took.
func TestCapWindow(t *testing.T) {
	w := capWindow(t, 100, false)
	at := time.Unix(1000, 0)
	for i := range 10 {
		if o := decideCapped(t, w, at, 10); !o.Decision.Allowed || o.Decision.Limit != 10 || o.Decision.Remaining != int64(9-i) {
			t.Fatalf("call %d under a cap of 10: %+v, want allowed, limit 10, remaining %d", i, o.Decision, 9-i)
		}
	}
	o := decideCapped(t, w, at, 10)
	if o.Decision.Allowed || o.Decision.Limit != 10 || o.Decision.RetryAfter <= 0 {
		t.Fatalf("11th call under a cap of 10: %+v, want denied with limit 10 and a retry-after", o.Decision)
	}
	if o := decideCapped(t, w, at, 10); !o.Cached {
		t.Errorf("12th call under the same cap: %+v, want answered from the deny cache", o)
	}
	if o := decideCapped(t, w, at, 20); !o.Decision.Allowed || o.Cached || o.Decision.Remaining != 9 {
		t.Errorf("a call under a cap raised to 20: %+v, want allowed by the store (remaining 9)", o)
	}
	if o := decideCapped(t, w, at, 0); !o.Decision.Allowed || o.Decision.Limit != 100 || o.Decision.Remaining != 100-12 {
		t.Errorf("an uncapped call: %+v, want allowed with limit 100, remaining 88", o.Decision)
	}
	if o := decideCapped(t, w, at, 1000); !o.Decision.Allowed || o.Decision.Limit != 100 {
		t.Errorf("a cap above the limit: %+v, want the limit", o.Decision)
	}
}

// A hot key with leases under a cap: the leases are taken (the key is
// decided mostly in process) and no trailing window of stamps holds more
// than the cap (the history checker over the calls).
func TestCapLeases(t *testing.T) {
	w := capWindow(t, 1000, true)
	const cap = 200
	start := time.Unix(2000, 0)
	var calls []limitertest.Call
	var admitted int64
	for i := range 3000 { // 1,000 a second for 3 s: 5.5 times the cap's rate
		at := start.Add(time.Duration(i) * time.Millisecond)
		o := decideCapped(t, w, at, cap)
		calls = append(calls, limitertest.Call{Key: "k", Cost: 1, Stamp: at, Allowed: o.Decision.Allowed, Reached: !o.Leased && !o.Cached})
		if o.Decision.Allowed {
			admitted++
		}
	}
	st := w.LeaseStats()
	if st.Takes == 0 || st.Decisions == 0 {
		t.Errorf("no leases under the cap: %+v", st)
	}
	for _, v := range limitertest.CheckTrailingWindow(calls, cap, time.Second) {
		t.Errorf("over the cap: %v", v)
	}
	// The bounded estimator with 10 sub-windows admits the cap per 1.1 s.
	if admitted < 3*cap*9/10 {
		t.Errorf("admitted %d in 3 s under a cap of %d a second: far too few", admitted, cap)
	}
	t.Logf("admitted %d under a cap of %d a second for 3 s; leases %+v", admitted, cap, st)
}

// A limit other than a window with sub-window counters refuses a cap.
func TestCapRefused(t *testing.T) {
	s := newStore(t)
	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 10, RefillTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "p", Limit: 10, Window: time.Second, Representation: limiter.Packed})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []limiter.Limiter{b, p, capWindow(t, 100, false)} {
		var out [1]limiter.Outcome
		cap := int64(5)
		if l != b && l != p {
			cap = -1
		}
		_, err := limiter.Decide(context.Background(), time.Unix(0, 0), []limiter.Item{{Limit: l, Key: "k", N: 1, Cap: cap}}, out[:])
		if !errors.Is(err, limiter.ErrInvalidConfig) {
			t.Errorf("%T with cap %d: %v, want ErrInvalidConfig", l, cap, err)
		}
	}
}
