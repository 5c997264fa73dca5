package limitertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// DelayStore wraps a [Store] and holds each call back for a random time
// before handing it to the inner store, so that calls stamped earlier reach
// the store after calls stamped later (the disorder a request stamped before
// it travels meets in production). It watches, per key, the calls in the
// order it hands them to the inner store (the newest sub-window or stamp so
// far, and when it grew), counts the late ones (see [ArrivalStats]) and
// tells each limiter call what happened to it (see [Trace]).
//
// Half of the calls go through at once, the other half wait a uniform random
// time below the maximum delay. A call's delays are drawn from the *rand.Rand that
// [WithDelayRand] put in its context (one goroutine's, so a seed reproduces
// the draws), else from the store's own. A DelayStore is safe for
// concurrent use.
//
// why hand-written: no library injects delays into a store interface, and
// the arrival bookkeeping needs the store's own arguments (sub-window, span,
// stamp, window).
type DelayStore struct {
	inner    Store
	maxDelay time.Duration
	whole    bool // Do hands batches over whole (MergeBatches)

	rmu sync.Mutex
	rnd *rand.Rand

	mu    sync.Mutex
	keys  map[storage.Key]*arrival
	stats ArrivalStats
}

var (
	_ Store                     = (*DelayStore)(nil)
	_ storage.PackedCounter     = (*DelayStore)(nil)
	_ storage.LeaseKeeper       = (*DelayStore)(nil)
	_ storage.CrossRegionWriter = (*DelayStore)(nil)
)

// arrival is what has reached the inner store for one key.
type arrival struct {
	seen   bool
	newest int64     // newest sub-window (windows) or stamp (buckets, logs)
	span   int64     // the span of the last window add, for refunds
	last   time.Time // when the last call was handed over
	// marks records when newest grew, in order: the newest handed over by
	// any time.
	marks []mark
}

type mark struct {
	t      time.Time
	newest int64
}

// newestBy returns the newest sub-window or stamp handed over by t.
func (a *arrival) newestBy(t time.Time) int64 {
	i := sort.Search(len(a.marks), func(i int) bool { return a.marks[i].t.After(t) })
	if i == 0 {
		return a.newest // no add yet (a refund first), or t before the first
	}
	return a.marks[i-1].newest
}

// ArrivalStats counts what reached the inner store of a [DelayStore], in
// the order calls were handed to it.
type ArrivalStats struct {
	// Arrivals is the number of calls handed to the inner store.
	Arrivals int64
	// Late counts window adds whose sub-window (a fixed window's window)
	// is older than one already handed over for the same key, and bucket or
	// log updates whose stamp is older than one already handed over.
	Late int64
	// LateRefunds counts window refunds (Sub) into a sub-window older than
	// the newest one already added to for the key: refunds after a roll.
	LateRefunds int64
	// PastHorizon counts window calls that may have reached the store more
	// than span sub-windows behind the newest sub-window of their key (the
	// store contract's horizon, storage.Horizon: one window plus one
	// sub-window; one window for a fixed window), and log updates more than
	// one window behind the newest stamp: those behind by that much when
	// they returned, against every call handed over before (a store that
	// retries may apply a call long after it arrived). Buckets have no
	// horizon: a late stamp only refills nothing.
	PastHorizon int64
	// Idle counts bucket updates that reached a key no call had reached
	// for at least half the bucket's TTL: the store may have let the
	// bucket expire, so that it starts again full at the call's stamp (see
	// [CheckTokenBucket]).
	Idle int64
	// MaxBehind is the most sub-windows a window call was behind.
	MaxBehind int64
	// MaxBehindTime is the most a bucket or log stamp was behind.
	MaxBehindTime time.Duration
	// LateAcrossLevel[l-1] counts late packed adds (storage.PackedCounter)
	// whose level-l counter is older than the newest slot's: arrivals
	// reordered across a boundary of level l (level 1: every 4 slots).
	LateAcrossLevel [storage.PackedLevels]int64
}

// NewDelayStore returns inner wrapped with random delays below maxDelay;
// seed seeds the draws of calls whose context carries no rand.
func NewDelayStore(inner Store, maxDelay time.Duration, seed uint64) *DelayStore {
	return &DelayStore{
		inner:    inner,
		maxDelay: maxDelay,
		rnd:      rand.New(rand.NewPCG(seed, 0x5eed)),
		keys:     map[storage.Key]*arrival{},
	}
}

type delayRandKey struct{}

type traceKey struct{}

