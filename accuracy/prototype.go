package accuracy

import (
	"context"
	"fmt"
	"math/bits"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// This file holds two prototype estimators for limiter.SlidingWindow. Both
// keep the k+1 counters of the sliding window (one memcached item per
// sub-window, one incr in parallel with one get-multi per decision, decr to
// refund), and both never admit more than the limit in any window-length
// interval. They differ from the Bounded estimator only in what they add to
// a counter: a request adds a number that also says where in its
// sub-window it arrived.
//
// Why a count alone cannot do better than Bounded: at offset e into
// sub-window i, the window (t-W, t] holds the part of the oldest sub-window
// i-k after offset e. If all c requests of sub-window i-k arrived in its last
// nanosecond (possible after a quiet spell, and nothing in the counters
// tells it apart from c requests spread over the sub-window), all c are in
// view for every e < s-1ns. So the in-view share of the oldest counter is c
// in the worst case, which is what Bounded counts: any estimator that is a
// function of the counts and admits where Bounded denies lets through more
// than the limit in the window on that trace. Doing better needs the
// counters to carry when the requests came, not only how many.

// SlicedWindow is a sliding window of k sub-windows whose counters each pack
// B counts, one per slice of s/B of their sub-window, in fields of 64/B bits
// (slice 0, the earliest, in the low bits): a request at offset x adds
// n << (bits * floor(x*B/s)). The estimate counts the sub-windows in view in
// full, and of the oldest only the slices that reach into the window. Its
// decisions are those of the Bounded estimator with k*B sub-windows, with
// the items and store calls of k.
//
// Fields must not overflow: NewSlicedWindow requires the limit to fit in
// bits-1 bits, and denied requests are refunded (a counter holds at most
// the limit plus the requests in flight).
type SlicedWindow struct {
	store      storage.Counter
	limit, sub int64
	k, b       int
	bits       uint
	space      string
	ttl        time.Duration
}

// NewSlicedWindow returns a sliced window enforcing p with k sub-windows of b
// slices.
func NewSlicedWindow(store storage.Counter, p Params, k, b int) (*SlicedWindow, error) {
	if k < 1 || k > limiter.MaxSubWindows || b < 1 || b > 64 || p.Window%time.Duration(k*b) != 0 {
		return nil, fmt.Errorf("accuracy: sliced window: %d sub-windows of %d slices do not divide %v", k, b, p.Window)
	}
	width := uint(64 / b)
	if width < 64 && p.Limit >= 1<<(width-1) {
		return nil, fmt.Errorf("accuracy: sliced window: limit %d does not fit in %d-bit fields", p.Limit, width)
	}
	sub := int64(p.Window) / int64(k)
	return &SlicedWindow{
		store: store, limit: p.Limit, sub: sub, k: k, b: b, bits: width,
		space: "sws:" + strconv.FormatInt(p.Limit, 10) + ":" + p.Window.String() + ":" + strconv.Itoa(k) + "x" + strconv.Itoa(b),
		ttl:   p.Window + time.Duration(sub),
	}, nil
}

// field returns slice f of a packed counter.
func (w *SlicedWindow) field(v int64, f int) int64 {
	if w.bits == 64 {
		return v
	}
	return int64(uint64(v)>>(w.bits*uint(f))) & (1<<w.bits - 1)
}

// total is the sum of the slices of a packed counter.
func (w *SlicedWindow) total(v int64) int64 {
	var n int64
	for f := range w.b {
		n += w.field(v, f)
	}
	return n
}

func (w *SlicedWindow) delta(t, n int64) (idx, slice, delta int64) {
	idx = floorDiv(t, w.sub)
	slice = (t - idx*w.sub) * int64(w.b) / w.sub
	return idx, slice, n << (w.bits * uint(slice))
}

// AllowN implements limiter.Limiter.
func (w *SlicedWindow) AllowN(ctx context.Context, key string, now time.Time, n int64) (limiter.Decision, error) {
	if n <= 0 || n > w.limit {
		return limiter.Decision{}, fmt.Errorf("%w: cost %d", limiter.ErrInvalidCost, n)
	}
	idx, slice, delta := w.delta(now.UnixNano(), n)
	k := storage.Key{Space: w.space, Name: key}
	c, err := w.store.Add(ctx, k, idx, w.k+1, delta, w.ttl)
	if err != nil {
		return limiter.Decision{}, err
	}
	used := w.total(c.Later)
	for j := 0; j < w.k; j++ {
		used += w.total(c.C[j])
	}
	for f := int(slice); f < w.b; f++ { // the oldest sub-window's slices still in view
		used += w.field(c.C[w.k], f)
	}
	d := limiter.Decision{Limit: w.limit}
	if used <= w.limit {
		d.Allowed, d.Remaining = true, w.limit-used
		return d, nil
	}
	return d, w.store.Sub(ctx, k, idx, delta)
}

// Refund implements limiter.Limiter.
func (w *SlicedWindow) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	idx, _, delta := w.delta(now.UnixNano(), n)
	return w.store.Sub(ctx, storage.Key{Space: w.space, Name: key}, idx, delta)
}

