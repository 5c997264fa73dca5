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

// ringOps returns the ops of the ring refund tests at stamp now: a bucket
// of 100 with no refill in the test (one token an hour), leases of 10.
func ringOps(now int64) func(mode storage.Mode, n int64) storage.BucketOp {
	return func(mode storage.Mode, n int64) storage.BucketOp {
		return storage.BucketOp{MaxAmount: 100, RefillTime: time.Hour, RefillAmount: 1, Now: now, N: n, Mode: mode, Want: 10,
			Epoch: now/int64(storage.LeaseEpoch) + 2}
	}
}

// takeUntilDenied sends take on key through s until a denial, an error or
// most takes: the takes allowed, and the error.
func takeUntilDenied(t *testing.T, s *dynamo.Store, key storage.Key, take storage.BucketOp, most int) (taken int64, err error) {
	for range most {
		d, err := s.UpdateBucket(t.Context(), key, take, time.Hour)
		if err != nil || !d.Allowed {
			return taken, err
		}
		taken++
	}
	return taken, nil
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
	op := ringOps(time.Now().UnixNano())
	if d, err := a.UpdateBucket(t.Context(), key, op(storage.ModeTake, 50), time.Hour); err != nil || !d.Allowed {
		t.Fatalf("A's take of 50: %+v, %v", d, err)
	}
	if d, err := b.UpdateBucket(t.Context(), key, op(storage.ModeLease, 1), time.Hour); err != nil || !d.Allowed {
		t.Fatalf("B's lease: %+v, %v", d, err)
	}
	if _, err := a.UpdateBucket(t.Context(), key, op(storage.ModeRefund, 20), time.Hour); err != nil {
		t.Fatalf("A's refund of 20: %v", err)
	}
	r.taken, r.err = takeUntilDenied(t, b, key, op(storage.ModeTake, 1), 100)
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

// TestRingRefundRoom: a refund planned on a stale item meets another
// that filled the bucket first, and gives back only what fits. A bucket
// of 100 (no refill): B leases 10 (the ring), takes 30 (settled: tat =
// -70) and 5 (unsettled: s = 5); C reads the bucket (55 free: room for
// 30 in tat and 5 in s); A refunds 40, of which 35 fit (tat = -100, the
// full bucket at step 0; s = 0); C then refunds 35 on what it
// remembers: its conditions (tat >= -70, s >= 5) fail, and planned again
// on the item returned, nothing fits. After both, tat = -100, h = 10,
// c = -90, and B takes exactly 90, 1 at a time (the lease holds the
// rest). Without the room conditions C's refund lowers tat to -130 and
// s to -5 (h to 5): B's condition then allows 95, its plan (which caps
// the bucket at MaxAmount) 90 until a settlement, and B takes 91: over a
// bucket of 100 with nothing refilled.
func TestRingRefundRoom(t *testing.T) {
	r := staleRefunds(t, nil)
	t.Logf("after the refunds: tat %d, h %d, c %d; B took %d (%v)", r.tat, r.held, r.committed, r.taken, r.err)
	if r.tat != -100 || r.committed != -90 || r.held != 10 || r.taken != 90 || r.err != nil {
		t.Errorf("want tat -100, h 10, c -90 after the refunds, and 90 taken")
	}
	r = staleRefunds(t, func(s *dynamo.Store) { dynamo.BreakRingRefund(s, false, true) })
	t.Logf("room conditions dropped: after the refunds: tat %d, h %d, c %d; B took %d (%v)", r.tat, r.held, r.committed, r.taken, r.err)
	if r.taken <= 90 {
		t.Errorf("the broken refund passed: B took %d", r.taken)
	}
}

// staleRefunds runs TestRingRefundRoom's calls, breaking C's store with
// broken (if not nil): the item's tat, h and c after the refunds, and
// what B took then.
func staleRefunds(t *testing.T, broken func(*dynamo.Store)) (r ringRefundRun) {
	a, _, client := newStore(t, dynamo.Config{})
	b, _, _ := newStore(t, dynamo.Config{})
	c, _, _ := newStore(t, dynamo.Config{})
	if broken != nil {
		broken(c)
	}
	key := storage.Key{Space: "tb:ringroom", Name: t.Name() + time.Now().Format(time.RFC3339Nano)}
	op := ringOps(time.Now().UnixNano())
	for _, step := range []struct {
		name string
		s    *dynamo.Store
		op   storage.BucketOp
	}{
		{"B's lease", b, op(storage.ModeLease, 1)},
		{"B's take of 30", b, op(storage.ModeTake, 30)},
		{"B's take of 5", b, op(storage.ModeTake, 5)},
		{"C's read", c, op(storage.ModePeek, 0)},
		{"A's refund of 40", a, op(storage.ModeRefund, 40)},
		{"C's refund of 35", c, op(storage.ModeRefund, 35)},
	} {
		if d, err := step.s.UpdateBucket(t.Context(), key, step.op, time.Hour); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", step.name, d, err)
		}
		if err := b.WaitRefunds(t.Context()); err != nil { // the settlement of the 30
			t.Fatal(err)
		}
	}
	r.tat, r.held, r.committed = ringAttrs(t, client, key)
	r.taken, r.err = takeUntilDenied(t, b, key, op(storage.ModeTake, 1), 200)
	return r
}
