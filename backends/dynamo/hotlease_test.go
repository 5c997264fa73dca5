package dynamo_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// Capacity leases on a hot key far above its partition's cap: DynamoDB
// Local behind the cap proxy at half DynamoDB's caps (500 write units a
// second per partition key, so that Local on 2 shared cores serves more
// than the cap), a limit of 5,000 a second (ten times the cap), 64
// processes (an SDK client and a store each, as 64 Lambda
// containers). Without leases every decision is a write, and the key is
// throttled at a tenth of its limit.
const (
	leaseScale    = 0.5
	leaseLimit    = 5000 // a second
	leaseProcs    = 64
	leaseDuration = 5 * time.Second
)

// TestLeasesHotKeyCapped is the run for the default sliding window of
// that limit (a minute of 300,000: sub-window counters of 3 s) and a
// token bucket, with even demand at 0.8 of the limit, and with uneven
// demand over it (one process with half the traffic, 63 sharing the
// other half, 1.2 times the limit, the key prefilled so that the limit
// binds). It asserts, for every run, that the admitted units never
// exceed the limit in any window of stamps (the history checkers); for
// the window, also no throttled decision after the first second, at
// least 97% of what the same limiter without leases admits on the same
// calls in stamp order, at most 0.1 store requests per decision under
// the limit (counted at the proxy), and no failure. The bucket's lease
// writes conflict on its item (docs/leases.md): its figures are
// reported, not asserted.
func TestLeasesHotKeyCapped(t *testing.T) {
	if testing.Short() {
		t.Skip("20 s against DynamoDB Local")
	}
	for _, alg := range []string{"bucket", "window"} {
		for _, uneven := range []bool{false, true} {
			name := alg
			if uneven {
				name += "/uneven-at-limit"
			}
			t.Run(name, func(t *testing.T) { leaseRun(t, alg, uneven) })
		}
	}
}

