package accuracy

import (
	"slices"
	"testing"
	"time"
)

// sweepParams are the limits of the seed sweeps: the report's, a small
// limit on a short window, and a window that 7 and 9 divide.
var sweepParams = []Params{DefaultParams, {Limit: 7, Window: 10 * time.Second}, {Limit: 40, Window: 63 * time.Second}}

// subBurst is the adversary of the estimators: after a quiet spell, bursts
// of the limit in the last 50 ms of random sub-windows, each followed by
// Poisson traffic at 3x the limit's rate, so that every sub-window offset
// meets a counter whose requests all came at its very end.
func subBurst(p Params, k int, seed uint64) Trace {
	r := newRand(seed, "sub-burst")
	w, s := int64(p.Window), int64(p.Window)/int64(k)
	var times []int64
	t := Epoch.UnixNano()
	for range 4 {
		idx := (t + 2*w) / s
		b := (idx+1)*s - int64(50*time.Millisecond)
		for range p.Limit {
			times = append(times, b+r.Int64N(int64(50*time.Millisecond)))
		}
		slices.Sort(times[len(times)-int(p.Limit):])
		times = poisson(r, times, (idx+1)*s, (idx+1)*s+2*w, 3*p.limitRate())
		t = (idx+1)*s + 2*w + r.Int64N(s)
	}
	return Trace{Name: "sub-burst", Times: times}
}

// sweep runs c on every test trace of p for seeds 1..n and the sub-window
// adversary, failing on an overshoot.
func sweepNoOvershoot(t *testing.T, p Params, c Config, seeds int) {
	t.Helper()
	trs := testTraces(t, p, 1, seeds)
	for s := range seeds {
		trs = append(trs, subBurst(p, c.resolution(), uint64(s+1)))
	}
	for _, tr := range trs {
		res, err := Simulate(tr, p, c)
		if err != nil {
			t.Fatal(err)
		}
		if res.WorstWindow > p.Limit || res.Excess != 0 {
			t.Errorf("%s, limit %d per %v, trace %s: %d requests in a window (%d admissions above the limit)",
				c.Name(), p.Limit, p.Window, tr.Name, res.WorstWindow, res.Excess)
		}
	}
}

// TestBoundedNeverOvershoots: the Bounded estimator never admits more than
// the limit within a window, on every kind of trace, a sweep of seeds and
// several limits and sub-window counts.
func TestBoundedNeverOvershoots(t *testing.T) {
	t.Parallel()
	for _, p := range sweepParams {
		for _, k := range []int{1, 2, 3, 4, 6, 7, 9, 10, 12, 20, 30} {
			if p.Window%time.Duration(k) != 0 {
				continue
			}
			sweepNoOvershoot(t, p, Config{Algorithm: Bounded, SubWindows: k}, 4)
		}
	}
}

// TestPrototypesNeverOvershoot: the same sweep for the sliced and moment
// prototypes.
func TestPrototypesNeverOvershoot(t *testing.T) {
	t.Parallel()
	for _, p := range sweepParams {
		for _, c := range []Config{
			{Algorithm: Sliced, SubWindows: 1, Slices: 4},
			{Algorithm: Sliced, SubWindows: 3, Slices: 3},
			{Algorithm: Sliced, SubWindows: 10, Slices: 2},
			{Algorithm: Sliced, SubWindows: 10, Slices: 4},
			{Algorithm: Moment, SubWindows: 1},
			{Algorithm: Moment, SubWindows: 4},
			{Algorithm: Moment, SubWindows: 10},
		} {
			if !c.valid(p) {
				continue
			}
			sweepNoOvershoot(t, p, c, 3)
		}
	}
}

// TestInterpolatedOvershoots: the interpolated estimator over-admits on the
// edge-end trace (the articles' weighting trusts that the oldest
// sub-window's traffic was spread out), so the report has something to
// report.
func TestInterpolatedOvershoots(t *testing.T) {
	p := DefaultParams
	for _, k := range IssueSubWindows {
		res, err := Simulate(EdgeEnd(p, 3, 1), p, Config{Algorithm: Interpolated, SubWindows: k})
		if err != nil {
			t.Fatal(err)
		}
		if res.WorstWindow <= p.Limit {
			t.Errorf("interpolated k=%d: worst window %d, want above the limit %d", k, res.WorstWindow, p.Limit)
		}
	}
}

