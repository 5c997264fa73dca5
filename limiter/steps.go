package limiter

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// The package's limiters as batch items (see [Decide]): each turns a call
// into one store Step and the Step's answer into a decision.

var (
	_ stepper = (*SlidingWindow)(nil)
	_ stepper = (*FixedWindow)(nil)
	_ stepper = (*TokenBucket)(nil)
	_ stepper = (*SlidingLog)(nil)
)

// newDenyCache returns the cache of a limit: none when off, or when the
// limit's denials change what the store holds (then a cached denial would
// hide them from it).
func newDenyCache(off, denialsWrite bool) *denyCache {
	if off || denialsWrite {
		return nil
	}
	return makeDenyCache(denyCacheSize)
}

func (w *SlidingWindow) denyCache() *denyCache { return w.cache }

// batcher returns what a limiter sends its steps to: its store itself when
// the store batches, else a plain loop over its single-step methods: of
// every kind for a [storage.Store], else loop, of the kinds the limiter
// sends (the store in their fields).
func batcher(loop storage.Steps) storage.Batcher {
	// A store of every kind: its own Batcher or its plain loop over every
	// kind, the same for each limit on it (one group in Decide).
	if s, ok := loop.Counter.(storage.Store); ok {
		return storage.AsBatcher(s)
	}
	if s, ok := loop.Bucket.(storage.Store); ok {
		return storage.AsBatcher(s)
	}
	if s, ok := loop.Log.(storage.Store); ok {
		return storage.AsBatcher(s)
	}
	if b, ok := loop.Counter.(storage.Batcher); ok {
		return b
	}
	if b, ok := loop.Bucket.(storage.Batcher); ok {
		return b
	}
	if b, ok := loop.Log.(storage.Batcher); ok {
		return b
	}
	return loop
}

// leaseNeed is what a window's step st must get for the decision at hand,
// of n units: n when st is a lease take (it asks for more), else 0.
func leaseNeed(st *storage.Step, n int64) int64 {
	if st.N > n {
		return n
	}
	return 0
}

func (w *SlidingWindow) plan(key string, now time.Time, n int64) (storage.Step, storage.Batcher, error) {
	if err := w.checkCost(n); err != nil {
		return storage.Step{}, nil, err
	}
	t, err := unixNano(w.cfg.Name, now)
	if err != nil {
		return storage.Step{}, nil, err
	}
	k := storage.Key{Space: w.space, Name: key}
	if w.packed != nil {
		op := storage.PackedPlan(floorDiv(t, w.sub), w.r, n, time.Duration(w.sub))
		return storage.Step{Kind: storage.StepPackedAdd, Key: k, N: n, Packed: op}, w.batch, nil
	}
	return storage.Step{Kind: storage.StepAdd, Key: k, Idx: floorDiv(t, w.sub), Span: w.k + 1, N: n, TTL: w.ttl}, w.batch, nil
}

func (w *SlidingWindow) refund(key string, now time.Time, n int64) (storage.Step, storage.Batcher, error) {
	if err := w.checkCost(n); err != nil {
		return storage.Step{}, nil, err
	}
	t, err := unixNano(w.cfg.Name, now)
	if err != nil {
		return storage.Step{}, nil, err
	}
	k, idx := storage.Key{Space: w.space, Name: key}, floorDiv(t, w.sub)
	if w.packed != nil {
		return storage.Step{Kind: storage.StepPackedSub, Key: k, N: n, Packed: packedSub(idx, w.r, n, time.Duration(w.sub))}, w.batch, nil
	}
	return storage.Step{Kind: storage.StepSub, Key: k, Idx: idx, N: n}, w.batch, nil
}

func (w *SlidingWindow) storeErr(err error) error {
	return fmt.Errorf("limiter: sliding window %q: %w", w.cfg.Name, err)
}

