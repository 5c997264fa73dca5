package limiter

import (
	"context"
	"fmt"
	"math/bits"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// Estimator selects how a [SlidingWindow] turns sub-window counters into an
// estimate of the requests in the last window.
type Estimator uint8

const (
	// Bounded counts the oldest, partly visible sub-window in full. It never
	// admits more than the limit within any window-length interval; it
	// admits less than an exact sliding log, the less the more sub-windows
	// there are. It is the zero value.
	Bounded Estimator = iota
	// Interpolated weights the oldest sub-window by the share of it still
	// inside the window (ClassDojo, Criteo). It is exact under steady
	// traffic but over-admits when the oldest sub-window's traffic was
	// bunched at its start.
	Interpolated
)

// String returns "bounded" or "interpolated".
func (e Estimator) String() string {
	switch e {
	case Bounded:
		return "bounded"
	case Interpolated:
		return "interpolated"
	}
	return "estimator(" + strconv.Itoa(int(e)) + ")"
}

// UnmarshalText parses the names String returns ("" is Bounded).
func (e *Estimator) UnmarshalText(text []byte) error {
	switch s := string(text); s {
	case "bounded", "":
		*e = Bounded
	case "interpolated":
		*e = Interpolated
	default:
		return fmt.Errorf("%w: unknown estimator %q (want bounded or interpolated)", ErrInvalidConfig, s)
	}
	return nil
}

const (
	// MaxSubWindows is the largest sub-window count of a [SlidingWindow].
	MaxSubWindows = storage.MaxSpan - 1
	// DefaultSubWindows is the sub-window count used when none is given.
	// With the Bounded estimator it is the fewest sub-windows that admits
	// at least 97% of what an exact sliding log admits on bursty traffic
	// (docs/accuracy.md); it divides every window that is a whole number of
	// 20 ns.
	DefaultSubWindows = 20
)

// SlidingWindowConfig configures a [SlidingWindow].
type SlidingWindowConfig struct {
	// Name identifies the limit in decisions and metrics.
	Name string
	// Tag, when not empty, is added to the key space the parameters name
	// (as "#" Tag), so that two limits of the same parameters on one
	// store keep their own counters for the same keys (the policy tags
	// the second of two such limits of one rule with its name).
	Tag string
	// Limit is the number of units allowed per Window.
	Limit int64
	// Window is the length of the sliding window.
	Window time.Duration
	// SubWindows is the number of counters per window (k); it must divide
	// Window exactly. Zero means DefaultSubWindows.
	SubWindows int
	// Estimator chooses between Bounded (the zero value) and Interpolated.
	Estimator Estimator
	// CountDenied keeps denied requests in the counters (ClassDojo's
	// behaviour: a client that keeps hammering stays blocked). By default a
	// denied request is refunded. Such a window has no deny cache.
	CountDenied bool
	// NoDenyCache turns off the limit's deny cache (docs/consistency.md, "The deny cache"),
	// which is on by default: a key the store denied is denied again
	// without a store request until the denial's RetryAfter has passed.
	NoDenyCache bool
	// Representation chooses how the counts are stored: Auto (the zero
	// value: Packed where the store and the window allow it, else
	// SubWindowCounters; see [Auto]), SubWindowCounters (every store) or
	// Packed (a store implementing [storage.PackedCounter]; NewSlidingWindow
	// refuses a store without it, and limits above MaxPackedLimit,
	// CountDenied and Interpolated). A window's keys differ between the
	// two, so changing the representation of a live limit starts its
	// counts afresh (see docs/accuracy.md).
	Representation Representation
	// Slots is the resolution of a Packed window, slots per window (r),
	// between MinSlots and MaxSlots; it must divide Window exactly. Zero
	// means DefaultSlots. SubWindows is not used by a Packed window.
	Slots int
	// MaxCost is the largest cost a call will ask (AllowN's n), at most
	// Limit; a call asking more is refused with ErrInvalidCost and takes
	// nothing. A Packed window is exact only while the units of denied
	// calls in flight (added, not yet given back) stay below 2^15 in every
	// slot field, which PackedMaxCost bounds: Auto picks Packed only when
	// MaxCost is at most PackedMaxCost, and NewSlidingWindow refuses Packed
	// above it. Zero means the limit on a SubWindowCounters window, and
	// PackedMaxCost (or the limit, if smaller) on a Packed one: a caller
	// whose costs may exceed 32 sets MaxCost, which then keeps sub-window
	// counters under Auto, rather than meeting ErrInvalidCost at run time.
	MaxCost int64
	// Leases lets a hot key be decided in this process from capacity
	// leases: units added to the key's current slot (sub-window) in one
	// store step and spent here until the slot ends, without a store
	// request, never over the limit (docs/leases.md). A cold key is
	// decided as without them. Only a Bounded window that refunds
	// denials leases; it pays where a slot lasts 100 ms or more.
	Leases bool
}

// SlidingWindow is the approximated sliding window: a request is allowed
// if the estimated count over the last Window, including the request, stays
// within Limit.
//
// With the Packed representation (the default where the store and the
// window allow it, see [Auto]), time is cut into Slots slots per window
// (160 by default), kept in packed counters at 4 levels, and a decision is
// one PackedCounter.AddPacked (and a SubPacked when a denied request is
// refunded): the Bounded estimate at a resolution of Slots, reading at
// most 8 counters. It admits at least 97% of the exact sliding log on
// every traffic shape of docs/accuracy.md.
//
// With SubWindowCounters, time is cut into sub-windows of Window/k, each
// with a counter in the store; the estimate sums the k-1 most recent
// sub-windows and the current one, plus the oldest sub-window that is
// partly inside the window, weighted by the Estimator. A decision is one
// Counter.Add (one round trip) plus a Counter.Sub when a denied request is
// refunded.
//
// A SlidingWindow is safe for concurrent use. With the Bounded estimator
// it never over-admits, provided the store's steps are atomic and callers'
// clocks agree; concurrent denials may briefly under-admit while their
// refunds are in flight.
type SlidingWindow struct {
	cfg   SlidingWindowConfig
	store storage.Counter
	batch storage.Batcher // store's
	space string
	sub   int64 // sub-window length in ns
	k     int
	ttl   time.Duration
	cache *denyCache
	// Packed: the store, and the slots per window (sub is the slot
	// length).
	packed storage.PackedCounter
	r      int
	// maxCostSet: the caller gave MaxCost (else it is the packed default,
	// and a refused call's error says how to ask for more).
	maxCostSet bool
	lz         *leaser // nil: no leases
}

// NewSlidingWindow returns a sliding window on store, or an error wrapping
// [ErrInvalidConfig] naming the bad field.
func NewSlidingWindow(store storage.Counter, cfg SlidingWindowConfig) (*SlidingWindow, error) {
	const kind = "sliding window"
	switch {
	case store == nil:
		return nil, configError(kind, cfg.Name, "store", "must not be nil")
	case cfg.Limit <= 0:
		return nil, configError(kind, cfg.Name, "limit", "must be positive, got %d", cfg.Limit)
	case cfg.Window <= 0:
		return nil, configError(kind, cfg.Name, "window", "must be positive, got %v", cfg.Window)
	case cfg.Estimator > Interpolated:
		return nil, configError(kind, cfg.Name, "estimator", "unknown estimator %d", cfg.Estimator)
	case cfg.Representation > Packed:
		return nil, configError(kind, cfg.Name, "representation", "unknown representation %d", cfg.Representation)
	case cfg.MaxCost < 0 || cfg.MaxCost > cfg.Limit:
		return nil, configError(kind, cfg.Name, "max-cost", "must be between 0 and the limit %d, got %d", cfg.Limit, cfg.MaxCost)
	case cfg.Leases && (cfg.Estimator != Bounded || cfg.CountDenied):
		return nil, configError(kind, cfg.Name, "leases", "only a bounded window that refunds denials leases")
	}
	if cfg.Representation == Auto {
		cfg.Representation = SubWindowCounters
		if cfg.Slots != 0 || packedFits(store, cfg) {
			cfg.Representation = Packed
		}
	}
	if cfg.Representation == Packed {
		return newPackedWindow(store, cfg)
	}
	if cfg.SubWindows == 0 {
		cfg.SubWindows = DefaultSubWindows
	}
	switch {
	case cfg.Slots != 0:
		return nil, configError(kind, cfg.Name, "slots", "only a packed window has slots, got %d", cfg.Slots)
	case cfg.SubWindows < 0 || cfg.SubWindows > MaxSubWindows:
		return nil, configError(kind, cfg.Name, "sub-windows", "must be between 1 and %d, got %d", MaxSubWindows, cfg.SubWindows)
	case cfg.Window%time.Duration(cfg.SubWindows) != 0:
		return nil, configError(kind, cfg.Name, "sub-windows", "%d does not divide the window %v into whole nanoseconds", cfg.SubWindows, cfg.Window)
	case cfg.Window/time.Duration(cfg.SubWindows) < time.Millisecond:
		return nil, configError(kind, cfg.Name, "sub-windows", "sub-window %v is shorter than 1ms", cfg.Window/time.Duration(cfg.SubWindows))
	}
	sub := cfg.Window / time.Duration(cfg.SubWindows)
	space := "sw:" + strconv.FormatInt(cfg.Limit, 10) + ":" + cfg.Window.String() + ":" + strconv.Itoa(cfg.SubWindows)
	if cfg.CountDenied {
		space += ":d"
	}
	space += tagSpace(cfg.Tag)
	return &SlidingWindow{
		cfg:   cfg,
		store: store,
		batch: batcher(storage.Steps{Counter: store}),
		space: space,
		sub:   int64(sub),
		k:     cfg.SubWindows,
		ttl:   windowTTL(int64(sub), cfg.SubWindows+1),
		cache: newDenyCache(cfg.NoDenyCache, cfg.CountDenied),
		lz:    windowLeaser(cfg.Leases, cfg.Limit, store),
	}, nil
}

// newPackedWindow is NewSlidingWindow for the Packed representation.
func newPackedWindow(store storage.Counter, cfg SlidingWindowConfig) (*SlidingWindow, error) {
	const kind = "sliding window"
	if cfg.Slots == 0 {
		cfg.Slots = DefaultSlots
	}
	ps, ok := store.(storage.PackedCounter)
	switch {
	case !ok:
		return nil, configError(kind, cfg.Name, "representation", "packed needs a store implementing storage.PackedCounter; %T does not (use subwindows)", store)
	case cfg.Limit > MaxPackedLimit:
		return nil, configError(kind, cfg.Name, "limit", "%d is above %d, the largest a packed window's 16-bit fields hold (use subwindows)", cfg.Limit, MaxPackedLimit)
	case cfg.Estimator != Bounded:
		return nil, configError(kind, cfg.Name, "estimator", "a packed window is bounded, got %v", cfg.Estimator)
	case cfg.CountDenied:
		return nil, configError(kind, cfg.Name, "count-denied", "a packed window cannot count denied requests (its 16-bit fields would overflow under a flood)")
	case cfg.MaxCost > PackedMaxCost:
		return nil, configError(kind, cfg.Name, "max-cost", "%d is above %d, the largest cost a packed window takes (denied calls in flight could overflow its 16-bit fields; use subwindows)", cfg.MaxCost, PackedMaxCost)
	case cfg.Slots < MinSlots || cfg.Slots > MaxSlots:
		return nil, configError(kind, cfg.Name, "slots", "must be between %d and %d, got %d", MinSlots, MaxSlots, cfg.Slots)
	case cfg.Window%time.Duration(cfg.Slots) != 0:
		return nil, configError(kind, cfg.Name, "slots", "%d does not divide the window %v into whole nanoseconds", cfg.Slots, cfg.Window)
	case cfg.Window/time.Duration(cfg.Slots) < minSlotLen:
		return nil, configError(kind, cfg.Name, "slots", "slot %v is shorter than 100us", cfg.Window/time.Duration(cfg.Slots))
	}
	maxCostSet := cfg.MaxCost != 0
	if !maxCostSet {
		// Not "calls up to the limit": two calls of that size in flight
		// carry a field (see PackedMaxCost), and every decision that read it
		// meanwhile would count 65,536 units too few.
		cfg.MaxCost = min(PackedMaxCost, cfg.Limit)
	}
	slot := cfg.Window / time.Duration(cfg.Slots)
	space := "swp:" + strconv.FormatInt(cfg.Limit, 10) + ":" + cfg.Window.String() + ":" + strconv.Itoa(cfg.Slots) + ":" + strconv.Itoa(storage.PackedLevels) + tagSpace(cfg.Tag)
	return &SlidingWindow{
		cfg:        cfg,
		store:      store,
		batch:      batcher(storage.Steps{Counter: store, Packed: ps}),
		space:      space,
		sub:        int64(slot),
		cache:      newDenyCache(cfg.NoDenyCache, false),
		packed:     ps,
		r:          cfg.Slots,
		maxCostSet: maxCostSet,
		lz:         windowLeaser(cfg.Leases, packedMaxWant, store),
	}, nil
}

// Config returns the window's configuration (with defaults applied).
func (w *SlidingWindow) Config() SlidingWindowConfig { return w.cfg }

// Allow is AllowN(ctx, key, now, 1).
func (w *SlidingWindow) Allow(ctx context.Context, key string, now time.Time) (Decision, error) {
	return w.AllowN(ctx, key, now, 1)
}

// AllowN counts n units for key at now and reports whether the estimate over
// the last window stays within the limit: one Counter.Add, and a
// Counter.Sub giving back a denied request (unless CountDenied). A key
// denied earlier is answered from the deny cache until its RetryAfter.
func (w *SlidingWindow) AllowN(ctx context.Context, key string, now time.Time, n int64) (Decision, error) {
	return decideOne(ctx, w, key, now, n)
}

// checkCost refuses a cost of n: not positive, above the limit, or above
// MaxCost when the window has one.
func (w *SlidingWindow) checkCost(n int64) error {
	if w.cfg.MaxCost > 0 && n > w.cfg.MaxCost && n <= w.cfg.Limit {
		if w.packed != nil && !w.maxCostSet {
			return fmt.Errorf("%w: limit %q: cost %d exceeds %d, the largest cost of a packed window without MaxCost (set SlidingWindowConfig.MaxCost to the largest cost you ask: above %d the window keeps sub-window counters)",
				ErrInvalidCost, w.cfg.Name, n, w.cfg.MaxCost, PackedMaxCost)
		}
		return fmt.Errorf("%w: limit %q: cost %d exceeds the window's MaxCost %d", ErrInvalidCost, w.cfg.Name, n, w.cfg.MaxCost)
	}
	if n <= 0 || n > w.cfg.Limit {
		return costError(w.cfg.Name, n, w.cfg.Limit)
	}
	return nil
}

// Refund gives back n units counted by an allowed AllowN at now.
func (w *SlidingWindow) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	return refundOne(ctx, w, key, now, n)
}

