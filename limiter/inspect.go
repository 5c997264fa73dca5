package limiter

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
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
	// capacity again (see [storage.Resetter] for what holds under concurrency),
	// and the key's denial cached in this process.
	Reset(ctx context.Context, key string, now time.Time) error
}

var (
	_ Inspector = (*SlidingWindow)(nil)
	_ Inspector = (*FixedWindow)(nil)
	_ Inspector = (*TokenBucket)(nil)
	_ Inspector = (*SlidingLog)(nil)
)

// resetStore returns store as a Resetter, or an error naming the limit.
func resetStore(store any, kind, name string) (storage.Resetter, error) {
	r, ok := store.(storage.Resetter)
	if !ok {
		return nil, fmt.Errorf("limiter: %s %q: reset: %w (%T is not a storage.Resetter)", kind, name, storage.ErrUnsupported, store)
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
	k := storage.Key{Space: w.space, Name: key}
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
func (w *SlidingWindow) peekPacked(ctx context.Context, k storage.Key, t int64) (Decision, error) {
	f := floorDiv(t, w.sub)
	op := storage.PackedPlan(f, w.r, 0, time.Duration(w.sub))
	c, err := w.packed.AddPacked(ctx, k, &op)
	if err != nil {
		return Decision{}, fmt.Errorf("limiter: sliding window %q: %w", w.cfg.Name, err)
	}
	if c.Stale {
		return Decision{}, fmt.Errorf("%w: limit %q: the key's newest writer is more than a window ahead of %v: its view there is gone",
			ErrInvalidTime, w.cfg.Name, time.Unix(0, t).UTC())
	}
	elapsed := t - f*w.sub
	d := Decision{Limit: w.cfg.Limit, Name: w.cfg.Name}
	total := storage.PackedTotal(&op, w.r, &c)
	d.Remaining = max(w.cfg.Limit-total, 0)
	var buf [4*storage.MaxPackedReads + 3*3]storage.PackedSpan
	fs := refineAtSlot(storage.PackedSpans(&op, w.r, &c, buf[:0]), &c, f)
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
		if x.N > 0 && (!seen || x.Last > last) {
			last, seen = x.Last, true
		}
	}
	if seen {
		d.ResetAfter = max(time.Duration((last+int64(w.r)+1-f)*w.sub-elapsed), 0)
	}
	return d, nil
}

// Reset forgets the window's counters of key (see [storage.Resetter]): those of
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
		op = storage.ResetOp{Kind: storage.StepPackedAdd, From: idx - 4*span - pow4(storage.PackedLevels), To: idx + 2*span, Unit: time.Duration(w.sub)}
	}
	if err := r.Reset(ctx, storage.Key{Space: w.space, Name: key}, &op); err != nil {
		return fmt.Errorf("limiter: sliding window %q: reset: %w", w.cfg.Name, err)
	}
	return nil
}

// windowReset is the ResetOp of a window of span sub-windows of sub ns at
// sub-window idx: the counters a writer up to a window behind or ahead of
// idx may have created within their TTL (2*span sub-windows) or will read
// (a late writer reads span more behind, an early one span ahead).
func windowReset(idx, span, sub int64) storage.ResetOp {
	return storage.ResetOp{Kind: storage.StepAdd, From: idx - 4*span, To: idx + 2*span, Unit: time.Duration(sub)}
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
	c, err := w.store.Add(ctx, storage.Key{Space: w.space, Name: key}, idx, 1, 0, windowTTL(win, 1))
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

// Reset forgets the window's counters of key (see [storage.Resetter]).
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
	if err := r.Reset(ctx, storage.Key{Space: w.space, Name: key}, &op); err != nil {
		return fmt.Errorf("limiter: fixed window %q: reset: %w", w.cfg.Name, err)
	}
	return nil
}

// Peek is [TokenBucket.Get]: the bucket's state at now, without taking
// anything or writing (Remaining is the tokens; RetryAfter is for one).
func (b *TokenBucket) Peek(ctx context.Context, key string, now time.Time) (Decision, error) {
	return b.Get(ctx, key, now)
}

// Reset forgets the bucket of key (see [storage.Resetter]): it is full again.
func (b *TokenBucket) Reset(ctx context.Context, key string, now time.Time) error {
	defer b.cache.forget(key)
	if _, err := unixNano(b.cfg.Name, now); err != nil {
		return err
	}
	r, err := resetStore(b.store, "token bucket", b.cfg.Name)
	if err != nil {
		return err
	}
	if err := r.Reset(ctx, storage.Key{Space: b.space, Name: key}, &storage.ResetOp{Kind: storage.StepBucket}); err != nil {
		return fmt.Errorf("limiter: token bucket %q: reset: %w", b.cfg.Name, err)
	}
	return nil
}

// Peek reports the log's state for key at now from its timestamps, read
// with the store's [storage.LogReader] (a store without one answers an error
// wrapping ErrUnsupported).
func (l *SlidingLog) Peek(ctx context.Context, key string, now time.Time) (Decision, error) {
	t, err := unixNano(l.cfg.Name, now)
	if err != nil {
		return Decision{}, err
	}
	lr, ok := l.store.(storage.LogReader)
	if !ok {
		return Decision{}, fmt.Errorf("limiter: sliding log %q: peek: %w (%T is not a storage.LogReader)", l.cfg.Name, storage.ErrUnsupported, l.store)
	}
	entries, err := lr.ReadLog(ctx, storage.Key{Space: l.space, Name: key})
	if err != nil {
		return Decision{}, fmt.Errorf("limiter: sliding log %q: %w", l.cfg.Name, err)
	}
	// What is left now (a refund of nothing), then what a request of 1
	// would get, each on its own copy: nothing is written.
	read := storage.LogOp{Limit: l.cfg.Limit, Window: l.cfg.Window, Now: t, Mode: storage.ModeRefund}
	_, d, _ := read.Apply(slices.Clone(entries))
	take := storage.LogOp{Limit: l.cfg.Limit, Window: l.cfg.Window, Now: t, N: 1, Mode: storage.ModeTake}
	_, one, _ := take.Apply(slices.Clone(entries))
	d.Allowed, d.RetryAfter = one.Allowed, one.RetryAfter
	return fromStore(d, l.cfg.Name), nil
}

// Reset forgets the log of key (see [storage.Resetter]).
func (l *SlidingLog) Reset(ctx context.Context, key string, now time.Time) error {
	defer l.cache.forget(key)
	if _, err := unixNano(l.cfg.Name, now); err != nil {
		return err
	}
	r, err := resetStore(l.store, "sliding log", l.cfg.Name)
	if err != nil {
		return err
	}
	if err := r.Reset(ctx, storage.Key{Space: l.space, Name: key}, &storage.ResetOp{Kind: storage.StepLog}); err != nil {
		return fmt.Errorf("limiter: sliding log %q: reset: %w", l.cfg.Name, err)
	}
	return nil
}
