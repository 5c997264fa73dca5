package limiter

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// backoff keeps this process off the keys of a limit that its store
// throttled (ErrThrottled, or ErrConflict: see [ThrottledRetryAfter]),
// without denying their decisions: a throttle says nothing of the limit.
// For ThrottledRetryAfter after a throttle (wall clock) no decision of the
// key goes to the store: a decision a live lease covers is answered from
// it; any other waits, bounded by its context's deadline, for the backoff
// to end. Then one of them goes to the store (the key's one store request
// in flight in this process) while the others wait for its answer:
// throttled again, the backoff starts over; else the key is free, and
// each waiter first tries the lease that answer may have taken. A
// decision whose deadline comes before the backoff's end is denied as
// throttled without a store request.
// docs/leases.md ("A throttle's backoff") has the reasoning and figures.
//
// The zero value is ready to use; safe for concurrent use. It holds at
// most maxBackoffKeys keys: past that a throttled key gets no backoff.
type backoff struct {
	n  atomic.Int64 // len(m): zero keeps the lock off an untroubled limit
	mu sync.Mutex
	m  map[string]*keyBackoff
}

// keyBackoff is one throttled key's state in this process.
type keyBackoff struct {
	until   time.Time     // no store request before (wall, monotonic)
	held    bool          // a decision of the key is at the store
	waiters int           // decisions waiting (for until, or for held to end)
	free    chan struct{} // closed when held ends
}

// maxBackoffKeys bounds the keys a limit backs off from at once.
const maxBackoffKeys = 1024

// Test knobs. brokenThrottleCache: a throttle's denial is remembered in
// the deny cache for its RetryAfter and nothing waits, as before (the
// key's next decisions in the process are denied). brokenNoBackoff: it is
// not remembered and nothing waits either (every decision of a throttled
// key goes to the store). Tests only.
var brokenThrottleCache, brokenNoBackoff = false, false

// throttled starts (or restarts) the backoff of key: its store throttled
// it just now.
func (b *backoff) throttled(key string) {
	if b == nil || brokenThrottleCache || brokenNoBackoff {
		return
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = make(map[string]*keyBackoff)
	}
	k := b.m[key]
	if k == nil {
		if len(b.m) >= maxBackoffKeys && !b.evict(now) {
			return
		}
		k = &keyBackoff{free: make(chan struct{})}
		b.m[key] = k
		b.n.Store(int64(len(b.m)))
	}
	k.until = now.Add(ThrottledRetryAfter)
}

// evict drops the keys whose backoff is over and that nobody holds or
// waits for; it reports whether there is room. The caller holds b.mu.
func (b *backoff) evict(now time.Time) bool {
	for key, k := range b.m {
		if !k.held && k.waiters == 0 && !now.Before(k.until) {
			delete(b.m, key)
		}
	}
	b.n.Store(int64(len(b.m)))
	return len(b.m) < maxBackoffKeys
}

// gate is what tryEnter found for a key.
type gate int

const (
	gateFree gate = iota // not backed off: go to the store as usual
	gateHeld             // backed off, and this decision now holds the key
	gateWait             // wait for wake (or until), then try again
)

