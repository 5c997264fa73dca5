package limiter

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// MaxLogLimit is the largest limit of a [SlidingLog]: it stores one
// timestamp per unit allowed in the window.
const MaxLogLimit = 10000

// SlidingLogConfig configures a [SlidingLog].
type SlidingLogConfig struct {
	Name   string
	Limit  int64
	Window time.Duration
	// NoDenyCache turns off the limit's deny cache (see [DenyCache]),
	// which is on by default: a key the store denied is denied again
	// without a store request until the denial's RetryAfter has passed.
	NoDenyCache bool
}

// SlidingLog is the exact sliding window: it keeps the time of every unit
// allowed in the last Window and allows a request if the units in
// (now-Window, now] plus the request's fit within Limit. It is the accuracy
// reference for the approximations, and practical for small limits (memory
// and item size grow with Limit: up to twice Limit entries are kept, for
// callers whose clocks lag the newest writer's, see [LogOp.Apply]). A
// decision is one
// LogStore.UpdateLog; safe for concurrent use; exact on any store that
// honours the LogStore contract.
type SlidingLog struct {
	cfg   SlidingLogConfig
	store LogStore
	batch Batcher // store's
	space string
	cache *DenyCache
}

// NewSlidingLog returns a sliding log on store, or an error wrapping
// [ErrInvalidConfig].
func NewSlidingLog(store LogStore, cfg SlidingLogConfig) (*SlidingLog, error) {
	const kind = "sliding log"
	switch {
	case store == nil:
		return nil, configError(kind, cfg.Name, "store", "must not be nil")
	case cfg.Limit <= 0 || cfg.Limit > MaxLogLimit:
		return nil, configError(kind, cfg.Name, "limit", "must be between 1 and %d, got %d", MaxLogLimit, cfg.Limit)
	case cfg.Window <= 0:
		return nil, configError(kind, cfg.Name, "window", "must be positive, got %v", cfg.Window)
	}
	return &SlidingLog{cfg: cfg, store: store, batch: AsBatcher(store), space: "sl:" + strconv.FormatInt(cfg.Limit, 10) + ":" + cfg.Window.String(), cache: newDenyCache(cfg.NoDenyCache, false)}, nil
}

// Config returns the log's configuration.
func (l *SlidingLog) Config() SlidingLogConfig { return l.cfg }

// Allow is AllowN(ctx, key, now, 1).
func (l *SlidingLog) Allow(ctx context.Context, key string, now time.Time) (Decision, error) {
	return l.AllowN(ctx, key, now, 1)
}

// AllowN records n units at now if they fit in the window.
func (l *SlidingLog) AllowN(ctx context.Context, key string, now time.Time, n int64) (Decision, error) {
	return decideOne(ctx, l, key, now, n)
}

// Refund removes up to n timestamps recorded at now.
func (l *SlidingLog) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	return refundOne(ctx, l, key, now, n)
}

// LogOp is one sliding-log step, handed to a [LogStore].
type LogOp struct {
	Limit  int64
	Window time.Duration
	// Now is the caller's time in Unix nanoseconds.
	Now  int64
	N    int64
	mode opMode
}

