package dynamo_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestRingRefundFromPlainView: a refund from a process that remembers the
// bucket without a lease ring (its own plain write made the item; a
// region's agent refilling the share's item it prepared, while its
// processes lease from it) must not change tat alone on an item that has
// a ring since: the ring's takes are conditioned on c = tat + h, and
// planned on tat. Store A takes 50 of a bucket of 100 (no refill in the
// test); store B leases 10 (the item gets its ring); A refunds 20; B
// then takes 1 at a time until denied. Every take must end in a decision:
// with the refund written as plain (tat -= 20, c unchanged) B's plan saw
// 20 tokens more than its condition allowed, and its 41st take lost its
// conditional write on the same item again and again until the store gave
// up (ErrConflict after MaxAttempts: a decision held for up to its
// deadline). The refund's tokens are dropped on a ring item (a ring
// refund gives back only what is unsettled), as they were, in effect,
// before: the takes' condition never counted them.
func TestRingRefundFromPlainView(t *testing.T) {
	a, _, _ := newStore(t, dynamo.Config{})
	b, _, _ := newStore(t, dynamo.Config{MaxAttempts: 8})
	key := storage.Key{Space: "tb:ringplain", Name: t.Name() + time.Now().Format(time.RFC3339Nano)}
	now := time.Now().UnixNano()
	op := func(mode storage.Mode, n int64) storage.BucketOp {
		return storage.BucketOp{MaxAmount: 100, RefillTime: time.Hour, RefillAmount: 1, Now: now, N: n, Mode: mode, Want: 10,
			Epoch: now/int64(storage.LeaseEpoch) + 2}
	}
	if d, err := a.UpdateBucket(t.Context(), key, op(storage.ModeTake, 50), time.Hour); err != nil || !d.Allowed {
		t.Fatalf("A's take of 50: %+v, %v", d, err)
	}
	if d, err := b.UpdateBucket(t.Context(), key, op(storage.ModeLease, 1), time.Hour); err != nil || !d.Allowed {
		t.Fatalf("B's lease: %+v, %v", d, err)
	}
	if _, err := a.UpdateBucket(t.Context(), key, op(storage.ModeRefund, 20), time.Hour); err != nil {
		t.Fatalf("A's refund of 20: %v", err)
	}
	taken := 0
	for range 100 {
		d, err := b.UpdateBucket(t.Context(), key, op(storage.ModeTake, 1), time.Hour)
		if err != nil {
			t.Fatalf("B's take after %d taken: %v (%d conditional writes lost)", taken, err, b.Stats().Conflicts)
		}
		if !d.Allowed {
			break
		}
		taken++
	}
	t.Logf("B took %d before a denial (%d conditional writes lost)", taken, b.Stats().Conflicts)
	if taken > 40 {
		t.Errorf("B took %d: want at most 40 (100 - 50 - the lease's 10; the refund is dropped on a ring)", taken)
	}
}
