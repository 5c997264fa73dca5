package storage

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"
)

// MaxLogLimit is the largest limit of a limiter.SlidingLog: it stores one
// timestamp per unit allowed in the window.
const MaxLogLimit = 10000

// LogOp is one sliding-log step, handed to a [LogStore].
type LogOp struct {
	Limit  int64
	Window time.Duration
	// Now is the caller's time in Unix nanoseconds.
	Now int64
	N   int64
	// Mode is ModeTake (record N entries at Now) or ModeRefund (remove
	// up to N entries recorded at Now).
	Mode Mode
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
	switch op.Mode {
	case ModeRefund:
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

// Refund reports whether the op removes entries it recorded (a batch's
// refund round) rather than recording them. Like a [StepSub], a refund's
// answer is not needed by the caller: a [Batcher] may send it without
// waiting.
func (op LogOp) Refund() bool { return op.Mode == ModeRefund }

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