// tryEnter asks to send a decision of key to the store. On gateWait the
// caller waits for the wake channel or until, whichever is set, then
// calls done(key) and tries again; on gateHeld it calls leave(key) once
// its store step is judged.
func (b *backoff) tryEnter(key string) (g gate, wake <-chan struct{}, until time.Time) {
	if b == nil || b.n.Load() == 0 {
		return gateFree, nil, time.Time{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.m[key]
	switch {
	case k == nil:
		return gateFree, nil, time.Time{}
	case time.Now().Before(k.until):
		k.waiters++
		return gateWait, nil, k.until
	case k.held:
		k.waiters++
		return gateWait, k.free, time.Time{}
	}
	k.held = true
	return gateHeld, nil, time.Time{}
}

// done ends a wait tryEnter asked for.
func (b *backoff) done(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if k := b.m[key]; k != nil {
		k.waiters--
	}
}

// leave ends the hold of key: the next waiter may go, or, when its
// backoff is over (the held step was not throttled again), every waiter:
// the key is free.
func (b *backoff) leave(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.m[key]
	if k == nil || !k.held {
		return
	}
	k.held = false
	close(k.free)
	k.free = make(chan struct{})
	if !time.Now().Before(k.until) {
		delete(b.m, key)
		b.n.Store(int64(len(b.m)))
	}
}

// wait waits for wake to be closed, or for until (one of them is set),
// or for ctx: false when ctx ended first, or when its deadline comes
// before until.
func wait(ctx context.Context, wake <-chan struct{}, until time.Time) bool {
	if wake == nil {
		if dl, ok := ctx.Deadline(); ok && dl.Before(until) {
			return false
		}
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	select {
	case <-wake:
		return true
	case <-ctx.Done():
		return false
	}
}

// backoffRound is a Decide's holds of throttled keys: the items whose
// store step may go only because this decision holds their key.
type backoffRound struct {
	held    []int
	heldBuf [scratchItems]int
	// waited: the decision waited for a backoff (a lease or a denial
	// may have come meanwhile).
	waited bool
}

// enter waits until each item bound for the store may go: its key not
// backed off, or held by this decision (one key after another; a key
// found busy releases those held first, so two batches never wait for
// each other). It returns an item whose backoff its context's deadline
// does not cover (-1: none), and holds nothing then.
func (r *backoffRound) enter(ctx context.Context, items []Item, lr *leaseRound) int {
	r.held = r.heldBuf[:0]
	for {
		i, wake, until := r.tryAll(items, lr)
		if i < 0 {
			return -1
		}
		r.leaveAll(items)
		bo := items[i].Limit.(stepper).backoffs()
		ok := wait(ctx, wake, until)
		bo.done(items[i].Key)
		if !ok {
			return i
		}
		r.waited = true
	}
}

// tryAll enters each item's key in turn: the first item that must wait,
// with what to wait for (-1: none; every backed-off key held).
func (r *backoffRound) tryAll(items []Item, lr *leaseRound) (int, <-chan struct{}, time.Time) {
	if brokenThrottleCache || brokenNoBackoff {
		return -1, nil, time.Time{}
	}
	for i, it := range items {
		s, ok := it.Limit.(stepper)
		if !ok || it.Shadow || lr.spent(i) || r.holds(items, i) {
			continue
		}
		switch g, wake, until := s.backoffs().tryEnter(it.Key); g {
		case gateHeld:
			r.held = append(r.held, i)
		case gateWait:
			return i, wake, until
		}
	}
	return -1, nil, time.Time{}
}

// holds reports whether the round holds item i's key (through an
// earlier item of the same limit and key).
func (r *backoffRound) holds(items []Item, i int) bool {
	for _, j := range r.held {
		if items[j].Limit == items[i].Limit && items[j].Key == items[i].Key {
			return true
		}
	}
	return false
}

// leaveAll ends the round's holds.
func (r *backoffRound) leaveAll(items []Item) {
	for _, i := range r.held {
		items[i].Limit.(stepper).backoffs().leave(items[i].Key)
	}
	r.held = r.held[:0]
}

// afterWait answers, after a wait, the items a lease now covers (the
// decision before may have taken one), and ends their holds.
func (r *backoffRound) afterWait(items []Item, out []Outcome, t int64, lr *leaseRound) {
	if !r.waited || lr.use == nil {
		return
	}
	for i := range items {
		if !items[i].Shadow && lr.respend(items, out, i, t) {
			r.leaveOne(items, i)
		}
	}
}

// leaveOne ends the round's hold of item i's key, if it holds it.
func (r *backoffRound) leaveOne(items []Item, i int) {
	for k, j := range r.held {
		if j == i {
			items[i].Limit.(stepper).backoffs().leave(items[i].Key)
			r.held = append(r.held[:k], r.held[k+1:]...)
			return
		}
	}
}

// backedOff denies the batch by item i, whose key is backed off past its
// context's deadline: no store request (the others Skipped, what leases
// spent put back).
func backedOff(items []Item, out []Outcome, i int, lr *leaseRound) int {
	lr.unspendAll(items, out)
	for j := range out {
		out[j] = Outcome{Skipped: true}
	}
	d := throttledDecision(items[i].Limit)
	out[i] = Outcome{Decision: d, Throttled: true, Err: fmt.Errorf("limiter: %q: backing off a throttled key past the deadline: %w", d.Name, storage.ErrThrottled)}
	return i
}
