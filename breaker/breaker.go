package breaker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// ErrOpen is wrapped by the error of a call the breaker refused; the same
// error wraps [storage.ErrUnavailable].
var ErrOpen = storage.ErrBreakerOpen

// Defaults of [Config].
const (
	// DefaultFailures is how many failures in a row open a breaker.
	DefaultFailures = 5
	// DefaultOpenFor is how long a breaker stays open before a probe.
	DefaultOpenFor = time.Second
	// DefaultKeys is how many distinct keys the failures that open a
	// breaker must come from.
	DefaultKeys = 3
)

// State is a breaker's state.
type State int32

// States of a breaker.
const (
	Closed State = iota
	HalfOpen
	Open
)

// String returns "closed", "half-open" or "open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half-open"
	case Open:
		return "open"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// Config configures a [Breaker].
type Config struct {
	// Name names the backend in errors, log lines and OnChange.
	Name string
	// Node, when set, names the part of the backend this breaker guards
	// (a memcached node's address): it follows Name in errors and is the
	// "node" attribute of the log lines.
	Node string
	// Failures is how many failures in a row (errors wrapping
	// storage.ErrUnavailable) open the breaker (DefaultFailures when 0).
	Failures int
	// Keys is how many distinct keys those failures must come from
	// (DefaultKeys when 0, at most Failures): a run of one hot or slow
	// key's failures says nothing about the other keys, and opening the
	// breaker for them would hand their decisions to the fail mode. A
	// failure reported without a key (Done, or DoneKey with key 0) and a
	// refused connection count as a distinct key each: they are evidence
	// about the backend as a whole.
	Keys int
	// OpenFor is how long the breaker refuses calls before it lets one
	// probe through (DefaultOpenFor when 0).
	OpenFor time.Duration
	// Clock is the breaker's time (limiter.SystemClock when nil).
	Clock limiter.Clock
	// Logger receives the transitions (none when nil).
	Logger *slog.Logger
	// OnChange, when not nil, is called after each transition, outside
	// the breaker's lock.
	OnChange func(name string, from, to State)
}

// Stats counts a breaker's work since it was made.
type Stats struct {
	State    State
	Opens    int64 // transitions to Open (from Closed or a failed probe)
	Closes   int64 // transitions from HalfOpen to Closed
	Probes   int64 // calls let through in HalfOpen
	Rejected int64 // calls refused without reaching the store
	Failures int64 // calls that failed with ErrUnavailable
}

// Breaker is a circuit breaker (see the package documentation). The zero
// value is not usable: make one with [New]. Safe for concurrent use.
type Breaker struct {
	cfg     Config
	openErr error

	mu         sync.Mutex
	state      State
	fails      int       // consecutive failures while closed
	failKeys   []uint64  // the keys of the last consecutive failures (a ring of Failures)
	openedAt   time.Time // when it last opened
	probing    bool      // a probe is in flight
	probeStart time.Time
	lastErr    error // the failure that opened it

	opens, closes, probes, rejected, failures atomic.Int64
}

