package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/internal/regions"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// Regional shares whose processes and agents share nothing but the table
// (regions.Process, regions.NewTableAgent; docs/regions.md, "Processes
// and agent through the table"), on the default-mode harness: the
// limits, splits and rates of regionshares_test.go.

// tableTimes are the table's times in the runs: a process reads its
// entry every 100 ms and writes its demand with each read; an entry
// is valid for 1 s; a decision's deadline is 1 s (the dynamo store's
// default timeout); an agent that stops ticking keeps the role 750 ms
// (a region's gate holds writes for up to about 500 ms at times).
var tableTimes = regions.Table{Refresh: 100 * time.Millisecond, Flush: 100 * time.Millisecond, Validity: time.Second, Deadline: time.Second,
	LockLife: 750 * time.Millisecond}

// benchTableTimes is tableTimes, with the times SLUICE_SHARES_TIMES names
// (for a benchmark's comparison of shorter ones: "validity=500ms,
// deadline=500ms,locklife=400ms,refresh=50ms"), and a bucket's raises
// fenced with SLUICE_SHARES_FENCE_RAISES=1 (Table.FenceRaises).
func benchTableTimes(tb testing.TB) regions.Table {
	tb.Helper()
	t := tableTimes
	t.FenceRaises = os.Getenv("SLUICE_SHARES_FENCE_RAISES") == "1"
	v := os.Getenv("SLUICE_SHARES_TIMES")
	if v == "" {
		return t
	}
	for _, kv := range strings.Split(v, ",") {
		k, dv, ok := strings.Cut(kv, "=")
		d, err := time.ParseDuration(dv)
		if !ok || err != nil || d <= 0 {
			tb.Fatalf("SLUICE_SHARES_TIMES: %q is not name=duration", kv)
		}
		switch k {
		case "validity":
			t.Validity = d
		case "deadline":
			t.Deadline = d
		case "locklife":
			t.LockLife = d
		case "refresh":
			t.Refresh, t.Flush = d, d
		default:
			tb.Fatalf("SLUICE_SHARES_TIMES: no time %q", k)
		}
	}
	return t
}

// tableRun is a run through the table: a holder agent per region, and,
// with standby set, a second agent per region ready to take the role.
// freeze, if set, is called by each of region 0's agents after each of
// its ticks, with region 0's other agent (nil without standby): it
// returns how long the agent then stops (a frozen container).
type tableRun struct {
	standby bool
	freeze  func(a, other *regions.Agent) time.Duration
	// times, if set, replaces tableTimes.
	times *regions.Table
	// trace, if set, logs a second-by-second trace of the run (traceRun).
	trace bool
	// noFence: the agents' store does not fence (noFence), so they keep
	// the wait.
	noFence bool
	// requests, if set, counts the store requests in place of g's gates
	// (another harness's: the MRSC one, mrscshares_test.go); raw, if set,
	// is a regional round trip timed during the run (runRegions).
	requests func() int
	raw      func(context.Context) error
	// offers: the agents make and take offers (Config.Offers; a
	// bucket's only through the table).
	offers bool
	// sizes, if set, samples the regions' items' sizes by part.
	sizes *itemSizes
}

// tableReport is a run's report with the agents' table counts and the
// processes' requests to their region's item.
type tableReport struct {
	sharesReport
	// holders and standbys: region r's agents' counts (standbys empty
	// without them).
	holders, standbys         []regions.TableStats
	holderStats, standbyStats []regions.AgentStats
	procs                     regions.ProcessStats
	stale                     int64 // decisions failed for want of a valid entry
	// tableWrites and tableWCU: the agents' and processes' writes to the
	// regions' table items (saves, role, demand; not the buckets' and
	// windows' own items) and the write units DynamoDB reported for them
	// (ReturnConsumedCapacity).
	tableWrites int64
	tableWCU    float64
	// kinds: the run's store requests by sender and kind (tableKinds).
	kinds tableKinds
	// leaseStats sums the processes' lease counts.
	leaseStats limiter.LeaseStats
}

func (r tableReport) String() string {
	s := r.sharesReport.String()
	s += fmt.Sprintf("; processes: %d reads (%d with demand), %d stale, %d fenced, %d denied by the entry; leases %+v", r.procs.Reads, r.procs.Flushes, r.procs.Stale, r.procs.Fenced,
		r.procs.Unshared, r.leaseStats)
	s += fmt.Sprintf("; table items: %d writes, %.1f WCU", r.tableWrites, r.tableWCU)
	s += fmt.Sprintf("; requests by kind: %v", r.kinds.per(r.decisions))
	for i, h := range r.holders {
		s += fmt.Sprintf("; region %d holder %+v", i, h)
		if len(r.standbys) > 0 {
			s += fmt.Sprintf(", standby %+v (grants %d)", r.standbys[i], r.standbyStats[i].Grants)
		}
	}
	return s
}

