package wiring

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/regions"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/policy"
)

// The keeper and the in-line sweep on the harness, through Build: demand
// for a key in region 0 only, and regions 1 and 2 giving their shares of
// it away, either from a keeper (the scheduled event, as EventBridge
// sends it, through the handler's Invoke) or in line with their
// decisions of another key.
//
// The table's replication lag is 500 ms, not the 1 s of
// TestSharesGlobalRule's table (on the same shared harness): a
// grant from a region without traffic takes two lags, a tick or two and
// its lowering's wait (the entry's validity is not in it: the giver has
// published none before, and the deadline, 1 s) before it is in force
// in region 0, about 3 s at 500 ms, and the run must show a steady part
// after it within a few seconds (make test's time). The lag changes when
// the grant lands, not whether the shares sum above the limit (never:
// TestRegionShares, at 1 s).

const (
	keeperLag    = 500 * time.Millisecond
	keeperRun    = 8 * time.Second
	keeperSteady = 5 * time.Second // the run's steady part starts here
	keeperIdle   = time.Second     // the keeper runs alone first
	keeperAgain  = 2 * time.Second // a keeper invoked again runs this long
	// keeperGiven is most of what regions 1 and 2 hold of the limit (two
	// thirds of 200, less their minimum): region 0 has received them.
	keeperGiven = 100
	// keeperMinSteady and keeperExtra: a steady part shorter than this
	// (exact's admissions) is run on for keeperExtra at a time.
	keeperMinSteady = 150
	keeperExtra     = 4 * time.Second
)

// keeperCall is a decision of the keeper runs.
type keeperCall struct {
	limitertest.Call
	region int
	key    string
}

// runKeyed offers, for each region r, rates[r] decisions a second of
// events[r] for d, every container deciding one request at a time at its
// share of its region's pace; the other regions' containers go on at
// their pace for as long as region 0's decide. A container that falls
// behind its pace catches up, so on a loaded machine region 0's (96 a
// second) decide for two or three times d, and an in-line sweep runs
// only with a decision: regions 1 and 2's (4 a second) that stopped at d
// left region 0's key listed and nobody to give it (a run of 32 s whose
// other regions decided for its first 9: a grant under way when they
// stopped, none received).
func runKeyed(t *testing.T, cs []*sharesContainer, events [][]byte, rates []float64, d time.Duration, seen func(keeperCall)) []keeperCall {
	t.Helper()
	var (
		mu    sync.Mutex
		calls []keeperCall
		wg    sync.WaitGroup
		hot   sync.WaitGroup // region 0's containers
	)
	hotDone := make(chan struct{})
	start := time.Now()
	for w, c := range cs {
		per := rates[c.region] / sharesProcs
		if per <= 0 {
			continue
		}
		every := time.Duration(float64(time.Second) / per)
		length := d
		if c.region == 0 {
			hot.Add(1)
		} else {
			length = 1 << 62 // until region 0's have decided too
		}
		wg.Go(func() {
			if c.region == 0 {
				defer hot.Done()
			}
			paced(start, length, every, func() bool {
				if time.Since(start) >= d && c.region != 0 && isClosed(hotDone) {
					return false
				}
				t0 := time.Now()
				_, res, err := c.built.Handler.Decide(t.Context(), events[c.region])
				t1 := time.Now()
				if err != nil {
					t.Errorf("decide: %v", err)
					return false
				}
				var key string
				if len(res.Evals) > 0 {
					key = res.Evals[0].Key
				}
				call := keeperCall{Call: limitertest.Call{Worker: w*10 + c.region, Key: key, Stamp: time.Unix(0, c.clock.last.Load()), Cost: 1,
					Start: t0.Sub(start), End: t1.Sub(start), Reached: true, Allowed: res.Outcome == policy.Allow}, region: c.region, key: key}
				if len(res.Evals) > 0 && res.Evals[0].Failed {
					call.Err = res.Evals[0].Err
				}
				mu.Lock()
				calls = append(calls, call)
				mu.Unlock()
				if seen != nil {
					seen(call)
				}
				return true
			})
		})
	}
	hot.Wait()
	close(hotDone)
	wg.Wait()
	t.Logf("a run of %v planned: each region's last call ended at %v", d, lastEnds(calls))
	return calls
}

