package dynamo_test

import (
	"fmt"
	"sync"
	"sync/atomic"
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
// the memory store's 4,485 here. It runs in parallel with
// TestPackedRemoval's cases: its 8,000 calls go one at a time, as
// theirs do. A call's time is not checked (the store's default deadline
// of 1 s did: under load one call past 1 s on a cold server failed a
// run), so each call has a minute and the slowest are logged. Nothing
// expires on the wall clock either: its 4 s of stamps took up to 175 s
// under load, and a key idle for seconds (one call took 5 s) expired in
// the memory store, a full bucket again (memory admitted 5,160, not
// 4,485); the stores' expiry clocks stand still (memory) or run an hour
// ahead (DynamoDB, whose Local deletes expired items).
func TestLeaseRingMatchesMemory(t *testing.T) {
	t.Parallel()
	at := time.Now()
	st, _, _ := newStore(t, dynamo.Config{Timeout: time.Minute, Clock: func() time.Time { return time.Now().Add(time.Hour) }})
	mem, err := memory.New(memory.Config{Clock: func() time.Time { return at }})
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
	var admitted [2]int64
	var slow int
	var slowest time.Duration
	for n := range 8000 {
		stamp := at.Add(time.Duration(n) * 500 * time.Microsecond) // 2,000 a second offered, 1,000 refilled
		for k := range 2 {
			began := time.Now()
			d, err := procs[k][n%4].AllowN(t.Context(), key, stamp, 1)
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(began)
			slowest = max(slowest, took)
			if took > time.Second {
				slow++
			}
			if d.Allowed {
				admitted[k]++
			}
		}
	}
	slack := cfg.MaxAmount/4 + 50 // settleSteps' coarse step, and settleSkew's 50 ms of refill
	t.Logf("8,000 calls: DynamoDB admitted %d, memory %d (allowed difference %d); %d calls took over 1 s, the slowest %v",
		admitted[0], admitted[1], slack, slow, slowest.Round(time.Millisecond))
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

// TestSettlementsOnePerCrossing: a settlement is sent by the one write
// whose addition took the unsettled consumption past a step, however many
// processes write the key. Sixteen processes (a store each, with its own
// cache) share one leasing bucket of 1,000 (steps of 31 and 250 tokens),
// writing takes of 1 in 50 ms cells, 400 in all, 16 at a time: at most one
// settlement per 31 tokens added to s may be sent. A trigger read from a
// process's own view ("my write added a new element to g", which every
// process whose cached item lacked the element saw) sent 394 here, 369
// of which failed on another's settlement.
func TestSettlementsOnePerCrossing(t *testing.T) {
	const procs, writes = 16, 400
	stores := make([]*dynamo.Store, procs)
	for i := range stores {
		stores[i], _, _ = newStore(t, dynamo.Config{})
	}
	key := storage.Key{Space: "tb:cross", Name: t.Name() + time.Now().Format(time.RFC3339Nano)}
	t0 := time.Now().Truncate(time.Second).UnixNano()
	op := func(mode storage.Mode, i int64) storage.BucketOp {
		now := t0 + i*int64(50*time.Millisecond) + 1
		return storage.BucketOp{MaxAmount: 1000, RefillTime: time.Second, RefillAmount: 1, Now: now, N: 1, Mode: mode,
			Want: 10, Epoch: now/int64(storage.LeaseEpoch) + 2}
	}
	if d, err := stores[0].UpdateBucket(t.Context(), key, op(storage.ModeLease, 0), time.Hour); err != nil || !d.Allowed {
		t.Fatalf("lease: %+v, %v", d, err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for p := range procs {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > writes {
					return
				}
				if d, err := stores[p].UpdateBucket(t.Context(), key, op(storage.ModeTake, i), time.Hour); err != nil || !d.Allowed {
					errs <- fmt.Errorf("take %d: %+v, %v", i, d, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var sent, lost int64
	for _, st := range stores {
		if err := st.WaitRefunds(t.Context()); err != nil {
			t.Fatal(err)
		}
		ss := st.Stats()
		sent, lost = sent+ss.Settlements, lost+ss.SettlesLost
	}
	// Added to s: every take, and the lease's 10 when its epoch expired.
	added := int64(writes + 10)
	bound := added/31 + added/250
	t.Logf("%d writes from %d processes: %d settlements sent (%d failed), bound %d", writes, procs, sent, lost, bound)
	if sent > bound {
		t.Errorf("%d settlements sent, above one per crossing (%d)", sent, bound)
	}
	if sent == 0 {
		t.Errorf("no settlement sent for %d tokens added to s", added)
	}
}
