package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// Decision is the outcome of one rate-limit check.
type Decision struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Limit is the capacity of the limit that decided: a bucket's
	// maxAmount, a window's request count.
	Limit int64
	// Remaining is how much of Limit is left after this request (never
	// negative).
	Remaining int64
	// ResetAfter is how long until the limit is back to full capacity if
	// no more requests arrive.
	ResetAfter time.Duration
	// RetryAfter is how long until a request of the same cost could be
	// allowed if no more requests arrive; zero when Allowed.
	RetryAfter time.Duration
	// Name is the name of the limit that decided (for a [Stack], the limit
	// that denied, or the allowing limit with the least remaining).
	Name string
	// Granted is what a store's lease take gave a capacity lease (the
	// decision at hand's cost included); zero for any other step.
	// LeaseRef is where a bucket's lease take counted them: the lease
	// epoch of its slot, which its return names.
	Granted, LeaseRef int64
}

// fromStore is a store's decision d as limit name's.
func fromStore(d storage.Decision, name string) Decision {
	return Decision{
		Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		ResetAfter: d.ResetAfter, RetryAfter: d.RetryAfter, Name: name,
		Granted: d.Granted, LeaseRef: d.LeaseRef,
	}
}

// Limiter is what every algorithm in this package offers.
//
// AllowN takes n units (the request's cost) from key at time now and reports
// the decision. Refund gives back n units taken by an allowed AllowN with the
// same key and now (a [Stack] uses it when a later limit denies).
type Limiter interface {
	AllowN(ctx context.Context, key string, now time.Time, n int64) (Decision, error)
	Refund(ctx context.Context, key string, now time.Time, n int64) error
}

// Clock supplies the current time. Algorithms never read the time
// themselves: callers pass Clock.Now() (or a historical timestamp) as now.
type Clock interface {
	Now() time.Time
}

// ClockFunc adapts a function to a [Clock].
type ClockFunc func() time.Time

// Now returns f().
func (f ClockFunc) Now() time.Time { return f() }

// SystemClock is the wall clock.
var SystemClock Clock = ClockFunc(time.Now)

var (
	// ErrInvalidConfig is wrapped by every configuration error.
	ErrInvalidConfig = errors.New("limiter: invalid configuration")
	// ErrInvalidCost is wrapped when a request's cost is not positive or
	// exceeds what the limit could ever allow.
	ErrInvalidCost = errors.New("limiter: invalid cost")
	// ErrInvalidTime is wrapped when now lies outside the years 1678 to
	// 2261, which Unix nanoseconds cannot represent.
	ErrInvalidTime = errors.New("limiter: time out of range")
	// ErrRefund is wrapped when giving back units after a denial failed;
	// the accompanying Decision is still valid.
	ErrRefund = errors.New("limiter: refund failed")
	// ErrUnknownLease is wrapped by [ParseLease] when its input is not a
	// lease.
	ErrUnknownLease = errors.New("limiter: not a lease")
	// ErrNoUtilization is wrapped when the utilization signal could not be
	// read. The accompanying decision of [UtilizationShedder.Check] is
	// still valid.
	ErrNoUtilization = errors.New("limiter: utilization unavailable")
	// ErrStaleUtilization is wrapped when a published utilization is
	// missing or older than its MaxAge.
	ErrStaleUtilization = errors.New("limiter: published utilization is missing or stale")
)

// unixNano returns now in Unix nanoseconds, or an error if it does not fit.
func unixNano(name string, now time.Time) (int64, error) {
	if sec := now.Unix(); sec <= -(1<<63-1)/int64(time.Second) || sec >= (1<<63-1)/int64(time.Second) {
		return 0, fmt.Errorf("%w: limit %q: %v", ErrInvalidTime, name, now)
	}
	return now.UnixNano(), nil
}