// noBucketFence is the dynamo store without storage.BucketFencer (the
// field hides the method): a bucket's agent on it keeps the wait
// (SLUICE_SHARES_NOFENCE=1, to compare a bucket without leases with and
// without the fence in one binary; SLUICE_SHARES_LEASES=0 runs the table
// path without leases). A bucket with leases keeps the wait either way
// (its fenced rebase is not enabled: docs/regions.md, "Bucket: a fence
// instead of the wait").
type noBucketFence struct {
	*dynamo.Store
	UpdateBucketFenced struct{}
}

// noFence is the dynamo store without storage.Fencer (nor BucketFencer):
// an agent on it keeps the wait for a window's lowerings and a bucket's
// rebases (docs/regions.md, "A store that does not fence").
type noFence struct {
	*dynamo.Store
	AddFenced, RaiseFence, UpdateBucketFenced struct{}
}

// runRegionSharesTable is runRegionShares through the table.
func runRegionSharesTable(tb testing.TB, g *testserver.Regions, table string, eps []string, d regionDemand, from time.Duration, run tableRun) tableReport {
	tb.Helper()
	leases := os.Getenv("SLUICE_SHARES_LEASES") != "0"
	cfg := regions.Config{Regions: len(eps), Key: d.Name, Limit: regionLimit, Window: regionWindow, SubWindows: regionSubs, Leases: leases}
	if d.Alg == regionAlgBucket {
		b := regionBucket
		cfg = regions.Config{Regions: len(eps), Key: d.Name, Bucket: &b, Leases: leases}
	}
	cfg.Offers = run.offers
	times := tableTimes
	if run.times != nil {
		times = *run.times
	}
	kc := &kindCounters{procTable: requests{consumed: true}, agentTable: requests{consumed: true}}
	tt := func(region int, counted *requests) regions.Table {
		t := times
		t.Client, t.Table, t.Name, t.Region = newClient(eps[region], counted.middleware), table, d.Name, region
		return t
	}
	newAgent := func(region int, holder string) *regions.Agent {
		st, err := dynamo.New(newClient(eps[region], kc.agentStore.middleware), dynamo.Config{Table: table, Timeout: times.Deadline})
		if err != nil {
			tb.Fatal(err)
		}
		var store any = st
		if os.Getenv("SLUICE_SHARES_NOFENCE") == "1" {
			store = noBucketFence{Store: st}
		}
		if run.noFence {
			store = noFence{Store: st}
		}
		a, err := regions.NewTableAgent(cfg, tt(region, &kc.agentTable), holder, store)
		if err != nil {
			tb.Fatal(err)
		}
		return a
	}
	holders := make([]*regions.Agent, len(eps))
	var standbys []*regions.Agent
	for i := range eps {
		holders[i] = newAgent(i, fmt.Sprintf("r%d-holder", i))
		// The first tick takes the role and publishes the entry the
		// processes need.
		if err := holders[i].Tick(tb.Context(), time.Now()); err != nil || !holders[i].Holds() {
			tb.Fatalf("region %d's first tick: %v (holds: %v)", i, err, holders[i].Holds())
		}
		if run.standby {
			standbys = append(standbys, newAgent(i, fmt.Sprintf("r%d-standby", i)))
		}
	}
	ctx, cancel := context.WithCancel(tb.Context())
	var wg sync.WaitGroup
	tick := func(a *regions.Agent, freeze func(a *regions.Agent) time.Duration) {
		wg.Go(func() {
			t := time.NewTicker(shareTick)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				a.Tick(ctx, time.Now()) // errors counted in its stats
				if freeze != nil {
					if d := freeze(a); d > 0 {
						select {
						case <-ctx.Done():
							return
						case <-time.After(d):
						}
					}
				}
			}
		})
	}
	// Region 0's agents each call freeze, with the other (the role may
	// have moved to the standby before the moment freeze waits for, on
	// a loaded machine).
	freeze := func(other *regions.Agent) func(*regions.Agent) time.Duration {
		if run.freeze == nil {
			return nil
		}
		return func(a *regions.Agent) time.Duration { return run.freeze(a, other) }
	}
	for i, a := range holders {
		var f func(*regions.Agent) time.Duration
		if i == 0 {
			var other *regions.Agent
			if run.standby {
				other = standbys[0]
			}
			f = freeze(other)
		}
		tick(a, f)
	}
	for i, a := range standbys {
		var f func(*regions.Agent) time.Duration
		if i == 0 {
			f = freeze(holders[0])
		}
		tick(a, f)
	}
	var (
		pmu    sync.Mutex
		procs  []*regions.Process
		stores []procStore // the processes' stores, for the trace's lost races
	)
	d.Timeout = times.Deadline
	rep := tableReport{sharesReport: sharesReport{start: time.Now()}}
	var samples []shareSample
	if run.trace {
		wg.Go(func() {
			t := time.NewTicker(shareTick)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				s := shareSample{at: time.Since(rep.start)}
				for _, a := range holders {
					o, p := a.Share()
					s.owned, s.pending = append(s.owned, o), append(s.pending, p)
					st := a.Stats()
					s.demand, s.held = append(s.demand, st.Demand), append(s.held, st.Held)
					s.took, s.usual = append(s.took, st.Took), append(s.usual, st.UsualTook)
				}
				s.lost = make([]int64, len(holders))
				pmu.Lock()
				for _, ps := range stores {
					s.lost[ps.region] += ps.st.Stats().Conflicts
				}
				pmu.Unlock()
				samples = append(samples, s)
			}
		})
	}
	if run.sizes != nil {
		wg.Go(func() { run.sizes.run(ctx, tb, table, d.Name, eps) })
	}
	requests := run.requests
	if requests == nil {
		requests = regionsGates{g}.requests
	}
	var gates *gateKinds
	if g != nil && run.requests == nil {
		gates = &gateKinds{g: g}
	}
	if z := run.sizes; z != nil {
		// The size sampler's reads pass the gates: not the run's.
		gated := requests
		requests = func() int { return gated() - int(z.sent.Load()) }
	}
	rep.regionReport = runRegions(tb, table, eps, kc.marking(requests, gates), run.raw, d, func(i int, _ *dynamo.Store) limiter.Limiter {
		// The process's own store, as runRegions makes it, with a
		// counter of its requests.
		st, err := dynamo.New(newClient(eps[i], kc.procSteps.middleware), dynamo.Config{Table: table, Timeout: d.Timeout, CrossRegion: d.MRSC})
		if err != nil {
			tb.Fatal(err)
		}
		p, err := regions.NewProcess(cfg, tt(i, &kc.procTable), st)
		if err != nil {
			tb.Fatal(err)
		}
		pmu.Lock()
		procs = append(procs, p)
		stores = append(stores, procStore{i, st})
		pmu.Unlock()
		return p
	})
	cancel()
	wg.Wait()
	for i, a := range holders {
		rep.agents = append(rep.agents, a.Stats())
		rep.holders = append(rep.holders, a.TableStats())
		rep.holderStats = append(rep.holderStats, a.Stats())
		if run.standby {
			rep.standbys = append(rep.standbys, standbys[i].TableStats())
			rep.standbyStats = append(rep.standbyStats, standbys[i].Stats())
			if standbys[i].Holds() {
				rep.agents[i] = standbys[i].Stats()
			}
		}
	}
	for _, p := range procs {
		s := p.Stats()
		rep.procs.Reads += s.Reads
		rep.procs.Flushes += s.Flushes
		rep.procs.Stale += s.Stale
		rep.procs.Fenced += s.Fenced
		rep.procs.Cached += s.Cached
		rep.procs.Unshared += s.Unshared
		rep.leaseStats = rep.leaseStats.Add(p.LeaseStats())
	}
	// RunHot tells a decision answered from a lease or the deny cache
	// by its Outcome, which a Process's decisions (a limiter of its own,
	// not a store's step) do not carry, and sums the processes' lease
	// counts at each phase's end (twice the first phase's where demand
	// moves): the processes' own counts, once.
	rep.leased, rep.cached, rep.leases = rep.leaseStats.Decisions, rep.procs.Cached, rep.leaseStats
	rep.tableWrites = kc.procTable.update.Load() + kc.agentTable.update.Load()
	rep.tableWCU = float64(kc.procTable.wcuMilli.Load()+kc.agentTable.wcuMilli.Load()) / 1000
	rep.kinds = kc.kinds(gates)
	for _, ps := range stores {
		st := ps.st.Stats()
		rep.kinds.conflicts += st.Conflicts
		rep.kinds.storeReads += st.Reads
	}
	rep.from = rep.start.Add(from)
	rep.fromAdmitted, rep.fromExact = exactAfter(tb, d.Alg, rep.calls, rep.from)
	if run.trace {
		traceRun(tb, d.Alg, rep, samples)
	}
	return rep
}

