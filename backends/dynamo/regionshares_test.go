package dynamo_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/internal/regions"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// Regional shares (internal/regions) of a global window and a global
// token bucket on the default-mode harness (three regions, lag 1 s, last
// writer wins; docs/regions.md, "Default mode with regional shares").
// The limits are regions_test.go's: the window 1,000 per 4 s in four
// sub-window counters (200 a second steadily), the bucket 200 a second
// with a second's burst; both leasing.

// shareTick is how often a region's agent runs.
const shareTick = 250 * time.Millisecond

// shareSplits are the demand splits of the acceptance.
var shareSplits = []struct {
	name        string
	split, then []float64
}{
	{"98/1/1", []float64{0.98, 0.01, 0.01}, nil},
	{"60/30/10", []float64{0.6, 0.3, 0.1}, nil},
	{"33/33/33", []float64{1. / 3, 1. / 3, 1. / 3}, nil},
	{"98/1/1-then-1/1/98", []float64{0.98, 0.01, 0.01}, []float64{0.01, 0.01, 0.98}},
}

// sharesReport is a run's report with the agents' counts and the share
// of exact over the calls stamped from a point on (steady: after the
// shares left the even split they start from).
type sharesReport struct {
	regionReport
	agents []regions.AgentStats
	// peak is each region's largest share after a tick of the run: the
	// end's shares follow the end of the demand (a region whose
	// processes finish first gives its share away), the peak follows the
	// demand while it runs.
	peak, initial []int64
	start         time.Time
	// from, admitted and exact: the calls stamped at or after from.
	from                    time.Time
	fromAdmitted, fromExact int64
	// gates: the run's requests at the regions' gates by region,
	// operation and HTTP status (the memory path's; gateKinds).
	gates map[string]int
}

func (r sharesReport) fromShare() float64 {
	return float64(r.fromAdmitted) / float64(max(r.fromExact, 1))
}

func (r sharesReport) String() string {
	s := fmt.Sprintf("%v; from +%v: %.3f of exact (%d of %d)", r.regionReport, r.from.Sub(r.start), r.fromShare(), r.fromAdmitted, r.fromExact)
	if r.gates != nil {
		s += "; at the gates: " + gateString(r.gates)
	}
	for i, a := range r.agents {
		s += fmt.Sprintf("; region %d: share %d", i, a.Share)
		if i < len(r.peak) {
			s += fmt.Sprintf(" (peak %d)", r.peak[i])
		}
		s += fmt.Sprintf(", gave %d in %d grants, received %d, rebases %d, ledger errors %d/%d", a.Given, a.Grants, a.Received,
			a.Rebases, a.ReadErrors, a.PublishErrors)
	}
	return s
}