// estimate reports whether the counts plus extra fit the limit when the
// oldest sub-window has rem ns left in view, and what remains.
func (w *SlidingWindow) estimate(c *storage.Counts, rem, extra int64) (bool, int64) {
	full := satAdd(c.Later, extra)
	for j := 0; j < w.k; j++ {
		full = satAdd(full, c.C[j])
	}
	oldest := c.C[w.k]
	if w.cfg.Estimator == Bounded {
		full = satAdd(full, oldest)
		return full <= w.cfg.Limit, max(w.cfg.Limit-full, 0)
	}
	// full + oldest*rem/sub <= limit, in exact integer arithmetic.
	if full > w.cfg.Limit {
		return false, 0
	}
	weighted := ceilMulDiv(oldest, rem, w.sub)
	return fitsWeighted(full, oldest, rem, w.sub, w.cfg.Limit), max(w.cfg.Limit-full-weighted, 0)
}

// retryAfter is how long until n more units would fit, with no more traffic.
func (w *SlidingWindow) retryAfter(c *storage.Counts, elapsed, n int64) time.Duration {
	s, k, limit := w.sub, w.k, w.cfg.Limit
	for j := 0; j <= k; j++ {
		// In sub-window idx+j the view holds c[0..k-j]; c[k-j] is oldest.
		full := satAdd(c.Later, n)
		for i := 0; i < k-j; i++ {
			full = satAdd(full, c.C[i])
		}
		oldest := c.C[k-j]
		start := int64(0)
		if j == 0 {
			start = elapsed
		}
		offset := func(x int64) time.Duration { return time.Duration(int64(j)*s + x - elapsed) }
		if w.cfg.Estimator == Bounded {
			if j > 0 && satAdd(full, oldest) <= limit {
				return offset(0)
			}
			continue
		}
		if full > limit {
			continue
		}
		if oldest == 0 {
			return offset(start)
		}
		// Need oldest*(s-x) <= (limit-full)*s, i.e. x >= s - floor((limit-full)*s/oldest).
		a := limit - full
		x := int64(0)
		if a < oldest {
			x = s - floorMulDiv(a, s, oldest)
		}
		x = max(x, start)
		if x < s {
			return offset(x)
		}
	}
	// Only traffic newer than our clock (Later) is left in view.
	return time.Duration(int64(k+1)*s - elapsed)
}

