package policy

import (
	"fmt"
	"strconv"

	"github.com/sluicehq/sluice/limiter"
)

// parsePriority parses a rule's priority: a name of [limiter.Priority]
// (low, normal, high, critical) or the same as a number (-1 to 2).
func parsePriority(s string) (limiter.Priority, error) {
	var p limiter.Priority
	if err := p.UnmarshalText([]byte(s)); err == nil {
		return p, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < int(limiter.PriorityLow) || n > int(limiter.PriorityCritical) {
		return 0, fmt.Errorf("%q is not low, normal, high, critical or a number from %d (low) to %d (critical)", s, limiter.PriorityLow, limiter.PriorityCritical)
	}
	return limiter.Priority(n), nil
}

// FailMode says what a rule does when its backend errs or times out.
type FailMode uint8

const (
	// FailOpen allows the request (Stripe's choice). It is the zero value.
	FailOpen FailMode = iota
	// FailClosed denies the request.
	FailClosed
)

// String returns "open" or "closed".
func (f FailMode) String() string {
	if f == FailClosed {
		return "closed"
	}
	return "open"
}

// Algorithm names a limit's algorithm.
type Algorithm uint8

// The algorithms of package limiter.
const (
	TokenBucket Algorithm = iota + 1
	SlidingWindow
	FixedWindow
	SlidingLog
)

var algorithmNames = map[string]Algorithm{
	"token_bucket":   TokenBucket,
	"sliding_window": SlidingWindow,
	"fixed_window":   FixedWindow,
	"sliding_log":    SlidingLog,
}

// String returns the name used in rules files.
func (a Algorithm) String() string {
	for n, v := range algorithmNames {
		if v == a {
			return n
		}
	}
	return "algorithm(" + strconv.Itoa(int(a)) + ")"
}
