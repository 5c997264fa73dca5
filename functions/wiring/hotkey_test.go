package wiring

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestHotKeyStaysOnItsKey is the hot-key run on real DynamoDB's partition
// cap (testserver.CapProxy, scaled to 1/20: 50 write units a second per
// partition key, so that DynamoDB Local on a loaded 2-core machine can
// serve more than the cap), as 64 Lambda containers would meet it: 64
// independent stores (an SDK client each), each behind the backend
// breaker as Build wires it (5 failures, 1 s open), all deciding one hot
// key whose limit is three times what its partition can take, with the
// rules' default fail-open, and a victim key at 5 a minute on the same
// stores. It checks that
//
//   - the hot key's admitted units never exceed its limit in any window of
//     stamps (a throttled decision is denied, never admitted uncounted);
//   - the victim, never throttled itself, is admitted exactly its limit;
//   - no breaker opens: a throttle is an answer, and one key's failures
//     never open the breaker for the others.
//
// Before throttles were denied, the same run admitted the hot key's
// throttled calls through the fail mode (tens of thousands a second once
// the breakers opened) and the victim far past its 5.
func TestHotKeyStaysOnItsKey(t *testing.T) {
	if testing.Short() {
		t.Skip("a 4 s run against DynamoDB Local")
	}
	for _, alg := range []string{"token_bucket", "sliding_window"} {
		t.Run(alg, func(t *testing.T) {
			// A run whose only failures were decisions past their 2 s
			// deadline did not test throttling (a cold DynamoDB Local, a
			// machine loaded by the rest of the suite: 38 of 221 in one
			// fresh-clone run, 2 of 1,833 in a first run alone): it is
			// run again, up to twice; the last run is checked in full.
			for attempt := 1; attempt <= hotAttempts; attempt++ {
				if !hotKeyRun(t, alg, attempt == hotAttempts) {
					break
				}
			}
		})
	}
}

// hotAttempts is how many runs a hot-key subtest makes at most.
const hotAttempts = 3

const (
	hotScale    = 0.05 // of DynamoDB's caps: 50 write units a second per partition key
	hotLimit    = 150  // a second: three times the partition's cap
	hotStores   = 64
	hotOffered  = 450 // decisions a second offered on the hot key, over all stores
	hotDuration = 4 * time.Second
	victimLimit = 5 // a minute
)

