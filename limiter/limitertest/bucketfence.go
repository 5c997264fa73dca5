package limitertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// bucketFenceStep is one step of RunBucketFence: a bucket op (a take, a
// lease take, a read, a refund, a lease's return) under a fence, or a
// raise.
type bucketFenceStep struct {
	what  string
	raise int64 // RaiseFence to raise (0: an op)
	mode  storage.Mode
	n     int64
	want  int64 // a lease take's Want
	fence int64
	// ret carries the return of the last lease granted (all unspent).
	ret bool
	// fenced: the op is refused with ErrFenced; remaining is the bucket's
	// free tokens after the step.
	fenced    bool
	remaining int64
}

// bucketFenceMax is the capacity of RunBucketFence's bucket.
const bucketFenceMax = 100

var bucketFenceSteps = []bucketFenceStep{
	{what: "fenced take on a key without a fence", n: 1, fence: 7, remaining: 99},
	{what: "raise to 5", raise: 5, remaining: 99},
	{what: "take fenced below", n: 2, fence: 3, fenced: true, remaining: 99},
	{what: "take fenced at the fence", n: 2, fence: 5, remaining: 97},
	{what: "take fenced above", n: 1, fence: 6, remaining: 96},
	{what: "raise to 2 (lower: no change)", raise: 2, remaining: 96},
	{what: "take fenced below the unlowered fence", n: 1, fence: 4, fenced: true, remaining: 96},
	{what: "unfenced take", n: 1, remaining: 95},
	{what: "read fenced below (reads are not fenced)", mode: storage.ModePeek, n: 1, fence: 1, remaining: 95},
	{what: "refund fenced below (refunds are not fenced)", mode: storage.ModeRefund, n: 2, fence: 1, remaining: 97},
	{what: "lease take fenced below", mode: storage.ModeLease, n: 1, want: 10, fence: 3, fenced: true, remaining: 97},
	{what: "lease take fenced at the fence", mode: storage.ModeLease, n: 1, want: 10, fence: 5, remaining: 87},
	{what: "take fenced below carrying the lease's return (not applied)", n: 1, fence: 3, ret: true, fenced: true, remaining: 87},
	{what: "the lease's return alone fenced below (returns are not fenced)", mode: storage.ModeReturn, fence: 1, ret: true, remaining: 97},
	{what: "raise to 9", raise: 9, remaining: 97},
	{what: "take fenced at the old fence", n: 1, fence: 5, fenced: true, remaining: 97},
	{what: "lease take fenced at the old fence", mode: storage.ModeLease, n: 1, want: 10, fence: 5, fenced: true, remaining: 97},
}

// RunBucketFence is the conformance suite of a [storage.BucketFencer]
// (with [storage.Fencer]'s RaiseFence on a bucket's key): a fenced take
// or lease take below the key's fence changes nothing (a lease return it
// carries included) and answers ErrFenced, one at or above it is
// performed, fence 0 always is, RaiseFence never lowers, reads, refunds
// and lease returns are never fenced. It runs the steps through
// UpdateBucketFenced and through the store's batch path
// (storage.AsBatcher: Step.Fence), then a batch of fenced and unfenced
// bucket takes and a window add on one key name (a store that merges them
// into one write must refuse only the fenced one).
func RunBucketFence(t *testing.T, s Store) {
	fs, ok1 := s.(storage.Fencer)
	bf, ok2 := s.(storage.BucketFencer)
	if !ok1 || !ok2 {
		t.Fatalf("%T is not a storage.Fencer and a storage.BucketFencer", s)
	}
	name := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	now := time.Now().UnixNano()
	runFencePaths(t, "bucket-fence-conformance", name, "UpdateBucketFenced", len(bucketFenceSteps), func(k storage.Key, batch bool) func(i int) (string, error) {
		r := &bucketFenceRun{s: s, fs: fs, bf: bf, batch: batch, now: now}
		return func(i int) (string, error) { return bucketFenceSteps[i].what, r.step(k, bucketFenceSteps[i]) }
	})
	t.Run("merged", func(t *testing.T) { runBucketFenceMerged(t, s, fs, name+"-merged", now) })
}

// bucketFenceOp is a RunBucketFence bucket's op at now.
func bucketFenceOp(now, n int64, mode storage.Mode) storage.BucketOp {
	return storage.BucketOp{MaxAmount: bucketFenceMax, RefillTime: time.Hour, RefillAmount: 1, Now: now, N: n, Mode: mode}
}