// runRegionShares runs d on the harness with the limit kept as regional
// shares: per region an agent (ticking every shareTick, its ledger entry
// in the table, its own store) and regionProcs processes deciding
// against the region's share. The processes tell the agent their demand
// in memory (a deployment would publish it through the table). from is
// where the steady share of exact starts, after the run's start.
func runRegionShares(tb testing.TB, g *testserver.Regions, table string, eps []string, d regionDemand, from time.Duration) sharesReport {
	tb.Helper()
	cfg := regions.Config{Regions: len(eps), Key: d.Name, Limit: regionLimit, Window: regionWindow, SubWindows: regionSubs, Leases: true}
	if d.Alg == regionAlgBucket {
		b := regionBucket
		cfg = regions.Config{Regions: len(eps), Key: d.Name, Bucket: &b, Leases: true}
	}
	agents := make([]*regions.Agent, len(eps))
	for i, ep := range eps {
		st, err := dynamo.New(newClient(ep), dynamo.Config{Table: table, Timeout: regionTimeout})
		if err != nil {
			tb.Fatal(err)
		}
		a, err := regions.NewAgent(cfg, i, &regions.DynamoLedger{Client: newClient(ep), Table: table, Name: d.Name}, st)
		if err != nil {
			tb.Fatal(err)
		}
		agents[i] = a
	}
	ctx, cancel := context.WithCancel(tb.Context())
	var wg sync.WaitGroup
	peak := make([]int64, len(agents)) // peak[i]: agent i's goroutine only, until wg.Wait
	initial := make([]int64, len(agents))
	for i, a := range agents {
		initial[i] = a.Stats().Share
		wg.Go(func() {
			tick := time.NewTicker(shareTick)
			defer tick.Stop()
			for {
				a.Tick(ctx, time.Now()) // errors counted in its stats
				peak[i] = max(peak[i], a.Stats().Share)
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	rep := sharesReport{start: time.Now(), peak: peak, initial: initial}
	var (
		lmu  sync.Mutex
		lims []*regions.Limiter
	)
	gates := &gateKinds{g: g}
	rep.regionReport = runRegions(tb, table, eps, gates.marking(regionsGates{g}.requests), nil, d, func(i int, st *dynamo.Store) limiter.Limiter {
		l, err := agents[i].NewLimiter(st)
		if err != nil {
			tb.Fatal(err)
		}
		lmu.Lock()
		lims = append(lims, l)
		lmu.Unlock()
		return l
	})
	cancel()
	wg.Wait()
	rep.gates = gates.ops
	// RunHot sums the limiters' lease counts at each phase's end (twice
	// the first phase's where demand moves), and tells a decision
	// answered from a lease by its Outcome, which a Limiter's decisions
	// do not carry: the limiters' own counts, once.
	rep.leases = limiter.LeaseStats{}
	for _, l := range lims {
		rep.leases = rep.leases.Add(l.LeaseStats())
	}
	rep.leased = rep.leases.Decisions
	for _, a := range agents {
		rep.agents = append(rep.agents, a.Stats())
	}
	rep.from = rep.start.Add(from)
	mem, err := memory.New(memory.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	exact := regionLimiter(tb, cmpAlg(d.Alg), mem, false)
	cs := slices.Clone(rep.calls)
	slices.SortStableFunc(cs, func(a, b limitertest.Call) int { return a.Stamp.Compare(b.Stamp) })
	for _, c := range cs {
		dec, err := exact.AllowN(tb.Context(), c.Key, c.Stamp, c.Cost)
		if err != nil {
			tb.Fatal(err)
		}
		if !c.Stamp.Before(rep.from) {
			if dec.Allowed {
				rep.fromExact += c.Cost
			}
			if c.Allowed {
				rep.fromAdmitted += c.Cost
			}
		}
	}
	return rep
}

func cmpAlg(a regionAlg) regionAlg {
	if a == "" {
		return regionAlgWindow
	}
	return a
}

// checkShares fails tb for any window (interval) of stamps over the
// limit (the bucket's bound) over the union of regions, and any failed
// decision.
func checkShares(tb testing.TB, rep sharesReport) {
	tb.Helper()
	if rep.failed > 0 {
		tb.Errorf("%d decisions failed; the first: %v", rep.failed, rep.firstErr)
	}
	for _, v := range rep.over {
		tb.Errorf("over the limit: %v", v)
	}
}

// TestRegionShares: on one default-mode harness (three regions, lag
// 1 s), the window with demand moving from region 0 to region 2
// (98/1/1 for 3 s, then 1/1/98 for 3 s) and, with SLUICE_LONG=1, the
// bucket at 60/30/10 for 4 s, each at 1.2 times the steady rate: no
// window of stamps over the union of regions is over the limit (the
// bucket's bound), no decision failed, and the shares moved (region 2
// held more of the window than it started with; the bucket's regions
// made grants and region 0 held more than a third). Peaks, not the
// end's shares: the regions' processes do not finish together, and a
// region whose demand ended gives its share to those still deciding. The
// share of exact is logged; BenchmarkRegionShares reports it on 30 s runs. The
// table's runs follow (testRegionSharesTable), then the baseline without
// shares (testRegionsEventual: the regions admit over the limit).
func TestRegionShares(t *testing.T) {
	if testing.Short() {
		t.Skip("three DynamoDB Locals")
	}
	testserver.DynamoDBLocal(t) // skip (or fail under make test) without the servers
	g, table, eps := startEventual(t)
	t.Run("window/98/1/1-then-1/1/98", func(t *testing.T) {
		d := regionDemand{Name: "rs/window/move", Split: shareSplits[3].split, Then: shareSplits[3].then, Rate: 1.2 * regionRate, Duration: 3 * time.Second}
		rep := runRegionShares(t, g, table, eps, d, 0)
		t.Logf("%v", rep)
		checkShares(t, rep)
		if s := rep.peak[2]; s <= rep.initial[2] {
			t.Errorf("region 2's share was never above %d (its first %d): the demand moved to it, its share did not", s, rep.initial[2])
		}
	})
	if testserver.Long() {
		// The same demand and bound as table/bucket/60/30/10, which runs
		// it through the table as deployed (docs/testing.md).
		t.Run("bucket/60/30/10", func(t *testing.T) { testAgentBucket(t, g, table, eps) })
	}
	testRegionSharesTable(t, g, table, eps) // the same through the table (regionstable_test.go)
	testRegionsEventual(t, g, table, eps)   // the baseline (regions_test.go)
	t.Logf("replication: %+v", g.Stats())
}

// testAgentBucket is TestRegionShares' bucket at 60/30/10 on agents that
// keep their ledger in DynamoDB (SLUICE_LONG=1).
func testAgentBucket(t *testing.T, g *testserver.Regions, table string, eps []string) {
	d := regionDemand{Name: "rs/bucket/60/30/10", Split: shareSplits[1].split, Rate: 1.2 * regionRate, Duration: 4 * time.Second, Alg: regionAlgBucket}
	rep := runRegionShares(t, g, table, eps, d, 0)
	t.Logf("%v", rep)
	checkShares(t, rep)
	var grants int64
	for _, a := range rep.agents {
		grants += a.Grants
	}
	if grants == 0 || rep.peak[0] <= rep.initial[0] {
		t.Errorf("no grant, or region 0 (60%% of the demand) never held more than %d of %d (its first %d): the shares did not follow the demand",
			rep.peak[0], regionBucket.MaxAmount, rep.initial[0])
	}
}

// shareRun is one run of the regional shares' benchmarks.
type shareRun struct {
	name        string
	split, then []float64
	dur         time.Duration
}

// shareRuns are each steady split (shareSplits) for 30 s and each split
// that moves for every length of moves, named by name.
func shareRuns(moves []time.Duration, name func(split string, d time.Duration) string) []shareRun {
	var runs []shareRun
	for _, s := range shareSplits {
		if s.then == nil {
			runs = append(runs, shareRun{s.name, s.split, nil, 30 * time.Second})
			continue
		}
		for _, d := range moves {
			runs = append(runs, shareRun{name(s.name, d), s.split, s.then, d})
		}
	}
	return runs
}

// BenchmarkRegionShares reports the regional shares' figures on the
// default-mode harness, lag 1 s, 1.2 times the steady rate (run with
// -benchtime=1x): per limit, each split for 30 s, and the split that
// moves (at half time) for 30 s, 60 s and 120 s. Metrics: the share of
// exact over the run and over the calls stamped after its first 10 s
// (steady: the shares start split evenly), the worst window over the
// limit (the window), windows over the limit, store requests per
// decision.
func BenchmarkRegionShares(b *testing.B) {
	g, table, eps := startEventual(b)
	runs := shareRuns([]time.Duration{30 * time.Second, 60 * time.Second, 120 * time.Second},
		func(split string, d time.Duration) string { return fmt.Sprintf("%s/%v", split, d) })
	for _, alg := range []regionAlg{regionAlgWindow, regionAlgBucket} {
		for _, r := range runs {
			b.Run(string(alg)+"/"+r.name, func(b *testing.B) {
				for i := range b.N {
					d := regionDemand{Name: fmt.Sprintf("rs/%s/%s/%d-%d", alg, r.name, i, time.Now().UnixNano()), Split: r.split, Then: r.then,
						Rate: 1.2 * regionRate, Duration: r.dur, Alg: alg}
					if r.then != nil {
						d.Duration /= 2
					}
					rep := runRegionShares(b, g, table, eps, d, 10*time.Second)
					b.Logf("shares %s/%s: %v", alg, r.name, rep)
					reportRegions(b, rep.regionReport)
					b.ReportMetric(rep.fromShare(), "exact-share-after-10s")
					checkShares(b, rep)
				}
			})
		}
	}
	b.Logf("replication: %+v", g.Stats())
}

// BenchmarkRegionSharesPartition: each limit's shares (1.2 times the
// steady rate, 50 s) with region 2 cut off from replication from 10 s to
// 40 s, demand split 33/33/33 throughout ("even"), or 98/1/1 moving to
// 1/1/98 at 25 s, inside the cut ("move-into-cut": the cut-off region
// keeps only what it holds). It reports the share of exact and the
// windows over the limit over the whole run, and what each region
// admitted during the partition, a second and as a share of what it
// asked then (-benchtime=1x).
func BenchmarkRegionSharesPartition(b *testing.B) {
	g, table, eps := startEventual(b)
	const from, to = 10 * time.Second, 40 * time.Second
	for _, alg := range []regionAlg{regionAlgWindow, regionAlgBucket} {
		for _, c := range []struct {
			name        string
			split, then []float64
		}{{"even", shareSplits[2].split, nil}, {"move-into-cut", shareSplits[3].split, shareSplits[3].then}} {
			b.Run(string(alg)+"/"+c.name, func(b *testing.B) {
				for i := range b.N {
					d := regionDemand{Name: fmt.Sprintf("rs/partition/%s/%s/%d-%d", alg, c.name, i, time.Now().UnixNano()), Split: c.split, Then: c.then,
						Rate: 1.2 * regionRate, Duration: 50 * time.Second, Alg: alg}
					if c.then != nil {
						d.Duration /= 2
					}
					begin := time.Now()
					cut := time.AfterFunc(from, func() { g.Partition(2) })
					heal := time.AfterFunc(to, func() { g.Heal(2) })
					rep := runRegionShares(b, g, table, eps, d, 10*time.Second)
					cut.Stop()
					if heal.Stop() {
						g.Heal(2)
					}
					b.Logf("shares %s/%s with region 2 cut off %v-%v: %v", alg, c.name, from, to, rep)
					reportRegions(b, rep.regionReport)
					checkShares(b, rep)
					for r, calls := range rep.byRegion {
						var asked, got int64
						for _, c := range calls {
							if at := c.Stamp.Sub(begin); at >= from && at < to {
								asked++
								if c.Allowed {
									got++
								}
							}
						}
						b.Logf("%s/%s: region %d during the partition: %d of %d decisions admitted (%.1f a second, %.2f of its demand)", alg, c.name, r, got, asked,
							float64(got)/(to-from).Seconds(), float64(got)/float64(max(asked, 1)))
						b.ReportMetric(float64(got)/(to-from).Seconds(), fmt.Sprintf("region%d-admitted/s-cut", r))
					}
				}
			})
		}
	}
}
