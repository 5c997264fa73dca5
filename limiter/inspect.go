package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// An operator's view of one key: how much is left (Peek, without taking
// anything) and giving the key its capacity back (Reset). Peeks are not
// decisions: they never ask or fill the deny cache and never count.

// Inspector is implemented by the package's limiters (*SlidingWindow,
// *FixedWindow, *TokenBucket, *SlidingLog).
type Inspector interface {
	Limiter
	// Peek reports key's state at now without taking anything: Limit,
	// Remaining (what is left now), ResetAfter (until the limit is full
	// again with no more traffic), and Allowed and RetryAfter for a
	// request of cost 1 (RetryAfter is zero when it would pass).
	Peek(ctx context.Context, key string, now time.Time) (Decision, error)
	// Reset forgets key's state for this limit, so that it has its full
	// capacity again (see [Resetter] for what holds under concurrency),
	// and the key's denial cached in this process.
	Reset(ctx context.Context, key string, now time.Time) error
}

var (
	_ Inspector = (*SlidingWindow)(nil)
	_ Inspector = (*FixedWindow)(nil)
	_ Inspector = (*TokenBucket)(nil)
	_ Inspector = (*SlidingLog)(nil)
)

// ErrUnsupported is wrapped when a store does not offer an optional
// operation ([Resetter], [LogReader]).
var ErrUnsupported = errors.New("limiter: not supported by the store")

// ResetOp says which state of one limit a [Resetter] forgets.
type ResetOp struct {
	// Kind is the step kind that writes the state: StepAdd (a window's
	// sub-window counters), StepPackedAdd (a packed window's counters),
	// StepBucket or StepLog.
	Kind StepKind
	// From and To bound, for StepAdd, the sub-windows and, for
	// StepPackedAdd, the slots whose counters may hold units that are in
	// view of a writer now or will come into view: a store that keeps a
	// key's counters in one place (memory, a DynamoDB item) forgets them
	// all and needs no bounds; one that cannot list them (memcached)
	// deletes those named in the bounds, widened by its own expiry slack.
	// The bounds cover every counter still alive under its TTL whose
	// writer's clock was within a window of the caller's.
	From, To int64
	// Unit is the length of a sub-window (StepAdd) or slot
	// (StepPackedAdd).
	Unit time.Duration
}

// Cells returns the first and last index of the packed counters of level
// (1 to PackedLevels) that cover the slots From to To.
func (op *ResetOp) Cells(level int) (first, last int64) {
	return op.From >> (2 * level), op.To >> (2 * level)
}

// Resetter is an optional store interface: it forgets the state of one
// limit (key.Space) on one key (key.Name), and only that limit's: a store
// that keeps several limits of a key together (DynamoDB's item per Name)
// removes this limit's part and leaves the others as they are.
//
// Reset is exact when nothing else writes the key meanwhile: the limit is
// then full, as for a key never seen. Under concurrency, state that
// requests in flight write is either removed with the rest or kept:
// a request in flight during the reset may or may not be counted. A
// refund that lands after the reset, for units taken before it, is given
// to the new state (a window's counter a new request created again, a
// bucket), so at worst the key admits as if it were new plus the units of
// the denied requests that were being refunded at that moment.
type Resetter interface {
	Reset(ctx context.Context, key Key, op *ResetOp) error
}

// LogReader is an optional [LogStore] interface: ReadLog returns key's
// timestamps (nil when it holds none) without writing anything, for
// [SlidingLog.Peek]. (LogOp.Apply writes when it prunes old entries, even
// when it takes nothing, so UpdateLog cannot peek.)
type LogReader interface {
	ReadLog(ctx context.Context, key Key) ([]int64, error)
}

// resetStore returns store as a Resetter, or an error naming the limit.
func resetStore(store any, kind, name string) (Resetter, error) {
	r, ok := store.(Resetter)
	if !ok {
		return nil, fmt.Errorf("limiter: %s %q: reset: %w (%T is not a limiter.Resetter)", kind, name, ErrUnsupported, store)
	}
	return r, nil
}