// isClosed reports whether c is closed.
func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// grantWatch polls, every 50 ms, region 0's agents of the key its calls
// decide (learned from the first, seen) for the first time they have
// received at least min units: when the other regions' grants are in
// force there.
type grantWatch struct {
	key  atomic.Pointer[string]
	at   atomic.Int64 // Unix ns; 0: not yet
	stop chan struct{}
	done chan struct{}
}

func watchGrants(cs []*sharesContainer, min int64) *grantWatch {
	w := &grantWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			k := w.key.Load()
			if k == nil || w.at.Load() != 0 {
				continue
			}
			var got int64
			for _, c := range cs {
				for _, ks := range c.built.shares {
					if st, ok := ks.Stats(*k); ok && c.region == 0 {
						got += st.Agent.Received
					}
				}
			}
			if got >= min {
				w.at.Store(time.Now().UnixNano())
			}
		}
	}()
	return w
}

func (w *grantWatch) seen(c keeperCall) {
	if c.region == 0 && w.key.Load() == nil {
		w.key.Store(&c.key)
	}
}

// end stops the watch: when the grants were in force (zero: never).
func (w *grantWatch) end() time.Time {
	close(w.stop)
	<-w.done
	if at := w.at.Load(); at != 0 {
		return time.Unix(0, at)
	}
	return time.Time{}
}

// keyedSteady runs the calls of runKeyed for keeperRun, and for up to
// two more keeperExtra while region 0 has not received keeperGiven units
// or the steady part holds fewer than keeperMinSteady decisions exact
// admits: the part from keeperSteady
// into the run, or from a lag and a second after region 0 has received
// keeperGiven units if that is later (a loaded machine slows the
// giving; how fast it is, is for the benchmarks). It returns the calls,
// the steady part's start (zero: region 0 never received them), and the
// admitted and exact of region 0's key over it.
func keyedSteady(t *testing.T, cs []*sharesContainer, events [][]byte, rates []float64) (calls []keeperCall, from time.Time, admitted, exact, failed int64) {
	t.Helper()
	w := watchGrants(cs, keeperGiven)
	start := time.Now()
	calls = runKeyed(t, cs, events, rates, keeperRun, w.seen)
	for extra := 0; ; extra++ {
		from = start.Add(keeperSteady)
		if at := w.at.Load(); at != 0 {
			if g := time.Unix(0, at).Add(keeperLag + time.Second); g.After(from) {
				from = g
			}
		}
		k := w.key.Load()
		if k == nil {
			w.end()
			t.Fatal("region 0 made no call")
		}
		admitted, exact, failed = steadyShare(t, calls, *k, from)
		if exact >= keeperMinSteady && w.at.Load() != 0 || extra == 2 {
			break
		}
		calls = append(calls, runKeyed(t, cs, events, rates, keeperExtra, nil)...)
	}
	given := w.end()
	at := "never"
	if !given.IsZero() {
		at = given.Sub(start).Round(time.Millisecond).String()
	}
	t.Logf("run of %v: region 0 received %d units at %s; steady part from %v", time.Since(start).Round(time.Millisecond), keeperGiven,
		at, from.Sub(start).Round(time.Millisecond))
	if given.IsZero() {
		// Each container decides one request at a time: on a loaded
		// machine slow decisions stretch the run and the offered rate can
		// fall to region 0's own share, which then asks nobody to give.
		took := time.Since(start)
		t.Errorf("region 0's agents never received %d units: the other regions did not give (region 0 offered %.1f calls a second of the %.1f planned over %v)",
			keeperGiven, float64(regionCalls(calls, 0))/took.Seconds(), rates[0], took.Round(time.Millisecond))
		return calls, time.Time{}, admitted, exact, failed
	}
	return calls, from, admitted, exact, failed
}