// shareSample is the holders' shares (without pending grants) and the
// units they withheld for grants, at an instant of a run.
type shareSample struct {
	at             time.Duration
	owned, pending []int64
	demand         []float64
	held           []int64 // the holder's ticks held as slow, so far
	// took and usual: how long the holder's last tick waited on the
	// store (AgentStats.Took), and usually waits.
	took, usual []time.Duration
	// lost: the region's processes' conditional writes that lost so far
	// (their stores' Stats().Conflicts).
	lost []int64
}

// procStore is a process's store and its region.
type procStore struct {
	region int
	st     *dynamo.Store
}

// traceRun logs, for each second of a run: per region the units offered
// and admitted and the holder's share, withheld units, demand estimate and
// ticks held as slow so far (Agent.estimate) at the second's end, the
// longest reads of its ticks sampled in the second against their usual,
// the longest decision of its processes stamped in the second and their
// conditional writes that lost in it (a bucket's takes that keep losing
// hold a decision until its deadline: the processes then ask few calls a
// second); over the union, what was admitted and what exact admitted.
func traceRun(tb testing.TB, alg regionAlg, rep tableReport, samples []shareSample) {
	tb.Helper()
	sec := func(t time.Time) int { return int(t.Sub(rep.start) / time.Second) }
	n := 0
	for _, c := range rep.calls {
		n = max(n, sec(c.Stamp)+1)
	}
	if n <= 0 {
		return
	}
	offered, admitted := make([][]int64, n), make([][]int64, n)
	longest := make([][]time.Duration, n) // the longest decision stamped in the second
	for i := range n {
		offered[i], admitted[i], longest[i] = make([]int64, len(rep.byRegion)), make([]int64, len(rep.byRegion)), make([]time.Duration, len(rep.byRegion))
	}
	for r, cs := range rep.byRegion {
		for _, c := range cs {
			if i := sec(c.Stamp); i >= 0 {
				offered[i][r] += c.Cost
				if c.Allowed {
					admitted[i][r] += c.Cost
				}
				longest[i][r] = max(longest[i][r], c.End-c.Start)
			}
		}
	}
	exact := make([]int64, n)
	mem, err := memory.New(memory.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	ex := regionLimiter(tb, cmpAlg(alg), mem, false)
	cs := slices.Clone(rep.calls)
	slices.SortStableFunc(cs, func(a, b limitertest.Call) int { return a.Stamp.Compare(b.Stamp) })
	for _, c := range cs {
		dec, err := ex.AllowN(tb.Context(), c.Key, c.Stamp, c.Cost)
		if err != nil {
			tb.Fatal(err)
		}
		if i := sec(c.Stamp); i >= 0 && dec.Allowed {
			exact[i] += c.Cost
		}
	}
	var lines []string
	for i := range n {
		line := fmt.Sprintf("trace %2ds:", i)
		var adm int64
		for r := range rep.byRegion {
			var s, before shareSample // the second's last sample, and the one before the second
			var took time.Duration    // the longest wait sampled in the second
			for _, x := range samples {
				if x.at < time.Duration(i)*time.Second {
					before = x
				}
				if x.at < time.Duration(i+1)*time.Second {
					s = x
					if x.at >= time.Duration(i)*time.Second && r < len(x.took) {
						took = max(took, x.took[r])
					}
				}
			}
			o, p, dm, h, usual := int64(-1), int64(-1), -1.0, int64(-1), time.Duration(-1)
			if r < len(s.owned) {
				o, p, dm, h, usual = s.owned[r], s.pending[r], s.demand[r], s.held[r], s.usual[r]
			}
			var lost int64
			if r < len(s.lost) {
				lost = s.lost[r]
				if r < len(before.lost) {
					lost -= before.lost[r]
				}
			}
			line += fmt.Sprintf(" r%d %4d/%4d share %4d-%4d demand %5.1f held %2d waited %4d/%3d ms calls %4d ms lost %4d |", r, admitted[i][r], offered[i][r], o, p, dm, h,
				took.Milliseconds(), usual.Milliseconds(), longest[i][r].Milliseconds(), lost)
			adm += admitted[i][r]
		}
		lines = append(lines, fmt.Sprintf("%s admitted %4d exact %4d", line, adm, exact[i]))
	}
	// To stderr: a benchmark's log is cut after ten lines.
	fmt.Fprintf(os.Stderr, "%s: trace:\n%s\n", tb.Name(), strings.Join(lines, "\n"))
}

// exactAfter replays calls on one serialized limiter and returns what the
// calls and it admitted from stamp from on.
func exactAfter(tb testing.TB, alg regionAlg, calls []limitertest.Call, from time.Time) (got, want int64) {
	tb.Helper()
	mem, err := memory.New(memory.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	exact := regionLimiter(tb, cmpAlg(alg), mem, false)
	cs := slices.Clone(calls)
	slices.SortStableFunc(cs, func(a, b limitertest.Call) int { return a.Stamp.Compare(b.Stamp) })
	for _, c := range cs {
		dec, err := exact.AllowN(tb.Context(), c.Key, c.Stamp, c.Cost)
		if err != nil {
			tb.Fatal(err)
		}
		if !c.Stamp.Before(from) {
			if dec.Allowed {
				want += c.Cost
			}
			if c.Allowed {
				got += c.Cost
			}
		}
	}
	return got, want
}

// checkTable fails tb for any window (interval) of stamps over the limit
// (the bucket's bound) over the union of regions, and for a decision
// that failed other than as an unavailable store (a store request past
// its deadline, or no entry valid at its stamp: the rule's fail mode
// decides those; on the shared machine, whose servers stall for seconds
// at times, some do, and they are logged).
func checkTable(tb testing.TB, rep tableReport) {
	tb.Helper()
	for _, v := range rep.over {
		tb.Errorf("over the limit: %v", v)
	}
	if rep.failed > 0 {
		tb.Logf("%d of %d decisions failed (%d without a valid entry); the first: %v", rep.failed, rep.decisions, rep.procs.Stale, rep.firstErr)
		if rep.firstErr != nil && !errors.Is(rep.firstErr, storage.ErrUnavailable) {
			tb.Errorf("a decision failed with %v, not an unavailable store", rep.firstErr)
		}
	}
}

// takeoverSteps is the demand of takeover-mid-grant: it leaves region 0
// for region 2 in two steps, so that a grant at the first leaves region
// 0 units to give at the second. (In one step, 98/1/1 then 1/1/98, the
// first grant gave all but a few units where region 0 read region 2's
// new demand by the time its own estimate fell, and the successor had
// nothing to give.) Region 0's first grant after the first step waits
// for region 2's new demand (its own fall alone leaves a surplus under
// the hysteresis): 1.8-4.9 s after the step (docs/regions.md), so the
// middle step lasts 5 s.
var takeoverSteps = []regionPhase{
	{Split: shareSplits[3].split, Duration: 4 * time.Second},
	{Split: []float64{0.3, 0.01, 0.69}, Duration: 5 * time.Second},
	{Split: shareSplits[3].then, Duration: 3 * time.Second},
}

// testRegionSharesTable (a part of TestRegionShares, on its harness:
// three regions, lag 1 s): processes and agents that share nothing but
// the table.
//
//   - window/takeover-mid-grant: demand leaving region 0 for region 2 in
//     two steps (98/1/1 for 4 s, 30/1/69 for 5 s, 1/1/98 for 3 s), a
//     standby agent in every region; region 0's holder freezes for
//     2.5 s right after its first tick after the first step that gave
//     a grant (the store fences: a lowering is published, fenced and
//     given in one tick; docs/regions.md, "A fence instead of the
//     wait"), then ticks again. The standby takes the role and gives
//     grants of its own (the units the grant left, at the second
//     step), raising the fence to numbers above its predecessor's; the
//     frozen holder finds the role gone (its write refused, or the
//     item's epoch moved). (Mid-grant, between a lowering's
//     publication and its fence: TestSharesTableFence.)
//   - window/wait: the window's moving split (4 s each way) with agents
//     whose store does not fence (noFence): the lowerings wait a
//     validity and a deadline before their grants ("A store that does
//     not fence"); grants are made, and no lowering is fenced.
//   - bucket: 60/30/10 for 4 s: the shares move (grants, rebases and
//     their carries through the table).
//
// All: no window of stamps over the union of regions is over the limit
// (the bucket's bound); a decision fails only as an unavailable store.
func testRegionSharesTable(t *testing.T, g *testserver.Regions, table string, eps []string) {
	t.Run("table/window/takeover-mid-grant", func(t *testing.T) {
		// Demand leaves region 0 in two steps (takeoverSteps). The
		// holder of region 0's role freezes after its first grant after
		// the first step (the holder, unless a stall moved the role to
		// the standby before): that grant leaves region 0 its target at
		// the middle split, about 300 units, which its successor gives at
		// the second step. The counts of both at the freeze, to compare
		// with the end's.
		d := regionDemand{Name: "rt/window/move", Split: takeoverSteps[0].Split, Rate: 1.2 * regionRate, Duration: takeoverSteps[0].Duration,
			More: takeoverSteps[1:]}
		var (
			mu             sync.Mutex
			moved          []time.Time // the steps' starts
			frozen, other  *regions.Agent
			last           map[*regions.Agent]int64 // an agent's grants at its last tick after the first step
			otherAt        regions.TableStats
			otherGrants    int64
			otherGivenAt   int64
			frozenLostAt   int64
			frozenFencedAt int64
			shareAt        int64         // region 0's share left after the frozen holder's grant
			frozeAt        time.Duration // the freeze, after the first step
		)
		last = map[*regions.Agent]int64{}
		d.Began = func(phase int, at time.Time) {
			mu.Lock()
			defer mu.Unlock()
			if phase > 0 {
				moved = append(moved, at)
			}
		}
		freeze := func(a, o *regions.Agent) time.Duration {
			mu.Lock()
			defer mu.Unlock()
			if len(moved) == 0 || frozen != nil || o == nil || !a.Holds() {
				return 0
			}
			// A grant in a tick that started after the step: the tick
			// before ended after it.
			g := a.Stats().Grants
			prev, ok := last[a]
			last[a] = g
			if !ok || g <= prev {
				return 0
			}
			frozen, other = a, o
			otherAt, otherGrants, otherGivenAt = o.TableStats(), o.Stats().Grants, o.Stats().Given
			frozenLostAt, frozenFencedAt = a.TableStats().Lost, a.TableStats().Fenced
			shareAt, _ = a.Share()
			frozeAt = time.Since(moved[0])
			// Past the role's life: LockLife after the save, plus as long
			// again as the tick took (at most LockLife), and a standby's
			// tick.
			return 2500 * time.Millisecond
		}
		rep := runRegionSharesTable(t, g, table, eps, d, 0, tableRun{standby: true, freeze: freeze})
		t.Logf("%v", rep)
		checkTable(t, rep)
		mu.Lock()
		defer mu.Unlock()
		if frozen == nil {
			t.Fatalf("region 0's agent holding the role never gave a grant after the first step: no takeover")
		}
		fs, os := frozen.TableStats(), other.TableStats()
		t.Logf("region 0's holder froze %v after the first step (the second %v after it), its share left %d; the successor gave %d units in %d grants after",
			frozeAt.Round(time.Millisecond), moved[len(moved)-1].Sub(moved[0]).Round(time.Millisecond), shareAt,
			other.Stats().Given-otherGivenAt, other.Stats().Grants-otherGrants)
		if os.Takeovers == otherAt.Takeovers || frozenFencedAt == 0 || os.Raises == otherAt.Raises || other.Stats().Grants == otherGrants {
			t.Errorf("region 0's successor: %+v (at the freeze %+v), grants %d (%d at the freeze); frozen holder fenced %d lowerings: want fenced lowerings before, and a takeover, fences raised and grants after",
				os, otherAt, other.Stats().Grants, otherGrants, frozenFencedAt)
		}
		if fs.Lost == frozenLostAt {
			t.Errorf("region 0's frozen holder never found the role gone: %+v", fs)
		}
	})
	t.Run("table/window/wait", func(t *testing.T) {
		d := regionDemand{Name: "rt/window/wait", Split: shareSplits[3].split, Then: shareSplits[3].then, Rate: 1.2 * regionRate, Duration: 4 * time.Second}
		rep := runRegionSharesTable(t, g, table, eps, d, 0, tableRun{noFence: true})
		t.Logf("%v", rep)
		checkTable(t, rep)
		var grants, fenced, raises int64
		for i, a := range rep.agents {
			grants += a.Grants
			fenced += rep.holders[i].Fenced
			raises += rep.holders[i].Raises
		}
		if grants == 0 || fenced != 0 || raises != 0 {
			t.Errorf("%d grants, %d lowerings fenced, %d fences raised: want grants by the wait, none fenced", grants, fenced, raises)
		}
	})
	t.Run("table/bucket/60/30/10", func(t *testing.T) {
		d := regionDemand{Name: "rt/bucket/60/30/10", Split: shareSplits[1].split, Rate: 1.2 * regionRate, Duration: 4 * time.Second, Alg: regionAlgBucket}
		rep := runRegionSharesTable(t, g, table, eps, d, 0, tableRun{})
		t.Logf("%v", rep)
		checkTable(t, rep)
		var grants, carries int64
		for i, a := range rep.agents {
			grants += a.Grants
			carries += rep.holders[i].Carries
		}
		if grants == 0 || carries == 0 {
			t.Errorf("%d grants, %d carries: the shares did not move", grants, carries)
		}
	})
}

// envDurations is the comma-separated durations in the environment
// variable key, or def if it is unset.
func envDurations(tb testing.TB, key string, def ...time.Duration) []time.Duration {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	var ds []time.Duration
	for _, f := range strings.Split(v, ",") {
		d, err := time.ParseDuration(f)
		if err != nil || d <= 0 {
			tb.Fatalf("%s: %q is not a duration", key, f)
		}
		ds = append(ds, d)
	}
	return ds
}

// BenchmarkRegionSharesTable compares, in one run on one default-mode
// harness (lag 1 s, 1.2 times the steady rate, -benchtime=1x), the shares
// whose processes reach their agent in memory ("memory", as
// BenchmarkRegionShares) with the shares through the table ("table"):
// per limit and split, 30 s (the moving split 15 s each way). Metrics as
// BenchmarkRegionShares's, and for the table the processes' reads of
// their region's item a decision (those that carried demand: flushes),
// and the decisions failed (no valid entry, or a store request past the
// 1 s deadline). SLUICE_SHARES_TIMES sets other table times
// (benchTableTimes); SLUICE_SHARES_TRACE=1 logs each table run second by
// second (traceRun); SLUICE_SHARES_MOVES lists the lengths of the moving
// split's runs (default 30s; any other, e.g. "30s,60s", is named
// .../<split>/<length>/<path>), SLUICE_SHARES_STEADY those of the
// steady splits' (the same); SLUICE_SHARES_LEASES=0 runs the table
// path without leases, SLUICE_SHARES_NOFENCE=1 with agents whose store
// does not fence buckets (noBucketFence), SLUICE_SHARES_OFFERS=1 with
// offers (Config.Offers: a bucket's; a window's table agents ignore it);
// SLUICE_SHARES_FENCE_RAISES=1 with a bucket's raises fenced
// (Table.FenceRaises); SLUICE_SHARES_PATH=table (or memory) runs that
// path only.
// The table's write units (ReturnConsumedCapacity on the agents' and
// processes' writes to the regions' items) are reported a decision and a
// write; a table row logs its store requests by sender and kind, and at
// the gates by region, operation and status (tableKinds), and its
// processes' lease counts.
func BenchmarkRegionSharesTable(b *testing.B) {
	g, table, eps := startEventual(b)
	times := benchTableTimes(b)
	moves := envDurations(b, "SLUICE_SHARES_MOVES", 30*time.Second)
	steady := envDurations(b, "SLUICE_SHARES_STEADY", 30*time.Second)
	if v := os.Getenv("SLUICE_SHARES_BURST"); v != "" {
		// A bucket that holds more than a replication lag of its refill:
		// a grant in transit no longer fills up with its refill, so what
		// its giver saved (the tokens it carries) counts.
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			b.Fatalf("SLUICE_SHARES_BURST: %q is not a duration of 1s or more (the refill the bucket holds)", v)
		}
		old := regionBucket
		regionBucket.MaxAmount = int64(d.Seconds() * regionRate)
		b.Cleanup(func() { regionBucket = old })
	}
	b.Logf("table times: refresh %v, flush %v, validity %v, deadline %v, lock life %v; bucket of %d", times.Refresh, times.Flush, times.Validity, times.Deadline, times.LockLife, regionBucket.MaxAmount)
	name := func(split string, d time.Duration) string {
		if d == 30*time.Second {
			return split
		}
		return fmt.Sprintf("%s/%gs", split, d.Seconds())
	}
	var runs []shareRun
	for _, r := range shareRuns(moves, name) {
		if r.then != nil {
			runs = append(runs, r)
			continue
		}
		for _, d := range steady {
			runs = append(runs, shareRun{name(r.name, d), r.split, nil, d})
		}
	}
	for _, alg := range []regionAlg{regionAlgWindow, regionAlgBucket} {
		for _, s := range runs {
			for _, path := range []string{"memory", "table"} {
				if p := os.Getenv("SLUICE_SHARES_PATH"); p != "" && p != path {
					continue
				}
				b.Run(string(alg)+"/"+s.name+"/"+path, func(b *testing.B) {
					for i := range b.N {
						d := regionDemand{Name: fmt.Sprintf("rst/%s/%s/%s/%d-%d", alg, s.name, path, i, time.Now().UnixNano()), Split: s.split, Then: s.then,
							Rate: 1.2 * regionRate, Duration: s.dur, Alg: alg}
						if s.then != nil {
							d.Duration /= 2
						}
						if path == "memory" {
							rep := runRegionShares(b, g, table, eps, d, 10*time.Second)
							b.Logf("%s %s/%s: %v", path, alg, s.name, rep)
							reportRegions(b, rep.regionReport)
							b.ReportMetric(rep.fromShare(), "exact-share-after-10s")
							checkShares(b, rep)
							continue
						}
						sizes := &itemSizes{}
						rep := runRegionSharesTable(b, g, table, eps, d, 10*time.Second, tableRun{trace: os.Getenv("SLUICE_SHARES_TRACE") != "", times: &times,
							offers: os.Getenv("SLUICE_SHARES_OFFERS") == "1", sizes: sizes})
						b.Logf("%s %s/%s: %v", path, alg, s.name, rep)
						b.Logf("%s %s/%s: item sizes (bytes, mean and max over the regions' items sampled each second): %v", path, alg, s.name, sizes)
						rr := rep.regionReport
						rr.failed = 0 // reported below, and checked by checkTable
						reportRegions(b, rr)
						b.ReportMetric(rep.fromShare(), "exact-share-after-10s")
						b.ReportMetric(float64(rep.procs.Reads)/float64(rep.decisions), "item-reads/decision")
						b.ReportMetric(float64(rep.procs.Flushes)/float64(rep.decisions), "demand-writes/decision")
						b.ReportMetric(float64(rep.failed), "failed")
						b.ReportMetric(float64(rep.procs.Stale), "stale")
						b.ReportMetric(rep.tableWCU/float64(rep.decisions), "table-WCU/decision")
						b.ReportMetric(rep.tableWCU/float64(max(rep.tableWrites, 1)), "WCU/table-write")
						checkTable(b, rep)
					}
				})
			}
		}
	}
	b.Logf("replication: %+v", g.Stats())
}

// kindCounters count a table run's store requests at the clients, each
// attempt (SDK retries and lost conditional writes included), by sender:
// the processes' steps on their region's bucket or window items
// (procSteps), their reads of their region's entry (procTable: GetItem,
// or UpdateItem with demand), the agents' requests to the regions' table
// items (agentTable) and to a bucket's items (agentStore: a new item's
// first take, carries, the old item's reads and returns).
type kindCounters struct {
	procSteps, procTable, agentTable, agentStore requests
	// at are the counts at the first call of the marking func (the
	// run's start), end at the second (its end).
	at, end tableKinds
	calls   int
}

// tableKinds are a run's store requests by kind (kindCounters), and,
// from the gates (gateKinds), the requests the regions' endpoints
// received by operation and HTTP status (the benchmark's item size
// sampler's GetItem among them, which the run's count leaves out).
type tableKinds struct {
	steps, stepsFailed, stepsGet, stepsOther int64 // the processes' UpdateItem (failed), GetItem, others on their items
	entryReads, demandWrites, tableFailed    int64 // the processes' GetItem and UpdateItem of their region's entry (failed)
	agentTable, agentStore                   int64
	// conflicts and storeReads: the processes' stores' own counts
	// (dynamo.Stats: conditional writes lost, consistent reads).
	conflicts, storeReads int64
	gates                 map[string]int // "op status" at the gates
}

func (c *kindCounters) snapshot() tableKinds {
	return tableKinds{
		steps: c.procSteps.update.Load(), stepsFailed: c.procSteps.failed.Load(), stepsGet: c.procSteps.get.Load(),
		stepsOther: c.procSteps.total.Load() - c.procSteps.update.Load() - c.procSteps.get.Load(),
		entryReads: c.procTable.get.Load(), demandWrites: c.procTable.update.Load(), tableFailed: c.procTable.failed.Load(),
		agentTable: c.agentTable.total.Load(), agentStore: c.agentStore.total.Load(),
	}
}

// marking returns requests (runRegions' count of the run's requests),
// snapshotting the counters (and the gates', if set) as it is called at
// the run's start and end.
func (c *kindCounters) marking(requests func() int, gates *gateKinds) func() int {
	return func() int {
		n := requests()
		switch c.calls {
		case 0:
			c.at = c.snapshot()
			gates.mark()
		case 1:
			c.end = c.snapshot()
			gates.count()
		}
		c.calls++
		return n
	}
}

// kinds is the run's counts: from the start's snapshot to the end's.
func (c *kindCounters) kinds(gates *gateKinds) tableKinds {
	a, b := c.at, c.end
	k := tableKinds{
		steps: b.steps - a.steps, stepsFailed: b.stepsFailed - a.stepsFailed, stepsGet: b.stepsGet - a.stepsGet, stepsOther: b.stepsOther - a.stepsOther,
		entryReads: b.entryReads - a.entryReads, demandWrites: b.demandWrites - a.demandWrites, tableFailed: b.tableFailed - a.tableFailed,
		agentTable: b.agentTable - a.agentTable, agentStore: b.agentStore - a.agentStore,
	}
	if gates != nil {
		k.gates = gates.ops
	}
	return k
}

func (k tableKinds) total() int64 {
	return k.steps + k.stepsGet + k.stepsOther + k.entryReads + k.demandWrites + k.agentTable + k.agentStore
}

// per formats the counts, each also a decision.
func (k tableKinds) per(decisions int64) string {
	d := float64(max(decisions, 1))
	f := func(n int64) string { return fmt.Sprintf("%d (%.3f)", n, float64(n)/d) }
	s := fmt.Sprintf("processes' steps %s, of them lost %s (their stores' conflicts %d), their GetItem %s (their stores' reads %d), other %s; "+
		"entry reads %s, with demand %s (failed %d); agents: table items %s, bucket items %s; all %s",
		f(k.steps), f(k.stepsFailed), k.conflicts, f(k.stepsGet), k.storeReads, f(k.stepsOther), f(k.entryReads), f(k.demandWrites), k.tableFailed,
		f(k.agentTable), f(k.agentStore), f(k.total()))
	if k.gates != nil {
		s += "; at the gates: " + gateString(k.gates)
	}
	return s
}

// gateString formats a gateKinds count: the total, then by region,
// operation and status.
func gateString(ops map[string]int) string {
	var n int
	var parts []string
	for _, op := range slices.Sorted(maps.Keys(ops)) {
		parts = append(parts, fmt.Sprintf("%s %d", op, ops[op]))
		n += ops[op]
	}
	return fmt.Sprintf("%d: %s", n, strings.Join(parts, ", "))
}

// gateKinds counts the requests the regions' gates received between two
// marks, by operation and HTTP status.
type gateKinds struct {
	g     *testserver.Regions
	marks []int
	ops   map[string]int
}

// marking returns requests, marking the gates at its first call (the
// run's start) and counting at its second (its end).
func (gk *gateKinds) marking(requests func() int) func() int {
	calls := 0
	return func() int {
		n := requests()
		switch calls {
		case 0:
			gk.mark()
		case 1:
			gk.count()
		}
		calls++
		return n
	}
}

func (gk *gateKinds) mark() {
	if gk == nil {
		return
	}
	for i := range gk.g.Len() {
		gk.marks = append(gk.marks, gk.g.Gate(i).Len())
	}
}

func (gk *gateKinds) count() {
	if gk == nil {
		return
	}
	gk.ops = map[string]int{}
	for i := range gk.g.Len() {
		for _, r := range gk.g.Gate(i).Since(gk.marks[i]) {
			gk.ops[fmt.Sprintf("r%d %s %d", i, r.Op, r.Status)]++
		}
	}
}
