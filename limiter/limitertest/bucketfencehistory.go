package limitertest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// bucketHistoryMax is the capacity of RunBucketFenceHistory's bucket:
// never emptied, so every take is allowed and what the bucket lost is
// what was taken.
const bucketHistoryMax = 1 << 40

// RunBucketFenceHistory is [RunFenceHistory] for a token bucket: Workers
// goroutines take from one bucket with fence 1 through a [DelayStore] on
// s (arrivals reordered on purpose), every other one capacity-lease takes
// (one token, up to 4; none with NoLeases), half of them through the store's batch path
// (Step.Fence) and half through UpdateBucketFenced; the bucket's fence is
// raised to 2 half-way and its free tokens read at once, then again when
// every take has returned. Every op is stamped with one instant, so the
// bucket never refills and no lease expires: AtRaise and Final count the
// tokens taken, Landed the tokens the takes answered (a lease's grant).
// Check the result with [FenceHistory.Err].
func RunBucketFenceHistory(ctx context.Context, s Store, opt FenceHistoryOptions) (FenceHistory, error) {
	opt = fenceDefaults(opt)
	fs, ok := s.(storage.Fencer)
	if _, bf := s.(storage.BucketFencer); !ok || !bf {
		return FenceHistory{}, fmt.Errorf("%T is not a storage.Fencer and a storage.BucketFencer", s)
	}
	ds := NewDelayStore(s, opt.MaxDelay, opt.Seed)
	k := storage.Key{Space: "bucket-fence-history", Name: fmt.Sprintf("k-%d-%d", opt.Seed, time.Now().UnixNano())}
	now := time.Now().UnixNano()
	take := func(ctx context.Context, w int) (int64, error) {
		return bucketHistoryTake(ctx, ds, k, now, w, !opt.NoLeases)
	}
	read := func(ctx context.Context) (int64, error) {
		free, err := bucketHistoryFree(ctx, s, k, now)
		return bucketHistoryMax - free, err
	}
	return runFenceHistory(ctx, fs, k, opt, take, read)
}

// bucketHistoryTake is worker w's take with fence 1: a lease take for an
// odd w when leases, through Do for w%4 >= 2. It returns the tokens
// taken.
func bucketHistoryTake(ctx context.Context, ds *DelayStore, k storage.Key, now int64, w int, leases bool) (int64, error) {
	op := bucketHistoryOp(now, storage.ModeTake)
	if leases && w%2 == 1 {
		op.Mode, op.Want, op.Epoch = storage.ModeLease, 4, floorDivide(now, int64(storage.LeaseEpoch))
	}
	var (
		d   storage.Decision
		err error
	)
	if w%4 >= 2 {
		var out [1]storage.StepResult
		ds.Do(ctx, []storage.Step{{Kind: storage.StepBucket, Key: k, Bucket: op, TTL: fenceTTL, Fence: 1}}, out[:])
		d, err = out[0].Decision, out[0].Err
	} else {
		d, err = ds.UpdateBucketFenced(ctx, k, op, fenceTTL, 1)
	}
	switch {
	case err != nil:
		return 0, err
	case !d.Allowed:
		return 0, errors.New("a take of a bucket never emptied was denied")
	case d.Granted > 0:
		return d.Granted, nil
	}
	return 1, nil
}

func bucketHistoryOp(now int64, mode storage.Mode) storage.BucketOp {
	return storage.BucketOp{MaxAmount: bucketHistoryMax, RefillTime: time.Hour, RefillAmount: 1, Now: now, N: 1, Mode: mode}
}

// bucketHistoryFree reads the bucket's free tokens (leased ones are not).
func bucketHistoryFree(ctx context.Context, s storage.BucketStore, k storage.Key, now int64) (int64, error) {
	d, err := s.UpdateBucket(ctx, k, bucketHistoryOp(now, storage.ModePeek), fenceTTL)
	return d.Remaining, err
}
