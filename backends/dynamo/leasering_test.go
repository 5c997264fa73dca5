package dynamo_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestLeaseRingMatchesMemory: the same calls, one at a time, through 4
// leasing buckets on DynamoDB and 4 on the memory store (which keeps
// storage.BucketState as it is): DynamoDB's lease ring, with its
// unsettled consumption and settlements, admits no more than the memory
// store's exact bucket, and less by at most what it counts early (a
// quarter of the bucket unsettled, and the settlement's skew allowance of
// refill). A ring that counted a lease's units twice admitted 2,051 of
// the memory store's 4,485 here.
func TestLeaseRingMatchesMemory(t *testing.T) {
	st, _, _ := newStore(t, dynamo.Config{})
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := limiter.TokenBucketConfig{Name: "ring", MaxAmount: 500, RefillTime: time.Millisecond, RefillAmount: 1, Leases: true}
	var procs [2][4]*limiter.TokenBucket
	for i := range 4 {
		if procs[0][i], err = limiter.NewTokenBucket(st, cfg); err != nil {
			t.Fatal(err)
		}
		if procs[1][i], err = limiter.NewTokenBucket(mem, cfg); err != nil {
			t.Fatal(err)
		}
	}
	key := "ring-" + t.Name()
	at := time.Now()
	var admitted [2]int64
	for n := range 8000 {
		stamp := at.Add(time.Duration(n) * 500 * time.Microsecond) // 2,000 a second offered, 1,000 refilled
		for k := range 2 {
			d, err := procs[k][n%4].AllowN(t.Context(), key, stamp, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted[k]++
			}
		}
	}
	slack := cfg.MaxAmount/4 + 50 // settleAt, and settleSkew's 50 ms of refill
	t.Logf("8,000 calls: DynamoDB admitted %d, memory %d (allowed difference %d)", admitted[0], admitted[1], slack)
	if admitted[0] > admitted[1] || admitted[1]-admitted[0] > slack {
		t.Errorf("DynamoDB admitted %d, memory %d: want at most, and within %d", admitted[0], admitted[1], slack)
	}
}

// TestSettlementLateTrigger: a settlement counts the unsettled tokens as
// spent no earlier than the latest of their stamps, however late its
// trigger. A full bucket of 100 (refilled 1 every 10 ms) with a lease of
// 10; 20 tokens taken at T+300ms; then a take of 6 stamped T, which
// arrives last and sends the settlement. At T+300ms the bucket holds at
// most 100-10-20 = 70 for others (exact: 64 after the 6 too), so a take
// of 90 then must be denied, with at most 64 remaining. A settlement
// counted as of its trigger's stamp (T plus a skew of 50 ms) credits the
// 20 with refill they did not have: it answered 89 remaining, so 20 + 89
// tokens at one instant from a bucket of 100.
func TestSettlementLateTrigger(t *testing.T) {
	st, _, _ := newStore(t, dynamo.Config{})
	key := storage.Key{Space: "tb:late", Name: t.Name() + time.Now().Format(time.RFC3339Nano)}
	t0 := time.Now().Truncate(time.Second).UnixNano()
	op := func(mode storage.Mode, at time.Duration, n int64) storage.BucketOp {
		now := t0 + int64(at)
		return storage.BucketOp{MaxAmount: 100, RefillTime: 10 * time.Millisecond, RefillAmount: 1, Now: now, N: n, Mode: mode,
			Want: 10, Epoch: now/int64(storage.LeaseEpoch) + 2}
	}
	steps := []struct {
		name  string
		op    storage.BucketOp
		allow bool
	}{
		{"lease of 10 at T", op(storage.ModeLease, 0, 1), true},
		{"take 20 at T+300ms", op(storage.ModeTake, 300*time.Millisecond, 20), true},
		{"take 6 stamped T, arriving last", op(storage.ModeTake, 0, 6), true},
	}
	for _, s := range steps {
		d, err := st.UpdateBucket(t.Context(), key, s.op, time.Hour)
		if err != nil || d.Allowed != s.allow {
			t.Fatalf("%s: %+v, %v", s.name, d, err)
		}
	}
	if err := st.WaitRefunds(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ss := st.Stats(); ss.Settlements != 1 || ss.SettlesLost != 0 {
		t.Fatalf("%d settlements (%d failed), want 1 sent and landed", ss.Settlements, ss.SettlesLost)
	}
	d, err := st.UpdateBucket(t.Context(), key, op(storage.ModeTake, 300*time.Millisecond, 90), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Remaining > 64 {
		t.Errorf("take of 90 at T+300ms: %+v; want denied, with at most 64 remaining", d)
	}
}
