package storage

import (
	"context"
	"errors"
	"time"
)

// ErrUnsupported is wrapped when a store does not offer an optional
// operation ([Resetter], [LogReader]).
var ErrUnsupported = errors.New("storage: not supported by the store")

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
// limiter.SlidingLog.Peek. (LogOp.Apply writes when it prunes old entries, even
// when it takes nothing, so UpdateLog cannot peek.)
type LogReader interface {
	ReadLog(ctx context.Context, key Key) ([]int64, error)
}

// Gauge is a value published at a time.
type Gauge struct {
	Value float64
	// At is the publisher's time in Unix nanoseconds.
	At int64
}

// GaugeStore holds named values that one part of a system publishes for
// another to read: the backend fleet's utilization, read by the shedders.
// PutGauge overwrites key's value (last writer wins), to be kept at least
// ttl; GetGauge reads it (found is false when there is none).
type GaugeStore interface {
	PutGauge(ctx context.Context, key Key, g Gauge, ttl time.Duration) error
	GetGauge(ctx context.Context, key Key) (g Gauge, found bool, err error)
}

// Fencer is an optional [Counter] interface: a fence per key, below which
// no take lands. A caller that lowers what others may take on a key (a
// share of a limit, limiter.Item.Cap) raises the key's fence, then reads
// the counters: every take decided on the older state carries a lower
// fence, so it is either in what the read counts or refused.
//
// AddFenced is [Counter.Add] on condition that key's fence is at most
// fence: if it is higher, nothing is added and the error wraps
// [ErrFenced]. With fence 0, or n 0 (a read), it is Add. The add and the
// fence check are one linearizable step.
//
// RaiseFence raises key's fence to f (f > 0) and never lowers it: a fence
// already at f or above stays as it is, and the call succeeds. Once it has
// returned nil, every AddFenced with a fence below f either landed before
// (a consistent read afterwards counts it) or is refused with ErrFenced.
// ttl is how long the fence must be kept at least (a window's counter
// TTL, a bucket's TTL); a store keeps it with the key's state, as long as
// that is kept, and a key's fence survives a [Resetter]'s reset. The key
// is a window's counters or, on a store that is also a [BucketFencer], a
// token bucket: one fence per key, whatever its kind.
//
// A [Batcher] that implements Fencer honours [Step].Fence in its Do. A
// store wrapping another implements Fencer only if the wrapped one does,
// and forwards both calls.
type Fencer interface {
	AddFenced(ctx context.Context, key Key, cur int64, span int, n int64, ttl time.Duration, fence int64) (Counts, error)
	RaiseFence(ctx context.Context, key Key, f int64, ttl time.Duration) error
}

// BucketFencer is an optional [BucketStore] interface, on a store that is
// a [Fencer] too: the fence of [Fencer] on a token bucket's takes.
//
// UpdateBucketFenced is [BucketStore.UpdateBucket] on condition that
// key's fence ([Fencer.RaiseFence] on the bucket's key) is at most fence,
// when op takes ([BucketOp.Take]: ModeTake, or ModeLease, with any lease
// return it carries): if it is higher, the op changes nothing (a return it
// carries is not applied either) and the error wraps [ErrFenced]. With
// fence 0, or an op that does not take (a read, a refund, a lease's return
// alone), it is UpdateBucket. The op and the fence check are one
// linearizable step. Once RaiseFence returned nil, every fenced take below
// the fence either landed before (a read of the bucket afterwards shows
// it) or is refused.
//
// A [Batcher] that implements BucketFencer honours [Step].Fence on its
// StepBucket takes. A wrapper implements it only if the wrapped store
// does, and forwards it.
type BucketFencer interface {
	UpdateBucketFenced(ctx context.Context, key Key, op BucketOp, ttl time.Duration, fence int64) (Decision, error)
}