func hotKeyRun(t *testing.T, alg string, last bool) (again bool) {
	proxy := testserver.NewCapProxy(t, testserver.DynamoDBLocal(t), testserver.CapConfig{Scale: hotScale})
	sdkEnv(t, proxy.URL())
	table := fmt.Sprintf("sluice-hotkey-%s-%d", alg, time.Now().UnixNano())
	ctx := t.Context()
	env := Env{Deadline: 2 * time.Second}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	type container struct {
		br          *breaker.Store
		hot, victim limiter.Limiter
		warm        limiter.Limiter // the hot key's algorithm on the store, not through the breaker
	}
	cs := make([]container, hotStores)
	for i := range cs {
		awsCfg, err := loadAWSConfig(ctx, env, logger)
		if err != nil {
			t.Fatal(err)
		}
		client := dynamodb.NewFromConfig(awsCfg)
		if i == 0 {
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := dynamo.CreateTable(cctx, client, table)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
		// The deadline is generous (the production default is 250 ms) so
		// that a loaded test machine's slow answers do not send decisions to
		// the fail mode: this run is about throttling.
		st, err := dynamo.New(client, dynamo.Config{Table: table, Timeout: env.Deadline})
		if err != nil {
			t.Fatal(err)
		}
		br, err := breaker.Wrap(st, breaker.Config{Name: BackendDynamo, Failures: config.DefaultBreakerFailures, OpenFor: config.DefaultBreakerOpenFor})
		if err != nil {
			t.Fatal(err)
		}
		c := &cs[i]
		c.br = br
		switch alg {
		case "token_bucket":
			// 150 a second, refilled 3 every 20 ms.
			c.hot, err = limiter.NewTokenBucket(br, limiter.TokenBucketConfig{Name: "global", MaxAmount: hotLimit, RefillTime: 20 * time.Millisecond, RefillAmount: 3})
		default:
			c.hot, err = limiter.NewSlidingWindow(br, limiter.SlidingWindowConfig{Name: "global", Limit: hotLimit, Window: time.Second})
		}
		if err != nil {
			t.Fatal(err)
		}
		if c.warm, err = newWarm(st, alg); err != nil {
			t.Fatal(err)
		}
		c.victim, err = limiter.NewSlidingWindow(br, limiter.SlidingWindowConfig{Name: "per-ip", Limit: victimLimit, Window: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
	}

	warms := make([]limiter.Limiter, len(cs))
	for i := range cs {
		warms[i] = cs[i].warm
	}
	warmHotStores(t, warms)
	failOpen := &limiter.Decision{Allowed: true}
	var (
		mu                  sync.Mutex
		calls               []limitertest.Call
		victimAllowed       atomic.Int64
		victimCalls         atomic.Int64
		throttled, failed   atomic.Int64
		pastDeadline        atomic.Int64
		cached, hotAdmitted atomic.Int64
	)
	begin := time.Now()
	end := begin.Add(hotDuration)
	pace := time.Second * hotStores / hotOffered
	var wg sync.WaitGroup
	for i := range cs {
		c := &cs[i]
		wg.Go(func() {
			var local []limitertest.Call
			defer func() { mu.Lock(); calls = append(calls, local...); mu.Unlock() }()
			out := make([]limiter.Outcome, 1)
			for n := 0; time.Now().Before(end); n++ {
				// Stagger the containers over the pace interval.
				next := begin.Add(time.Duration(i)*pace/hotStores + time.Duration(n)*pace)
				time.Sleep(time.Until(next))
				now := time.Now()
				start := now.Sub(begin)
				if _, err := limiter.Decide(ctx, now, []limiter.Item{{Limit: c.hot, Key: "all", N: 1, Fail: failOpen}}, out); err != nil {
					t.Error(err)
					return
				}
				o := out[0]
				switch {
				case o.Failed:
					if failed.Add(1) == 1 {
						t.Logf("first failed decision: %v", o.Err)
					}
					if errors.Is(o.Err, context.DeadlineExceeded) {
						pastDeadline.Add(1)
					}
				case o.Throttled:
					throttled.Add(1)
				case o.Cached:
					cached.Add(1)
				case o.Decision.Allowed:
					hotAdmitted.Add(1)
				}
				local = append(local, limitertest.Call{Worker: i, Key: "all", Stamp: now, Cost: 1, Start: start, End: time.Since(begin),
					Reached: !o.Cached, Allowed: o.Decision.Allowed, Remaining: o.Decision.Remaining, Cached: o.Cached, Err: o.Err})
				// The victim, every eighth call of every eighth container:
				// about 7 a second in all.
				if i%8 == 0 && n%8 == 0 {
					victimCalls.Add(1)
					if _, err := limiter.Decide(ctx, now, []limiter.Item{{Limit: c.victim, Key: "victim", N: 1, Fail: failOpen}}, out); err != nil {
						t.Error(err)
						return
					}
					if out[0].Failed {
						failed.Add(1)
						if errors.Is(out[0].Err, context.DeadlineExceeded) {
							pastDeadline.Add(1)
						}
					}
					if out[0].Decision.Allowed {
						victimAllowed.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()

	st := proxy.Stats()
	t.Logf("%s: %d hot decisions in %v: %d admitted (%.0f a second, limit %d), %d denied as throttled, %d from the deny cache, %d failed; victim %d of %d admitted; proxy: %d requests forwarded, %.0f write units, %d throttled",
		alg, len(calls), hotDuration, hotAdmitted.Load(), float64(hotAdmitted.Load())/hotDuration.Seconds(), hotLimit,
		throttled.Load(), cached.Load(), failed.Load(), victimAllowed.Load(), victimCalls.Load(), st.Requests, st.WriteUnits, st.Throttled)

	if n := failed.Load(); n != 0 && n == pastDeadline.Load() && !last {
		t.Logf("%d decisions failed, every one past its deadline: the run did not test throttling; running it again", n)
		return true
	}
	// The partition's cap was reached: the run tests throttling.
	if st.Throttled == 0 {
		t.Fatal("the proxy throttled no request: the run did not reach the partition's cap")
	}
	// Every store answered (the generous deadline): no decision went to
	// the fail mode, so every admitted unit was counted.
	if n := failed.Load(); n != 0 {
		t.Errorf("%d decisions failed and were decided by the fail mode", n)
	}
	// The victim: exactly its limit (never throttled, never failed open).
	if got := victimAllowed.Load(); got != victimLimit {
		t.Errorf("victim admitted %d times, want its limit %d", got, victimLimit)
	}
	// No breaker opened.
	for i := range cs {
		if s := cs[i].br.Breaker().Stats(); s.Opens != 0 || s.Rejected != 0 {
			t.Errorf("container %d: breaker %+v, want never opened", i, s)
		}
	}
	// The hot key never over its limit in any window of stamps.
	var vs []limitertest.Violation
	switch alg {
	case "token_bucket":
		// A bucket of 150 refilled 150 a second admits at most 150 + 150
		// in any second of stamps, and at most 150 + 150 x the run's
		// length in all.
		vs = limitertest.CheckTrailingWindow(calls, 2*hotLimit, time.Second)
		vs = append(vs, limitertest.CheckTrailingWindow(calls, hotLimit+int64(hotLimit*hotDuration.Seconds()), hotDuration+time.Second)...)
	default:
		vs = limitertest.CheckTrailingWindow(calls, hotLimit, time.Second)
	}
	for _, v := range vs {
		t.Errorf("hot key over its limit: %v", v)
	}
	return false
}

// hotWarmDecisions is how many decisions each container makes before a
// hot-key run, on a key of its own.
const hotWarmDecisions = 8

// newWarm is the hot key's algorithm on st, for warmHotStores.
func newWarm(st *dynamo.Store, alg string) (limiter.Limiter, error) {
	if alg == "token_bucket" {
		return limiter.NewTokenBucket(st, limiter.TokenBucketConfig{Name: "warm", MaxAmount: hotLimit, RefillTime: 20 * time.Millisecond, RefillAmount: 3})
	}
	return limiter.NewSlidingWindow(st, limiter.SlidingWindowConfig{Name: "warm", Limit: hotLimit, Window: time.Second})
}

// warmHotStores opens each container's connection and warms DynamoDB
// Local before the timed run: hotWarmDecisions decisions of the hot key's
// algorithm a container, all containers at once, each on a key of its own
// (a partition each, far under its cap), straight on the store (a failure
// here is logged, and opens no breaker). Without it the run's first decisions opened 64
// connections at once to a server whose JVM had not yet compiled its
// write path: on a cold shared DynamoDB Local the first run of a fresh
// scripts/testenv had decisions past their 2 s deadline (38 of 221 in one
// fresh-clone CI run; runs again failed the same way).
func warmHotStores(t *testing.T, warms []limiter.Limiter) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var failed atomic.Int64
	var wg sync.WaitGroup
	for i, l := range warms {
		wg.Go(func() {
			for range hotWarmDecisions {
				out := make([]limiter.Outcome, 1)
				if _, err := limiter.Decide(ctx, time.Now(), []limiter.Item{{Limit: l, Key: fmt.Sprintf("warm-%d", i), N: 1}}, out); err != nil || out[0].Failed {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Logf("warm-up: %d of %d decisions failed", n, len(warms)*hotWarmDecisions)
	}
}
