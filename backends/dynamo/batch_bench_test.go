package dynamo_test

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// Benchmarks of one batch per request on DynamoDB Local, each
// reporting its figures as ratios to a raw UpdateItem measured in the same
// run (docs/benchmarks.md, "One batch per request: DynamoDB").

// singleStep hides a store's Do: Decide then sends the steps one after
// another through the single-step methods (the path before the batch).
type singleStep struct{ limitertest.Store }

// threeLimits returns the three limits of a decision (a sliding window, a
// token bucket, a fixed window: every kind of step but the log) on st, all
// far from denying.
func threeLimits(b *testing.B, st limitertest.Store) []limiter.Item {
	w := mustB(limiter.NewSlidingWindow(st, limiter.SlidingWindowConfig{Name: "w", Limit: 1 << 40, Window: time.Minute}))(b)
	tb := mustB(limiter.NewTokenBucket(st, limiter.TokenBucketConfig{Name: "b", MaxAmount: 1 << 40, RefillTime: time.Hour}))(b)
	f := mustB(limiter.NewFixedWindow(st, limiter.FixedWindowConfig{Name: "f", Limit: 1 << 40, Window: time.Hour}))(b)
	key := limitertest.Key(b)
	return []limiter.Item{{Limit: w, Key: key, N: 1}, {Limit: tb, Key: key, N: 1}, {Limit: f, Key: key, N: 1}}
}

// p50 returns the median of ds (sorted in place).
func p50(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}

// reportP50 reports the p50 of each of a benchmark's decisions
// ("p50-<what>-ms"), of the raw UpdateItems alternating with them, and
// their ratio (sorting both in place).
func reportP50(b *testing.B, what string, dec, raw []time.Duration) {
	pd, pr := p50(dec), p50(raw)
	b.ReportMetric(float64(pd.Microseconds())/1000, "p50-"+what+"-ms")
	b.ReportMetric(float64(pr.Microseconds())/1000, "p50-raw-ms")
	b.ReportMetric(float64(pd)/float64(pr), "p50-ratio")
}

// BenchmarkBatchLatency: one allowed decision with three limits, each
// iteration alternating with one raw UpdateItem so both see the same
// server; p50 of each and their ratio (target: at most 1.2). Parallel is
// the store's Do (the default); Sequential hides Do (one step after
// another, the path before the batch). It also reports the requests and,
// where DynamoDB reports it (ReturnConsumedCapacity=TOTAL), the write units
// per decision. Raw3Parallel replaces the decision by three raw UpdateItems
// sent at once: what the server makes of parallel requests.
func BenchmarkBatchLatency(b *testing.B) {
	for _, mode := range []string{"Parallel", "Sequential", "Raw3Parallel"} {
		b.Run(mode, func(b *testing.B) {
			s, r, client := newStore(b, dynamo.Config{})
			r.consumed = true
			var st limitertest.Store = s
			if mode == "Sequential" {
				st = singleStep{s}
			}
			items := threeLimits(b, st)
			out := make([]limiter.Outcome, len(items))
			ctx := context.Background()
			rawKey := limitertest.Key(b)
			raw3 := [3]string{limitertest.Key(b), limitertest.Key(b), limitertest.Key(b)}
			decide := func() {
				if mode == "Raw3Parallel" {
					// The server's part: three raw UpdateItems at once.
					var wg sync.WaitGroup
					errs := make([]error, 3)
					for i := range raw3 {
						wg.Add(1)
						go func() { defer wg.Done(); errs[i] = rawUpdate(ctx, client, raw3[i]) }()
					}
					wg.Wait()
					for _, err := range errs {
						if err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				if _, err := limiter.Decide(ctx, time.Now(), items, out); err != nil {
					b.Fatal(err)
				}
				for i := range out {
					if !out[i].Decision.Allowed || out[i].Err != nil {
						b.Fatalf("limit %d: %+v", i, out[i])
					}
				}
			}
			for range 20 { // warm: keys created, connections open
				decide()
				if err := rawUpdate(ctx, client, rawKey); err != nil {
					b.Fatal(err)
				}
			}
			r.total.Store(0)
			r.wcuMilli.Store(0)
			dec, raw := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				decide()
				t1 := time.Now()
				if err := rawUpdate(ctx, client, rawKey); err != nil {
					b.Fatal(err)
				}
				dec, raw = append(dec, t1.Sub(t0)), append(raw, time.Since(t1))
			}
			b.StopTimer()
			reportP50(b, "decision", dec, raw)
			// The raw UpdateItems are counted too: 1 request each.
			reqs := float64(r.total.Load()-int64(b.N)) / float64(b.N)
			b.ReportMetric(reqs, "requests/decision")
			b.ReportMetric(float64(r.wcuMilli.Load())/1000/float64(b.N), "wcu/decision+raw")
		})
	}
}

// BenchmarkBatchFlood: 64 goroutines on one key far over its limit (a
// sliding window of 100 a minute, the default Bounded estimator, deny cache
// on as in the authorizer), against 64 goroutines sending raw UpdateItems
// to one key in the same run. Reports both rates, their ratio (target: at
// least 10), the store requests per decision, and the units admitted
// beyond the limit in any minute of stamps (must be 0).
func BenchmarkBatchFlood(b *testing.B) {
	const workers, limit = 64, 100
	s, r, client := newStore(b, dynamo.Config{})
	w := mustB(limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: limit, Window: time.Minute}))(b)
	key, rawKey := limitertest.Key(b), limitertest.Key(b)
	ctx := context.Background()
	run := func(n int, op func() error) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		var failed atomic.Value
		t0 := time.Now()
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(n) {
					if err := op(); err != nil {
						failed.Store(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err, ok := failed.Load().(error); ok {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	var mu sync.Mutex
	var admitted []time.Time
	decide := func() error {
		now := time.Now()
		d, err := w.Allow(ctx, key, now)
		if err == nil && d.Allowed {
			mu.Lock()
			admitted = append(admitted, now)
			mu.Unlock()
		}
		return err
	}
	for range limit + 10 { // over the limit before the clock starts
		if err := decide(); err != nil {
			b.Fatal(err)
		}
		if err := rawUpdate(ctx, client, rawKey); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	rawTime := run(b.N, func() error { return rawUpdate(ctx, client, rawKey) })
	before := r.total.Load()
	decTime := run(b.N, decide)
	reqs := r.total.Load() - before
	b.StopTimer()
	decRate, rawRate := float64(b.N)/decTime.Seconds(), float64(b.N)/rawTime.Seconds()
	b.ReportMetric(decRate, "decisions/s")
	b.ReportMetric(rawRate, "raw-updates/s")
	b.ReportMetric(decRate/rawRate, "ratio")
	b.ReportMetric(float64(reqs)/float64(b.N), "requests/decision")
	b.ReportMetric(float64(overAdmitted(admitted, limit, time.Minute)), "over-admitted")
}

// overAdmitted returns the most units beyond limit admitted in any
// interval of stamps of length window.
func overAdmitted(stamps []time.Time, limit int, window time.Duration) int {
	sort.Slice(stamps, func(i, j int) bool { return stamps[i].Before(stamps[j]) })
	worst, lo := 0, 0
	for hi := range stamps {
		for stamps[hi].Sub(stamps[lo]) >= window {
			lo++
		}
		worst = max(worst, hi-lo+1-limit)
	}
	return worst
}