func leaseLimiter(t *testing.T, alg string, s any, leases bool) limiter.Limiter {
	t.Helper()
	var l limiter.Limiter
	var err error
	switch alg {
	case "bucket":
		// 5,000 a second, refilled 5 every millisecond, a second's burst.
		l, err = limiter.NewTokenBucket(s.(limiter.BucketStore), limiter.TokenBucketConfig{Name: "global", MaxAmount: leaseLimit, RefillTime: time.Millisecond, RefillAmount: leaseLimit / 1000, Leases: leases})
	default:
		l, err = limiter.NewSlidingWindow(s.(limiter.Counter), limiter.SlidingWindowConfig{Name: "global", Limit: 60 * leaseLimit, Window: time.Minute, Leases: leases})
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func leaseRun(t *testing.T, alg string, uneven bool) {
	local := testserver.DynamoDBLocal(t)
	table := fmt.Sprintf("sluice-leases-%s-%d", alg, time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, newClient(local), table); err != nil {
		t.Fatal(err)
	}
	proxy := testserver.NewCapProxy(t, local, testserver.CapConfig{Scale: leaseScale})
	ls := make([]limiter.Limiter, leaseProcs)
	stores := make([]*dynamo.Store, leaseProcs)
	for i := range ls {
		st, err := dynamo.New(newClient(proxy.URL()), dynamo.Config{Table: table, Timeout: 2 * time.Second, BucketLeases: true})
		if err != nil {
			t.Fatal(err)
		}
		ls[i], stores[i] = leaseLimiter(t, alg, st, true), st
	}
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	opt := limitertest.HotOptions{Key: "all", Rate: 0.8 * leaseLimit, Uneven: uneven, Duration: leaseDuration}
	if uneven {
		// Over the limit from the start: 1.2 times its rate offered, and
		// the key prefilled so that the limit binds within the run (the
		// bucket emptied; the window's minute filled but for 4 s of its rate).
		opt.Rate = 1.2 * leaseLimit
		opt.Prefill, opt.Prefiller = leaseLimit, leaseLimiter(t, alg, ls0Store(t, table, proxy.URL()), false)
		if alg != "bucket" {
			opt.Prefill = 56 * leaseLimit
		}
	}
	demand := opt.Rate / leaseLimit
	rep := limitertest.RunHot(t.Context(), ls, opt)

	exact, err := limitertest.ExactAdmitted(t.Context(), leaseLimiter(t, alg, mem, false), rep.Calls)
	if err != nil {
		t.Fatal(err)
	}
	ps := proxy.Stats()
	n := int64(len(rep.Calls))
	perDecision := float64(ps.Requests) / float64(n)
	if uneven {
		// Over the limit, denied decisions cost a request each when the
		// deny cache does not answer them: reported, not asserted.
		perDecision = 0
	}
	t.Logf("%s (demand %.1f of the limit, uneven %v): %d decisions, %d admitted (%d from leases), exact %d: %.3f; %d throttled (%d after the first second); proxy: %d requests (%.3f a decision), %.0f write units (%.3f a decision), %d throttled; leases %+v",
		alg, demand, uneven, n, rep.Admitted, rep.Leased, exact, float64(rep.Admitted)/float64(exact),
		rep.Throttled, rep.ThrottledLate, ps.Requests, perDecision, ps.WriteUnits, ps.WriteUnits/float64(n), ps.Throttled, rep.Leases)

	var conflicts, reads int64
	for _, st := range stores {
		conflicts += st.Stats().Conflicts
		reads += st.Stats().Reads
	}
	t.Logf("stores: %d conflicts, %d reads", conflicts, reads)
	if len(rep.ThrottledAt) > 0 {
		slices.Sort(rep.ThrottledAt)
		t.Logf("throttled at %v .. %v (median %v); cached denials %d", rep.ThrottledAt[0], rep.ThrottledAt[len(rep.ThrottledAt)-1], rep.ThrottledAt[len(rep.ThrottledAt)/2], rep.Cached)
	}
	if alg == "window" {
		if rep.Failed != 0 {
			t.Errorf("%d decisions failed; the first: %v", rep.Failed, rep.FirstErr)
		}
		if rep.ThrottledLate != 0 {
			t.Errorf("%d decisions throttled after the first second", rep.ThrottledLate)
		}
		if float64(rep.Admitted) < 0.97*float64(exact) {
			t.Errorf("admitted %d, below 97%% of the exact %d", rep.Admitted, exact)
		}
		if perDecision > 0.1 {
			t.Errorf("%.3f store requests a decision, above 0.1", perDecision)
		}
	} else if rep.Failed != 0 {
		t.Logf("%d decisions failed; the first: %v", rep.Failed, rep.FirstErr)
	}
	var vs []limitertest.Violation
	switch alg {
	case "bucket":
		vs = limitertest.CheckBucketBound(rep.Calls, leaseLimiter(t, alg, mem, false).(*limiter.TokenBucket).Config())
	default:
		vs = limitertest.CheckTrailingWindow(rep.Calls, 60*leaseLimit, time.Minute)
	}
	for _, v := range vs {
		t.Errorf("over the limit: %v", v)
	}
}

// ls0Store is a store of its own on table through the proxy.
func ls0Store(t *testing.T, table, endpoint string) *dynamo.Store {
	st, err := dynamo.New(newClient(endpoint), dynamo.Config{Table: table, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestLeaseHistory runs capacity leases on DynamoDB Local behind the
// shared cap proxy (a window of sub-window counters, a packed window, a
// token bucket with Config.BucketLeases), 4 processes at four times the
// limit with arrivals reordered: never over the limit
// (limitertest.RunLeaseHistory).
func TestLeaseHistory(t *testing.T) {
	st, _, _ := newStore(t, dynamo.Config{BucketLeases: true})
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	limitertest.RunLeaseHistory(t, st, mem)
}

// TestColdLeases: a cold key decides the same with and without leases on
// DynamoDB, one store call per decision the deny cache does not answer.
func TestColdLeases(t *testing.T) {
	st, _, _ := newStore(t, dynamo.Config{BucketLeases: true})
	limitertest.RunColdLeases(t, st)
}