// Trace is what a [DelayStore] tells the caller about one limiter call:
// when it was first handed to the inner store (the earliest moment it can
// take effect) and when the inner store last returned (the latest), and
// whether one of its store calls arrived late or past the horizon (see
// [ArrivalStats]).
type Trace struct {
	// Reached is set when a store call was handed to the inner store, at
	// time Arrived (the first one's); Returned is when the last one
	// returned.
	Reached           bool
	Arrived, Returned time.Time
	Late              bool
	PastHorizon       bool
	// Idle: a bucket update reached a key idle for half its TTL or more.
	Idle bool
	// Narrowed is set when the store reported its last request's bounds,
	// From and To (see [Narrow]).
	Narrowed bool
	From, To time.Time
}

// Narrow tells the [Trace] in ctx, if any, that the request a store just
// made for the call ran from start to end. A store (or its test, through a
// client hook) that calls it after each request to its server narrows the
// call's interval in the history to that of its last request: the one whose
// answer decided the call (a conditional write that succeeded, or the read
// a denial was confirmed by), so the effect lies within it. Narrower
// intervals leave a linearizability check fewer orders to try; call it from
// the goroutine that made the store call.
func Narrow(ctx context.Context, start, end time.Time) {
	if tr, ok := ctx.Value(traceKey{}).(*Trace); ok {
		tr.Narrowed, tr.From, tr.To = true, start, end
	}
}

// WithTrace returns ctx carrying tr: a [DelayStore] fills tr in for the
// store calls made with the returned context. Use it for one limiter call
// at a time.
func WithTrace(ctx context.Context, tr *Trace) context.Context {
	return context.WithValue(ctx, traceKey{}, tr)
}

// WithDelayRand returns ctx carrying r: a [DelayStore] draws the delays of
// calls made with the returned context from r. r is not locked: use it from
// one goroutine only.
func WithDelayRand(ctx context.Context, r *rand.Rand) context.Context {
	return context.WithValue(ctx, delayRandKey{}, r)
}

// Arrivals returns the counts so far.
func (s *DelayStore) Arrivals() ArrivalStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *DelayStore) delay(ctx context.Context) error {
	if s.maxDelay <= 0 {
		return ctx.Err()
	}
	var d time.Duration
	if r, ok := ctx.Value(delayRandKey{}).(*rand.Rand); ok {
		if r.IntN(2) == 0 {
			d = time.Duration(r.Int64N(int64(s.maxDelay)))
		}
	} else {
		s.rmu.Lock()
		if s.rnd.IntN(2) == 0 {
			d = time.Duration(s.rnd.Int64N(int64(s.maxDelay)))
		}
		s.rmu.Unlock()
	}
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// storeCall is one store call handed to the inner store.
type storeCall struct {
	tr      *Trace
	a       *arrival
	at      int64 // sub-window or stamp
	horizon int64 // how far behind (in the same unit) it may be; 0: no horizon
	arrived time.Time
}

// arrive records that a store call on k at position at (sub-window or
// stamp) is handed to the inner store now. window tells sub-windows from
// stamps; refund marks a window Sub; horizon is how far behind (in the same
// unit) a call may be; a bucket call after idleAfter without calls is idle.
func (s *DelayStore) arrive(ctx context.Context, k storage.Key, at int64, window, refund bool, horizon int64, idleAfter time.Duration, packed bool) storeCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	tr, _ := ctx.Value(traceKey{}).(*Trace)
	if tr == nil {
		tr = &Trace{}
	}
	now := time.Now()
	if !tr.Reached {
		tr.Reached, tr.Arrived = true, now
	}
	s.stats.Arrivals++
	a := s.keys[k]
	if a == nil {
		a = &arrival{}
		s.keys[k] = a
	}
	if idleAfter > 0 && a.seen && now.Sub(a.last) >= idleAfter {
		s.stats.Idle++
		tr.Idle = true
	}
	a.last = now
	if window && !refund {
		a.span = horizon
	}
	if window && refund {
		horizon = a.span
	}
	if a.seen && at < a.newest && packed && !refund {
		for l := 1; l <= storage.PackedLevels; l++ {
			if at>>(2*l) != a.newest>>(2*l) {
				s.stats.LateAcrossLevel[l-1]++
			}
		}
	}
	if a.seen && at < a.newest {
		behind := a.newest - at
		if refund {
			s.stats.LateRefunds++
		} else {
			s.stats.Late++
		}
		tr.Late = true
		if window {
			s.stats.MaxBehind = max(s.stats.MaxBehind, behind)
		} else {
			s.stats.MaxBehindTime = max(s.stats.MaxBehindTime, time.Duration(behind))
		}
	}
	if !refund && (!a.seen || at > a.newest) {
		a.newest, a.seen = at, true
		a.marks = append(a.marks, mark{now, at})
	}
	return storeCall{tr: tr, a: a, at: at, horizon: horizon, arrived: now}
}

