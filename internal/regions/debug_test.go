package regions

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// exactFrom replays calls (by stamp) on exact and returns what it and the
// calls admitted with stamps at or after from.
func exactFrom(t testing.TB, exact limiter.Limiter, calls []limitertest.Call, from time.Time) (got, want int64) {
	cs := slices.Clone(calls)
	slices.SortStableFunc(cs, func(a, b limitertest.Call) int { return a.Stamp.Compare(b.Stamp) })
	for _, c := range cs {
		d, err := exact.AllowN(context.Background(), c.Key, c.Stamp, c.Cost)
		if err != nil {
			t.Fatal(err)
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

// SIM_DEBUG=1 go test -run TestDebugTune -v ./internal/regions
func TestDebugTune(t *testing.T) {
	if os.Getenv("SIM_DEBUG") == "" {
		t.Skip()
	}
	dur := 30 * time.Second
	if v := os.Getenv("SIM_DUR"); v != "" {
		dur, _ = time.ParseDuration(v)
	}
	for _, alg := range []struct {
		name string
		cfg  Config
	}{{"window", simWindow}, {"bucket", simBucket}} {
		for _, sp := range simSplits {
			var all, steady []float64
			for seed := range 5 {
				res := sim{cfg: alg.cfg, split: sp.split, then: sp.then, rate: 240, dur: dur, lag: time.Second, procs: 2, seed: uint64(seed + 1)}.run(t)
				all = append(all, res.share())
				mem := memStore(t)
				var ex limiter.Limiter
				if b := alg.cfg.Bucket; b != nil {
					ex, _ = limiter.NewTokenBucket(mem, *b)
				} else {
					ex, _ = limiter.NewSlidingWindow(mem, limiter.SlidingWindowConfig{Name: "exact", Limit: 1000, Window: 4 * time.Second, SubWindows: 4, Representation: limiter.SubWindowCounters})
				}
				g, w := exactFrom(t, ex, res.calls, time.Unix(1_000_000_000, 0).Add(10*time.Second))
				steady = append(steady, float64(g)/float64(w))
				if len(res.over) > 0 {
					t.Errorf("over: %v", res.over[0])
				}
			}
			t.Logf("%s %-20s whole run: min %.3f mean %.3f | from 10 s: min %.3f mean %.3f", alg.name, sp.name, slices.Min(all), mean(all), slices.Min(steady), mean(steady))
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

func TestDebugSim(t *testing.T) {
	if os.Getenv("SIM_DEBUG") == "" || os.Getenv("SIM_SPLIT") == "" {
		t.Skip()
	}
	cfg := simWindow
	if os.Getenv("SIM_ALG") == "bucket" {
		cfg = simBucket
	}
	var i int
	fmt.Sscan(os.Getenv("SIM_SPLIT"), &i)
	sp := simSplits[i]
	res := sim{cfg: cfg, split: sp.split, then: sp.then, rate: 240, dur: 30 * time.Second, lag: time.Second, procs: 2, seed: 1, trace: t}.run(t)
	t.Logf("%s %s: %.3f of exact (%d/%d), over %d", os.Getenv("SIM_ALG"), sp.name, res.share(), res.admitted, res.exact, len(res.over))
}