// momentQuanta is the resolution of MomentWindow's offsets: a sub-window is
// cut into this many quanta.
const momentQuanta = 1024

// MomentWindow is a sliding window of k sub-windows whose counters each pack
// the count (high 32 bits) and the sum of the arrival offsets of the
// requests, in quanta of s/1024 (low 32 bits): a request at offset x adds
// n<<32 + n*floor(x*1024/s). At offset e, the requests of the oldest
// sub-window still in view arrived at offsets above e, so each added at
// least m = floor(e*1024/s) to the sum S: there are at most floor(S/m) of
// them (Markov's inequality, tight for counts alone), and the estimate
// counts min(count, floor(S/m)) of the oldest instead of the whole count.
type MomentWindow struct {
	store      storage.Counter
	limit, sub int64
	k          int
	space      string
	ttl        time.Duration
}

// NewMomentWindow returns a moment window enforcing p with k sub-windows.
func NewMomentWindow(store storage.Counter, p Params, k int) (*MomentWindow, error) {
	if k < 1 || k > limiter.MaxSubWindows || p.Window%time.Duration(k) != 0 {
		return nil, fmt.Errorf("accuracy: moment window: %d sub-windows do not divide %v", k, p.Window)
	}
	if p.Limit*momentQuanta >= 1<<32 {
		return nil, fmt.Errorf("accuracy: moment window: limit %d too large for 32-bit offset sums", p.Limit)
	}
	sub := int64(p.Window) / int64(k)
	return &MomentWindow{
		store: store, limit: p.Limit, sub: sub, k: k,
		space: "swm:" + strconv.FormatInt(p.Limit, 10) + ":" + p.Window.String() + ":" + strconv.Itoa(k),
		ttl:   p.Window + time.Duration(sub),
	}, nil
}

func (w *MomentWindow) delta(t, n int64) (idx, quantum, delta int64) {
	idx = floorDiv(t, w.sub)
	hi, lo := bits.Mul64(uint64(t-idx*w.sub), momentQuanta)
	q, _ := bits.Div64(hi, lo, uint64(w.sub))
	return idx, int64(q), n<<32 + n*int64(q)
}

// AllowN implements limiter.Limiter.
func (w *MomentWindow) AllowN(ctx context.Context, key string, now time.Time, n int64) (limiter.Decision, error) {
	if n <= 0 || n > w.limit {
		return limiter.Decision{}, fmt.Errorf("%w: cost %d", limiter.ErrInvalidCost, n)
	}
	idx, m, delta := w.delta(now.UnixNano(), n)
	k := storage.Key{Space: w.space, Name: key}
	c, err := w.store.Add(ctx, k, idx, w.k+1, delta, w.ttl)
	if err != nil {
		return limiter.Decision{}, err
	}
	used := c.Later >> 32 // a carry out of the sums only makes this larger
	for j := 0; j < w.k; j++ {
		used += c.C[j] >> 32
	}
	oldest, sum := c.C[w.k]>>32, c.C[w.k]&(1<<32-1)
	if m > 0 {
		oldest = min(oldest, sum/m)
	}
	used += oldest
	d := limiter.Decision{Limit: w.limit}
	if used <= w.limit {
		d.Allowed, d.Remaining = true, w.limit-used
		return d, nil
	}
	return d, w.store.Sub(ctx, k, idx, delta)
}

// Refund implements limiter.Limiter.
func (w *MomentWindow) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	idx, _, delta := w.delta(now.UnixNano(), n)
	return w.store.Sub(ctx, storage.Key{Space: w.space, Name: key}, idx, delta)
}

var (
	_ limiter.Limiter = (*SlicedWindow)(nil)
	_ limiter.Limiter = (*MomentWindow)(nil)
)

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