func (w *SlidingWindow) judge(st *storage.Step, r *storage.StepResult, t, n int64) (Decision, storage.Step, bool, error) {
	if w.packed != nil {
		return w.judgePacked(st, r, t, n)
	}
	if r.Err != nil {
		return Decision{}, storage.Step{}, false, w.storeErr(r.Err)
	}
	c := r.Counts
	sanitize(&c, w.k+1)
	idx := st.Idx
	elapsed := t - idx*w.sub
	rem := w.sub - elapsed
	if c.Moved {
		// Counted in an older sub-window than ours: judge as a writer
		// there, with the oldest sub-window fully in view (stricter).
		idx, rem = c.At, w.sub
	}
	undo := storage.Step{Kind: storage.StepSub, Key: st.Key, Idx: idx, N: st.N}
	d := Decision{Limit: w.cfg.Limit, Name: w.cfg.Name, ResetAfter: time.Duration(int64(w.k+1)*w.sub - elapsed)}
	if need := leaseNeed(st, n); need > 0 {
		if c.Moved { // counted in an older sub-window than its own: no lease there
			d.RetryAfter = 1
			return d, undo, true, nil
		}
		if got, remaining, ok := leaseGot(w.boundedTotal(&c), w.cfg.Limit, st.N, need); ok {
			undo.N = st.N - got
			return leaseTaken(d, undo, got, remaining)
		}
	}
	if ok, remaining := w.estimate(&c, rem, 0); ok {
		d.Allowed = true
		d.Remaining = remaining
		return d, undo, false, nil
	}
	if w.cfg.CountDenied {
		undo = storage.Step{}
	} else {
		c.C[0] = max(c.C[0]-st.N, 0)
	}
	d.RetryAfter = max(w.retryAfter(&c, elapsed, st.N), 1)
	return d, undo, undo.Kind != 0, nil
}

func (w *FixedWindow) denyCache() *denyCache { return w.cache }

func (w *FixedWindow) plan(key string, now time.Time, n int64) (storage.Step, storage.Batcher, error) {
	if n <= 0 || n > w.cfg.Limit {
		return storage.Step{}, nil, costError(w.cfg.Name, n, w.cfg.Limit)
	}
	t, err := unixNano(w.cfg.Name, now)
	if err != nil {
		return storage.Step{}, nil, err
	}
	win := int64(w.cfg.Window)
	return storage.Step{Kind: storage.StepAdd, Key: storage.Key{Space: w.space, Name: key}, Idx: floorDiv(t, win), Span: 1, N: n, TTL: windowTTL(win, 1)}, w.batch, nil
}

func (w *FixedWindow) refund(key string, now time.Time, n int64) (storage.Step, storage.Batcher, error) {
	if n <= 0 || n > w.cfg.Limit {
		return storage.Step{}, nil, costError(w.cfg.Name, n, w.cfg.Limit)
	}
	t, err := unixNano(w.cfg.Name, now)
	if err != nil {
		return storage.Step{}, nil, err
	}
	return storage.Step{Kind: storage.StepSub, Key: storage.Key{Space: w.space, Name: key}, Idx: floorDiv(t, int64(w.cfg.Window)), N: n}, w.batch, nil
}

func (w *FixedWindow) storeErr(err error) error {
	return fmt.Errorf("limiter: fixed window %q: %w", w.cfg.Name, err)
}

func (w *FixedWindow) judge(st *storage.Step, r *storage.StepResult, t, n int64) (Decision, storage.Step, bool, error) {
	if r.Err != nil {
		return Decision{}, storage.Step{}, false, w.storeErr(r.Err)
	}
	c := r.Counts
	sanitize(&c, 1)
	win := int64(w.cfg.Window)
	idx := st.Idx
	left := time.Duration(win - (t - idx*win))
	used := c.C[0]
	if c.Moved {
		// Counted in the newest writer's window: judged there, against
		// everything newer too (a store that could not count the units
		// where a punctual writer sees them reports Later saturated).
		idx = c.At
		used = satAdd(used, c.Later)
	}
	undo := storage.Step{Kind: storage.StepSub, Key: st.Key, Idx: idx, N: st.N}
	d := Decision{Limit: w.cfg.Limit, Name: w.cfg.Name, ResetAfter: left}
	if used <= w.cfg.Limit {
		d.Allowed = true
		d.Remaining = w.cfg.Limit - used
		return d, undo, false, nil
	}
	d.RetryAfter = left
	if w.cfg.CountDenied {
		return d, storage.Step{}, false, nil
	}
	return d, undo, true, nil
}

func (b *TokenBucket) denyCache() *denyCache { return b.cache }

func (b *TokenBucket) op(t, n int64, mode storage.Mode) storage.BucketOp {
	return storage.BucketOp{
		MaxAmount:    b.cfg.MaxAmount,
		RefillTime:   b.cfg.RefillTime,
		RefillAmount: b.cfg.RefillAmount,
		Strict:       b.cfg.Strict,
		Now:          t,
		N:            n,
		Mode:         mode,
	}
}