type bucketFenceRun struct {
	s     Store
	fs    storage.Fencer
	bf    storage.BucketFencer
	batch bool
	now   int64
	lease storage.LeaseReturn // the last lease granted
}

func (r *bucketFenceRun) step(k storage.Key, st bucketFenceStep) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var (
		d   storage.Decision
		err error
	)
	op := bucketFenceOp(r.now, st.n, st.mode)
	op.Want, op.Epoch = st.want, floorDivide(r.now, int64(storage.LeaseEpoch))
	if st.ret {
		op.Return = r.lease
	}
	switch {
	case st.raise > 0:
		err = r.fs.RaiseFence(ctx, k, st.raise, fenceTTL)
	case r.batch:
		var out [1]storage.StepResult
		// Sync: a refund's answer is waited for (a batch may send it
		// without waiting), so that the read after it sees it.
		storage.AsBatcher(r.s).Do(ctx, []storage.Step{{Kind: storage.StepBucket, Key: k, Bucket: op, TTL: fenceTTL, Fence: st.fence, Sync: true}}, out[:])
		d, err = out[0].Decision, out[0].Err
	default:
		d, err = r.bf.UpdateBucketFenced(ctx, k, op, fenceTTL, st.fence)
	}
	if err := checkFenced(st.fenced, err); err != nil {
		return fmt.Errorf("%w (%+v)", err, d)
	}
	if st.raise == 0 && !st.fenced && st.mode != storage.ModeRefund && !d.Allowed {
		return fmt.Errorf("not allowed: %+v", d)
	}
	if d.Granted > 0 {
		r.lease = storage.LeaseReturn{Epoch: d.LeaseRef, Got: d.Granted, Unspent: d.Granted}
	}
	rem, err := bucketFree(ctx, r.s, k, r.now)
	if err != nil {
		return err
	}
	if rem != st.remaining {
		return fmt.Errorf("%d free tokens after the step, want %d", rem, st.remaining)
	}
	return nil
}

// bucketFree reads the free tokens of a RunBucketFence bucket.
func bucketFree(ctx context.Context, s storage.BucketStore, k storage.Key, now int64) (int64, error) {
	d, err := s.UpdateBucket(ctx, k, bucketFenceOp(now, 1, storage.ModePeek), fenceTTL)
	if err != nil {
		return 0, fmt.Errorf("read: %w", err)
	}
	return d.Remaining, nil
}

// runBucketFenceMerged sends, in one batch, takes of two buckets and a
// window's add on one key name: a take fenced below its key's fence, one
// fenced at it, an unfenced add.
func runBucketFenceMerged(t *testing.T, s Store, fs storage.Fencer, name string, now int64) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	keys := raiseMergedFences(ctx, t, fs, "bucket-fence-merged", name)
	steps := []storage.Step{
		{Kind: storage.StepBucket, Key: keys[0], Bucket: bucketFenceOp(now, 1, storage.ModeTake), TTL: fenceTTL, Fence: 3},
		{Kind: storage.StepBucket, Key: keys[1], Bucket: bucketFenceOp(now, 1, storage.ModeTake), TTL: fenceTTL, Fence: 4},
		{Kind: storage.StepAdd, Key: keys[2], Idx: fenceCur, Span: fenceSpan, N: 1, TTL: fenceTTL},
	}
	out := make([]storage.StepResult, len(steps))
	storage.AsBatcher(s).Do(ctx, steps, out)
	if !errors.Is(out[0].Err, storage.ErrFenced) {
		t.Errorf("take fenced below: %v, want ErrFenced", out[0].Err)
	}
	if out[1].Err != nil || !out[1].Decision.Allowed || out[2].Err != nil {
		t.Errorf("take fenced at the fence: %v %+v; unfenced add: %v", out[1].Err, out[1].Decision, out[2].Err)
	}
	for i, want := range []int64{bucketFenceMax, bucketFenceMax - 1} {
		if rem, err := bucketFree(ctx, s, keys[i], now); err != nil || rem != want {
			t.Errorf("%s: %d free tokens (%v), want %d", keys[i].Space, rem, err, want)
		}
	}
	if c, err := s.Add(ctx, keys[2], fenceCur, fenceSpan, 0, fenceTTL); err != nil || c.C[0] != 1 {
		t.Errorf("%s: count %d (%v), want 1", keys[2].Space, c.C[0], err)
	}
}

func floorDivide(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}