// Peek reports the window's state for key at now, reading the counters in
// view (a Counter.Add of 0, or a PackedCounter.AddPacked that adds
// nothing) without adding to them.
func (w *SlidingWindow) Peek(ctx context.Context, key string, now time.Time) (Decision, error) {
	t, err := unixNano(w.cfg.Name, now)
	if err != nil {
		return Decision{}, err
	}
	k := Key{Space: w.space, Name: key}
	if w.packed != nil {
		return w.peekPacked(ctx, k, t)
	}
	idx := floorDiv(t, w.sub)
	c, err := w.store.Add(ctx, k, idx, w.k+1, 0, w.ttl)
	if err != nil {
		return Decision{}, fmt.Errorf("limiter: sliding window %q: %w", w.cfg.Name, err)
	}
	sanitize(&c, w.k+1)
	elapsed := t - idx*w.sub
	rem := w.sub - elapsed
	d := Decision{Limit: w.cfg.Limit, Name: w.cfg.Name}
	_, d.Remaining = w.estimate(&c, rem, 0)
	if ok, _ := w.estimate(&c, rem, 1); ok {
		d.Allowed = true
	} else {
		d.RetryAfter = max(w.retryAfter(&c, elapsed, 1), 1)
	}
	// Full again when the newest counted sub-window has left the view (k
	// sub-windows after its own); a count ahead of our clock (Later) may
	// be as new as k sub-windows ahead.
	newest, counted := int64(w.k), c.Later > 0 // sub-windows after idx
	for j := 0; j <= w.k && !counted; j++ {
		if c.C[j] > 0 {
			newest, counted = -int64(j), true
		}
	}
	if counted {
		d.ResetAfter = max(time.Duration((newest+int64(w.k)+1)*w.sub-elapsed), 0)
	}
	return d, nil
}

// peekPacked is Peek of a packed window: the op of a decision at t with
// no adds, only its reads.
func (w *SlidingWindow) peekPacked(ctx context.Context, k Key, t int64) (Decision, error) {
	f := floorDiv(t, w.sub)
	p := planPacked(f, w.r, 0, time.Duration(w.sub))
	c, err := w.packed.AddPacked(ctx, k, &p.op)
	if err != nil {
		return Decision{}, fmt.Errorf("limiter: sliding window %q: %w", w.cfg.Name, err)
	}
	if c.Stale {
		return Decision{}, fmt.Errorf("%w: limit %q: the key's newest writer is more than a window ahead of %v: its view there is gone",
			ErrInvalidTime, w.cfg.Name, time.Unix(0, t).UTC())
	}
	elapsed := t - f*w.sub
	d := Decision{Limit: w.cfg.Limit, Name: w.cfg.Name}
	total := p.total(&c)
	d.Remaining = max(w.cfg.Limit-total, 0)
	var buf [4*MaxPackedReads + 3*3]fieldSpan
	fs := refineAtSlot(p.fields(&c, buf[:0]), &c, f)
	if total+1 <= w.cfg.Limit {
		d.Allowed = true
	} else {
		j := packedRetryAfter(fs, f, w.r, 1, w.cfg.Limit)
		d.RetryAfter = max(time.Duration(j*w.sub-elapsed), 1)
	}
	// Full again when the newest field with units has left every view
	// (a view at slot g reads slots from g-r).
	last, seen := int64(0), false
	for _, x := range fs {
		if x.n > 0 && (!seen || x.last > last) {
			last, seen = x.last, true
		}
	}
	if seen {
		d.ResetAfter = max(time.Duration((last+int64(w.r)+1-f)*w.sub-elapsed), 0)
	}
	return d, nil
}

// Reset forgets the window's counters of key (see [Resetter]): those of
// every sub-window (slot) that may be in view now or later, as
// ResetOp.From and To bound them around now.
func (w *SlidingWindow) Reset(ctx context.Context, key string, now time.Time) error {
	defer w.cache.forget(key)
	t, err := unixNano(w.cfg.Name, now)
	if err != nil {
		return err
	}
	r, err := resetStore(w.store, "sliding window", w.cfg.Name)
	if err != nil {
		return err
	}
	idx := floorDiv(t, w.sub)
	op := windowReset(idx, int64(w.k+1), w.sub)
	if w.packed != nil {
		// A packed view reaches r slots either side; a counter of the
		// top level covers 4^PackedLevels slots.
		span := int64(w.r) + 1
		op = ResetOp{Kind: StepPackedAdd, From: idx - 4*span - pow4(PackedLevels), To: idx + 2*span, Unit: time.Duration(w.sub)}
	}
	if err := r.Reset(ctx, Key{Space: w.space, Name: key}, &op); err != nil {
		return fmt.Errorf("limiter: sliding window %q: reset: %w", w.cfg.Name, err)
	}
	return nil
}

// windowReset is the ResetOp of a window of span sub-windows of sub ns at
// sub-window idx: the counters a writer up to a window behind or ahead of
// idx may have created within their TTL (2*span sub-windows) or will read
// (a late writer reads span more behind, an early one span ahead).
func windowReset(idx, span, sub int64) ResetOp {
	return ResetOp{Kind: StepAdd, From: idx - 4*span, To: idx + 2*span, Unit: time.Duration(sub)}
}