// lastEnds is when each region's last call of calls ended (from the
// start of its run).
func lastEnds(calls []keeperCall) []time.Duration {
	out := make([]time.Duration, len(sharesRegions))
	for _, c := range calls {
		out[c.region] = max(out[c.region], c.End.Round(time.Millisecond))
	}
	return out
}

// regionCalls counts region's calls.
func regionCalls(calls []keeperCall, region int) (n int) {
	for _, c := range calls {
		if c.region == region {
			n++
		}
	}
	return n
}

// steadyShare replays key's calls in stamp order on one exact window and
// returns, over the calls stamped from from on, the admitted and what the
// exact window admits; it checks that no window of stamps of key's calls
// (over the union of regions) is over the limit, and counts failures.
func steadyShare(t *testing.T, calls []keeperCall, key string, from time.Time) (admitted, exact, failed int64) {
	t.Helper()
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := limiter.NewSlidingWindow(mem, limiter.SlidingWindowConfig{Name: "exact", Limit: sharesLimit, Window: sharesWindow, SubWindows: 4,
		Representation: limiter.SubWindowCounters})
	if err != nil {
		t.Fatal(err)
	}
	var cs []limitertest.Call
	for _, c := range calls {
		if c.key == key {
			cs = append(cs, c.Call)
		}
	}
	for _, v := range limitertest.CheckTrailingWindow(cs, sharesLimit, sharesWindow) {
		t.Errorf("key %s over the limit: %v", key, v)
	}
	sortCalls(cs)
	for _, c := range cs {
		if c.Err != nil {
			failed++
			continue
		}
		d, err := w.AllowN(t.Context(), "k", c.Stamp, 1)
		if err != nil {
			t.Fatal(err)
		}
		if c.Stamp.Before(from) {
			continue
		}
		if d.Allowed {
			exact++
		}
		if c.Allowed {
			admitted++
		}
	}
	return admitted, exact, failed
}

func sortCalls(cs []limitertest.Call) {
	for i := 1; i < len(cs); i++ {
		for j := i; j > 0 && cs[j].Stamp.Before(cs[j-1].Stamp); j-- {
			cs[j], cs[j-1] = cs[j-1], cs[j]
		}
	}
}

// gateCounts is the requests each region's gate answered since marks.
func gateCounts(g *testserver.Regions, marks []int) []int {
	out := make([]int, g.Len())
	for i := range out {
		out[i] = g.Gate(i).Len() - marks[i]
	}
	return out
}

func gateMarks(g *testserver.Regions) []int {
	out := make([]int, g.Len())
	for i := range out {
		out[i] = g.Gate(i).Len()
	}
	return out
}