// New returns a closed breaker.
func New(cfg Config) (*Breaker, error) {
	if cfg.Failures < 0 || cfg.OpenFor < 0 {
		return nil, fmt.Errorf("%w: breaker %q: negative Failures or OpenFor", limiter.ErrInvalidConfig, cfg.Name)
	}
	if cfg.Failures == 0 {
		cfg.Failures = DefaultFailures
	}
	if cfg.OpenFor == 0 {
		cfg.OpenFor = DefaultOpenFor
	}
	if cfg.Keys < 0 {
		return nil, fmt.Errorf("%w: breaker %q: negative Keys", limiter.ErrInvalidConfig, cfg.Name)
	}
	if cfg.Keys == 0 {
		cfg.Keys = DefaultKeys
	}
	cfg.Keys = min(cfg.Keys, cfg.Failures)
	if cfg.Clock == nil {
		cfg.Clock = limiter.SystemClock
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	name := cfg.Name
	if cfg.Node != "" {
		name += " node " + cfg.Node
		cfg.Logger = cfg.Logger.With(slog.String("node", cfg.Node))
	}
	return &Breaker{
		cfg:      cfg,
		failKeys: make([]uint64, cfg.Failures),
		openErr:  fmt.Errorf("breaker %s: %w, failing fast: %w", name, ErrOpen, storage.ErrUnavailable),
	}, nil
}

// Name returns the configured name.
func (b *Breaker) Name() string { return b.cfg.Name }

// Node returns the configured node ("" for a whole backend).
func (b *Breaker) Node() string { return b.cfg.Node }

// State returns the current state. An open breaker whose OpenFor has
// passed reports Open until a call arrives to probe.
func (b *Breaker) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Stats returns the counters and the state.
func (b *Breaker) Stats() Stats {
	return Stats{
		State: b.State(), Opens: b.opens.Load(), Closes: b.closes.Load(), Probes: b.probes.Load(),
		Rejected: b.rejected.Load(), Failures: b.failures.Load(),
	}
}

// Allow asks whether a call may go to the store. It returns an error
// wrapping [ErrOpen] and [storage.ErrUnavailable] when it may not;
// otherwise the caller makes the call and reports its error with Done,
// passing on probe.
func (b *Breaker) Allow() (probe bool, err error) {
	b.mu.Lock()
	switch b.state {
	case Closed:
		b.mu.Unlock()
		return false, nil
	case Open:
		now := b.cfg.Clock.Now()
		if now.Sub(b.openedAt) < b.cfg.OpenFor {
			b.mu.Unlock()
			b.rejected.Add(1)
			return false, b.openErr
		}
		b.state, b.probing, b.probeStart = HalfOpen, true, now
		b.mu.Unlock()
		b.probes.Add(1)
		b.changed(Open, HalfOpen, nil)
		return true, nil
	default: // HalfOpen
		now := b.cfg.Clock.Now()
		// A probe outstanding for longer than OpenFor is presumed lost
		// (its caller never reported): let another through.
		if b.probing && now.Sub(b.probeStart) < b.cfg.OpenFor {
			b.mu.Unlock()
			b.rejected.Add(1)
			return false, b.openErr
		}
		b.probing, b.probeStart = true, now
		b.mu.Unlock()
		b.probes.Add(1)
		return true, nil
	}
}

// Done reports the error of a call Allow let through, as DoneKey with no
// key: a failure counts as one from a distinct key. Done(true, err) may
// also report work that did not come through Allow (a connection's I/O,
// when the calls' ends cannot be seen): while closed it counts as any
// call does, while open it is ignored, and while half-open it decides the
// probe in flight.
func (b *Breaker) Done(probe bool, err error) { b.DoneKey(probe, 0, err) }

// DoneKey reports the error of a call Allow let through for the key whose
// hash is key (0: unknown, or the backend as a whole). A throttle
// (storage.ErrThrottled) is an answer: the store refused that key for
// capacity and is up; so is a fenced take's refusal (storage.ErrFenced).
// Failures (storage.ErrUnavailable) open the breaker when Config.Failures
// of them come in a row from at least Config.Keys distinct keys.
func (b *Breaker) DoneKey(probe bool, key uint64, err error) {
	var outcome int // 1: the store answered; -1: it failed; 0: neither
	switch {
	case err == nil || errors.Is(err, storage.ErrConflict) || errors.Is(err, storage.ErrCorruptState) ||
		errors.Is(err, storage.ErrThrottled) || errors.Is(err, storage.ErrFenced):
		outcome = 1
	case errors.Is(err, storage.ErrBreakerOpen):
		// A wrapped store's own breaker: not this backend's answer.
	case errors.Is(err, storage.ErrUnavailable):
		outcome = -1
		b.failures.Add(1)
		if refused(err) {
			key = 0
		}
	}
	if outcome == 0 && !probe {
		return
	}
	b.mu.Lock()
	from := b.state
	switch {
	case probe && from == HalfOpen:
		b.probing = false
		switch outcome {
		case 1:
			b.state, b.fails = Closed, 0
		case -1:
			b.state, b.openedAt, b.lastErr = Open, b.cfg.Clock.Now(), err
		}
	case from == Closed && outcome == 1:
		b.fails = 0
	case from == Closed && outcome == -1:
		b.failKeys[b.fails%len(b.failKeys)] = key
		b.fails++
		if b.fails >= b.cfg.Failures && distinct(b.failKeys, b.cfg.Keys) {
			b.state, b.openedAt, b.lastErr, b.fails = Open, b.cfg.Clock.Now(), err, 0
		}
	}
	to := b.state
	b.mu.Unlock()
	if to != from {
		switch to {
		case Open:
			b.opens.Add(1)
		case Closed:
			b.closes.Add(1)
		}
		b.changed(from, to, err)
	}
}

// changed logs a transition and calls OnChange.
func (b *Breaker) changed(from, to State, err error) {
	ctx := context.Background()
	log := b.cfg.Logger
	switch {
	case to == Open && from == Closed:
		log.LogAttrs(ctx, slog.LevelWarn, "circuit breaker open", slog.String("backend", b.cfg.Name),
			slog.Int("failures", b.cfg.Failures), slog.String("open_for", b.cfg.OpenFor.String()), slog.String("error", errString(err)))
	case to == Open:
		log.LogAttrs(ctx, slog.LevelWarn, "circuit breaker probe failed; open again", slog.String("backend", b.cfg.Name),
			slog.String("open_for", b.cfg.OpenFor.String()), slog.String("error", errString(err)))
	case to == HalfOpen:
		log.LogAttrs(ctx, slog.LevelDebug, "circuit breaker half-open: probing", slog.String("backend", b.cfg.Name))
	case to == Closed:
		log.LogAttrs(ctx, slog.LevelInfo, "circuit breaker closed", slog.String("backend", b.cfg.Name),
			slog.Int64("rejected_total", b.rejected.Load()))
	}
	if b.cfg.OnChange != nil {
		b.cfg.OnChange(b.cfg.Name, from, to)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// distinct reports whether keys holds at least n distinct keys, counting
// each 0 (no key) as distinct.
func distinct(keys []uint64, n int) bool {
	seen := 0
	for i, k := range keys {
		if k == 0 || !slices.Contains(keys[:i], k) {
			seen++
		}
	}
	return seen >= n
}

// refused reports whether err is a connection the backend refused or
// reset: evidence about the backend as a whole, not about one key.
func refused(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}
