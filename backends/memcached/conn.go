package memcached

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/breaker"
)

// pool holds idle connections per node for the counter commands, which
// gomemcache cannot pipeline. Connections are dialled with the same dialer
// (and so the same TLS settings) as gomemcache's. A pool is safe for
// concurrent use.
type pool struct {
	dial    dialFunc
	timeout time.Duration
	maxIdle int
	// breakers, when not nil, holds a circuit breaker per node (see
	// breaker.go): exec asks the node's before running and reports to it.
	breakers *breaker.Nodes

	mu   sync.Mutex
	idle map[string][]*pconn
}

// pconn is one connection to a node.
type pconn struct {
	nc   net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	addr string
	num  [24]byte // for formatting numbers into w
	mg   mget     // a batch pipeline's retrieval
	mg1  mget     // through a proxy: the first round's (see pipeline)
}

func newPool(dial dialFunc, timeout time.Duration, maxIdle int) *pool {
	return &pool{dial: dial, timeout: timeout, maxIdle: maxIdle, idle: make(map[string][]*pconn)}
}

// writeBuffer is the write buffer of a pooled connection.
const writeBuffer = 32 << 10

// errProtocol is wrapped when a server's reply does not follow the protocol.
var errProtocol = errors.New("memcached: unexpected reply")

// exec runs f on a connection to addr (see run) behind the node's circuit
// breaker, if the pool has breakers: while the breaker refuses, exec
// fails at once with its error (wrapping storage.ErrBreakerOpen and
// storage.ErrUnavailable); otherwise it runs f and reports the outcome
// (execErr).
func (p *pool) exec(ctx context.Context, addr net.Addr, f func(c *pconn) error) error {
	b := p.breakers.Get(addr.String())
	if b == nil {
		return p.run(ctx, addr, f)
	}
	probe, err := b.Allow()
	if err != nil {
		return err
	}
	err = p.run(ctx, addr, f)
	b.Done(probe, execErr(ctx, err))
	return err
}

// run runs f on a connection to addr with a deadline of ctx's or the
// pool's timeout from now, whichever is earlier; cancelling ctx interrupts
// f. A connection goes back to the pool only if f succeeded. If f fails because
// a pooled connection turns out dead (the server restarted or dropped it),
// the node's idle connections are dropped (they are most likely dead too)
// and f runs once more on a new connection. f must be safe to run twice: a
// command that reached a server just before it died may count twice, which
// makes a limit stricter, never laxer.
func (p *pool) run(ctx context.Context, addr net.Addr, f func(c *pconn) error) error {
	deadline := time.Now().Add(p.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	fresh := false
	for {
		c, reused, err := p.get(ctx, deadline, addr, fresh)
		if err != nil {
			return err
		}
		c.nc.SetDeadline(deadline)
		interrupted := false
		if ctx.Done() != nil {
			// Cancelling ctx makes every blocked read or write fail at once.
			stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
			err = f(c)
			interrupted = !stop()
		} else {
			err = f(c)
		}
		if err == nil && !interrupted {
			p.put(c)
			return nil
		}
		c.nc.Close()
		if err == nil {
			return nil // done, but the connection's deadline was spoiled
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(deadline) {
			return fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
		}
		if !reused || fresh || !deadConn(err) {
			return err
		}
		p.drop(addr.String())
		fresh = true
	}
}

// get returns an idle connection to addr, or dials one (always when fresh).
func (p *pool) get(ctx context.Context, deadline time.Time, addr net.Addr, fresh bool) (*pconn, bool, error) {
	key := addr.String()
	if !fresh {
		p.mu.Lock()
		if l := p.idle[key]; len(l) > 0 {
			c := l[len(l)-1]
			p.idle[key] = l[:len(l)-1]
			p.mu.Unlock()
			return c, true, nil
		}
		p.mu.Unlock()
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	nc, err := p.dial(ctx, addr.Network(), key)
	if err != nil {
		return nil, false, err
	}
	// A batch's pipeline goes out in one write: several windows' gets of
	// up to 2*20 keys each exceed 4 KB.
	return &pconn{nc: nc, r: bufio.NewReaderSize(nc, writeBuffer), w: bufio.NewWriterSize(nc, writeBuffer), addr: key}, false, nil
}

func (p *pool) put(c *pconn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle[c.addr]) >= p.maxIdle {
		c.nc.Close()
		return
	}
	p.idle[c.addr] = append(p.idle[c.addr], c)
}

// drop closes the idle connections to addr.
func (p *pool) drop(addr string) {
	p.mu.Lock()
	l := p.idle[addr]
	delete(p.idle, addr)
	p.mu.Unlock()
	for _, c := range l {
		c.nc.Close()
	}
}

// retain closes the idle connections to nodes not in addrs.
func (p *pool) retain(addrs []string) {
	p.breakers.Retain(addrs)
	p.mu.Lock()
	var gone []*pconn
	for a, l := range p.idle {
		if !slices.Contains(addrs, a) {
			gone = append(gone, l...)
			delete(p.idle, a)
		}
	}
	p.mu.Unlock()
	for _, c := range gone {
		c.nc.Close()
	}
}

// close closes every idle connection. The pool still works afterwards.
func (p *pool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle = make(map[string][]*pconn)
	p.mu.Unlock()
	for _, l := range idle {
		for _, c := range l {
			c.nc.Close()
		}
	}
}
