package storage

import (
	"context"
	"fmt"
	"time"
)

// StepKind names the operation of a [Step].
type StepKind uint8

// String returns "add", "sub", "bucket", "log", "packed-add" or
// "packed-sub".
func (k StepKind) String() string {
	switch k {
	case StepAdd:
		return "add"
	case StepSub:
		return "sub"
	case StepBucket:
		return "bucket"
	case StepLog:
		return "log"
	case StepPackedAdd:
		return "packed-add"
	case StepPackedSub:
		return "packed-sub"
	}
	return fmt.Sprintf("step(%d)", uint8(k))
}

const (
	// StepAdd is [Counter.Add](Key, Idx, Span, N, TTL): a window's take.
	StepAdd StepKind = iota + 1
	// StepSub is [Counter.Sub](Key, Idx, N): a window's refund. A store may
	// send it without waiting for the answer (StepResult.Err then reports
	// only a failure to send).
	StepSub
	// StepBucket is [BucketStore.UpdateBucket](Key, Bucket, TTL).
	StepBucket
	// StepLog is [LogStore.UpdateLog](Key, Log, TTL).
	StepLog
	// StepPackedAdd is [PackedCounter.AddPacked](Key, &Packed): a packed
	// window's take. N is the units (for the limiter; the store uses
	// Packed only).
	StepPackedAdd
	// StepPackedSub is [PackedCounter.SubPacked](Key, &Packed): a packed
	// window's refund. A store may send it without waiting for the answer,
	// as StepSub.
	StepPackedSub
)

// Step is one limit's storage step in a batch: what one call of the
// single-step interfaces ([Counter], [BucketStore], [LogStore],
// [PackedCounter]) would do.
// The fields a kind does not use are zero.
type Step struct {
	Kind StepKind
	Key  Key
	// Idx is the sub-window of StepAdd (cur) and StepSub.
	Idx int64
	// Span is StepAdd's view.
	Span int
	// N is the units of StepAdd and StepSub.
	N int64
	// Fence, if positive, fences a StepAdd that takes (N > 0), or a
	// StepBucket that takes (Bucket.Take(): a take or a lease take): the
	// store performs it only if the key's fence is at most Fence, else it
	// changes nothing and answers an error wrapping ErrFenced ([Fencer],
	// [BucketFencer]). Zero is unfenced: exactly the request without it.
	// Refunds, lease returns and reads are never fenced.
	Fence int64
	// TTL is how long the state must be kept (StepAdd, StepBucket, StepLog).
	TTL    time.Duration
	Bucket BucketOp
	Log    LogOp
	// Packed is the op of StepPackedAdd and StepPackedSub.
	Packed PackedOp
	// Shadow reports that the step is a Shadow item's: its denial does
	// not deny the batch (a store must not skip other steps for it, see
	// StepResult.NotApplied).
	Shadow bool
	// Sync reports that the caller waits for the step's outcome (the
	// public Refund methods' give-backs): a store must not send it without
	// waiting, as it may a batch's refunds, and Err reports whether it
	// landed. A store that batches may perform it with its single-step
	// method.
	Sync bool
}

// StepResult is a store's answer to one [Step].
type StepResult struct {
	// Counts answers StepAdd.
	Counts Counts
	// Decision answers StepBucket and StepLog.
	Decision Decision
	// Packed answers StepPackedAdd.
	Packed PackedCounts
	// Err is the step's error: the same errors the single-step method
	// returns.
	Err error
	// NotApplied reports that the store did not perform the step, on
	// purpose: it is a take (StepAdd with N > 0, StepPackedAdd, a take
	// StepBucket or StepLog) and another step of the same Do, not Shadow,
	// was denied by the store (a bucket or log take Decision not Allowed),
	// so the batch is denied and the take would only be given back. Nothing
	// was taken and nothing is to be given back; the other fields are zero.
	// A store that merges the steps on one key into one write (DynamoDB)
	// answers it for the takes it had not written when the denial was
	// decided; a Shadow step is never NotApplied.
	NotApplied bool
}

// Batcher is a store that performs several steps (on any keys, of any
// kinds it serves) in one round trip of latency: memcached pipelines them
// per node, DynamoDB sends them at once.
//
// Do performs steps[i] and writes its answer to out[i] (len(out) >=
// len(steps)). Each step is exactly as atomic as the single-step method it
// stands for; the batch as a whole need not be (a store that makes it
// all-or-nothing says so). Do returns when every step that waits for an
// answer has one, or at ctx's deadline with errors in the unanswered ones.
// It must not change steps: the limiter judges the answers against them.
//
// It is the one store interface of the decision path: the limiters send
// every step through it, to a store that has only the single-step methods
// through the plain loop [Steps]. limiter.Decide groups a batch's steps by
// store with ==, so a Batcher's type must be comparable (a pointer, as the
// backends' stores are).
type Batcher interface {
	Do(ctx context.Context, steps []Step, out []StepResult)
}
