package dynamo_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/regions"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// Regional shares (internal/regions, through the table: regions.Process
// and regions.NewTableAgent) on the MRSC harness (one copy, 40 ms added
// to every request, write conflicts on): each region's processes and
// agent write only that region's items, so their writes meet no
// conflict from another region, and a grant is visible everywhere once
// its write is acknowledged (a lag of 0 past the latency). The shares
// are safe whatever the lag (internal/regions' package comment), so no
// setting of theirs changes for MRSC; the table's times are
// tableTimes'.

// mrscSharesDur is the length of BenchmarkRegionSharesMRSC's runs: 10 s
// (BenchmarkRegionsMRSC's), or SLUICE_MRSC_SHARES_DUR.
func mrscSharesDur(tb testing.TB) time.Duration {
	tb.Helper()
	v := os.Getenv("SLUICE_MRSC_SHARES_DUR")
	if v == "" {
		return 10 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		tb.Fatalf("SLUICE_MRSC_SHARES_DUR: %q is not a duration", v)
	}
	return d
}

// runSharesMRSC runs d as regional shares through the table on the MRSC
// harness m and reports the run's figures as BenchmarkRegionsMRSC does
// (reportMRSC: of exact, never over, requests, conflicts and throttled
// decisions a decision, p50 and p99), and the share of exact over the
// calls stamped after from, the processes' reads of their region's item
// a decision, and the decisions failed.
func runSharesMRSC(b *testing.B, m *testserver.MRSC, table string, eps []string, run tableRun, d regionDemand, from time.Duration) {
	b.Helper()
	mark := m.Stats()
	rep := runRegionSharesTable(b, nil, table, eps, d, from, run)
	rr := rep.regionReport
	rr.failed = 0 // reported below, and checked by checkTable
	reportMRSC(b, m, mark, d.Name, rr)
	b.Logf("shares on mrsc %s: %v", d.Name, rep)
	b.ReportMetric(rep.fromShare(), fmt.Sprintf("exact-share-after-%gs", from.Seconds()))
	b.ReportMetric(float64(rep.procs.Reads)/float64(rep.decisions), "item-reads/decision")
	b.ReportMetric(float64(rep.failed), "failed")
	if run.trace {
		traceLatency(b, rep)
	}
	checkTable(b, rep)
}

// traceLatency logs, for each second of a run and each region, the
// decisions admitted and denied and their mean latencies: in the
// processes' closed loop a region's calls a second are what its
// decisions' latency lets through.
func traceLatency(b *testing.B, rep tableReport) {
	b.Helper()
	type cell struct {
		n    [2]int
		took [2]time.Duration
	}
	var secs [][]cell
	for r, cs := range rep.byRegion {
		for _, c := range cs {
			i := int(c.Stamp.Sub(rep.start) / time.Second)
			if i < 0 || c.Worker < 0 {
				continue
			}
			for len(secs) <= i {
				secs = append(secs, make([]cell, len(rep.byRegion)))
			}
			k := 0
			if !c.Allowed {
				k = 1
			}
			secs[i][r].n[k]++
			secs[i][r].took[k] += c.End - c.Start
		}
	}
	mean := func(c cell, k int) int64 { return (c.took[k] / time.Duration(max(c.n[k], 1))).Milliseconds() }
	for i, row := range secs {
		line := fmt.Sprintf("latency %2ds:", i)
		for r, c := range row {
			line += fmt.Sprintf(" r%d admitted %3d in %3d ms, denied %3d in %3d ms |", r, c.n[0], mean(c, 0), c.n[1], mean(c, 1))
		}
		b.Log(line)
	}
}

// BenchmarkRegionSharesMRSC reports regional shares on the MRSC harness
// (40 ms, conflicts on): BenchmarkRegionsMRSC's rows (mrscDemands: the
// window under and over its rate at 98/1/1, 33/33/33 and 60/30/10 and
// where demand moves, the bucket over its rate at 98/1/1 and 33/33/33),
// 10 s each (SLUICE_MRSC_SHARES_DUR), run with -benchtime=1x. The shares
// take no prefill (their processes are built by runRegionSharesTable,
// and runRegions prefills leases' limiters only): the "over" rows start
// from a fresh limit, and the exact replay likewise. Metrics:
// reportMRSC's, and the share of exact after the first 3 s (the shares
// start split evenly). SLUICE_SHARES_TIMES sets other table times
// (benchTableTimes), SLUICE_SHARES_TRACE=1 traces each run second by
// second (traceRun, traceLatency).
func BenchmarkRegionSharesMRSC(b *testing.B) {
	m, table, eps, raw := startMRSC(b)
	dur := mrscSharesDur(b)
	times := benchTableTimes(b)
	b.Logf("table times: refresh %v, flush %v, validity %v, deadline %v, lock life %v; runs of %v", times.Refresh, times.Flush, times.Validity, times.Deadline,
		times.LockLife, dur)
	for _, d := range mrscDemands(dur, true) {
		b.Run(d.Name, func(b *testing.B) {
			for i := range b.N {
				d := d
				d.Name = fmt.Sprintf("shares/%s/%d-%d", d.Name, i, time.Now().UnixNano()) // a key of its own
				d.Prefill = 0
				run := tableRun{requests: m.Requests, raw: raw, times: &times, trace: os.Getenv("SLUICE_SHARES_TRACE") != ""}
				runSharesMRSC(b, m, table, eps, run, d, 3*time.Second)
			}
		})
	}
}

