package memcached

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/internal/circuit"
	"github.com/sluicehq/sluice/limiter"
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
	DefaultBreakerFailures = circuit.DefaultFailures
	DefaultBreakerOpenFor  = circuit.DefaultOpenFor
)

// BreakerState is the state of one node's breaker (see [Store.Breakers]).
type BreakerState struct {
	Node  string
	State string // "closed", "half-open" or "open"
	// Counts since the breaker was made (on the node's first call).
	Opens, Closes, Probes, Rejected, Failures int64
}

// nodeBreakers holds a breaker per node address, made on the node's first
// call. A nil *nodeBreakers has none: every method lets everything
// through.
type nodeBreakers struct {
	cfg circuit.Config
	on  func(node, from, to string)

	mu sync.Mutex
	m  map[string]*circuit.Breaker
}

func newNodeBreakers(cfg *BreakerConfig) (*nodeBreakers, error) {
	if cfg == nil {
		return nil, nil
	}
	if cfg.Failures < 0 || cfg.OpenFor < 0 {
		return nil, fmt.Errorf("%w: memcached: Breaker: negative Failures or OpenFor", limiter.ErrInvalidConfig)
	}
	return &nodeBreakers{
		cfg: circuit.Config{Name: "memcached", Failures: cfg.Failures, OpenFor: cfg.OpenFor, Logger: cfg.Logger},
		on:  cfg.OnChange,
		m:   make(map[string]*circuit.Breaker),
	}, nil
}

// get returns the breaker of node (nil when nb is nil).
func (nb *nodeBreakers) get(node string) *circuit.Breaker {
	if nb == nil {
		return nil
	}
	nb.mu.Lock()
	defer nb.mu.Unlock()
	b := nb.m[node]
	if b == nil {
		cfg := nb.cfg
		cfg.Node = node
		if nb.on != nil {
			cfg.OnChange = func(_ string, from, to circuit.State) { nb.on(node, from.String(), to.String()) }
		}
		b, _ = circuit.New(cfg) // cfg was checked by newNodeBreakers
		nb.m[node] = b
	}
	return b
}

// retain forgets the breakers of nodes not in nodes (nodes that left the
// ring on an auto-discovery refresh), so a cluster that replaces its nodes
// over months does not keep a breaker per node it ever had. A node that
// comes back starts with a new, closed breaker.
func (nb *nodeBreakers) retain(nodes []string) {
	if nb == nil {
		return
	}
	nb.mu.Lock()
	defer nb.mu.Unlock()
	for node := range nb.m {
		if !slices.Contains(nodes, node) {
			delete(nb.m, node)
		}
	}
}

// states returns every node breaker's state, by node.
func (nb *nodeBreakers) states() []BreakerState {
	if nb == nil {
		return nil
	}
	nb.mu.Lock()
	out := make([]BreakerState, 0, len(nb.m))
	for node, b := range nb.m {
		st := b.Stats()
		out = append(out, BreakerState{Node: node, State: st.State.String(), Opens: st.Opens, Closes: st.Closes,
			Probes: st.Probes, Rejected: st.Rejected, Failures: st.Failures})
	}
	nb.mu.Unlock()
	slices.SortFunc(out, func(a, b BreakerState) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// Breakers returns the state of each node's circuit breaker (the nodes
// called since New), sorted by node; nil when Config.Breaker is nil.
func (s *Store) Breakers() []BreakerState { return s.pool.breakers.states() }

// execErr is what an exec's error tells the node's breaker: nil when the
// node answered (success, a reply that breaks the protocol, a corrupt
// value, a lost race), an error wrapping limiter.ErrUnavailable when it
// did not (timeouts, refused, reset or dropped connections, TLS failures,
// the caller's deadline while waiting for it), and any other error (the
// caller cancelled) when it tells nothing.
func execErr(ctx context.Context, err error) error {
	switch {
	case err == nil, errors.Is(err, errProtocol), errors.Is(err, limiter.ErrCorruptState), errors.Is(err, limiter.ErrConflict):
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
	nb *nodeBreakers
}

// PickServer returns the node that owns key, or the error of its open
// breaker (wrapping limiter.ErrBreakerOpen and limiter.ErrUnavailable).
func (s selector) PickServer(key string) (net.Addr, error) {
	a, err := s.Ring.PickServer(key)
	if err != nil {
		return nil, err
	}
	if _, err := s.nb.get(a.String()).Allow(); err != nil {
		return nil, err
	}
	return a, nil
}

// clientSelector returns the gomemcache client's selector over r.
func (nb *nodeBreakers) clientSelector(r *Ring) memcache.ServerSelector {
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
func (nb *nodeBreakers) clientDialer(dial dialFunc) dialFunc {
	if nb == nil {
		return dial
	}
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		b := nb.get(address)
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
	b     *circuit.Breaker
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
