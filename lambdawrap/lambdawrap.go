package lambdawrap

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Leaser is what [Concurrency] needs from a limit: [limiter.Concurrency].
type Leaser interface {
	Acquire(ctx context.Context, key string, now time.Time) (limiter.Lease, limiter.Decision, error)
	Release(ctx context.Context, l limiter.Lease) error
}

// Releaser gives back a lease: [limiter.Concurrency] and
// [limiter.FleetShedder].
type Releaser interface {
	Release(ctx context.Context, l limiter.Lease) error
}

var (
	_ Leaser   = (*limiter.Concurrency)(nil)
	_ Releaser = (*limiter.FleetShedder)(nil)
)

// ErrDenied is wrapped by the error a wrapped handler returns for a request
// over the limit, when Config.Denied is nil.
var ErrDenied = errors.New("lambdawrap: too many concurrent requests")

// DeniedError is the error a wrapped handler returns for a request over the
// limit, when Config.Denied is nil. It wraps [ErrDenied].
type DeniedError struct {
	// Decision is the limit's decision (RetryAfter says when to retry).
	Decision limiter.Decision
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("%v: limit %q of %d, retry after %v", ErrDenied, e.Decision.Name, e.Decision.Limit, e.Decision.RetryAfter)
}

// Unwrap returns ErrDenied.
func (e *DeniedError) Unwrap() error { return ErrDenied }

// DefaultReleaseTimeout bounds a release when Config.ReleaseTimeout is zero.
const DefaultReleaseTimeout = 2 * time.Second

// Config configures [ConcurrencyWith].
type Config[In, Out any] struct {
	// Key returns the limit's key for an event (a user, an API key, a
	// source IP; a constant for a global limit). An error is returned by
	// the wrapped handler as it is, without calling the handler. Required.
	Key func(context.Context, In) (string, error)
	// Denied builds the response to a request over the limit (say, a 429
	// APIGatewayProxyResponse with a Retry-After header). Nil means a zero
	// Out and a *DeniedError.
	Denied func(context.Context, In, limiter.Decision) (Out, error)
	// FailClosed refuses a request when the limit's store fails: the
	// wrapped handler returns the store's error. By default the handler
	// runs without a lease (Stripe fails open: a store outage must not
	// take the API down).
	FailClosed bool
	// OnError, when not nil, is told of store errors: a failed acquire
	// (before failing open or closed) and a failed release (the slot is
	// then held until its lease expires). Count them in a metric.
	OnError func(context.Context, error)
	// Clock supplies the acquire's time. Nil means limiter.SystemClock.
	Clock limiter.Clock
	// ReleaseTimeout bounds the release, which runs even when the
	// handler's context is done (on a context detached from its
	// cancellation). Zero means DefaultReleaseTimeout.
	ReleaseTimeout time.Duration
}

// Concurrency wraps h so that at most the limit's capacity of calls per key
// run at once: ConcurrencyWith with Config{Key: key}.
func Concurrency[In, Out any](h func(context.Context, In) (Out, error), l Leaser, key func(context.Context, In) (string, error)) func(context.Context, In) (Out, error) {
	return ConcurrencyWith(h, l, Config[In, Out]{Key: key})
}

// ConcurrencyWith wraps h: each call acquires a lease on cfg.Key's key
// before calling h and releases it after h returns, returns an error or
// panics (the panic continues after the release). A call over the limit
// does not call h and answers with cfg.Denied. It panics if l or cfg.Key is
// nil, when wrapping (at start-up), never during a call.
func ConcurrencyWith[In, Out any](h func(context.Context, In) (Out, error), l Leaser, cfg Config[In, Out]) func(context.Context, In) (Out, error) {
	if h == nil || l == nil || cfg.Key == nil {
		panic("lambdawrap: ConcurrencyWith needs a handler, a limit and a Key function")
	}
	clock := cfg.Clock
	if clock == nil {
		clock = limiter.SystemClock
	}
	return func(ctx context.Context, in In) (Out, error) {
		var zero Out
		key, err := cfg.Key(ctx, in)
		if err != nil {
			return zero, err
		}
		lease, d, err := l.Acquire(ctx, key, clock.Now())
		switch {
		case err != nil:
			if cfg.OnError != nil {
				cfg.OnError(ctx, err)
			}
			if cfg.FailClosed {
				return zero, err
			}
		case !d.Allowed:
			if cfg.Denied != nil {
				return cfg.Denied(ctx, in, d)
			}
			return zero, &DeniedError{Decision: d}
		default:
			defer release(ctx, l, lease, cfg.ReleaseTimeout, cfg.OnError)
		}
		return h(ctx, in)
	}
}

// LeaseContextKey is the authorizer context key under which an authorizer
// passes its leases to the integration: Sluice's authorizer writes
// [FormatLeases] (read them with [LeasesFromContext] and release them with
// [ReleaseLeases]); a single bare lease (limiter.Lease.String) is read by
// [LeaseFromContext]. API Gateway
// hands it to a Lambda proxy integration as
// requestContext.authorizer.sluiceLease (REST APIs) or
// requestContext.authorizer.lambda.sluiceLease (HTTP APIs).
const LeaseContextKey = "sluiceLease"

// LeaseFromContext returns the lease an authorizer put in its context, given
// the authorizer map of the integration's event
// (events.APIGatewayProxyRequest.RequestContext.Authorizer, or
// events.APIGatewayV2HTTPRequest.RequestContext.Authorizer.Lambda). It
// reports false when there is none or it is malformed.
func LeaseFromContext(authorizer map[string]any) (limiter.Lease, bool) {
	s, ok := authorizer[LeaseContextKey].(string)
	if !ok || s == "" {
		return limiter.Lease{}, false
	}
	l, err := limiter.ParseLease(s)
	if err != nil {
		return limiter.Lease{}, false
	}
	return l, true
}

// ReleaseConfig configures [Release].
type ReleaseConfig struct {
	// OnError, when not nil, is told of a failed release.
	OnError func(context.Context, error)
	// ReleaseTimeout bounds the release. Zero means DefaultReleaseTimeout.
	ReleaseTimeout time.Duration
}

// Release wraps h so that the lease leaseOf finds in the event (taken
// upstream, for example by the authorizer) is released after h returns,
// returns an error or panics. An event without a lease just calls h.
func Release[In, Out any](h func(context.Context, In) (Out, error), r Releaser, leaseOf func(context.Context, In) (limiter.Lease, bool), cfg ReleaseConfig) func(context.Context, In) (Out, error) {
	if h == nil || r == nil || leaseOf == nil {
		panic("lambdawrap: Release needs a handler, a releaser and a lease function")
	}
	return func(ctx context.Context, in In) (Out, error) {
		if lease, ok := leaseOf(ctx, in); ok && lease.Held() {
			defer release(ctx, r, lease, cfg.ReleaseTimeout, cfg.OnError)
		}
		return h(ctx, in)
	}
}

// release gives lease back on a context detached from ctx's cancellation
// (the handler may have run out of time) and bounded by timeout.
func release(ctx context.Context, r Releaser, lease limiter.Lease, timeout time.Duration, onError func(context.Context, error)) {
	if timeout <= 0 {
		timeout = DefaultReleaseTimeout
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := r.Release(rctx, lease); err != nil && onError != nil {
		onError(ctx, err)
	}
}
