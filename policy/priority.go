package policy

import (
	"fmt"
	"strconv"
)

// Priority ranks requests for the load shedders: higher is more important.
// Rules give it by name (low, normal, high, critical) or as a number from 1
// to [MaxPriority]; zero means normal. A request's priority is the highest of its matching
// rules (normal when none matches).
type Priority int

// Named priorities.
const (
	PriorityLow      Priority = 25
	PriorityNormal   Priority = 50
	PriorityHigh     Priority = 75
	PriorityCritical Priority = 100
	// MaxPriority is the largest priority a rule may give.
	MaxPriority Priority = 100
)

// Critical reports whether p is critical traffic, which shedders never
// shed.
func (p Priority) Critical() bool { return p >= PriorityCritical }

// String returns the name of a named priority, else the number.
func (p Priority) String() string {
	switch p {
	case PriorityLow:
		return "low"
	case PriorityNormal:
		return "normal"
	case PriorityHigh:
		return "high"
	case PriorityCritical:
		return "critical"
	}
	return strconv.Itoa(int(p))
}

// ParsePriority parses a priority name or a number from 1 to MaxPriority.
func ParsePriority(s string) (Priority, error) {
	switch s {
	case "low":
		return PriorityLow, nil
	case "normal", "":
		return PriorityNormal, nil
	case "high":
		return PriorityHigh, nil
	case "critical":
		return PriorityCritical, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > int(MaxPriority) {
		return 0, fmt.Errorf("%q is not low, normal, high, critical or a number from 1 to %d", s, MaxPriority)
	}
	return Priority(n), nil
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