// Peek reports the window's state for key at now: its counter (a
// Counter.Add of 0).
func (w *FixedWindow) Peek(ctx context.Context, key string, now time.Time) (Decision, error) {
	t, err := unixNano(w.cfg.Name, now)
	if err != nil {
		return Decision{}, err
	}
	win := int64(w.cfg.Window)
	idx := floorDiv(t, win)
	c, err := w.store.Add(ctx, Key{Space: w.space, Name: key}, idx, 1, 0, windowTTL(win, 1))
	if err != nil {
		return Decision{}, fmt.Errorf("limiter: fixed window %q: %w", w.cfg.Name, err)
	}
	sanitize(&c, 1)
	used := c.C[0]
	left := time.Duration(win - (t - idx*win))
	d := Decision{Limit: w.cfg.Limit, Name: w.cfg.Name, Remaining: max(w.cfg.Limit-used, 0)}
	if used > 0 {
		d.ResetAfter = left
	}
	if satAdd(used, 1) <= w.cfg.Limit {
		d.Allowed = true
	} else {
		d.RetryAfter = left
	}
	return d, nil
}

// Reset forgets the window's counters of key (see [Resetter]).
func (w *FixedWindow) Reset(ctx context.Context, key string, now time.Time) error {
	defer w.cache.forget(key)
	t, err := unixNano(w.cfg.Name, now)
	if err != nil {
		return err
	}
	r, err := resetStore(w.store, "fixed window", w.cfg.Name)
	if err != nil {
		return err
	}
	win := int64(w.cfg.Window)
	op := windowReset(floorDiv(t, win), 1, win)
	if err := r.Reset(ctx, Key{Space: w.space, Name: key}, &op); err != nil {
		return fmt.Errorf("limiter: fixed window %q: reset: %w", w.cfg.Name, err)
	}
	return nil
}

// Peek is [TokenBucket.Get]: the bucket's state at now, without taking
// anything or writing (Remaining is the tokens; RetryAfter is for one).
func (b *TokenBucket) Peek(ctx context.Context, key string, now time.Time) (Decision, error) {
	return b.Get(ctx, key, now)
}

// Reset forgets the bucket of key (see [Resetter]): it is full again.
func (b *TokenBucket) Reset(ctx context.Context, key string, now time.Time) error {
	defer b.cache.forget(key)
	if _, err := unixNano(b.cfg.Name, now); err != nil {
		return err
	}
	r, err := resetStore(b.store, "token bucket", b.cfg.Name)
	if err != nil {
		return err
	}
	if err := r.Reset(ctx, Key{Space: b.space, Name: key}, &ResetOp{Kind: StepBucket}); err != nil {
		return fmt.Errorf("limiter: token bucket %q: reset: %w", b.cfg.Name, err)
	}
	return nil
}

// Peek reports the log's state for key at now from its timestamps, read
// with the store's [LogReader] (a store without one answers an error
// wrapping ErrUnsupported).
func (l *SlidingLog) Peek(ctx context.Context, key string, now time.Time) (Decision, error) {
	t, err := unixNano(l.cfg.Name, now)
	if err != nil {
		return Decision{}, err
	}
	lr, ok := l.store.(LogReader)
	if !ok {
		return Decision{}, fmt.Errorf("limiter: sliding log %q: peek: %w (%T is not a limiter.LogReader)", l.cfg.Name, ErrUnsupported, l.store)
	}
	entries, err := lr.ReadLog(ctx, Key{Space: l.space, Name: key})
	if err != nil {
		return Decision{}, fmt.Errorf("limiter: sliding log %q: %w", l.cfg.Name, err)
	}
	// What is left now (a refund of nothing), then what a request of 1
	// would get, each on its own copy: nothing is written.
	read := LogOp{Limit: l.cfg.Limit, Window: l.cfg.Window, Now: t, mode: opRefund}
	_, d, _ := read.Apply(slices.Clone(entries))
	take := LogOp{Limit: l.cfg.Limit, Window: l.cfg.Window, Now: t, N: 1, mode: opTake}
	_, one, _ := take.Apply(slices.Clone(entries))
	d.Allowed, d.RetryAfter, d.Name = one.Allowed, one.RetryAfter, l.cfg.Name
	return d, nil
}

// Reset forgets the log of key (see [Resetter]).
func (l *SlidingLog) Reset(ctx context.Context, key string, now time.Time) error {
	defer l.cache.forget(key)
	if _, err := unixNano(l.cfg.Name, now); err != nil {
		return err
	}
	r, err := resetStore(l.store, "sliding log", l.cfg.Name)
	if err != nil {
		return err
	}
	if err := r.Reset(ctx, Key{Space: l.space, Name: key}, &ResetOp{Kind: StepLog}); err != nil {
		return fmt.Errorf("limiter: sliding log %q: reset: %w", l.cfg.Name, err)
	}
	return nil
}