// Apply computes the log after op from entries (ascending timestamps in Unix
// nanoseconds; it may be nil). It reuses entries' storage. write reports
// whether the result differs from entries.
//
// Out-of-order writers: entries are kept for one window plus a horizon of
// one more window behind the newest entry (or Now, if newer), so a caller
// whose clock is up to one window behind the newest writer's is judged
// exactly: N units at Now are allowed if every window-length interval that
// holds Now, including those reaching into newer entries, stays within
// Limit. A caller further behind is judged, and recorded, at the oldest
// time in the newest writer's window: counted, never free.
// A refund removes up to N entries recorded at exactly Now.
func (op LogOp) Apply(entries []int64) (next []int64, d Decision, write bool) {
	w := int64(op.Window)
	newest := op.Now
	if len(entries) > 0 {
		newest = max(newest, entries[len(entries)-1])
	}
	at := op.Now
	if at < newest-w {
		at = newest - w + 1 // past the horizon: the oldest time in newest's window
	}
	cutoff := newest - 2*w // entries <= cutoff are out of every view
	drop := 0
	for drop < len(entries) && entries[drop] <= cutoff {
		drop++
	}
	next = entries
	if drop > 0 {
		next = append(entries[:0], entries[drop:]...)
		write = true
	}
	d = Decision{Limit: op.Limit}
	used := maxInWindows(next, at, w)
	switch op.mode {
	case opRefund:
		for i := len(next) - 1; i >= 0 && op.N > 0; i-- {
			if next[i] == op.Now {
				next = slices.Delete(next, i, i+1)
				op.N--
				write = true
			}
		}
		d.Allowed = true
		used = maxInWindows(next, at, w)
	default:
		if used+op.N <= op.Limit {
			// Keep the list sorted: a late clock inserts before newer entries.
			i := len(next)
			for i > 0 && next[i-1] > at {
				i--
			}
			for range op.N {
				next = slices.Insert(next, i, at)
			}
			used += op.N
			d.Allowed = true
			write = true
		}
	}
	d.Remaining = max(op.Limit-used, 0)
	if len(next) > 0 {
		d.ResetAfter = time.Duration(max(next[len(next)-1]+w-op.Now, 0))
	}
	if !d.Allowed {
		// The oldest (used+N-Limit) entries of at's window must leave it.
		first := len(next)
		for first > 0 && next[first-1] > at-w {
			first--
		}
		view := next[first:]
		m := min(used, int64(len(view))) + op.N - op.Limit
		if m >= 1 && m <= int64(len(view)) {
			d.RetryAfter = time.Duration(max(view[m-1]+w-op.Now, 1))
		} else {
			d.RetryAfter = 1
		}
	}
	return next, d, write
}

// maxInWindows returns the largest number of entries (ascending) in a
// window-length interval (s-w, s] that holds at: s = at, or an entry newer
// than at by less than w. In order (no entry newer than at) it is the count
// in (at-w, at].
func maxInWindows(entries []int64, at, w int64) int64 {
	lo := 0 // first entry > s-w
	best := int64(0)
	for hi := 0; hi <= len(entries); hi++ {
		// s is at when hi indexes the first entry newer than at, then
		// each newer entry in turn.
		if hi < len(entries) && entries[hi] <= at {
			continue
		}
		s := at
		end := hi // entries[:end] are <= s
		if hi > 0 && entries[hi-1] > at {
			s = entries[hi-1]
		}
		if s-at >= w {
			break
		}
		for lo < end && entries[lo] <= s-w {
			lo++
		}
		best = max(best, int64(end-lo))
	}
	return best
}

// AppendLog appends the binary encoding of entries (ascending Unix
// nanoseconds) to dst: a varint count, the first entry, then varint deltas.
// Backends that store a log as one value use it with [ParseLog].
func AppendLog(dst []byte, entries []int64) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(entries)))
	prev := int64(0)
	for _, e := range entries {
		dst = binary.AppendVarint(dst, e-prev)
		prev = e
	}
	return dst
}

// ParseLog decodes what [AppendLog] wrote, appending the entries to dst. A
// malformed value gives an error wrapping [ErrCorruptState].
func ParseLog(b []byte, dst []int64) ([]int64, error) {
	n, w := binary.Uvarint(b)
	if w <= 0 || n > MaxLogLimit {
		return dst, fmt.Errorf("%w: sliding log header", ErrCorruptState)
	}
	b = b[w:]
	prev := int64(0)
	for i := uint64(0); i < n; i++ {
		d, w := binary.Varint(b)
		if w <= 0 {
			return dst, fmt.Errorf("%w: sliding log entry %d of %d", ErrCorruptState, i, n)
		}
		b = b[w:]
		prev += d
		if len(dst) > 0 && prev < dst[len(dst)-1] {
			return dst, fmt.Errorf("%w: sliding log entries out of order", ErrCorruptState)
		}
		dst = append(dst, prev)
	}
	if len(b) != 0 {
		return dst, fmt.Errorf("%w: %d trailing bytes after sliding log", ErrCorruptState, len(b))
	}
	return dst, nil
}
