// Package contention holds what the hot-key bucket benchmarks of every
// backend share (the refill-contention workloads): the workloads,
// a hammer of independent clients on one key, latency percentiles, and an
// exactness check of the admitted calls against a Smyte bucket serialized
// in stamp order. It is test support: only benchmarks and tests import it.
package contention

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter/storage"
)

// Workload is one of the hot-key buckets: max tokens, one refilled
// per interval.
type Workload struct {
	Name     string
	Max      int64
	Interval time.Duration
}

// Op is the workload's take of one token at now.
func (wl Workload) Op(now time.Time) storage.BucketOp {
	return storage.BucketOp{MaxAmount: wl.Max, RefillTime: wl.Interval, RefillAmount: 1, Now: now.UnixNano(), N: 1}
}

// Workloads are the three buckets of BenchmarkRefillContention
// (docs/benchmarks.md).
var Workloads = []Workload{
	{"cap200-1per5ms", 200, 5 * time.Millisecond},
	{"cap100-1per10ms", 100, 10 * time.Millisecond},
	{"cap1000-1per1ms", 1000, time.Millisecond},
}

// Deadline is the authorizer's deadline: a decision that takes longer falls
// to the rule's fail mode, so the benchmarks count it as an error.
const Deadline = 250 * time.Millisecond

// Sample is one call of a hammer.
type Sample struct {
	Stamp   int64 // Unix ns, the call's stamp
	Allowed bool
	Took    time.Duration
	Err     error
}

// Hammer runs workers goroutines calling f (with the worker's index and the
// call's stamp) until d has passed, and returns every call's sample.
func Hammer(workers int, d time.Duration, f func(w int, stamp time.Time) (bool, error)) []Sample {
	per := make([][]Sample, workers)
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
				per[w] = append(per[w], Sample{Stamp: t0.UnixNano(), Allowed: ok && err == nil, Took: time.Since(t0), Err: err})
			}
		}()
	}
	end = time.Now().Add(d)
	close(start)
	wg.Wait()
	var all []Sample
	for _, s := range per {
		all = append(all, s...)
	}
	return all
}

// Errors counts the samples with an error and returns the first.
func Errors(ss []Sample) (n int, first error) {
	for _, s := range ss {
		if s.Err != nil {
			if n == 0 {
				first = s.Err
			}
			n++
		}
	}
	return n, first
}

// Percentile returns the p-quantile (0..1) of the samples' latencies.
func Percentile(ss []Sample, p float64) time.Duration {
	if len(ss) == 0 {
		return 0
	}
	d := make([]time.Duration, len(ss))
	for i, s := range ss {
		d[i] = s.Took
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(p*float64(len(d))))]
}

// Exactness checks the admitted calls of ss (the first of which created
// the bucket) against a Smyte bucket of wl. It returns the count admitted;
// the bound over all stamps (max plus the refills between the first and
// last stamp); the count a Smyte bucket applying the same calls in stamp
// order admits (storage.BucketOp.Apply from the same first op: the same
// refill grid), which with unit costs is the most any order can admit; and
// the tightest interval between two admitted stamps: the admitted calls
// stamped in [a, b] may number at most max plus one refill per grid point
// in the interval, floor((b-a)/interval)+1 (the grid's phase is unknown
// here). A report starting "OVER" names an interval past it.
func Exactness(ss []Sample, wl Workload) (allowed, bound, serial int64, worst string) {
	sorted := slices.Clone(ss)
	slices.SortFunc(sorted, func(a, b Sample) int { return int(a.Stamp - b.Stamp) })
	var stamps []int64
	for _, s := range sorted {
		if s.Allowed {
			stamps = append(stamps, s.Stamp)
		}
	}
	allowed = int64(len(stamps))
	if len(sorted) > 0 {
		bound = wl.Max + (sorted[len(sorted)-1].Stamp-sorted[0].Stamp)/int64(wl.Interval)
	}
	var st storage.BucketState
	found := false
	for _, s := range sorted {
		op := storage.BucketOp{MaxAmount: wl.Max, RefillTime: wl.Interval, RefillAmount: 1, Now: s.Stamp, N: 1}
		next, d, _ := op.Apply(st, found)
		st, found = next, true
		if d.Allowed {
			serial++
		}
	}
	slack := int64(1 << 62)
	for i := range stamps {
		for j := i; j < len(stamps); j++ {
			limit := wl.Max + (stamps[j]-stamps[i])/int64(wl.Interval) + 1
			count := int64(j - i + 1)
			if limit-count < slack {
				slack = limit - count
				worst = fmt.Sprintf("%d admitted in %v (limit %d)", count, time.Duration(stamps[j]-stamps[i]), limit)
				if slack < 0 {
					worst = "OVER: " + worst
					return
				}
			}
			if count > limit+wl.Max { // no later j can come back under
				break
			}
		}
	}
	return
}

// EnvBenchRun names the variable that sets [Run] (SLUICE_BENCH_RUN): a
// benchmark knob, not part of the deployed configuration.
const EnvBenchRun = config.Prefix + "BENCH_RUN"

// Run is how long each measured phase of a contention benchmark runs:
// 3 s, or EnvBenchRun (e.g. 10s).
func Run(tb testing.TB) time.Duration {
	if v := os.Getenv(EnvBenchRun); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			tb.Fatalf("%s=%q: %v", EnvBenchRun, v, err)
		}
		return d
	}
	return 3 * time.Second
}
