package dynamo_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter"
)

// wireCounter is a reverse proxy in front of DynamoDB Local that counts the
// requests it forwards, per operation (the X-Amz-Target header), and the
// failed conditions in the responses: requests per decision are counted at
// the wire, not by the code under test.
type wireCounter struct {
	srv                        *httptest.Server
	total, update, get, failed atomic.Int64
}

func newWireCounter(b testing.TB, endpoint string) *wireCounter {
	b.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		b.Fatal(err)
	}
	w := &wireCounter{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0}
	rp.ErrorLog = log.New(io.Discard, "", 0) // a decision past its deadline cancels its request
	rp.ModifyResponse = func(r *http.Response) error {
		if r.StatusCode != http.StatusBadRequest {
			return nil
		}
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if bytes.Contains(body, []byte("ConditionalCheckFailed")) {
			w.failed.Add(1)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		return err
	}
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.total.Add(1)
		switch t := r.Header.Get("X-Amz-Target"); {
		case strings.HasSuffix(t, ".UpdateItem"):
			w.update.Add(1)
		case strings.HasSuffix(t, ".GetItem"):
			w.get.Add(1)
		}
		rp.ServeHTTP(rw, r)
	}))
	b.Cleanup(w.srv.Close)
	return w
}

// refillWorkload is one of issue 16's hot-key buckets.
type refillWorkload struct {
	name     string
	max      int64
	interval time.Duration // one token per interval
}

var refillWorkloads = []refillWorkload{
	{"cap200-1per5ms", 200, 5 * time.Millisecond},
	{"cap100-1per10ms", 100, 10 * time.Millisecond},
	{"cap1000-1per1ms", 1000, time.Millisecond},
}

// benchRun is how long each phase of BenchmarkRefillContention runs
// (SLUICE_BENCH_RUN overrides it, e.g. 10s).
func benchRun(b *testing.B) time.Duration {
	if v := os.Getenv("SLUICE_BENCH_RUN"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("SLUICE_BENCH_RUN=%q: %v", v, err)
		}
		return d
	}
	return 3 * time.Second
}

// decisionDeadline is the authorizer's deadline: a decision that takes
// longer falls to the rule's fail mode, so it counts as an error here.
const decisionDeadline = 250 * time.Millisecond

type sample struct {
	stamp   int64
	allowed bool
	took    time.Duration
	err     error
}

// hammerFor runs workers goroutines calling f until d has passed and
// returns every call's sample.
func hammerFor(workers int, d time.Duration, f func(w int, stamp time.Time) (bool, error)) []sample {
	per := make([][]sample, workers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	var end time.Time
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for time.Now().Before(end) {
				t0 := time.Now()
				ok, err := f(w, t0)
				per[w] = append(per[w], sample{stamp: t0.UnixNano(), allowed: ok && err == nil, took: time.Since(t0), err: err})
			}
		}()
	}
	end = time.Now().Add(d)
	close(start)
	wg.Wait()
	var all []sample
	for _, s := range per {
		all = append(all, s...)
	}
	return all
}

func latencies(ss []sample) []time.Duration {
	out := make([]time.Duration, len(ss))
	for i, s := range ss {
		out[i] = s.took
	}
	return out
}

