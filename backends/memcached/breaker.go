package memcached

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// BreakerConfig configures the circuit breakers of a [Store]'s nodes
// (Config.Breaker): one breaker per node, so that a dead node fails its
// own keys fast while the other nodes' keys stay on the store. The
// package comment describes them.
type BreakerConfig struct {
	// Failures is how many unavailable failures in a row (timeouts,
	// refused or dropped connections) open a node's breaker
	// (DefaultBreakerFailures when 0).
	Failures int
	// OpenFor is how long an open node's breaker refuses calls before it
	// lets one probe through (DefaultBreakerOpenFor when 0).
	OpenFor time.Duration
	// Logger receives the transitions, with the attributes backend
	// ("memcached") and node (its address). None when nil.
	Logger *slog.Logger
	// OnChange, when not nil, is called after each transition of a node's
	// breaker with the node's address and the states ("closed",
	// "half-open", "open"), outside the breaker's lock.
	OnChange func(node, from, to string)
}

// Defaults of [BreakerConfig].
const (
	DefaultBreakerFailures = breaker.DefaultFailures
	DefaultBreakerOpenFor  = breaker.DefaultOpenFor
)

// BreakerState is the state of one node's breaker (see [Store.Breakers]).
type BreakerState struct {
	Node  string
	State string // "closed", "half-open" or "open"
	// Counts since the breaker was made (on the node's first call).
	Opens, Closes, Probes, Rejected, Failures int64
}

// newNodeBreakers returns the node breakers of cfg: nil (none) when cfg
// is nil.
func newNodeBreakers(cfg *BreakerConfig) (*breaker.Nodes, error) {
	if cfg == nil {
		return nil, nil
	}
	if cfg.Failures < 0 || cfg.OpenFor < 0 {
		return nil, fmt.Errorf("%w: memcached: Breaker: negative Failures or OpenFor", limiter.ErrInvalidConfig)
	}
	var on func(node string, from, to breaker.State)
	if cfg.OnChange != nil {
		on = func(node string, from, to breaker.State) { cfg.OnChange(node, from.String(), to.String()) }
	}
	return breaker.NewNodes(breaker.Config{Name: "memcached", Failures: cfg.Failures, OpenFor: cfg.OpenFor, Logger: cfg.Logger}, on)
}

// breakerStates returns every node breaker's state, by node (nil without
// breakers).
func breakerStates(nb *breaker.Nodes) []BreakerState {
	if nb == nil {
		return nil
	}
	stats := nb.Stats()
	out := make([]BreakerState, 0, len(stats))
	for _, st := range stats {
		out = append(out, BreakerState{Node: st.Node, State: st.State.String(), Opens: st.Opens, Closes: st.Closes,
			Probes: st.Probes, Rejected: st.Rejected, Failures: st.Failures})
	}
	return out
}

// Breakers returns the state of each node's circuit breaker (the nodes
// called since New), sorted by node; nil when Config.Breaker is nil.
func (s *Store) Breakers() []BreakerState { return breakerStates(s.pool.breakers) }

// execErr is what an exec's error tells the node's breaker: nil when the
// node answered (success, a reply that breaks the protocol, a corrupt
// value, a lost race), an error wrapping storage.ErrUnavailable when it
// did not (timeouts, refused, reset or dropped connections, TLS failures,
// the caller's deadline while waiting for it), and any other error (the
// caller cancelled) when it tells nothing.
func execErr(ctx context.Context, err error) error {
	switch {
	case err == nil, errors.Is(err, errProtocol), errors.Is(err, storage.ErrCorruptState), errors.Is(err, storage.ErrConflict):
		return nil
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// selector is the gomemcache client's ServerSelector when the nodes have
// breakers: a key on a node whose breaker refuses fails at once, before
// any connection. The client's connections report to the breakers
// (watch), since gomemcache's calls end where this package cannot see.
type selector struct {
	*Ring
	nb *breaker.Nodes
}

// PickServer returns the node that owns key, or the error of its open
// breaker (wrapping storage.ErrBreakerOpen and storage.ErrUnavailable).
func (s selector) PickServer(key string) (net.Addr, error) {
	a, err := s.Ring.PickServer(key)
	if err != nil {
		return nil, err
	}
	if _, err := s.nb.Get(a.String()).Allow(); err != nil {
		return nil, err
	}
	return a, nil
}

// clientSelector returns the gomemcache client's selector over r, with
// nb's breakers.
func clientSelector(nb *breaker.Nodes, r *Ring) memcache.ServerSelector {
	if nb == nil {
		return r
	}
	return selector{Ring: r, nb: nb}
}

// clientDialer wraps the gomemcache client's dial so that its connections
// report to their node's breaker: a failed dial or a failed read or write
// counts as a failure; the first bytes read after a write (a reply) as
// the node's answer. A report goes as Done(true, err): while half-open it
// decides the probe PickServer let through.
func clientDialer(nb *breaker.Nodes, dial dialFunc) dialFunc {
	if nb == nil {
		return dial
	}
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		b := nb.Get(address)
		c, err := dial(ctx, network, address)
		if err != nil {
			b.Done(true, fmt.Errorf("%w: %w", ErrUnavailable, err))
			return nil, err
		}
		return &watched{Conn: c, b: b}, nil
	}
}

// watched is a gomemcache connection that reports to its node's breaker.
// gomemcache uses a connection from one goroutine at a time.
type watched struct {
	net.Conn
	b     *breaker.Breaker
	wrote bool // a request was written whose reply has not been read
}

func (c *watched) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	switch {
	case n > 0:
		if c.wrote {
			c.wrote = false
			c.b.Done(true, nil)
		}
	case err != nil:
		c.failed(err)
	}
	return n, err
}

func (c *watched) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		c.failed(err)
	} else {
		c.wrote = true
	}
	return n, err
}

// failed reports a failed read or write, unless this side closed the
// connection (gomemcache's Close, or its pool dropping it).
func (c *watched) failed(err error) {
	if errors.Is(err, net.ErrClosed) {
		return
	}
	c.b.Done(true, fmt.Errorf("%w: %w", ErrUnavailable, err))
}