// TestSharesKeeper: demand for one key in region 0 only (1.2 times the
// steady rate), on the eventual harness through Build.
//
//   - keeper: regions 1 and 2 decide nothing; one container of each runs
//     the keeper, invoked with events/scheduled.json through the
//     handler's Invoke under a deadline (as Lambda gives one), for the
//     run. Region 0 lists the key as wanted, the keepers tick their
//     regions' agents of it, region 0's agents receive most of their
//     shares, and region 0 admits more than 0.8 of exact over the run's
//     steady part (its base share is a third): from 5 s of 8 s, or from
//     a lag and a second after the receipt if later, the run going on
//     while that part is short (keyedSteady: a loaded machine slows the
//     giving, and how fast it is belongs to the benchmarks); never over
//     the limit in any window of stamps. The
//     keepers' requests (counted at the gates) are logged: idle (no key
//     wanted) and while ticking.
//   - in-line: no keeper; regions 1 and 2 decide another key (4 a second
//     each, for as long as region 0 decides: runKeyed): their containers
//     sweep in line with those decisions and give region 0 the first
//     key's units (the same bound).
func TestSharesKeeper(t *testing.T) {
	cs, g := startSharesLag(t, keeperLag)
	scheduled, err := os.ReadFile("../../events/scheduled.json")
	if err != nil {
		t.Fatal(err)
	}
	base := float64(sharesLimit+2) / 3
	t.Run("keeper", func(t *testing.T) {
		hot := sharesEvent(t, "192.0.2.10")
		type result struct {
			out []byte
			err error
		}
		// Each keeper is invoked for the run as a schedule would: first
		// under the deadline of the run as planned, then again while
		// the decisions go on (a loaded machine stretches the run). The
		// results are kept in a slice: a channel of 64 filled when a
		// loaded run took more invocations, and the keepers blocked on
		// it while the test waited for them (a run of 1m16s hung).
		var (
			resMu   sync.Mutex
			results []result
		)
		done := make(chan struct{})
		var keepers sync.WaitGroup
		marks := gateMarks(g)
		deadline := time.Now().Add(keeperIdle + keeperRun + regions.DefaultKeeperMargin)
		for _, c := range cs {
			if c.region == 0 || c != firstOf(cs, c.region) {
				continue
			}
			keepers.Go(func() {
				for d := deadline; ; d = time.Now().Add(keeperAgain + regions.DefaultKeeperMargin) {
					ctx, cancel := context.WithDeadline(t.Context(), d)
					out, err := c.built.Handler.Invoke(ctx, scheduled)
					cancel()
					resMu.Lock()
					results = append(results, result{out, err})
					resMu.Unlock()
					select {
					case <-done:
						return
					default:
					}
				}
			})
		}
		time.Sleep(keeperIdle)
		idle := gateCounts(g, marks)
		marks = gateMarks(g)
		start := time.Now()
		calls, _, admitted, exact, failed := keyedSteady(t, cs, [][]byte{hot, nil, nil}, []float64{1.2 * sharesRate, 0, 0})
		took := time.Since(start)
		close(done)
		keepers.Wait()
		busy := gateCounts(g, marks)
		var ticks, rounds, reads, invoked int64
		for _, r := range results {
			if r.err != nil {
				t.Fatalf("keeper: %v", r.err)
			}
			var rep struct {
				Keeper regions.KeeperReport `json:"keeper"`
			}
			if err := json.Unmarshal(r.out, &rep); err != nil {
				t.Fatalf("keeper's result %s: %v", r.out, err)
			}
			t.Logf("keeper: %s", r.out)
			ticks, rounds, reads = ticks+rep.Keeper.Ticks, rounds+rep.Keeper.Rounds, reads+rep.Keeper.IndexReads
			invoked++
		}
		key := calls[0].key
		t.Logf("idle keeper (%v): requests at the gates %v; run (%v planned, %v taken): %v; keepers: %d invocations, %d rounds, %d index reads, %d ticks (%.1f requests a tick beyond the index reads)",
			keeperIdle, idle, keeperRun, took.Round(time.Millisecond), busy, invoked, rounds, reads, ticks, float64(busy[1]+busy[2]-int(reads)+int(idle[1]+idle[2]))/float64(max(ticks, 1)))
		logShares(t, cs, key)
		logWants(t, cs, key)
		checkSharesMetrics(t, cs, key)
		t.Logf("steady part: region 0 admitted %d, exact %d: %.3f of exact (its base share: %.3f of the limit); %d failed", admitted, exact,
			float64(admitted)/float64(max(exact, 1)), base/sharesLimit, failed)
		if ticks == 0 {
			t.Errorf("the keepers ticked nothing")
		}
		if float64(admitted) < 0.8*float64(exact) {
			t.Errorf("region 0 admitted %d of exact %d over the steady part: the regions without traffic did not give their shares", admitted, exact)
		}
	})
	t.Run("in-line", func(t *testing.T) {
		hot, other := sharesEvent(t, "192.0.2.20"), sharesEvent(t, "192.0.2.21")
		calls, _, admitted, exact, failed := keyedSteady(t, cs, [][]byte{hot, other, other}, []float64{1.2 * sharesRate, 4, 4})
		var key, otherKey string
		for _, c := range calls {
			if c.region == 0 {
				key = c.key
			} else {
				otherKey = c.key
			}
		}
		steadyShare(t, calls, otherKey, time.Time{}) // the other key: never over
		var sweeps regions.SweepStats
		for _, c := range cs {
			for _, k := range c.built.shares {
				if c.region != 0 {
					st := k.SweepStats()
					t.Logf("region %d: sweeps %+v", c.region, st)
					sweeps.Sweeps += st.Sweeps
					sweeps.Ticks += st.Ticks
				}
			}
		}
		logShares(t, cs, key)
		logWants(t, cs, key)
		checkSharesMetrics(t, cs, key, otherKey)
		t.Logf("steady part: region 0 admitted %d, exact %d: %.3f of exact; %d failed; regions 1 and 2 over the whole test: %d sweeps, %d ticks",
			admitted, exact, float64(admitted)/float64(max(exact, 1)), failed, sweeps.Sweeps, sweeps.Ticks)
		if float64(admitted) < 0.8*float64(exact) {
			t.Errorf("region 0 admitted %d of exact %d over the steady part: the in-line sweeps did not give", admitted, exact)
		}
	})
}