func (b *TokenBucket) plan(key string, now time.Time, n int64) (storage.Step, storage.Batcher, error) {
	if n <= 0 || n > b.cfg.MaxAmount {
		return storage.Step{}, nil, costError(b.cfg.Name, n, b.cfg.MaxAmount)
	}
	t, err := unixNano(b.cfg.Name, now)
	if err != nil {
		return storage.Step{}, nil, err
	}
	return storage.Step{Kind: storage.StepBucket, Key: storage.Key{Space: b.space, Name: key}, Bucket: b.op(t, n, storage.ModeTake), TTL: b.ttl}, b.batch, nil
}

func (b *TokenBucket) refund(key string, now time.Time, n int64) (storage.Step, storage.Batcher, error) {
	if n <= 0 || n > b.cfg.MaxAmount {
		return storage.Step{}, nil, costError(b.cfg.Name, n, b.cfg.MaxAmount)
	}
	t, err := unixNano(b.cfg.Name, now)
	if err != nil {
		return storage.Step{}, nil, err
	}
	return b.refundStep(storage.Key{Space: b.space, Name: key}, t, n), b.batch, nil
}

// refundStep gives back n tokens of key at t.
func (b *TokenBucket) refundStep(k storage.Key, t, n int64) storage.Step {
	return storage.Step{Kind: storage.StepBucket, Key: k, Bucket: b.op(t, n, storage.ModeRefund), TTL: b.ttl}
}

func (b *TokenBucket) storeErr(err error) error {
	return fmt.Errorf("limiter: token bucket %q: %w", b.cfg.Name, err)
}

func (b *TokenBucket) judge(st *storage.Step, r *storage.StepResult, t, n int64) (Decision, storage.Step, bool, error) {
	if r.Err != nil {
		return Decision{}, storage.Step{}, false, b.storeErr(r.Err)
	}
	d := fromStore(r.Decision, b.cfg.Name)
	if !d.Allowed {
		return d, storage.Step{}, false, nil
	}
	if d.Granted > 0 { // a lease's: a denied batch's units stay in the lease
		return d, storage.Step{}, false, nil
	}
	return d, b.refundStep(st.Key, t, st.Bucket.N), false, nil
}

func (l *SlidingLog) denyCache() *denyCache { return l.cache }

func (l *SlidingLog) plan(key string, now time.Time, n int64) (storage.Step, storage.Batcher, error) {
	if n <= 0 || n > l.cfg.Limit {
		return storage.Step{}, nil, costError(l.cfg.Name, n, l.cfg.Limit)
	}
	t, err := unixNano(l.cfg.Name, now)
	if err != nil {
		return storage.Step{}, nil, err
	}
	return l.step(storage.Key{Space: l.space, Name: key}, t, n, storage.ModeTake), l.batch, nil
}

func (l *SlidingLog) refund(key string, now time.Time, n int64) (storage.Step, storage.Batcher, error) {
	if n <= 0 || n > l.cfg.Limit {
		return storage.Step{}, nil, costError(l.cfg.Name, n, l.cfg.Limit)
	}
	t, err := unixNano(l.cfg.Name, now)
	if err != nil {
		return storage.Step{}, nil, err
	}
	return l.step(storage.Key{Space: l.space, Name: key}, t, n, storage.ModeRefund), l.batch, nil
}

// step records (ModeTake) or removes (ModeRefund) n entries of key at t.
func (l *SlidingLog) step(k storage.Key, t, n int64, mode storage.Mode) storage.Step {
	op := storage.LogOp{Limit: l.cfg.Limit, Window: l.cfg.Window, Now: t, N: n, Mode: mode}
	return storage.Step{Kind: storage.StepLog, Key: k, Log: op, TTL: satMul(2, l.cfg.Window)}
}

func (l *SlidingLog) storeErr(err error) error {
	return fmt.Errorf("limiter: sliding log %q: %w", l.cfg.Name, err)
}

func (l *SlidingLog) judge(st *storage.Step, r *storage.StepResult, t, n int64) (Decision, storage.Step, bool, error) {
	if r.Err != nil {
		return Decision{}, storage.Step{}, false, l.storeErr(r.Err)
	}
	d := fromStore(r.Decision, l.cfg.Name)
	if !d.Allowed {
		return d, storage.Step{}, false, nil
	}
	return d, l.step(st.Key, st.Log.Now, st.Log.N, storage.ModeRefund), false, nil
}
