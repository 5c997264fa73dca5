package limiter_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

func TestTighter(t *testing.T) {
	allow := func(rem int64, reset time.Duration, failed bool) limiter.Outcome {
		return limiter.Outcome{Decision: limiter.Decision{Allowed: true, Remaining: rem, ResetAfter: reset}, Failed: failed}
	}
	deny := limiter.Outcome{Decision: limiter.Decision{RetryAfter: time.Second}}
	throttled := limiter.Outcome{Decision: limiter.Decision{RetryAfter: limiter.ThrottledRetryAfter}, Throttled: true}
	for _, c := range []struct {
		name        string
		a, b        limiter.Outcome
		failedFirst bool
		want        bool
	}{
		{name: "denial over allowance", a: deny, b: allow(0, 0, false), want: true},
		{name: "throttled is a denial", a: throttled, b: allow(0, 0, false), want: true},
		{name: "first denial stands", a: deny, b: deny, want: false},
		{name: "allowance never over denial", a: allow(0, 0, false), b: deny, want: false},
		{name: "less remaining", a: allow(1, 0, false), b: allow(2, 0, false), want: true},
		{name: "more remaining", a: allow(3, 0, false), b: allow(2, 0, false), want: false},
		{name: "tie: longer reset", a: allow(2, 2*time.Second, false), b: allow(2, time.Second, false), want: true},
		{name: "tie: shorter reset", a: allow(2, time.Second, false), b: allow(2, 2*time.Second, false), want: false},
		{name: "tie: same reset keeps the first", a: allow(2, time.Second, false), b: allow(2, time.Second, false), want: false},
		{name: "answered over failed", a: allow(5, 0, false), b: allow(0, 0, true), want: true},
		{name: "failed under answered", a: allow(0, 0, true), b: allow(5, 0, false), want: false},
		{name: "failedFirst: failed over answered", a: allow(5, 0, true), b: allow(0, 0, false), failedFirst: true, want: true},
		{name: "failedFirst: answered under failed", a: allow(0, 0, false), b: allow(5, 0, true), failedFirst: true, want: false},
		{name: "failedFirst: denial still first", a: allow(0, 0, true), b: deny, failedFirst: true, want: false},
	} {
		if got := limiter.Tighter(&c.a, &c.b, c.failedFirst); got != c.want {
			t.Errorf("%s: Tighter = %v, want %v", c.name, got, c.want)
		}
	}
}
