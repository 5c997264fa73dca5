package limiter_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// waitingRTT is the store round trip of the slow-store runs: above
// 125 ms a process deciding one call at a time sees fewer than 8 a second.
const waitingRTT = 300 * time.Millisecond

// waitingRun is a hot bucket (1,000 a second, a second's burst) at 0.8 of
// its limit across 4 processes, each deciding one call at a time, on a
// store that answers in waitingRTT (a cappedStore that never throttles),
// for 10 s of virtual time. It returns the run and the store's calls.
func waitingRun(t *testing.T) (limitertest.HotReport, int64) {
	var rep limitertest.HotReport
	var calls int64
	synctest.Test(t, func(t *testing.T) {
		mem, err := memory.New(memory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		cs := &cappedStore{Store: mem, rtt: waitingRTT, rate: 1e9}
		cfg := limiter.TokenBucketConfig{Name: "waiting", MaxAmount: 1000, RefillTime: time.Millisecond, RefillAmount: 1, Leases: true}
		ls := make([]limiter.Limiter, 4)
		for i := range ls {
			if ls[i], err = limiter.NewTokenBucket(cs, cfg); err != nil {
				t.Fatal(err)
			}
		}
		rep = limitertest.RunHot(t.Context(), ls, limitertest.HotOptions{Key: "hot", Rate: 800, Duration: 10 * time.Second})
		calls = cs.calls
	})
	per := float64(calls) / float64(len(rep.Calls))
	t.Logf("store round trip %v: %d decisions, %d admitted (%d from leases), %d failed; %d store calls (%.3f a decision); leases %+v",
		waitingRTT, len(rep.Calls), rep.Admitted, rep.Leased, rep.Failed, calls, per, rep.Leases)
	return rep, calls
}

// maxWaitingPer is the most store calls a decision TestLeasesWaiting
// allows.
const maxWaitingPer = 0.1

// TestLeasesWaiting: a hot key's processes whose store answers in 300 ms
// decide one call at a time, 3 a second each, while 200 a second each
// are offered: the rate each sees is the store's pace, under the
// smallest lease. Calls that each begin as the key's previous store step
// answers, waitRun in a row, lease (the calls held back are then
// answered at once), so at most 0.1 store calls a decision, every
// decision admitted; without the rule each decision is a store call.
func TestLeasesWaiting(t *testing.T) {
	rep, calls := waitingRun(t)
	if rep.Failed != 0 {
		t.Errorf("%d decisions failed: %v", rep.Failed, rep.FirstErr)
	}
	if n := int64(len(rep.Calls)); rep.Admitted != n {
		t.Errorf("%d of %d decisions admitted, under the limit", rep.Admitted, n)
	}
	if per := float64(calls) / float64(len(rep.Calls)); per > maxWaitingPer {
		t.Errorf("%.3f store calls a decision, above %v", per, maxWaitingPer)
	}
}

// TestLeasesWaitingFailsBroken: with the rule off the processes stay
// cold, and the check of TestLeasesWaiting fails.
func TestLeasesWaitingFailsBroken(t *testing.T) {
	limiter.SetBrokenWaiting(true)
	defer limiter.SetBrokenWaiting(false)
	rep, calls := waitingRun(t)
	if per := float64(calls) / float64(len(rep.Calls)); per <= maxWaitingPer {
		t.Errorf("without the waiting rule: %.3f store calls a decision, at or under %v: the check cannot fail", per, maxWaitingPer)
	}
}

// handful is a client's quick handful: 12 calls on one key, one after
// another, each as the previous is answered, on a store that answers in
// waitingRTT. It returns the store calls and the lease takes.
func handful(t *testing.T) (calls, takes int64) {
	synctest.Test(t, func(t *testing.T) {
		mem, err := memory.New(memory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		cs := &cappedStore{Store: mem, rtt: waitingRTT, rate: 1e9}
		b, err := limiter.NewTokenBucket(cs, limiter.TokenBucketConfig{Name: "handful", MaxAmount: 1000, RefillTime: time.Second, RefillAmount: 100, Leases: true})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 12 {
			d, err := b.AllowN(t.Context(), "k", time.Now(), 1)
			if err != nil || !d.Allowed {
				t.Fatalf("call %d: %+v, %v", i, d, err)
			}
		}
		calls, takes = cs.calls, b.LeaseStats().Takes
	})
	t.Logf("12 calls: %d store calls, %d lease takes", calls, takes)
	return calls, takes
}

// TestLeasesWaitingHandful: a client's quick handful (12 calls, each
// waiting for its answer from a store 300 ms away) is 11 calls that
// began as the previous answered, fewer than waitRun: it never leases,
// one store call a decision.
func TestLeasesWaitingHandful(t *testing.T) {
	if calls, takes := handful(t); calls != 12 || takes != 0 {
		t.Errorf("%d store calls and %d lease takes for 12 calls, want 12 and none", calls, takes)
	}
}

// TestLeasesWaitingHandfulFailsBroken: a waiting run of 4 leases the
// handful, and the check of TestLeasesWaitingHandful fails.
func TestLeasesWaitingHandfulFailsBroken(t *testing.T) {
	limiter.SetBrokenWaitRun(4)
	defer limiter.SetBrokenWaitRun(0)
	if calls, takes := handful(t); calls == 12 && takes == 0 {
		t.Errorf("a waiting run of 4: %d store calls and no lease take for 12 calls: the check cannot fail", calls)
	}
}
