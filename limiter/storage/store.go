package storage

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
// return: the most sub-windows of a sliding window (limiter.MaxSubWindows,
// 60) plus the partially visible oldest one.
const MaxSpan = 61

// Horizon is how many sub-windows behind the newest sub-window written to a
// key a [Counter.Add] of the given span may be and still be exact: span
// sub-windows, one whole window plus one sub-window (for a fixed window,
// span 1: one window). See [Counter] for what it promises.
func Horizon(span int) int64 { return int64(span) }

// Ahead is how many sub-windows newer than its own an Add of the given span
// must see in [Counts.Later]: span-1, the newer part of every window-length
// interval that holds the caller's sub-window (none for a fixed window,
// which is exact per calendar window on its own counter).
func Ahead(span int) int64 { return int64(span - 1) }

// Counts is a window store's answer: the counters of the sub-windows in view,
// newest first, as they were after the add.
type Counts struct {
	// C[j] is the count of sub-window At-j, for j < span.
	C [MaxSpan]int64
	// Later is the total count of the sub-windows At+1 to At+Ahead(span)
	// (a store may count newer ones too: stricter, never laxer). Other
	// writers' clocks are ahead of ours; algorithms count Later in full, so
	// a late clock never sees less traffic than there was.
	Later int64
	// Moved reports that cur was past the horizon and the store counted
	// the units in sub-window At instead (the oldest sub-window of the
	// newest writer's view), reporting C as seen from At and Later as
	// everything newer. A refund must then go to At.
	Moved bool
	// At is the sub-window the units were counted in, when Moved.
	At int64
}

// Counter is the store the windows need: atomic counters per sub-window.
//
// Add adds n (n >= 0; n == 0 only reads) to sub-window cur of key and returns
// the counts of sub-windows cur, cur-1, ..., cur-span+1 and the total of the
// Ahead(span) newer ones, as seen after the add, atomically: the add and the
// reads are one linearizable step. A backend issues them in one round trip
// of latency (memcached: add+incr+get pipelined; DynamoDB: one UpdateItem).
//
// Sub subtracts n (n > 0) from the counter of sub-window idx of key, never
// going below zero (a refund after a denial), and from no other counter: a
// counter the store no longer holds has nothing to give back.
//
// # Out-of-order writers
//
// A request is stamped before it travels, so a store sees Adds whose cur is
// older than newest, the newest sub-window already written to the key.
// A store must keep the counter of every sub-window from
// newest-Horizon(span)-span+1 to newest, so that:
//
//   - Within the horizon (cur >= newest-Horizon(span)), Add counts n in
//     exactly the counter of cur and reports exactly the counters of cur's
//     view and Later; Sub(idx) with idx within the horizon takes from
//     exactly the counter it added to. Reordered arrivals then decide as
//     the same calls would in some serial order: the bounded sliding window
//     never admits more than its limit in any window-length interval of
//     stamps, and a fixed window never more than its limit per calendar
//     window.
//   - Past the horizon (cur < newest-Horizon(span)) the store no longer
//     holds cur's view. Its units are counted, never free: the store either
//     counts them in the oldest sub-window of the newest writer's view,
//     newest-span+1, and reports Moved and At (the caller is then judged
//     as a writer at At, against everything newer, and the newest writer
//     sees its units), or, if it cannot tell, keeps counters long enough
//     (below) that the case does not arise.
//
// A store that forgets counters by age instead of tracking newest
// (memcached) keeps each counter at least ttl after its creation; the
// windows pass ttl = 2*span sub-windows, which covers the horizon in real
// time when callers' clocks agree within a sub-window and every call reaches
// the store within one window of its stamp.
type Counter interface {
	Add(ctx context.Context, key Key, cur int64, span int, n int64, ttl time.Duration) (Counts, error)
	Sub(ctx context.Context, key Key, idx int64, n int64) error
}