// Space returns the key space of the window's counters: its parameters
// (and its Tag).
func (w *SlidingWindow) Space() string { return w.space }

// tagSpace is what a limit's Tag adds to its key space.
func tagSpace(tag string) string {
	if tag == "" {
		return ""
	}
	return "#" + tag
}

// FixedWindowConfig configures a [FixedWindow].
type FixedWindowConfig struct {
	Name string
	// Tag, when not empty, is added to the key space the parameters name
	// (as "#" Tag), so that two limits of the same parameters on one
	// store keep their own counters for the same keys (the policy tags
	// the second of two such limits of one rule with its name).
	Tag         string
	Limit       int64
	Window      time.Duration
	CountDenied bool
	// NoDenyCache turns off the limit's deny cache (docs/consistency.md, "The deny cache"),
	// which is on by default: a key the store denied is denied again
	// without a store request until the denial's RetryAfter has passed.
	NoDenyCache bool
}

// FixedWindow allows Limit units per calendar window (time cut into windows
// of Window from the Unix epoch): one counter per window. It is exact within
// a window but admits up to twice the limit across a window boundary. A
// decision is one Counter.Add. Safe for concurrent use.
type FixedWindow struct {
	cfg   FixedWindowConfig
	store storage.Counter
	batch storage.Batcher // store's
	space string
	cache *denyCache
}

