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

// shortAt replays calls (by stamp) on exact and returns, at each of
// marks (ascending), the units exact admitted among the calls stamped
// before it that the shares did not: where in the run the units were
// lost (both decide a call on the calls stamped before it only).
func shortAt(tb testing.TB, exact limiter.Limiter, calls []limitertest.Call, marks []time.Time) []int64 {
	tb.Helper()
	cs := slices.Clone(calls)
	slices.SortStableFunc(cs, func(a, b limitertest.Call) int { return a.Stamp.Compare(b.Stamp) })
	out := make([]int64, len(marks))
	var short int64
	i := 0
	for k, m := range marks {
		for ; i < len(cs) && cs[i].Stamp.Before(m); i++ {
			c := cs[i]
			d, err := exact.AllowN(context.Background(), c.Key, c.Stamp, c.Cost)
			if err != nil {
				tb.Fatal(err)
			}
			if d.Allowed {
				short += c.Cost
			}
			if c.Allowed {
				short -= c.Cost
			}
		}
		out[k] = short
	}
	return out
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

// simOffers is cfg with its offers off if SLUICE_SIM_OFFERS is 0 (the
// plan alone, as before offers).
func simOffers(tb testing.TB, cfg Config) Config {
	switch v := os.Getenv("SLUICE_SIM_OFFERS"); v {
	case "", "1":
	case "0":
		cfg.Offers = false
	default:
		tb.Fatalf("SLUICE_SIM_OFFERS: %q is not 0 or 1", v)
	}
	return cfg
}

// simTick is the agents' tick in the benchmark: 250 ms, or
// SLUICE_SIM_TICK (a duration).
func simTick(tb testing.TB) time.Duration {
	v := os.Getenv("SLUICE_SIM_TICK")
	if v == "" {
		return 250 * time.Millisecond
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		tb.Fatalf("SLUICE_SIM_TICK: %q is not a duration", v)
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
// fixed cost an event, the start or a move, whatever the run's length),
// where they were lost: by 10 s (start-units: the start and 10 s of
// steady demand), in the 10 s from the move (move-units, where demand
// moves) and a second over the rest of the run (late-units/s).
// SLUICE_SIM_CURVE (a step) logs the units short so far at every step,
// SLUICE_SIM_TICK sets the agents' tick (250 ms). Never over is asserted
// on every run.
func BenchmarkSharesSim(b *testing.B) {
	lag, tick := simLag(b), simTick(b)
	for _, alg := range []struct {
		name string
		cfg  Config
	}{{"window", simOffers(b, simWindow)}, {"bucket", simOffers(b, simBucket)}} {
		for _, r := range simRuns(b) {
			b.Run(fmt.Sprintf("%s/%s/%v", alg.name, r.name, r.dur), func(b *testing.B) {
				for range b.N {
					var all, steady, short, startU, moveU, late []float64
					var curve [][]int64
					for seed := range 5 {
						sm := sim{cfg: alg.cfg, split: r.split, then: r.then, rate: 240, dur: r.dur, lag: lag, procs: 2, seed: uint64(seed + 1), tick: tick}
						if r.seen > 0 {
							sm = sm.withStalls(r.seen)
						}
						res := sm.run(b)
						for _, v := range res.over {
							b.Errorf("seed %d: over the limit: %v", seed+1, v)
						}
						all = append(all, res.share())
						short = append(short, float64(res.exact-res.admitted))
						got, want := exactFrom(b, simExact(b, alg.cfg), res.calls, simStart.Add(10*time.Second))
						steady = append(steady, float64(got)/float64(want))
						st, mv, lt := lossWhere(b, alg.cfg, res.calls, r.dur, r.then != nil)
						startU, moveU, late = append(startU, st), append(moveU, mv), append(late, lt)
						if step := simCurve(b); step > 0 {
							curve = append(curve, shortAt(b, simExact(b, alg.cfg), res.calls, simMarks(step, r.dur)))
						}
					}
					b.ReportMetric(slices.Min(all), "exact-share-min")
					b.ReportMetric(mean(all), "exact-share-mean")
					b.ReportMetric(slices.Min(steady), "after-10s-min")
					b.ReportMetric(mean(steady), "after-10s-mean")
					b.ReportMetric(mean(short), "short-units-mean")
					b.ReportMetric(slices.Max(short), "short-units-max")
					b.ReportMetric(mean(startU), "start-units")
					if r.then != nil {
						b.ReportMetric(mean(moveU), "move-units")
					}
					b.ReportMetric(mean(late), "late-units/s")
					logCurve(b, simCurve(b), curve)
				}
			})
		}
	}
}

// lossWhere is where a run of dur lost its units against exact (shortAt):
// by 10 s, in the 10 s from the move at half time (if moves), and a
// second over the rest (from 10 s, or from 10 s after the move).
func lossWhere(tb testing.TB, cfg Config, calls []limitertest.Call, dur time.Duration, moves bool) (start, move, late float64) {
	ex := simExact(tb, cfg)
	ten := 10 * time.Second
	from := ten
	marks := []time.Time{simStart.Add(ten), simStart.Add(dur / 2), simStart.Add(dur/2 + ten), simStart.Add(dur)}
	s := shortAt(tb, ex, calls, marks)
	if moves {
		move = float64(s[2] - s[1])
		from = dur/2 + ten
	}
	at := s[0]
	if moves {
		at = s[2]
	}
	if span := (dur - from).Seconds(); span > 0 {
		late = float64(s[3]-at) / span
	}
	return float64(s[0]), move, late
}

// simCurve is SLUICE_SIM_CURVE (a duration; 0 if unset): the step at
// which BenchmarkSharesSim logs the units short so far (shortAt, the
// mean of the seeds).
func simCurve(tb testing.TB) time.Duration {
	v := os.Getenv("SLUICE_SIM_CURVE")
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		tb.Fatalf("SLUICE_SIM_CURVE: %q is not a duration", v)
	}
	return d
}

// simMarks are the stamps every step of a run of dur, its end last.
func simMarks(step, dur time.Duration) []time.Time {
	var m []time.Time
	for t := step; t <= dur; t += step {
		m = append(m, simStart.Add(t))
	}
	return m
}

// logCurve logs the mean of the seeds' units short at each step.
func logCurve(tb testing.TB, step time.Duration, curve [][]int64) {
	if len(curve) == 0 {
		return
	}
	var line strings.Builder
	for k := range curve[0] {
		var sum int64
		for _, c := range curve {
			sum += c[k]
		}
		fmt.Fprintf(&line, " %v:%.0f", time.Duration(k+1)*step, float64(sum)/float64(len(curve)))
	}
	tb.Logf("units short so far (mean of %d seeds):%s", len(curve), line.String())
}

// simExact is exact for cfg on a memory store of its own.
func simExact(tb testing.TB, cfg Config) limiter.Limiter {
	var ex limiter.Limiter
	var err error
	if c := cfg.Bucket; c != nil {
		ex, err = limiter.NewTokenBucket(memStore(tb), *c)
	} else {
		ex, err = limiter.NewSlidingWindow(memStore(tb), limiter.SlidingWindowConfig{Name: "exact", Limit: cfg.Limit, Window: cfg.Window,
			SubWindows: cfg.SubWindows, Representation: limiter.SubWindowCounters})
	}
	if err != nil {
		tb.Fatal(err)
	}
	return ex
}

func mean(x []float64) float64 {
	var s float64
	for _, v := range x {
		s += v
	}
	return s / float64(len(x))
}