// PackedCounter is the store the packed sliding window needs: counters of
// 64 bits, named by (key, level, index), to which packed deltas are added.
// It is optional: a store that implements it serves windows with
// limiter.Packed; the limiter computes which counters to add to and read, and
// the store does no arithmetic on fields.
//
// AddPacked adds each delta of op.Adds to its counter (creating it at 0),
// then reads op.Reads, and returns the added counters' new values and the
// counters read, as one linearizable step, or at least with every add of
// the op applied before its reads. Additions are on the whole 64-bit value,
// modulo 2^64: a field that overflows carries into the next, which the
// limiter detects from Added and undoes. A store must not clamp or
// saturate per field.
//
// SubPacked subtracts each delta of op.Adds from its counter (a refund), if
// the store holds it, never creating one and never touching another; it
// ignores op.Reads. Whenever the add being refunded is in the counter the
// subtraction is exact, also across a carry out of the top field (adds in
// flight may have wrapped the counter below the delta). Only a counter that
// was dropped and created again may be taken down field by field to 0, or
// subtracted modulo 2^64.
//
// Out-of-order writers: a store sees ops whose Slot is older than newest,
// the newest Slot added to the key. A store that tracks newest holds every
// counter that covers a slot in [newest-op.Keep, newest] ([PackedKeep]), so
// a writer within [PackedHorizon] of it is exact, and answers Stale,
// leaving none of the op's units counted, when a counter the op names may
// have been dropped; a store that forgets by age keeps each counter at
// least its delta's TTL and never answers Stale. docs/consistency.md ("The
// packed window") states this contract in full and why it keeps the window
// exact; docs/stores.md how each backend meets it.
type PackedCounter interface {
	AddPacked(ctx context.Context, key Key, op *PackedOp) (PackedCounts, error)
	SubPacked(ctx context.Context, key Key, op *PackedOp) error
}

// PackedHorizon is how many slots behind the newest slot written to a key
// a packed writer at resolution r may be and still find its whole view:
// r+1, one window plus one slot.
func PackedHorizon(r int) int64 { return int64(r) + 1 }

// PackedKeep is how many slots behind the newest a store that tracks it
// holds counters for: the horizon plus the view of a writer there, 2r+1.
func PackedKeep(r int) int64 { return PackedHorizon(r) + int64(r) }

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
	// Leased is what capacity leases hold of the bucket: the units taken
	// by leases of a lease epoch and not yet given back, in the slot of
	// the epoch's parity (zero when no lease was ever taken). Tokens then
	// counts them as still in the bucket; [BucketOp.Apply] shows Tokens
	// minus the leased units, and takes them out of Tokens when their
	// epoch expires. A store keeps Leased with Tokens and Updated.
	Leased [2]LeaseSlot
}

// LeaseSlot is the units that capacity leases of one lease epoch (Unix
// time divided by [LeaseEpoch]) took from a bucket and have not given
// back. Epoch 0 with Units 0 is an empty slot.
type LeaseSlot struct {
	Epoch, Units int64
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

// LeaseKeeper is implemented by a [BucketStore] that keeps
// [BucketState.Leased] with the rest of a bucket's state, as Sluice's
// backends do: a limiter.TokenBucket with Leases takes capacity leases only on
// such a store (a store that dropped Leased would let the leased units be
// spent twice). A store wrapping another reports what the wrapped one
// does.
type LeaseKeeper interface {
	KeepsLeased() bool
}

// CrossRegionWriter is an optional store interface: a store whose every
// write crosses regions before it is answered (a DynamoDB global table in
// multi-Region strong consistency: each write is a quorum of Regions, tens
// of milliseconds) says so, and a limiter's capacity leases on it are then
// sized by the store's measured round trip as well as by a key's rate
// (docs/leases.md, "Cross-region stores"). A store that does not implement
// it, or reports false, is regional: its leases follow the rate alone,
// however slow it is at a moment. A store wrapping another reports what
// the wrapped one does.
type CrossRegionWriter interface {
	WritesCrossRegions() bool
}

// WritesCrossRegions reports whether s says its writes cross regions
// ([CrossRegionWriter]).
func WritesCrossRegions(s any) bool {
	w, ok := s.(CrossRegionWriter)
	return ok && w.WritesCrossRegions()
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

// Store is a store of every kind the algorithms of a rule use: a backend
// (memory, memcached, DynamoDB) or a wrapper of one. A Store that also
// implements [PackedCounter] or [Batcher] serves packed windows or
// batches.
type Store interface {
	Counter
	BucketStore
	LogStore
}