// Space returns the key space of the window's counters: its parameters
// (and its Tag).
func (w *FixedWindow) Space() string { return w.space }

// NewFixedWindow returns a fixed window on store, or an error wrapping
// [ErrInvalidConfig].
func NewFixedWindow(store storage.Counter, cfg FixedWindowConfig) (*FixedWindow, error) {
	const kind = "fixed window"
	switch {
	case store == nil:
		return nil, configError(kind, cfg.Name, "store", "must not be nil")
	case cfg.Limit <= 0:
		return nil, configError(kind, cfg.Name, "limit", "must be positive, got %d", cfg.Limit)
	case cfg.Window < time.Millisecond:
		return nil, configError(kind, cfg.Name, "window", "must be at least 1ms, got %v", cfg.Window)
	}
	space := "fw:" + strconv.FormatInt(cfg.Limit, 10) + ":" + cfg.Window.String()
	if cfg.CountDenied {
		space += ":d"
	}
	space += tagSpace(cfg.Tag)
	return &FixedWindow{cfg: cfg, store: store, batch: batcher(storage.Steps{Counter: store}), space: space, cache: newDenyCache(cfg.NoDenyCache, cfg.CountDenied)}, nil
}

// Config returns the window's configuration.
func (w *FixedWindow) Config() FixedWindowConfig { return w.cfg }