// BenchmarkRefillContention is issue 16's acceptance: 64 independent
// clients (each its own SDK client and store, like 64 Lambda containers)
// on one hot key of a bucket refilled 1 token per interval, for
// SLUICE_BENCH_RUN (3 s) after a warm-up, each decision under the
// authorizer's 250 ms deadline and stamped with the wall clock. In the
// same run, 64 clients send raw UpdateItems (an unconditional ADD) on one
// hot key for as long. Reported: decisions/s and the ratio to raw
// updates/s; requests per decision and failed conditions per decision,
// counted at a reverse proxy in front of DynamoDB Local (the wire); p50
// and p99 of a decision and their ratio to the raw update's; errors
// returned to the caller, with the raw updates' in the same run; and
// exactness (the benchmark fails on a violation): the
// admitted count never exceeds what a Smyte bucket serialized in stamp
// order could admit over the stamps (max plus the refills between the
// first and the last stamp, checked for every interval between two
// admitted stamps), and never more than that bucket admits on the same
// calls. The measured key is created by one take just before the run and
// read once by every store (a warm Lambda), so every decision counted is
// on a key the store already knows.
func BenchmarkRefillContention(b *testing.B) {
	const workers = 64
	endpoint := sharedEndpoint(b)
	for _, wl := range refillWorkloads {
		b.Run(wl.name, func(b *testing.B) {
			wire := newWireCounter(b, endpoint)
			cfg := limiter.TokenBucketConfig{MaxAmount: wl.max, RefillTime: wl.interval, NoDenyCache: true}
			tb := mustB(limiter.NewTokenBucket(nopBuckets{}, cfg))(b)
			key := limiter.Key{Space: tb.Space(), Name: fmt.Sprintf("hot-%d", time.Now().UnixNano())}
			stores := make([]*dynamo.Store, workers)
			raws := make([]*dynamodb.Client, workers)
			for w := range workers {
				c := newClient(wire.srv.URL)
				s, err := dynamo.New(c, dynamo.Config{Table: tableName})
				if err != nil {
					b.Fatal(err)
				}
				stores[w], raws[w] = s, newClient(wire.srv.URL)
			}
			decide := func(w int, at time.Time) (bool, error) {
				ctx, cancel := context.WithTimeout(context.Background(), decisionDeadline)
				defer cancel()
				d, err := stores[w].UpdateBucket(ctx, key, limiter.BucketOp{
					MaxAmount: wl.max, RefillTime: wl.interval, RefillAmount: 1, Now: at.UnixNano(), N: 1,
				}, time.Minute)
				return d.Allowed, err
			}
			raw := func(w int, _ time.Time) (bool, error) {
				ctx, cancel := context.WithTimeout(context.Background(), decisionDeadline)
				defer cancel()
				return true, rawUpdate(ctx, raws[w], key.Name)
			}
			run := benchRun(b)
			// Warm up connections and the JIT on another key, then create
			// the measured key with one take and let every store read it
			// once (as a warm Lambda remembers it), so that the check
			// below replays the same bucket from its first op.
			warm := key
			warm.Name += "-warm"
			hammerFor(workers, run/5, raw)
			hammerFor(workers, run/5, func(w int, at time.Time) (bool, error) {
				ctx, cancel := context.WithTimeout(context.Background(), decisionDeadline)
				defer cancel()
				d, err := stores[w].UpdateBucket(ctx, warm, limiter.BucketOp{MaxAmount: wl.max, RefillTime: wl.interval, RefillAmount: 1, Now: at.UnixNano(), N: 1}, time.Minute)
				return d.Allowed, err
			})
			time.Sleep(time.Second) // let the server drain what the warm-up left queued
			first := time.Now()
			create := limiter.BucketOp{MaxAmount: wl.max, RefillTime: wl.interval, RefillAmount: 1, Now: first.UnixNano(), N: 1}
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if d, err := stores[0].UpdateBucket(cctx, key, create, time.Minute); err != nil || !d.Allowed {
				b.Fatalf("creating the bucket: %+v, %v", d, err)
			}
			for w := range workers {
				tbw := mustB(limiter.NewTokenBucket(stores[w], cfg))(b)
				if _, err := tbw.Get(cctx, key.Name, first); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			rawS := hammerFor(workers, run, raw)
			r0, u0, g0, f0 := wire.total.Load(), wire.update.Load(), wire.get.Load(), wire.failed.Load()
			decS := hammerFor(workers, run, decide)
			reqs, upd, gets, failed := wire.total.Load()-r0, wire.update.Load()-u0, wire.get.Load()-g0, wire.failed.Load()-f0
			b.StopTimer()

			var errs, rawErrs int
			var firstErr error
			for _, s := range decS {
				if s.err != nil {
					errs++
					if firstErr == nil {
						firstErr = s.err
					}
				}
			}
			for _, s := range rawS {
				if s.err != nil {
					rawErrs++
				}
			}
			n := float64(len(decS))
			dps := n / run.Seconds()
			rps := float64(len(rawS)) / run.Seconds()
			p50, p99 := percentile(latencies(decS), .5), percentile(latencies(decS), .99)
			r50, r99 := percentile(latencies(rawS), .5), percentile(latencies(rawS), .99)
			allowed, bound, serial, worst := exactness(append([]sample{{stamp: first.UnixNano(), allowed: true}}, decS...), wl)
			b.ReportMetric(dps, "decisions/s")
			b.ReportMetric(dps/rps, "ratio-to-raw")
			b.ReportMetric(float64(reqs)/n, "req/decision")
			b.ReportMetric(float64(failed)/n, "failed-cond/decision")
			b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(p99)/float64(p50), "p99/p50")
			b.ReportMetric(float64(p50)/float64(r50), "p50/raw-p50")
			b.ReportMetric(float64(errs), "errors")
			b.ReportMetric(float64(allowed), "allowed")
			var conflicts int64
			for _, s := range stores {
				conflicts += s.Stats().Conflicts
			}
			b.Logf("%s: %d decisions (%.0f/s; raw %.0f/s, p50 %v p99 %v, %d errors), %d requests at the wire (%d UpdateItem, %d GetItem, %d failed conditions; %d lost races retried, in Stats); p50 %v p99 %v; %d allowed, stamp-order Smyte bucket %d, bound %d; worst interval %s",
				wl.name, len(decS), dps, rps, r50, r99, rawErrs, reqs, upd, gets, failed, conflicts, p50, p99, allowed, serial, bound, worst)
			b.ReportMetric(float64(rawErrs), "raw-errors")
			if errs > 0 {
				// A target, not a failure of the benchmark: on a loaded
				// machine the raw updates miss the deadline too
				// (raw-errors); the figures say which.
				b.Logf("%d of %d decisions returned an error to the caller (raw updates: %d of %d); first: %v", errs, len(decS), rawErrs, len(rawS), firstErr)
			}
			if worst != "" && strings.HasPrefix(worst, "OVER") {
				b.Errorf("over-admitted: %s", worst)
			}
			if allowed > serial {
				b.Errorf("%d allowed, more than the %d a Smyte bucket applying the same calls in stamp order allows", allowed, serial)
			}
		})
	}
}