// leave records that the inner store returned c. The call took effect at
// some point before, perhaps well after it arrived (a store that retries
// holds it back too): it may have been past the horizon if, by then, a call
// far enough ahead had been handed over. "Then" is when the store returned,
// or the end of the last request it reported for the call (see [Narrow]).
func (s *DelayStore) leave(c storeCall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	c.tr.Returned = now
	by := now
	if c.tr.Narrowed && c.tr.From.After(c.arrived) {
		by = c.tr.To
	}
	if c.horizon > 0 && c.a.newestBy(by)-c.at > c.horizon {
		s.stats.PastHorizon++
		c.tr.PastHorizon = true
	}
}

// Add implements [storage.Counter].
func (s *DelayStore) Add(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration) (storage.Counts, error) {
	if err := s.delay(ctx); err != nil {
		return storage.Counts{}, fmt.Errorf("limitertest: delay: %w", err)
	}
	if n == 0 {
		return s.inner.Add(ctx, k, cur, span, n, ttl)
	}
	defer s.leave(s.arrive(ctx, k, cur, true, false, int64(span), 0, false))
	return s.inner.Add(ctx, k, cur, span, n, ttl)
}

// Sub implements [storage.Counter].
func (s *DelayStore) Sub(ctx context.Context, k storage.Key, idx int64, n int64) error {
	if err := s.delay(ctx); err != nil {
		return fmt.Errorf("limitertest: delay: %w", err)
	}
	defer s.leave(s.arrive(ctx, k, idx, true, true, 0, 0, false))
	return s.inner.Sub(ctx, k, idx, n)
}

// UpdateBucket implements [storage.BucketStore].
func (s *DelayStore) UpdateBucket(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration) (storage.Decision, error) {
	if err := s.delay(ctx); err != nil {
		return storage.Decision{}, fmt.Errorf("limitertest: delay: %w", err)
	}
	defer s.leave(s.arrive(ctx, k, op.Now, false, false, 0, ttl/2, false))
	return s.inner.UpdateBucket(ctx, k, op, ttl)
}

// UpdateLog implements [storage.LogStore].
func (s *DelayStore) UpdateLog(ctx context.Context, k storage.Key, op storage.LogOp, ttl time.Duration) (storage.Decision, error) {
	if err := s.delay(ctx); err != nil {
		return storage.Decision{}, fmt.Errorf("limitertest: delay: %w", err)
	}
	defer s.leave(s.arrive(ctx, k, op.Now, false, false, int64(op.Window), 0, false))
	return s.inner.UpdateLog(ctx, k, op, ttl)
}

// ServesPacked reports whether the inner store serves packed windows
// ([storage.ServesPacked]).
func (s *DelayStore) ServesPacked() bool { return storage.ServesPacked(s.inner) }

// AddPacked implements [storage.PackedCounter], forwarding to the inner
// store (an error if it does not implement it). A refund's horizon is the
// add's: op.Keep = 2r+1, so r+1 slots.
func (s *DelayStore) AddPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) (storage.PackedCounts, error) {
	p, ok := s.inner.(storage.PackedCounter)
	if !ok {
		return storage.PackedCounts{}, fmt.Errorf("limitertest: %T does not implement storage.PackedCounter", s.inner)
	}
	if err := s.delay(ctx); err != nil {
		return storage.PackedCounts{}, fmt.Errorf("limitertest: delay: %w", err)
	}
	defer s.leave(s.arrive(ctx, k, op.Slot, true, false, (op.Keep+1)/2, 0, true))
	return p.AddPacked(ctx, k, op)
}

// SubPacked implements [storage.PackedCounter].
func (s *DelayStore) SubPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) error {
	p, ok := s.inner.(storage.PackedCounter)
	if !ok {
		return fmt.Errorf("limitertest: %T does not implement storage.PackedCounter", s.inner)
	}
	if err := s.delay(ctx); err != nil {
		return fmt.Errorf("limitertest: delay: %w", err)
	}
	defer s.leave(s.arrive(ctx, k, op.Slot, true, true, 0, 0, true))
	return p.SubPacked(ctx, k, op)
}

// KeepsLeased reports what the inner store does ([storage.LeaseKeeper]),
// so that buckets with leases lease through a DelayStore.
func (d *DelayStore) KeepsLeased() bool {
	k, ok := d.inner.(storage.LeaseKeeper)
	return ok && k.KeepsLeased()
}

// WritesCrossRegions reports what the inner store does
// ([storage.CrossRegionWriter]), so that leases through a DelayStore are
// sized as they are on the inner store.
func (d *DelayStore) WritesCrossRegions() bool { return storage.WritesCrossRegions(d.inner) }
