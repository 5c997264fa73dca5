package dynamo_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestRingRefundFromPlainView: a refund from a process that remembers the
// bucket without a lease ring (its own plain write made the item; a
// region's agent refilling the share's item it prepared, while its
// processes lease from it) lands on the ring the item has since, and
// gives its tokens back. Store A takes 50 of a bucket of 100 (no refill
// in the test); store B leases 10 (the item gets its ring); A refunds 20;
// B then takes 1 at a time until denied: exactly 100 - 50 - 10 + 20 = 60,
// and c = tat + h after.
//
// Written as plain (tat -= 20, c unchanged), B's plan saw 20 tokens more
// than its condition allowed, and its 41st take lost its conditional
// write on the same item again and again until the store gave up
// (ErrConflict after MaxAttempts). Planned on the ring but given back
// only from s (which held nothing), the refund was dropped: 40 taken.
func TestRingRefundFromPlainView(t *testing.T) {
	r := refundOnRing(t, nil)
	if r.err != nil {
		t.Fatalf("B's take after %d taken: %v (%d conditional writes lost)", r.taken, r.err, r.conflicts)
	}
	t.Logf("B took %d before a denial (%d conditional writes lost); item: tat %d, h %d, c %d", r.taken, r.conflicts, r.tat, r.held, r.committed)
	if r.taken != 60 {
		t.Errorf("B took %d: want exactly 60 (100 - 50 - the lease's 10 + the refund's 20)", r.taken)
	}
	if r.committed != r.tat+r.held {
		t.Errorf("c = %d, want tat + h = %d + %d", r.committed, r.tat, r.held)
	}
}

// TestRingRefundFailsBroken: the same run with the refund lowering tat
// without c ends in a lost write after another until the store gives up,
// or in c != tat + h.
func TestRingRefundFailsBroken(t *testing.T) {
	r := refundOnRing(t, func(s *dynamo.Store) { dynamo.BreakRingRefund(s, true, false) })
	t.Logf("tat lowered without c: B took %d (%v, %d conditional writes lost); item: tat %d, h %d, c %d", r.taken, r.err, r.conflicts, r.tat, r.held, r.committed)
	if r.err == nil && r.taken == 60 && r.committed == r.tat+r.held {
		t.Error("the broken refund passed: want a failed take, another count than 60, or c != tat + h")
	}
}

type ringRefundRun struct {
	taken, conflicts     int64
	err                  error
	tat, held, committed int64
}

// refundOnRing runs TestRingRefundFromPlainView's calls, breaking A's
// store with broken (if not nil), and reads the item back.
func refundOnRing(t *testing.T, broken func(*dynamo.Store)) (r ringRefundRun) {
	a, _, client := newStore(t, dynamo.Config{})
	b, _, _ := newStore(t, dynamo.Config{MaxAttempts: 8})
	if broken != nil {
		broken(a)
	}
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
	for range 100 {
		d, err := b.UpdateBucket(t.Context(), key, op(storage.ModeTake, 1), time.Hour)
		if err != nil {
			r.err = err
			break
		}
		if !d.Allowed {
			break
		}
		r.taken++
	}
	r.conflicts = b.Stats().Conflicts
	for _, s := range []*dynamo.Store{a, b} {
		if err := s.WaitRefunds(t.Context()); err != nil { // settlements
			t.Fatal(err)
		}
	}
	r.tat, r.held, r.committed = ringAttrs(t, client, key)
	return r
}

// ringAttrs reads tat, h and c of key's bucket item.
func ringAttrs(t *testing.T, c *dynamodb.Client, key storage.Key) (tat, held, committed int64) {
	t.Helper()
	it := get(t, c, dynamo.ItemKey(key))
	num := func(attr string) int64 {
		av, ok := it[dynamo.Attr(key.Space, attr)].(*types.AttributeValueMemberN)
		if !ok {
			t.Fatalf("attribute %s of %s: %v", attr, dynamo.ItemKey(key), it[dynamo.Attr(key.Space, attr)])
		}
		v, err := strconv.ParseInt(av.Value, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return num("t"), num("h"), num("c")
}
