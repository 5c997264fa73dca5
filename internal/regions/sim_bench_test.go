package regions

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// exactFrom replays calls (by stamp) on exact and returns what the calls
// and exact admitted with stamps at or after from.
func exactFrom(tb testing.TB, exact limiter.Limiter, calls []limitertest.Call, from time.Time) (got, want int64) {
	tb.Helper()
	cs := slices.Clone(calls)
	slices.SortStableFunc(cs, func(a, b limitertest.Call) int { return a.Stamp.Compare(b.Stamp) })
	for _, c := range cs {
		d, err := exact.AllowN(context.Background(), c.Key, c.Stamp, c.Cost)
		if err != nil {
			tb.Fatal(err)
		}
		if !c.Stamp.Before(from) {
			if d.Allowed {
				want += c.Cost
			}
			if c.Allowed {
				got += c.Cost
			}
		}
	}
	return got, want
}

// simRuns are the runs of the benchmarks: each split for 30 s, and the
// split that moves (at half time) for 30 s, 60 s and 120 s; with
// SLUICE_SIM_LENGTHS (durations, comma-separated), every split for each
// of those lengths.
func simRuns(tb testing.TB) []simRun {
	var every []time.Duration
	if v := os.Getenv("SLUICE_SIM_LENGTHS"); v != "" {
		for _, f := range strings.Split(v, ",") {
			d, err := time.ParseDuration(f)
			if err != nil || d <= 0 {
				tb.Fatalf("SLUICE_SIM_LENGTHS: %q is not a duration", f)
			}
			every = append(every, d)
		}
	}
	var runs []simRun
	for _, sp := range simSplits {
		lengths := every
		if lengths == nil && sp.then == nil {
			lengths = []time.Duration{30 * time.Second}
		} else if lengths == nil {
			lengths = []time.Duration{30 * time.Second, 60 * time.Second, 120 * time.Second}
		}
		for _, d := range lengths {
			runs = append(runs, simRun{sp.name, sp.split, sp.then, d, 0})
		}
	}
	// The busy region's store stalls (sim.withStalls) at 98/1/1 and
	// where demand moves, 30 s (or each of SLUICE_SIM_LENGTHS), its
	// agent's requests waiting the whole stall, or its first half only
	// (-half: the processes' requests end later).
	for _, st := range []struct {
		sp   int
		name string
		seen float64
	}{{0, "-stalls", 1}, {3, "-stalls", 1}, {0, "-stalls-half", 0.5}, {3, "-stalls-half", 0.5}} {
		lengths := every
		if lengths == nil {
			lengths = []time.Duration{30 * time.Second}
		}
		sp := simSplits[st.sp]
		for _, d := range lengths {
			runs = append(runs, simRun{sp.name + st.name, sp.split, sp.then, d, st.seen})
		}
	}
	return runs
}

// simLag is the runs' replication lag: 1 s, or SLUICE_SIM_LAG (a
// duration, e.g. 40ms for a strongly consistent table's latency).
func simLag(tb testing.TB) time.Duration {
	v := os.Getenv("SLUICE_SIM_LAG")
	if v == "" {
		return time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		tb.Fatalf("SLUICE_SIM_LAG: %q is not a duration", v)
	}
	return d
}

type simRun struct {
	name        string
	split, then []float64
	dur         time.Duration
	seen        float64 // stalls (sim.withStalls) seen by the agent, if set
}

// BenchmarkSharesSim reports the shares' share of exact on memory stores
// with a simulated clock (lag 1 s or simLag's, 1.2 times the steady rate,
// five seeds per case; run with -benchtime=1x; the rows "-stalls" with four stalls
// of the busy region's store, sim.withStalls, "-stalls-half" the agent
// seeing their first half only): per limit and run (simRuns), the
// least and the mean over the seeds, over the whole run and over the
// calls stamped after its first 10 s (the shares start split evenly),
// and the units exact admitted that the shares did not (short-units: a
// fixed cost an event, the start or a move, whatever the run's length).
// Never over is asserted on every run.
func BenchmarkSharesSim(b *testing.B) {
	lag := simLag(b)
	for _, alg := range []struct {
		name string
		cfg  Config
	}{{"window", simWindow}, {"bucket", simBucket}} {
		for _, r := range simRuns(b) {
			b.Run(fmt.Sprintf("%s/%s/%v", alg.name, r.name, r.dur), func(b *testing.B) {
				for range b.N {
					var all, steady, short []float64
					for seed := range 5 {
						sm := sim{cfg: alg.cfg, split: r.split, then: r.then, rate: 240, dur: r.dur, lag: lag, procs: 2, seed: uint64(seed + 1)}
						if r.seen > 0 {
							sm = sm.withStalls(r.seen)
						}
						res := sm.run(b)
						for _, v := range res.over {
							b.Errorf("seed %d: over the limit: %v", seed+1, v)
						}
						all = append(all, res.share())
						short = append(short, float64(res.exact-res.admitted))
						var ex limiter.Limiter
						var err error
						if c := alg.cfg.Bucket; c != nil {
							ex, err = limiter.NewTokenBucket(memStore(b), *c)
						} else {
							ex, err = limiter.NewSlidingWindow(memStore(b), limiter.SlidingWindowConfig{Name: "exact", Limit: alg.cfg.Limit, Window: alg.cfg.Window,
								SubWindows: alg.cfg.SubWindows, Representation: limiter.SubWindowCounters})
						}
						if err != nil {
							b.Fatal(err)
						}
						got, want := exactFrom(b, ex, res.calls, simStart.Add(10*time.Second))
						steady = append(steady, float64(got)/float64(want))
					}
					b.ReportMetric(slices.Min(all), "exact-share-min")
					b.ReportMetric(mean(all), "exact-share-mean")
					b.ReportMetric(slices.Min(steady), "after-10s-min")
					b.ReportMetric(mean(steady), "after-10s-mean")
					b.ReportMetric(mean(short), "short-units-mean")
					b.ReportMetric(slices.Max(short), "short-units-max")
				}
			})
		}
	}
}

func mean(x []float64) float64 {
	var s float64
	for _, v := range x {
		s += v
	}
	return s / float64(len(x))
}
