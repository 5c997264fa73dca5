package dynamo_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestRingRefundRace: four processes (a store each, with its own cache)
// share one leasing bucket of 200 on DynamoDB Local, each taking (plain
// takes of 1-4, lease takes of up to 6 returned at once with some
// unspent) and refunding tokens it took before, so that settlements,
// takes, returns and refunds race on the item. Never over: at any
// instant, what the processes were granted by then is at most the bucket
// plus its refill plus what was given back (returns and refunds sent by
// then). Without refill, no refund overfills the bucket, so each must
// land whole: at the end the bucket holds exactly 200 less what was
// taken and not given back, and c = tat + h, tat >= -200 (the full
// bucket at the item's step 0).
func TestRingRefundRace(t *testing.T) {
	for _, tc := range []struct {
		name   string
		refill time.Duration
	}{{"exact", time.Hour}, {"refill", 10 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			r := refundRace(t, tc.refill, 120, dynamo.Config{}, nil)
			t.Logf("%s", r)
			if r.errs > 0 || r.over > 0 {
				t.Errorf("%d errors, %d units over the bound at worst", r.errs, r.over)
			}
			if tc.refill == time.Hour {
				if r.free != r.want || r.committed != r.tat+r.held || r.tat < -refundRaceMax {
					t.Errorf("free %d, want %d; c %d, tat %d, h %d", r.free, r.want, r.committed, r.tat, r.held)
				}
			}
		})
	}
}

// TestRingRefundRaceFailsBroken: the same run, exact, with the refunds
// broken. Lowering tat without c fails takes until their attempts run
// out (a third of the calls, so 40 a process). Such a take loses every
// attempt (the broken refunds leave c above tat + h for good), so these
// stores make 8 attempts rather than the default 32: about as many calls
// fail (38 of 160; 39-44 with 32), and the test's seconds were their lost
// writes (1,251-1,413 with 32 attempts, the test 10-12.6 s; 310 with 8,
// the test 6.0 s). Without the room condition the run passes (logged):
// what is free is capped at MaxAmount - h whatever tat holds
// (TestRingRefundRoom shows the condition on the item).
func TestRingRefundRaceFailsBroken(t *testing.T) {
	r := refundRace(t, time.Hour, 40, dynamo.Config{MaxAttempts: 8}, func(s *dynamo.Store) { dynamo.BreakRingRefund(s, true, false) })
	t.Logf("tat lowered without c: %s", r)
	if r.errs == 0 && r.free == r.want && r.committed == r.tat+r.held {
		t.Error("the broken refund passed")
	}
	r = refundRace(t, time.Hour, 120, dynamo.Config{}, func(s *dynamo.Store) { dynamo.BreakRingRefund(s, false, true) })
	t.Logf("room condition dropped: %s", r)
}

const refundRaceMax = 200

type raceRun struct {
	errs, over, conflicts         int64
	taken, credited, free, want   int64
	tat, held, committed, refunds int64
}

func (r raceRun) String() string {
	return fmtRace(r)
}

// raceEvent is a grant (units > 0, at the call's end) or a give-back
// (units < 0, at the call's start), in time since the run began.
type raceEvent struct {
	at    time.Duration
	units int64
}