// exactness checks the admitted decisions of ss (the first of which
// created the bucket) against a Smyte bucket of wl: the count admitted,
// the bound over all stamps (max plus the refills between the first and
// last stamp), the count a Smyte bucket applying the same calls in stamp
// order admits (limiter.BucketOp.Apply, from the same first op: the same
// refill grid), which with unit costs is the most any order can admit,
// and the
// tightest interval between two admitted stamps: the admitted calls
// stamped in [a, b] may number at most max plus one refill per grid point
// in the interval, floor((b-a)/interval)+1 (the grid's phase is unknown
// here); a report starting "OVER" names an interval past it.
func exactness(ss []sample, wl refillWorkload) (allowed, bound, serial int64, worst string) {
	sorted := slices.Clone(ss)
	slices.SortFunc(sorted, func(a, b sample) int { return int(a.stamp - b.stamp) })
	var stamps []int64
	for _, s := range sorted {
		if s.allowed {
			stamps = append(stamps, s.stamp)
		}
	}
	allowed = int64(len(stamps))
	if len(sorted) > 0 {
		bound = wl.max + (sorted[len(sorted)-1].stamp-sorted[0].stamp)/int64(wl.interval)
	}
	var st limiter.BucketState
	found := false
	for _, s := range sorted {
		op := limiter.BucketOp{MaxAmount: wl.max, RefillTime: wl.interval, RefillAmount: 1, Now: s.stamp, N: 1}
		next, d, _ := op.Apply(st, found)
		st, found = next, true
		if d.Allowed {
			serial++
		}
	}
	slack := int64(1 << 62)
	for i := range stamps {
		for j := i; j < len(stamps); j++ {
			limit := wl.max + (stamps[j]-stamps[i])/int64(wl.interval) + 1
			count := int64(j - i + 1)
			if limit-count < slack {
				slack = limit - count
				worst = fmt.Sprintf("%d admitted in %v (limit %d)", count, time.Duration(stamps[j]-stamps[i]), limit)
				if slack < 0 {
					worst = "OVER: " + worst
					return
				}
			}
			if count > limit+wl.max { // no later j can come back under
				break
			}
		}
	}
	return
}

// nopBuckets is a BucketStore that is never called: NewTokenBucket needs
// one to compute the key space.
type nopBuckets struct{}

func (nopBuckets) UpdateBucket(context.Context, limiter.Key, limiter.BucketOp, time.Duration) (limiter.Decision, error) {
	return limiter.Decision{}, fmt.Errorf("nopBuckets: not a store")
}
