package limiter

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// The limiters' lease takes and returns (see lease.go).

var (
	_ leasable = (*SlidingWindow)(nil)
	_ leasable = (*TokenBucket)(nil)
)

// packedMaxWant bounds a packed window's lease take: the units of takes
// in flight share a slot field's headroom with denied calls' (see
// PackedMaxCost); 64 processes taking 256 at once use half of it.
const packedMaxWant = 8 * PackedMaxCost

// leaseGot splits the answer to a window's lease take of want units, at
// least need: total is the window's count with all of them. got is what
// fits the limit; ok when that is at least need.
func leaseGot(total, limit, want, need int64) (got, remaining int64, ok bool) {
	got = want
	if total > limit {
		got = want - (total - limit)
	}
	if got < need {
		return 0, 0, false
	}
	return got, max(limit-total, 0), true
}

// leaseTaken is the decision of a window's lease take that got units;
// undo gives back, at once, the N units that did not fit (none: N 0).
func leaseTaken(d Decision, undo storage.Step, got, remaining int64) (Decision, storage.Step, bool, error) {
	d.Allowed, d.Granted, d.Remaining = true, got, remaining
	if undo.N <= 0 {
		return d, storage.Step{}, false, nil
	}
	return d, undo, true, nil
}

func (w *SlidingWindow) leases() *leaser { return w.lz }

// LeaseStats returns the window's lease counters in this process.
func (w *SlidingWindow) LeaseStats() LeaseStats { return w.lz.Stats() }

// ReturnLeases ends the window's live leases in this process at now and
// gives their unspent units back, waiting for the writes: for a process
// about to stop. Leases not returned are not lost for good: their units
// stay counted until their slot leaves the window.
func (w *SlidingWindow) ReturnLeases(ctx context.Context, now time.Time) error {
	return returnLeases(ctx, w, now)
}

// leaseTerms: a window's lease is counted in the slot (sub-window) it is
// taken in and spent only there (docs/leases.md, "A slot-bound lease is
// exact").
func (w *SlidingWindow) leaseTerms(t int64) (ref, end int64) {
	ref = floorDiv(t, w.sub)
	return ref, (ref + 1) * w.sub
}

func (w *SlidingWindow) leaseStep(key string, t, n, want, ref int64) storage.Step {
	k := storage.Key{Space: w.space, Name: key}
	if w.packed != nil {
		op := storage.PackedPlan(ref, w.r, want, time.Duration(w.sub))
		return storage.Step{Kind: storage.StepPackedAdd, Key: k, N: want, Packed: op}
	}
	return storage.Step{Kind: storage.StepAdd, Key: k, Idx: ref, Span: w.k + 1, N: want, TTL: w.ttl}
}

func (w *SlidingWindow) returnStep(c lease) (storage.Step, storage.Batcher) {
	k := storage.Key{Space: w.space, Name: c.key}
	if w.packed != nil {
		return storage.Step{Kind: storage.StepPackedSub, Key: k, N: c.unspent, Packed: packedSub(c.ref, w.r, c.unspent, time.Duration(w.sub))}, w.batch
	}
	return storage.Step{Kind: storage.StepSub, Key: k, Idx: c.ref, N: c.unspent}, w.batch
}

// boundedTotal is the Bounded estimate's count: the view and Later.
func (w *SlidingWindow) boundedTotal(c *storage.Counts) int64 {
	full := c.Later
	for j := 0; j <= w.k; j++ {
		full = satAdd(full, c.C[j])
	}
	return full
}

// windowLeaser is a window's leaser on store, nil without leases.
func windowLeaser(on bool, maxWant int64, store storage.Counter) *leaser {
	if !on {
		return nil
	}
	return newLeaser(maxWant, store)
}

func (b *TokenBucket) leases() *leaser { return b.lz }

// LeaseStats returns the bucket's lease counters in this process.
func (b *TokenBucket) LeaseStats() LeaseStats { return b.lz.Stats() }

// ReturnLeases ends the bucket's live leases in this process at now and
// gives their unspent tokens back, waiting for the writes: for a process
// about to stop. A lease not returned holds its units out of the bucket
// until its epoch expires (at most 4.8 s).
func (b *TokenBucket) ReturnLeases(ctx context.Context, now time.Time) error {
	return returnLeases(ctx, b, now)
}

// leaseTerms: a bucket's lease is counted in its lease epoch and spent
// within MaxLeaseLife.
func (b *TokenBucket) leaseTerms(t int64) (ref, end int64) {
	return leaseEpochOf(t), t + int64(storage.MaxLeaseLife)
}

func (b *TokenBucket) leaseStep(key string, t, n, want, ref int64) storage.Step {
	op := b.op(t, n, storage.ModeLease)
	op.Want, op.Epoch = want, ref
	return storage.Step{Kind: storage.StepBucket, Key: storage.Key{Space: b.space, Name: key}, Bucket: op, TTL: b.ttl}
}

func (b *TokenBucket) returnStep(c lease) (storage.Step, storage.Batcher) {
	op := b.op(c.at, 0, storage.ModeReturn)
	op.Return = storage.LeaseReturn{Epoch: c.ref, Got: c.got, Unspent: c.unspent}
	return storage.Step{Kind: storage.StepBucket, Key: storage.Key{Space: b.space, Name: c.key}, Bucket: op, TTL: b.ttl}, b.batch
}

// carryReturn puts c's return on st, the next step of its key: a bucket's
// lease ends in the same write (every spent lease must end: its hold on
// the bucket lasts until then). A window's step cannot carry one (its
// return is to another slot).
func (b *TokenBucket) carryReturn(st *storage.Step, c lease) bool {
	if st.Kind != storage.StepBucket || st.Bucket.Return.Got > 0 {
		return false
	}
	st.Bucket.Return = storage.LeaseReturn{Epoch: c.ref, Got: c.got, Unspent: c.unspent}
	return true
}

func (w *SlidingWindow) carryReturn(*storage.Step, lease) bool { return false }