// logWants logs region 0's containers' writes of key to its wants index
// (a key never listed: nobody was asked to give).
func logWants(t *testing.T, cs []*sharesContainer, key string) {
	t.Helper()
	for _, c := range cs {
		for _, k := range c.built.shares {
			if st, ok := k.Stats(key); ok && c.region == 0 {
				t.Logf("region 0: wants index %+v", st.Wants)
			}
		}
	}
}

// firstOf is region's first container.
func firstOf(cs []*sharesContainer, region int) *sharesContainer {
	for _, c := range cs {
		if c.region == region {
			return c
		}
	}
	return nil
}

// sharesMetrics flushes every container's shares counts and returns, per
// region, the sums of the shares metric lines the containers wrote to
// stdout since the last call (SharesWanted: the most), by metric name; a line whose
// directive does not declare each metric with its unit, or lacks a
// value, fails the test.
func sharesMetrics(t *testing.T, cs []*sharesContainer) []map[string]int64 {
	t.Helper()
	out := make([]map[string]int64, len(sharesRegions))
	for i := range out {
		out[i] = map[string]int64{}
	}
	names := []string{config.MetricSharesGiven, config.MetricSharesReceived, config.MetricSharesTicks, config.MetricSharesTickErrors,
		config.MetricSharesTakeovers, config.MetricSharesRoleLost, config.MetricSharesStale, config.MetricSharesStaleEntries,
		config.MetricSharesSweeps, config.MetricSharesExpired, config.MetricSharesWanted, config.MetricSharesListed, config.MetricSharesDropped}
	for _, c := range cs {
		for _, k := range c.built.shares {
			k.Flush(time.Now())
		}
		for line := range strings.SplitSeq(strings.TrimSpace(c.stdout.Take()), "\n") {
			var l map[string]json.RawMessage
			if err := json.Unmarshal([]byte(line), &l); err != nil {
				t.Fatalf("region %d: a line that is not JSON: %q: %v", c.region, line, err)
			}
			var aws struct {
				CloudWatchMetrics []struct {
					Namespace  string
					Dimensions [][]string
					Metrics    []struct{ Name, Unit string }
				}
			}
			if err := json.Unmarshal(l["_aws"], &aws); err != nil || len(aws.CloudWatchMetrics) != 1 {
				t.Fatalf("region %d: line %s: %v", c.region, line, err)
			}
			cw := aws.CloudWatchMetrics[0]
			if len(cw.Dimensions) != 2 || len(cw.Dimensions[0]) != 1 || cw.Dimensions[0][0] != config.DimensionLimit || len(cw.Dimensions[1]) != 0 {
				continue // a decision's line
			}
			var limit string
			if err := json.Unmarshal(l[config.DimensionLimit], &limit); err != nil || limit != "global-window" || cw.Namespace != config.DefaultMetricsNamespace {
				t.Errorf("region %d: line %s: limit %q, namespace %q", c.region, line, limit, cw.Namespace)
			}
			if len(cw.Metrics) != len(names) {
				t.Fatalf("region %d: line %s declares %d metrics, want %d", c.region, line, len(cw.Metrics), len(names))
			}
			for i, name := range names {
				unit := "Count"
				if name == config.MetricSharesWanted {
					unit = "None"
				}
				if cw.Metrics[i].Name != name || cw.Metrics[i].Unit != unit {
					t.Fatalf("region %d: line %s declares %+v, want %s in %s", c.region, line, cw.Metrics[i], name, unit)
				}
				var v int64
				if err := json.Unmarshal(l[name], &v); err != nil {
					t.Fatalf("region %d: line %s: %s: %v", c.region, line, name, err)
				}
				if name == config.MetricSharesWanted {
					out[c.region][name] = max(out[c.region][name], v)
				} else {
					out[c.region][name] += v
				}
			}
			out[c.region]["lines"]++
		}
	}
	return out
}

