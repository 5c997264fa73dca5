package limitertest

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/sluicehq/sluice/limiter"
)

// BucketsAtStamp marks s as a store whose token buckets decide every op at
// its own stamp (see [StampBucket]) rather than at the newest refill the
// bucket has seen, as [storage.BucketOp.Apply] on the stored state does.
// The two agree whenever ops reach the store in the order of their stamps;
// they differ for an op that arrives after one stamped in a later refill
// step (a late arrival). [Run] and [RunHistory] given the marked store
// check the at-stamp semantics for buckets, and everything else as usual.
// It returns s itself (registered, not wrapped, so that the suite still
// sees every optional interface s implements); s must be comparable. The
// DynamoDB store's GCRA protocol is such a store: a late op cannot see the
// newer refills without a read of the newest step, which would cost a
// second request.
func BucketsAtStamp(s Store) Store {
	atStampStores.Store(s, true)
	return s
}

var atStampStores sync.Map // Store -> true

// atStamp reports whether s was marked by BucketsAtStamp.
func atStamp(s Store) bool {
	_, ok := atStampStores.Load(s)
	return ok
}

// StampBucket is the at-stamp token bucket, serialized: the reference the
// at-stamp stores are checked against, written from Smyte's semantics
// without the newest-refill rule. A bucket is a refill grid (Base,
// Base+RefillTime, ...) and Tat, the refill tokens counted from Base that
// its takes have used up. An op stamped s is in grid step
// k = floor((s-Base)/RefillTime) (negative before Base) and sees
// min(MaxAmount, RefillAmount*k - Tat) tokens. A new bucket starts full at
// its first stamp (Base = s, Tat = -MaxAmount). A take of n that fits
// leaves MaxAmount - n tokens if the bucket was full, else n fewer; a
// denial changes nothing, except in strict mode when s is not on the grid
// (s > Base + k*RefillTime): the grid restarts at s holding the tokens the
// op saw. With stamps in non-decreasing order it decides exactly as Smyte's
// bucket ([storage.BucketOp.Apply]): the refills of step k are those Smyte
// accounts for up to Base + k*RefillTime.
type StampBucket struct {
	Exists    bool
	Base, Tat int64
}

// Take is one AllowN of cost n stamped at (Unix ns) on the bucket of cfg:
// the next state, whether it was allowed and the tokens left (never
// negative).
func (b StampBucket) Take(cfg limiter.TokenBucketConfig, at, n int64) (next StampBucket, allowed bool, remaining int64) {
	amount := cfg.RefillAmount
	if amount == 0 {
		amount = 1
	}
	rt := int64(cfg.RefillTime)
	if !b.Exists {
		b = StampBucket{Exists: true, Base: at, Tat: -cfg.MaxAmount}
	}
	k := floorDiv(at-b.Base, rt)
	level := amount * k
	tokens := min(cfg.MaxAmount, level-b.Tat)
	switch {
	case n <= tokens:
		tokens -= n
		b.Tat = level - tokens
		allowed = true
	case cfg.Strict && at > b.Base+k*rt:
		b = StampBucket{Exists: true, Base: at, Tat: -tokens}
	}
	return b, allowed, max(tokens, 0)
}