// Allow is AllowN(ctx, key, now, 1).
func (w *FixedWindow) Allow(ctx context.Context, key string, now time.Time) (Decision, error) {
	return w.AllowN(ctx, key, now, 1)
}

// AllowN counts n units in the current window of key (see
// SlidingWindow.AllowN for refunds and the deny cache).
func (w *FixedWindow) AllowN(ctx context.Context, key string, now time.Time, n int64) (Decision, error) {
	return decideOne(ctx, w, key, now, n)
}

// Refund gives back n units counted by an allowed AllowN at now.
func (w *FixedWindow) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	return refundOne(ctx, w, key, now, n)
}

// windowTTL is how long a store must keep a sub-window counter of length sub
// after creating it, for a view of span: the view and the horizon behind the
// newest writer ([storage.Horizon]), 2*span sub-windows.
func windowTTL(sub int64, span int) time.Duration {
	return satMul(time.Duration(sub), time.Duration(int64(span)+storage.Horizon(span)))
}

// sanitize clears negative counts a store may report, so that a misbehaving
// store never mints capacity through them. Entries past span are never read.
func sanitize(c *storage.Counts, span int) {
	for i := range c.C[:span] {
		c.C[i] = max(c.C[i], 0)
	}
	c.Later = max(c.Later, 0)
}

// satAdd adds non-negative counts, saturating instead of overflowing.
func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return 1<<63 - 1
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && (a < 0) {
		q--
	}
	return q
}

// fitsWeighted reports full + oldest*rem/s <= limit exactly (all >= 0).
func fitsWeighted(full, oldest, rem, s, limit int64) bool {
	h1, l1 := bits.Mul64(uint64(full), uint64(s))
	h2, l2 := bits.Mul64(uint64(oldest), uint64(rem))
	lo, carry := bits.Add64(l1, l2, 0)
	hi, _ := bits.Add64(h1, h2, carry)
	h3, l3 := bits.Mul64(uint64(limit), uint64(s))
	return hi < h3 || (hi == h3 && lo <= l3)
}

// floorMulDiv is floor(a*b/c) for 0 <= a < c, b >= 0 (the result fits).
func floorMulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}

// ceilMulDiv is ceil(a*b/c) for a, b >= 0, 0 <= b <= c.
func ceilMulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, r := bits.Div64(hi, lo, uint64(c))
	if r != 0 {
		q++
	}
	return int64(q)
}