// checkSharesMetrics checks the shares metrics of a run where region 0
// wanted keys[0] and regions 1 and 2 gave it units (keys: every key the
// run decided, each new to the containers): each region wrote lines
// whose units given and received are its agents' (every tick is
// counted), region 0 listed the key and received, regions 1 and 2
// swept, saw it wanted, ticked and gave; every region took a role.
func checkSharesMetrics(t *testing.T, cs []*sharesContainer, keys ...string) {
	t.Helper()
	ms := sharesMetrics(t, cs)
	var given, received [3]int64
	for _, c := range cs {
		for _, k := range c.built.shares {
			for _, key := range keys {
				if st, ok := k.Stats(key); ok {
					given[c.region] += st.Agent.Given
					received[c.region] += st.Agent.Received
				}
			}
		}
	}
	for r, m := range ms {
		t.Logf("region %d: shares metrics %v (its agents: given %d, received %d)", r, m, given[r], received[r])
		if m["lines"] == 0 {
			t.Errorf("region %d wrote no shares metric line", r)
			continue
		}
		if m[config.MetricSharesGiven] != given[r] || m[config.MetricSharesReceived] != received[r] {
			t.Errorf("region %d: given %d, received %d in its metrics; its agents gave %d, received %d", r, m[config.MetricSharesGiven],
				m[config.MetricSharesReceived], given[r], received[r])
		}
		if m[config.MetricSharesTicks] == 0 || m[config.MetricSharesTakeovers] == 0 {
			t.Errorf("region %d: %d ticks, %d takeovers in its metrics: want some", r, m[config.MetricSharesTicks], m[config.MetricSharesTakeovers])
		}
		if r == 0 {
			if m[config.MetricSharesListed] == 0 || m[config.MetricSharesReceived] == 0 {
				t.Errorf("region 0: listed %d, received %d in its metrics: want some", m[config.MetricSharesListed], m[config.MetricSharesReceived])
			}
		} else if m[config.MetricSharesGiven] == 0 || m[config.MetricSharesSweeps] == 0 || m[config.MetricSharesWanted] == 0 {
			t.Errorf("region %d: given %d, sweeps %d, wanted %d in its metrics: want some", r, m[config.MetricSharesGiven], m[config.MetricSharesSweeps], m[config.MetricSharesWanted])
		}
	}
}
