package breaker

import (
	"time"

	"github.com/sluicehq/sluice/internal/circuit"
	"github.com/sluicehq/sluice/limiter"
)

// The state machine lives in internal/circuit, which the memcached store's
// breakers per node share; this package names it.

// ErrOpen is wrapped by the error of a call the breaker refused; the same
// error wraps [limiter.ErrUnavailable].
var ErrOpen = limiter.ErrBreakerOpen

// Defaults of [Config].
const (
	// DefaultFailures is how many failures in a row open a breaker.
	DefaultFailures = circuit.DefaultFailures
	// DefaultOpenFor is how long a breaker stays open before a probe.
	DefaultOpenFor time.Duration = circuit.DefaultOpenFor
)

// State is a breaker's state: [Closed], [HalfOpen] or [Open]. Its String
// method returns "closed", "half-open" or "open".
type State = circuit.State

// States of a breaker.
const (
	Closed   = circuit.Closed
	HalfOpen = circuit.HalfOpen
	Open     = circuit.Open
)

// Config configures a [Breaker]: Name (the backend in errors, log lines
// and OnChange), Node (optional: the part of the backend it guards),
// Failures (how many failures in a row open it, DefaultFailures when 0),
// OpenFor (how long it refuses calls before a probe, DefaultOpenFor when
// 0), Clock, Logger (transitions) and OnChange (called after each
// transition, outside the breaker's lock).
type Config = circuit.Config

// Stats counts a breaker's work since it was made: State, Opens, Closes,
// Probes, Rejected (calls refused without reaching the store) and Failures.
type Stats = circuit.Stats

// Breaker is a circuit breaker (see the package documentation). The zero
// value is not usable: make one with [New]. Safe for concurrent use.
//
// Allow asks whether a call may go to the store (an error wrapping
// [ErrOpen] and [limiter.ErrUnavailable] when it may not); the caller
// then makes the call and reports its error with Done, passing on Allow's
// probe. State and Stats read it.
type Breaker = circuit.Breaker

// New returns a closed breaker.
func New(cfg Config) (*Breaker, error) { return circuit.New(cfg) }