// refundRace runs TestRingRefundRace's processes, calls each, on a bucket
// refilled 1 every refill, each on a store of cfg, breaking each store
// with broken (if not nil).
func refundRace(t *testing.T, refill time.Duration, calls int, cfg dynamo.Config, broken func(*dynamo.Store)) raceRun {
	const workers = 4
	key := storage.Key{Space: "tb:ringrace", Name: t.Name() + time.Now().Format(time.RFC3339Nano)}
	start := time.Now()
	var (
		mu     sync.Mutex
		events []raceEvent
		r      raceRun
		wg     sync.WaitGroup
	)
	stores := make([]*dynamo.Store, workers)
	for w := range workers {
		stores[w], _, _ = newStore(t, cfg)
		if broken != nil {
			broken(stores[w])
		}
	}
	record := func(at time.Duration, units int64, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			r.errs++
			return
		}
		if units == 0 {
			return
		}
		events = append(events, raceEvent{at, units})
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keep := int64(12 + 38*(w%2)) // holding more, it gives back
			refundWorker(t, stores[w], key, refill, rand.New(rand.NewPCG(uint64(w), 7)), calls, keep, start, record)
		}()
	}
	wg.Wait()
	slices.SortStableFunc(events, func(a, b raceEvent) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return int(a.units - b.units) // give-backs first
	})
	var got, back int64
	for _, e := range events {
		if e.units > 0 {
			got += e.units
			bound := refundRaceMax + int64(e.at/refill) + 1 + back
			r.over = max(r.over, got-bound)
		} else {
			back -= e.units
			r.refunds++
		}
	}
	r.taken, r.credited, r.want = got, back, refundRaceMax-got+back
	for _, s := range stores {
		if err := s.WaitRefunds(t.Context()); err != nil {
			t.Fatal(err)
		}
		r.conflicts += s.Stats().Conflicts
	}
	peek, _, client := newStore(t, dynamo.Config{})
	d, err := peek.UpdateBucket(t.Context(), key, refundOp(refill, storage.ModePeek, 0), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	r.free = d.Remaining
	r.tat, r.held, r.committed = ringAttrs(t, client, key)
	return r
}

func refundOp(refill time.Duration, mode storage.Mode, n int64) storage.BucketOp {
	now := time.Now().UnixNano()
	return storage.BucketOp{MaxAmount: refundRaceMax, RefillTime: refill, RefillAmount: 1, Now: now, N: n, Mode: mode, Want: 6,
		Epoch: now/int64(storage.LeaseEpoch) + 2}
}

// refundWorker is one process of refundRace: it takes, leases and
// returns, and refunds up to what it holds.
func refundWorker(t *testing.T, s *dynamo.Store, key storage.Key, refill time.Duration, rng *rand.Rand, calls int, keep int64, start time.Time,
	record func(time.Duration, int64, error)) {
	held := int64(0) // taken and not given back
	for range calls {
		p := rng.IntN(10)
		if held >= keep {
			p = 9
		}
		switch {
		case p < 4:
			k := 1 + rng.Int64N(4)
			d, err := s.UpdateBucket(t.Context(), key, refundOp(refill, storage.ModeTake, k), time.Hour)
			if err != nil {
				record(0, 0, err)
			} else if d.Allowed {
				record(time.Since(start), k, nil)
				held += k
			}
		case p < 7:
			d, err := s.UpdateBucket(t.Context(), key, refundOp(refill, storage.ModeLease, 1), time.Hour)
			if err != nil || !d.Allowed {
				record(0, 0, err)
				continue
			}
			got := max(d.Granted, 1) // no slot: a plain take of 1
			record(time.Since(start), got, nil)
			held += got
			if d.Granted == 0 {
				continue
			}
			unspent := rng.Int64N(got + 1)
			op := refundOp(refill, storage.ModeReturn, 0)
			op.Return = storage.LeaseReturn{Epoch: d.LeaseRef, Got: got, Unspent: unspent}
			at := time.Since(start)
			if d, err := s.UpdateBucket(t.Context(), key, op, time.Hour); err != nil {
				record(0, 0, err)
			} else if d.Allowed {
				record(at, -unspent, nil)
				held -= unspent
			}
		default:
			if held == 0 {
				continue
			}
			k := 1 + rng.Int64N(min(held, 5))
			at := time.Since(start)
			if _, err := s.UpdateBucket(t.Context(), key, refundOp(refill, storage.ModeRefund, k), time.Hour); err != nil {
				record(0, 0, err)
				continue
			}
			record(at, -k, nil)
			held -= k
		}
	}
}

func fmtRace(r raceRun) string {
	return fmt.Sprintf("granted %d, given back %d (%d refunds and returns), %d errors, %d conditional writes lost; worst over the bound %d; free at the end %d (exact %d); item: tat %d, h %d, c %d",
		r.taken, r.credited, r.refunds, r.errs, r.conflicts, r.over, r.free, r.want, r.tat, r.held, r.committed)
}