// TestRegionSharesMRSCFence: a global window of 100 a second kept as
// regional shares (two of the MRSC harness's regions, through the
// table, on the dynamo store: it fences), decided on a simulated clock
// so that the steps are exact whatever the machine's load. Region 0's
// process reads its entry (a cap of 50) with its first decision and
// keeps it (Refresh 900 ms); region 1 asks 50 at once; region 0's agent
// learns that demand and gives region 1 most of its share in one tick:
// it publishes its lowered cap, raises its counters' fence and reads
// its count (each an MRSC write or read, acknowledged by the quorum),
// then publishes the grant. Region 0's process then decides 49 more by
// the entry it holds (7 decisions of 7), region 1 100 on its raised
// share (10 of 10: fewer round trips of 40 ms). The first of region 0's
// is refused by the fence, its process reads its entry again and
// decides by the lowered cap: no window of stamps over the union of the
// regions is over 100. brokenFence (region 0's store ignores the fence:
// dynamo.BreakFence): the grant is used while the lowering is not in
// force at the store, region 0's 49 land under the old cap beside
// region 1's raise, and the checker sees a window over the limit.
func TestRegionSharesMRSCFence(t *testing.T) {
	if testing.Short() {
		t.Skip("the MRSC harness on DynamoDB Local")
	}
	_, table, eps, _ := startMRSC(t)
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("brokenFence=%v", broken), func(t *testing.T) {
			t.Parallel() // keys of their own
			mrscFenceRun(t, table, eps, broken)
		})
	}
}

// mrscFenceRun is TestRegionSharesMRSCFence's run.
func mrscFenceRun(t *testing.T, table string, eps []string, broken bool) {
	cfg := regions.Config{Regions: 2, Key: limitertest.Key(t), Limit: 100, Window: time.Second, SubWindows: 10}
	now := time.Now()
	var (
		agents [2]*regions.Agent
		procs  [2]*regions.Process
		calls  []limitertest.Call
	)
	for r := range agents {
		// A decision's requests end its Deadline after its stamp: the
		// simulated clock falls behind the wall clock's seconds of MRSC
		// round trips, so a minute (a window's lowering through a store
		// that fences waits for no deadline).
		tt := regions.Table{Client: newClient(eps[r]), Table: table, Name: cfg.Key, Region: r, Refresh: 100 * time.Millisecond,
			Flush: 100 * time.Millisecond, Validity: time.Second, Deadline: time.Minute, LockLife: 750 * time.Millisecond}
		newStore := func() *dynamo.Store {
			st, err := dynamo.New(newClient(eps[r]), dynamo.Config{Table: table, Timeout: regionTimeout, CrossRegion: true})
			if err != nil {
				t.Fatal(err)
			}
			return st
		}
		a, err := regions.NewTableAgent(cfg, tt, fmt.Sprintf("r%d", r), newStore())
		if err != nil {
			t.Fatal(err)
		}
		agents[r] = a
		st := newStore()
		if r == 0 {
			tt.Refresh = 900 * time.Millisecond // uses the entry it read while it is valid
			if broken {
				dynamo.BreakFence(st)
			}
		}
		if procs[r], err = regions.NewProcess(cfg, tt, st); err != nil {
			t.Fatal(err)
		}
	}
	// decide decides n decisions of cost units each in region r.
	decide := func(r, n int, cost int64) int64 {
		var got int64
		for range n {
			d, err := procs[r].AllowN(t.Context(), cfg.Key, now, cost)
			if err != nil {
				t.Fatal(err)
			}
			calls = append(calls, limitertest.Call{Key: cfg.Key, Cost: cost, Stamp: now, Allowed: d.Allowed, Reached: true})
			if d.Allowed {
				got += cost
			}
		}
		return got
	}
	tick := func() {
		for _, a := range agents {
			if err := a.Tick(t.Context(), now); err != nil {
				t.Fatal(err)
			}
		}
	}
	tick()
	now = now.Add(10 * time.Millisecond)
	got0 := decide(0, 1, 1)
	if d, err := procs[1].AllowN(t.Context(), cfg.Key, now, 50); err != nil || !d.Allowed {
		t.Fatalf("region 1's first 50: %+v, %v", d, err)
	}
	calls = append(calls, limitertest.Call{Key: cfg.Key, Cost: 50, Stamp: now, Allowed: true, Reached: true})
	for range 2 { // region 0's agent learns region 1's demand, and gives
		now = now.Add(40 * time.Millisecond)
		tick()
	}
	st0 := agents[0].Stats()
	if st0.Given == 0 {
		t.Fatalf("region 0 gave nothing after region 1's demand rose: %+v, table %+v", st0, agents[0].TableStats())
	}
	reads := procs[0].Stats().Reads
	now = now.Add(40 * time.Millisecond)
	got0 += decide(0, 7, 7)
	got1 := decide(1, 10, 10)
	over := limitertest.CheckTrailingWindow(calls, cfg.Limit, cfg.Window)
	ps, ts := procs[0].Stats(), agents[0].TableStats()
	t.Logf("region 0 gave %d and admitted %d, region 1 admitted %d; region 0's process %+v (reads %d before its 49); region 0's table %+v; %d windows over, the first %v",
		st0.Given, got0, got1, ps, reads, ts, len(over), over)
	if broken {
		if len(over) == 0 {
			t.Errorf("a store that ignores the fence: no window over the limit (region 0 admitted %d, region 1 %d)", got0, got1)
		}
		return
	}
	for _, v := range over {
		t.Errorf("over the limit: %v", v)
	}
	if ps.Fenced == 0 || ps.Reads == reads || ts.Raises == 0 || got1 == 0 {
		t.Errorf("want region 0's process refused by the fence and reading again, a fence raised and region 1 admitting on the grant: process %+v (reads %d before), table %+v, region 1 admitted %d",
			ps, reads, ts, got1)
	}
}
