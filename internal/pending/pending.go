// Package pending runs a store's refunds without the caller waiting for
// them, bounded, and lets later calls on the same key wait for them: the
// detached refunds of the batch path (storage.Batcher) in the backends.
package pending

import (
	"context"
	"sync"
	"time"
)

// Refunds tracks refunds in flight per key. Its zero value is not usable:
// call New. Safe for concurrent use.
type Refunds struct {
	slots chan struct{}

	mu   sync.Mutex
	keys map[string]*key
	all  int
	idle chan struct{} // closed when all drops to 0; nil when all == 0
}

type key struct {
	n    int
	done chan struct{} // closed when n drops to 0
}

// New returns a tracker allowing at most max refunds in flight.
func New(max int) *Refunds {
	return &Refunds{slots: make(chan struct{}, max), keys: map[string]*key{}}
}

// Go runs f on its own goroutine, under a context of its own with timeout
// (nothing of the caller's context applies: the refund outlives the
// call), and reports true; or reports false, running nothing, when max
// refunds are already in flight (the caller then sends it itself). lost is
// called when f fails.
func (p *Refunds) Go(k string, timeout time.Duration, f func(context.Context) error, lost func()) bool {
	select {
	case p.slots <- struct{}{}:
	default:
		return false
	}
	p.add(k)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	go func() {
		defer func() {
			cancel()
			p.done(k)
			<-p.slots
		}()
		if err := f(ctx); err != nil && lost != nil {
			lost()
		}
	}()
	return true
}

func (p *Refunds) add(k string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.keys[k]
	if e == nil {
		e = &key{done: make(chan struct{})}
		p.keys[k] = e
	}
	e.n++
	if p.all == 0 {
		p.idle = make(chan struct{})
	}
	p.all++
}

func (p *Refunds) done(k string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.keys[k]; e != nil {
		if e.n--; e.n == 0 {
			close(e.done)
			delete(p.keys, k)
		}
	}
	if p.all--; p.all == 0 {
		close(p.idle)
		p.idle = nil
	}
}

// Wait waits for the refunds in flight on k, if any, or until ctx is done.
func (p *Refunds) Wait(ctx context.Context, k string) error {
	p.mu.Lock()
	var ch chan struct{}
	if e := p.keys[k]; e != nil {
		ch = e.done
	}
	p.mu.Unlock()
	return waitChan(ctx, ch)
}

// WaitAll waits until no refund is in flight, or until ctx is done.
func (p *Refunds) WaitAll(ctx context.Context) error {
	p.mu.Lock()
	ch := p.idle
	p.mu.Unlock()
	return waitChan(ctx, ch)
}

func waitChan(ctx context.Context, ch chan struct{}) error {
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