// stampModel is the porcupine model of one key's at-stamp bucket, with the
// same treatment of failed, idle and deny-cached calls as bucketModel.
func stampModel(cfg limiter.TokenBucketConfig) porcupine.Model {
	base := bucketModel(cfg, true)
	step := func(s StampBucket, i bucketInput) (StampBucket, bucketOutput) {
		n, ok, rem := s.Take(cfg, i.stamp, i.n)
		return n, bucketOutput{allowed: ok, remaining: rem}
	}
	nm := porcupine.NondeterministicModel{
		Partition: base.Partition,
		Init:      func() []any { return []any{StampBucket{}} },
		Step: func(st, in, out any) []any {
			s := st.(StampBucket)
			return bucketChoices(s, s.Exists, StampBucket{}, in.(bucketInput), out.(bucketOutput), step)
		},
		Equal: func(a, b any) bool { return a == b },
		Hash: func(st any) uint64 {
			s := st.(StampBucket)
			h := uint64(s.Tat)*0x9e3779b97f4a7c15 ^ uint64(s.Base)
			if s.Exists {
				h ^= 1 << 63
			}
			return h
		},
		DescribeOperation: base.DescribeOperation,
		DescribeState: func(st any) string {
			s := st.(StampBucket)
			if !s.Exists {
				return "no bucket"
			}
			return fmt.Sprintf("grid from %d, tat %d", s.Base, s.Tat)
		},
	}
	return nm.ToModel()
}

// CheckTokenBucketAtStamp is [CheckTokenBucket] against the at-stamp bucket
// ([StampBucket]) instead of Smyte's serialized bucket.
func CheckTokenBucketAtStamp(calls []Call, cfg limiter.TokenBucketConfig, timeout time.Duration) error {
	ops := bucketOps(calls)
	model := stampModel(cfg)
	res := porcupine.CheckOperationsTimeout(model, ops, timeout)
	return bucketVerdict(res, func() string { return explainBucket(model, ops, timeout) }, len(ops), timeout)
}

// bucketOps turns a bucket history into porcupine operations: a call is
// placed between its arrival at the store and its return (when Reached),
// a failed call that reached the store is open until the end and may or may
// not have happened, one that did not is left out, and a cached denial
// (Call.Cached) is checked as a denial that changes nothing.
func bucketOps(calls []Call) []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, len(calls))
	for id, c := range calls {
		if c.Err != nil && !c.Reached {
			continue
		}
		op := porcupine.Operation{
			ClientId: c.Worker,
			Input:    bucketInput{stamp: c.Stamp.UnixNano(), n: c.Cost, idle: c.Idle},
			Call:     int64(c.Start),
			Output:   bucketOutput{allowed: c.Allowed, remaining: c.Remaining},
			Return:   int64(c.End),
			Metadata: callRef{key: c.Key, id: id},
		}
		if c.Reached {
			op.Call, op.Return = int64(c.Arrived), int64(c.Returned)
		}
		if c.Cached && c.Err == nil {
			op.Input = bucketInput{stamp: c.Stamp.UnixNano(), n: c.Cost, cached: true}
			op.Output = bucketOutput{allowed: c.Allowed}
		}
		if c.Err != nil {
			op.Input = bucketInput{stamp: c.Stamp.UnixNano(), n: c.Cost, unknown: true, idle: c.Idle}
			op.Output = bucketOutput{}
			op.Return = math.MaxInt64
		}
		ops = append(ops, op)
	}
	return ops
}

// checkBucketHistory checks a bucket history with the model s declares.
func checkBucketHistory(s Store, calls []Call, cfg limiter.TokenBucketConfig, timeout time.Duration) error {
	if atStamp(s) {
		return CheckTokenBucketAtStamp(calls, cfg, timeout)
	}
	return CheckTokenBucket(calls, cfg, timeout)
}

// HotBucketScenario is the hot-key contention for the history checker: every
// goroutine on ONE key of a bucket of 100 refilled one token per
// millisecond, no pauses, costs 1 to 3, delays below 2 ms (two refill
// steps, so late arrivals cross steps all the time), for d. A refill is due
// on nearly every call: the case where a store that moves the refill time
// on every write conflicts on every write.
func HotBucketScenario(d time.Duration) Scenario {
	return Scenario{
		Name:     "HotBucket",
		Bucket:   &limiter.TokenBucketConfig{Name: "history-hot", MaxAmount: 100, RefillTime: time.Millisecond},
		Keys:     1,
		Duration: d,
		MaxDelay: 2 * time.Millisecond,
		MaxCost:  3,
	}
}