// TestSlicedDecidesAsBounded: k counters of B slices admit exactly what
// Bounded with k*B sub-windows admits.
func TestSlicedDecidesAsBounded(t *testing.T) {
	t.Parallel()
	p := DefaultParams
	for _, kb := range [][2]int{{1, 2}, {5, 4}, {10, 2}, {10, 3}, {6, 5}} {
		sliced := Config{Algorithm: Sliced, SubWindows: kb[0], Slices: kb[1]}
		bounded := Config{Algorithm: Bounded, SubWindows: kb[0] * kb[1]}
		for _, tr := range append(testTraces(t, p, 1, 2), subBurst(p, kb[0], 1)) {
			a, err := Simulate(tr, p, sliced)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Simulate(tr, p, bounded)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(a.Admits, b.Admits) {
				t.Errorf("%s and %s differ on %s: %d and %d admitted", sliced.Name(), bounded.Name(), tr.Name, a.Admitted, b.Admitted)
			}
			if a.Memcached.Items != kb[0]+1 || b.Memcached.Items != kb[0]*kb[1]+1 {
				t.Errorf("items: %s %d, %s %d", sliced.Name(), a.Memcached.Items, bounded.Name(), b.Memcached.Items)
			}
		}
	}
}

// TestCountsAloneCannotBeatBounded replays the history behind the claim
// that no function of the counters admits more than Bounded without
// overshooting: the limit's requests arrive in the last nanosecond of
// sub-window j after a quiet spell; at every offset e of sub-window j+k but
// the last nanosecond, all of them are still in the window, so the oldest
// counter's in-view share is its whole count. The exact log and Bounded
// deny there; an estimator that credits any part of the oldest counter (as
// Interpolated does) admits and overshoots.
func TestCountsAloneCannotBeatBounded(t *testing.T) {
	p := Params{Limit: 10, Window: time.Minute}
	for _, k := range []int{1, 2, 4, 6, 12, 30} {
		s := int64(p.Window) / int64(k)
		j := Epoch.UnixNano()/s + 5
		end := (j+1)*s - 1 // the last nanosecond of sub-window j
		for _, e := range []int64{0, 1, s / 3, s / 2, s - 2} {
			tr := Trace{Name: "adversary"}
			for range p.Limit {
				tr.Times = append(tr.Times, end)
			}
			probe := (j+int64(k))*s + e
			tr.Times = append(tr.Times, probe)
			if got := windowCounts(tr.Times[:p.Limit], []int64{probe}, int64(p.Window))[0]; got != p.Limit {
				t.Fatalf("k=%d e=%d: %d of the burst in view, want all %d", k, e, got, p.Limit)
			}
			for _, c := range []Config{{Algorithm: Log}, {Algorithm: Bounded, SubWindows: k}} {
				res, err := Simulate(tr, p, c)
				if err != nil {
					t.Fatal(err)
				}
				if res.Admitted != int(p.Limit) {
					t.Errorf("%s, k=%d, e=%d: admitted the probe (or not the burst): %d admitted", c.Name(), k, e, res.Admitted)
				}
			}
			if e > 0 {
				res, err := Simulate(tr, p, Config{Algorithm: Interpolated, SubWindows: k})
				if err != nil {
					t.Fatal(err)
				}
				if e >= s/3 && res.WorstWindow <= p.Limit {
					t.Errorf("interpolated k=%d e=%d: worst window %d, want an overshoot", k, e, res.WorstWindow)
				}
			}
		}
	}
}

// TestMomentBound checks the moment estimator's bound against its
// definition on hand-made counters.
func TestMomentBound(t *testing.T) {
	p := Params{Limit: 10, Window: 10 * time.Second}
	k := 1
	s := int64(p.Window)
	j := Epoch.UnixNano()/s + 3
	at := func(idx int64, frac float64) int64 { return idx*s + int64(frac*float64(s)) }
	tests := []struct {
		name    string
		oldest  []float64 // offsets (fraction of a sub-window) of the oldest sub-window's requests
		probeAt float64   // offset of the probes in the next sub-window
		want    int       // probes admitted
	}{
		// All 10 at offset 0.1: at 0.5 at most floor(10*102/512) = 1 is
		// in view (the bound), so 9 probes fit.
		{"early", []float64{.1, .1, .1, .1, .1, .1, .1, .1, .1, .1}, 0.5, 9},
		// All 10 at the end: every one may be in view, nothing fits.
		{"late", []float64{.99, .99, .99, .99, .99, .99, .99, .99, .99, .99}, 0.5, 0},
		// At offset 0 nothing is known: the whole count.
		{"start", []float64{.1, .1, .1, .1, .1}, 0, 5},
	}
	for _, tt := range tests {
		tr := Trace{Name: tt.name}
		for _, o := range tt.oldest {
			tr.Times = append(tr.Times, at(j, o))
		}
		for range 10 {
			tr.Times = append(tr.Times, at(j+1, tt.probeAt))
		}
		res, err := Simulate(tr, p, Config{Algorithm: Moment, SubWindows: k})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Admitted - len(tt.oldest); got != tt.want {
			t.Errorf("%s: %d probes admitted, want %d", tt.name, got, tt.want)
		}
	}
}
