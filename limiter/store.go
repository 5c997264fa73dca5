package limiter

import (
	"context"
	"time"
)

// Key identifies stored state. Space names the algorithm and its parameters
// (for example "tb:2:1m0s:1" for a bucket of 2 refilled by 1 every minute),
// so limits with different parameters never share state; Name is the
// caller's key. Name may hold any bytes, including spaces, control bytes and
// invalid UTF-8: backends must store it safely (escape or hash it).
type Key struct {
	Space string
	Name  string
}

// String returns Space and Name joined by a slash. Backends with their own
// key syntax should build keys themselves.
func (k Key) String() string { return k.Space + "/" + k.Name }

// MaxSpan is the largest number of sub-windows a [Counter] is asked to
// return: MaxSubWindows plus the partially visible oldest one.
const MaxSpan = MaxSubWindows + 1

// Counts is a window store's answer: the counters of the sub-windows in view,
// newest first, as they were after the add.
type Counts struct {
	// C[j] is the count of sub-window cur-j, for j < span.
	C [MaxSpan]int64
	// Later is the total count of sub-windows newer than cur that the store
	// knows of (other writers' clocks are ahead of ours). Algorithms count
	// it in full, so a late clock never sees less traffic than there was. A
	// store that cannot tell reports 0 and documents how far back it looks.
	Later int64
}

// Counter is the store the windows need: atomic counters per sub-window.
//
// Add adds n (n >= 0; n == 0 only reads) to sub-window cur of key and returns
// the counts of sub-windows cur, cur-1, ..., cur-span+1 as seen after the
// add. Sub-window counters must be kept for at least ttl after their last
// write. A backend issues the add and the reads in one round trip of latency
// (memcached: incr in parallel with get-multi; DynamoDB: one UpdateItem).
//
// Sub subtracts n (n > 0) from sub-window idx of key, never going below zero
// (a refund after a denial).
type Counter interface {
	Add(ctx context.Context, key Key, cur int64, span int, n int64, ttl time.Duration) (Counts, error)
	Sub(ctx context.Context, key Key, idx int64, n int64) error
}

// BucketState is a token bucket as stored.
type BucketState struct {
	// Tokens in the bucket.
	Tokens int64
	// Updated is the time of the last refill accounting, in Unix
	// nanoseconds.
	Updated int64
	// Version is opaque to the algorithm: a backend may keep a CAS id or a
	// version number here.
	Version uint64
}

// BucketStore is the store the token bucket needs: an atomic
// read-modify-write of one bucket.
//
// UpdateBucket applies op to the bucket of key: it calls op.Apply with the
// current state (found is false when the key holds none), stores the returned
// state when Apply asks for a write, and returns Apply's decision. The
// read-modify-write must be atomic: a backend without transactions uses
// optimistic concurrency (compare-and-swap, conditional writes), calling
// Apply again on the state that beat it, within ctx's deadline, and never
// loses an update. It may start from the last state it saw for key rather
// than reading first, provided the write is conditional on it. ttl is how
// long the state must be kept after the write.
type BucketStore interface {
	UpdateBucket(ctx context.Context, key Key, op BucketOp, ttl time.Duration) (Decision, error)
}

// LogStore is the store the sliding log needs: an atomic read-modify-write of
// one key's list of timestamps.
//
// UpdateLog calls op.Apply with the key's timestamps (nil when none), stores
// the returned list (which may alias the argument) when Apply asks for a
// write, and returns Apply's decision, atomically as for [BucketStore].
type LogStore interface {
	UpdateLog(ctx context.Context, key Key, op LogOp, ttl time.Duration) (Decision, error)
}
