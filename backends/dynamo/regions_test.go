package dynamo_test

import (
	"cmp"
	"context"
	"fmt"
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

// A global sliding window with leases, decided in three regions of a
// global table on the local harness (internal/testserver, regions.go;
// docs/regions.md): the default mode (asynchronous replication, lag 1 s,
// last writer wins) and MRSC (one copy, 40 ms added to every request).
// The window is 250 a second as 1,000 per 4 s in four sub-window counters
// of a second, so that a slot-bound lease lives long enough to pay.
const (
	regionLimit    = 1000
	regionWindow   = 4 * time.Second
	regionSubs     = 4
	regionProcs    = 4 // processes (limiters with their own store) per region
	regionLatency  = 40 * time.Millisecond
	regionRawEvery = 20 * time.Millisecond
	// regionTimeout bounds a decision: the shared machine stalls the
	// servers for seconds at times (a region's gate then holds its writes
	// while a replicated put waits: Stats().MaxHold reached 2 s at a load
	// of 20 on 2 cores).
	regionTimeout = 10 * time.Second
)

// regionRate is the most decisions a second the window admits steadily:
// the bounded estimator counts the current sub-window and the k before
// it, so the limit spans a window and a sub-window.
const regionRate = regionLimit / float64(regionWindow+regionWindow/regionSubs) * float64(time.Second)

// regionAlg is a global limit's algorithm in the runs: the window above,
// or a token bucket of the same steady rate (a second's burst).
type regionAlg string

const (
	regionAlgWindow regionAlg = "window"
	regionAlgBucket regionAlg = "bucket"
)

// regionBucket is the bucket: regionRate a second, refilled every 10 ms.
var regionBucket = limiter.TokenBucketConfig{Name: "global", MaxAmount: int64(regionRate), RefillTime: 10 * time.Millisecond,
	RefillAmount: int64(regionRate) / 100}

func regionLimiter(tb testing.TB, alg regionAlg, st any, leases bool) limiter.Limiter {
	tb.Helper()
	var l limiter.Limiter
	var err error
	switch alg {
	case regionAlgBucket:
		cfg := regionBucket
		cfg.Leases = leases
		l, err = limiter.NewTokenBucket(st.(limiter.BucketStore), cfg)
	default:
		l, err = limiter.NewSlidingWindow(st.(limiter.Counter), limiter.SlidingWindowConfig{Name: "global", Limit: regionLimit, Window: regionWindow,
			SubWindows: regionSubs, Representation: limiter.SubWindowCounters, Leases: leases})
	}
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// regionDemand is one run's offered load, on the key Name: Rate
// decisions a second over all regions, split between them by Split, for Duration; Prefill units
// taken in region 0 at the start (so that the limit binds sooner).
type regionDemand struct {
	Name     string
	Split    []float64
	Rate     float64
	Duration time.Duration
	Prefill  int64
	// Then, if set, is the split of a second phase as long as the
	// first, right after it, on the same processes: demand that moves.
	Then []float64
	// Alg is the limit's algorithm (the window by default).
	Alg regionAlg
}

// regionReport is what became of a run's decisions over the union of
// regions.
type regionReport struct {
	alg                      regionAlg
	calls                    []limitertest.Call
	byRegion                 [][]limitertest.Call
	decisions                int64
	admitted, leased, failed int64
	firstErr                 error
	// exact is what one serialized limiter admits on the same calls.
	exact int64
	// over are the windows (intervals) of stamps over the limit (the
	// bucket's bound); worst the most units admitted in one window of
	// stamps (the window only).
	over  []limitertest.Violation
	worst int64
	// requests is the store requests the regions' endpoints received.
	requests int
	// p50 is the median decision latency (p50Allowed: of the admitted
	// ones; p99 the 99th percentile), p50Raw the median of a plain
	// UpdateItem in one region measured meanwhile (MRSC only).
	p50, p50Allowed, p99, p50Raw time.Duration
}

func (r regionReport) share() float64 { return float64(r.admitted) / float64(max(r.exact, 1)) }

func (r regionReport) String() string {
	s := fmt.Sprintf("%s: %d decisions, %d admitted (%d from leases), exact %d: %.3f of exact; ", r.alg, r.decisions, r.admitted, r.leased, r.exact, r.share())
	if r.alg == regionAlgBucket {
		s += fmt.Sprintf("%d intervals over the bound", len(r.over))
	} else {
		s += fmt.Sprintf("worst window %d of %d (%d windows over)", r.worst, regionLimit, len(r.over))
	}
	s += fmt.Sprintf("; %d store requests (%.3f a decision)", r.requests, float64(r.requests)/float64(r.decisions))
	if r.p50Raw > 0 {
		s += fmt.Sprintf("; p50 %v (admitted %v, p99 %v), regional round trip %v: p50 %.3fx", r.p50.Round(time.Microsecond), r.p50Allowed.Round(time.Microsecond),
			r.p99.Round(time.Millisecond), r.p50Raw.Round(time.Microsecond), float64(r.p50)/float64(r.p50Raw))
	}
	if r.failed > 0 {
		s += fmt.Sprintf("; %d failed, the first: %v", r.failed, r.firstErr)
	}
	return s
}

// runRegions runs demand on the regions' endpoints, regionProcs
// processes per region (each its own client, store and leases), and
// checks the decisions over the union of regions. requests returns the
// store requests so far; raw, if set, is a regional round trip, timed
// every regionRawEvery during the run.
//
// newProc, if set, makes region i's process limiters on their stores (and
// then the run has no prefill); otherwise they are d.Alg's with leases.
func runRegions(tb testing.TB, table string, endpoints []string, requests func() int, raw func(ctx context.Context) error, d regionDemand,
	newProc func(region int, st *dynamo.Store) limiter.Limiter) regionReport {
	tb.Helper()
	ctx := tb.Context()
	procs := make([][]limiter.Limiter, len(endpoints))
	for i, ep := range endpoints {
		for range regionProcs {
			st, err := dynamo.New(newClient(ep), dynamo.Config{Table: table, Timeout: regionTimeout})
			if err != nil {
				tb.Fatal(err)
			}
			if newProc != nil {
				procs[i] = append(procs[i], newProc(i, st))
			} else {
				procs[i] = append(procs[i], regionLimiter(tb, d.Alg, st, true))
			}
		}
	}
	mark := requests()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		rep   = regionReport{alg: cmp.Or(d.Alg, regionAlgWindow), byRegion: make([][]limitertest.Call, len(endpoints))}
		raws  []time.Duration
		stopc = make(chan struct{})
	)
	if raw != nil {
		wg.Go(func() {
			tick := time.NewTicker(regionRawEvery)
			defer tick.Stop()
			for {
				select {
				case <-stopc:
					return
				case <-tick.C:
				}
				start := time.Now()
				if err := raw(ctx); err != nil {
					tb.Error(err)
					return
				}
				mu.Lock()
				raws = append(raws, time.Since(start))
				mu.Unlock()
			}
		})
	}
	phase := func(split []float64, prefill int64) {
		var runs sync.WaitGroup
		for i, ls := range procs {
			if split[i] == 0 {
				continue
			}
			opt := limitertest.HotOptions{Key: d.Name, Rate: d.Rate * split[i], Duration: d.Duration}
			if i == 0 && prefill > 0 && newProc == nil {
				st, err := dynamo.New(newClient(endpoints[0]), dynamo.Config{Table: table, Timeout: regionTimeout})
				if err != nil {
					tb.Fatal(err)
				}
				opt.Prefill, opt.Prefiller = prefill, regionLimiter(tb, d.Alg, st, false)
			}
			runs.Go(func() {
				h := limitertest.RunHot(ctx, ls, opt)
				mu.Lock()
				defer mu.Unlock()
				rep.calls = append(rep.calls, h.Calls...)
				rep.byRegion[i] = append(rep.byRegion[i], h.Calls...)
				rep.admitted += h.Admitted
				rep.leased += h.Leased
				rep.failed += h.Failed
				if rep.firstErr == nil {
					rep.firstErr = h.FirstErr
				}
			})
		}
		runs.Wait()
	}
	phase(d.Split, d.Prefill)
	if d.Then != nil {
		phase(d.Then, 0)
	}
	close(stopc)
	wg.Wait()
	rep.requests = requests() - mark

	var lat, latAllowed []time.Duration
	for _, c := range rep.calls {
		if c.Worker < 0 {
			continue // the prefill
		}
		rep.decisions++
		lat = append(lat, c.End-c.Start)
		if c.Allowed {
			latAllowed = append(latAllowed, c.End-c.Start)
		}
	}
	rep.p50, rep.p50Allowed, rep.p50Raw = p50(lat), p50(latAllowed), p50(raws) // sorts lat
	if len(lat) > 0 {
		rep.p99 = lat[len(lat)*99/100]
	}
	mem, err := memory.New(memory.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	if rep.exact, err = limitertest.ExactAdmitted(ctx, regionLimiter(tb, d.Alg, mem, false), rep.calls); err != nil {
		tb.Fatal(err)
	}
	if d.Alg == regionAlgBucket {
		rep.over = limitertest.CheckBucketBound(rep.calls, regionBucket)
		return rep
	}
	rep.over = limitertest.CheckTrailingWindow(rep.calls, regionLimit, regionWindow)
	for _, v := range limitertest.CheckTrailingWindow(rep.calls, 0, regionWindow) {
		rep.worst = max(rep.worst, v.Units) // every window of stamps with an admission
	}
	return rep
}

// startEventual starts the default-mode harness with a replicated table.
func startEventual(tb testing.TB) (*testserver.Regions, string, []string) {
	tb.Helper()
	g := testserver.StartRegions(tb, testserver.RegionsConfig{Lag: time.Second})
	table := fmt.Sprintf("sluice-regions-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(tb.Context(), time.Minute)
	defer cancel()
	eps := make([]string, g.Len())
	for i := range eps {
		eps[i] = g.Endpoint(i)
		if err := dynamo.CreateTable(ctx, newClient(eps[i]), table); err != nil {
			tb.Fatal(err)
		}
	}
	if err := g.Replicate(ctx, table); err != nil {
		tb.Fatal(err)
	}
	// Warm the new servers (a JVM's first requests are slow) and the
	// replicator.
	for i, ep := range eps {
		c := newClient(ep)
		for j := range 200 {
			if err := rawUpdateOn(ctx, c, table, fmt.Sprintf("warm-%d", (i+j)%3)); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := g.Settle(ctx); err != nil {
		tb.Fatal(err)
	}
	return g, table, eps
}

func (g regionsGates) requests() int {
	n := 0
	for i := range g.Len() {
		n += g.Gate(i).Len()
	}
	return n
}

type regionsGates struct{ *testserver.Regions }

// startMRSC starts the MRSC harness on the shared DynamoDB Local with a
// table of its own, and a regional round trip: a plain UpdateItem through
// a proxy with no added latency.
func startMRSC(tb testing.TB) (*testserver.MRSC, string, []string, func(context.Context) error) {
	tb.Helper()
	local := testserver.DynamoDBLocal(tb)
	sharedEndpoint(tb) // the raw round trip's table
	m := testserver.NewMRSC(tb, local, regionLatency)
	table := fmt.Sprintf("sluice-mrsc-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(tb.Context(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, newClient(local), table); err != nil {
		tb.Fatal(err)
	}
	eps := make([]string, testserver.MRSCRegions)
	for i := range eps {
		eps[i] = m.Endpoint(i)
	}
	regional := newClient(testserver.NewHTTPProxy(tb, local).URL())
	key := limitertest.Key(tb)
	return m, table, eps, func(ctx context.Context) error { return rawUpdate(ctx, regional, key) }
}

// mrscDemands are the MRSC runs of the window: each split under the limit
// (0.8 of its steady rate: every decision admitted, the latency of
// admissions) and over it (1.2, the window prefilled to half: the share
// of exact). all adds 60/30/10, demand moving from one region to another
// (98/1/1 then 1/1/98, over the limit) and the token bucket over the limit
// (98/1/1, 33/33/33).
func mrscDemands(d time.Duration, all bool) []regionDemand {
	rate := regionRate
	type split struct {
		name  string
		split []float64
	}
	splits := []split{{"98/1/1", []float64{0.98, 0.01, 0.01}}, {"33/33/33", []float64{1. / 3, 1. / 3, 1. / 3}}}
	if all {
		splits = append(splits, split{"60/30/10", []float64{0.6, 0.3, 0.1}})
	}
	var ds []regionDemand
	for _, s := range splits {
		ds = append(ds,
			regionDemand{Name: s.name + "/under", Split: s.split, Rate: 0.8 * rate, Duration: d},
			regionDemand{Name: s.name + "/over", Split: s.split, Rate: 1.2 * rate, Duration: d, Prefill: regionLimit / 2})
	}
	if all {
		ds = append(ds, regionDemand{Name: "98/1/1-then-1/1/98/over", Split: splits[0].split, Then: []float64{0.01, 0.01, 0.98},
			Rate: 1.2 * rate, Duration: d / 2, Prefill: regionLimit / 2})
		for _, s := range splits[:2] {
			ds = append(ds, regionDemand{Name: "bucket/" + s.name + "/over", Split: s.split, Rate: 1.2 * rate, Duration: d,
				Prefill: regionBucket.MaxAmount / 2, Alg: regionAlgBucket})
		}
	}
	return ds
}

// TestRegionsMRSCLeases: a global window with leases on an MRSC table
// (three regions, 40 ms added to every request), demand split 98/1/1 and
// 33/33/33, under and over the limit, and a global token bucket with
// leases over it (33/33/33). It asserts that no window (interval) of
// stamps over the union of regions is over the limit (the bucket's bound)
// and no decision failed; it reports the share of exact, the store
// requests per decision and the p50 decision latency against a regional
// round trip measured in the same run (BenchmarkRegionsMRSC reports them
// as metrics).
func TestRegionsMRSCLeases(t *testing.T) {
	if testing.Short() {
		t.Skip("15 s against DynamoDB Local")
	}
	m, table, eps, raw := startMRSC(t)
	ds := append(mrscDemands(3*time.Second, false), regionDemand{Name: "bucket/33/33/33/over", Split: []float64{1. / 3, 1. / 3, 1. / 3},
		Rate: 1.2 * regionRate, Duration: 3 * time.Second, Prefill: regionBucket.MaxAmount / 2, Alg: regionAlgBucket})
	for _, d := range ds {
		t.Run(d.Name, func(t *testing.T) {
			rep := runRegions(t, table, eps, m.Requests, raw, d, nil)
			t.Logf("mrsc %s: %v", d.Name, rep)
			if rep.failed > 0 {
				t.Errorf("%d decisions failed; the first: %v", rep.failed, rep.firstErr)
			}
			for _, v := range rep.over {
				t.Errorf("over the limit: %v", v)
			}
		})
	}
}

// BenchmarkRegionsEventual reports the baseline's figures (one run of
// 10 s per split, each region offering the whole limit's rate where it
// has demand; run with -benchtime=1x): the worst window of stamps as a
// multiple of the limit, the admitted units as a share of exact, and the
// store requests per decision.
func BenchmarkRegionsEventual(b *testing.B) {
	g, table, eps := startEventual(b)
	rate := regionRate
	for _, d := range []regionDemand{
		{Name: "33/33/33", Split: []float64{1. / 3, 1. / 3, 1. / 3}, Rate: 3 * rate},
		{Name: "98/1/1", Split: []float64{0.98, 0.01, 0.01}, Rate: 1.2 * rate},
	} {
		b.Run(d.Name, func(b *testing.B) {
			d.Duration = 10 * time.Second
			for i := range b.N {
				run := d
				run.Name = fmt.Sprintf("%s/%d-%d", d.Name, i, time.Now().UnixNano()) // a key of its own
				rep := runRegions(b, table, eps, regionsGates{g}.requests, nil, run, nil)
				b.Logf("eventual %s: %v", d.Name, rep)
				reportRegions(b, rep)
			}
		})
	}
	b.Logf("replication: %+v", g.Stats())
}

// BenchmarkRegionsMRSC reports the MRSC runs' figures (mrscDemands, 10 s
// each; run with -benchtime=1x): share of exact, the worst window as a
// multiple of the limit (never above 1), store requests per decision, p50
// decision latency in ms and as a multiple of a regional round trip
// measured in the same run, and p99.
func BenchmarkRegionsMRSC(b *testing.B) {
	m, table, eps, raw := startMRSC(b)
	for _, d := range mrscDemands(10*time.Second, true) {
		b.Run(d.Name, func(b *testing.B) {
			for i := range b.N {
				run := d
				run.Name = fmt.Sprintf("%s/%d-%d", d.Name, i, time.Now().UnixNano()) // a key of its own
				rep := runRegions(b, table, eps, m.Requests, raw, run, nil)
				b.Logf("mrsc %s: %v", d.Name, rep)
				reportRegions(b, rep)
				b.ReportMetric(float64(rep.p50.Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(rep.p50Raw.Microseconds())/1000, "p50-regional-ms")
				b.ReportMetric(float64(rep.p50)/float64(rep.p50Raw), "p50-ratio")
				b.ReportMetric(float64(rep.p99.Microseconds())/1000, "p99-ms")
			}
		})
	}
}

func reportRegions(b *testing.B, rep regionReport) {
	b.ReportMetric(rep.share(), "exact-share")
	if rep.alg != regionAlgBucket {
		b.ReportMetric(float64(rep.worst)/regionLimit, "worst-window/limit")
	}
	b.ReportMetric(float64(len(rep.over)), "over")
	b.ReportMetric(float64(rep.requests)/float64(rep.decisions), "requests/decision")
	if rep.failed > 0 {
		b.Errorf("%d decisions failed; the first: %v", rep.failed, rep.firstErr)
	}
}

// sharePeriod is how often a region's share agent runs.
const sharePeriod = 250 * time.Millisecond

// runShares runs demand on the default-mode harness with the global
// window kept as regional shares (internal/regions): per region an agent
// (ticking every sharePeriod, its ledger entry in the table) and
// regionProcs processes deciding against the region's shares in force.
// The processes tell the agent their demand in memory (a deployment would
// publish it through the table).
func runShares(tb testing.TB, g *testserver.Regions, table string, eps []string, d regionDemand) (regionReport, []regions.AgentStats) {
	tb.Helper()
	cfg := regions.Config{Regions: len(eps), Key: d.Name, Limit: regionLimit, Window: regionWindow, SubWindows: regionSubs, Leases: true}
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
	for _, a := range agents {
		wg.Go(func() {
			tick := time.NewTicker(sharePeriod)
			defer tick.Stop()
			for {
				a.Tick(ctx, time.Now()) // errors counted in its stats
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	rep := runRegions(tb, table, eps, regionsGates{g}.requests, nil, d, func(i int, st *dynamo.Store) limiter.Limiter {
		l, err := agents[i].NewLimiter(st)
		if err != nil {
			tb.Fatal(err)
		}
		return l
	})
	cancel()
	wg.Wait()
	stats := make([]regions.AgentStats, len(agents))
	for i, a := range agents {
		stats[i] = a.Stats()
	}
	return rep, stats
}

// TestRegionsEventual runs a global window with leases on one
// default-mode harness (three regions, lag 1 s), in two ways:
//
//   - shared: one key written in every region, demand split evenly and
//     each region offering the whole limit's rate. Each region's
//     conditional writes see its own copy only and whole items replace
//     each other (last writer wins), so the regions together admit up to
//     three times the limit: the test asserts that the history checker
//     over the union of regions finds windows over the limit (it must, or
//     the harness does not replicate as DynamoDB does). This is the
//     baseline regional shares must fix.
//   - shares: the window kept as regional shares (internal/regions),
//     demand 98/1/1 at 1.2 times its steady rate for 8 s: the test asserts
//     that no window of stamps over the union of regions is over the limit
//     (BenchmarkRegionsEventualShares: longer runs, every split).
//
// Both assert that no decision failed.
func TestRegionsEventual(t *testing.T) {
	if testing.Short() {
		t.Skip("three DynamoDB Locals")
	}
	testserver.DynamoDBLocal(t) // skip (or fail under make test) without the servers
	g, table, eps := startEventual(t)
	t.Run("shared", func(t *testing.T) {
		d := regionDemand{Name: "33/33/33", Split: []float64{1. / 3, 1. / 3, 1. / 3}, Rate: 3 * regionRate, Duration: 5 * time.Second}
		rep := runRegions(t, table, eps, regionsGates{g}.requests, nil, d, nil)
		t.Logf("eventual, %s, 3x the limit's rate offered: %v", d.Name, rep)
		t.Logf("replication: %+v", g.Stats())
		if rep.failed > 0 {
			t.Errorf("%d decisions failed; the first: %v", rep.failed, rep.firstErr)
		}
		if len(rep.over) == 0 {
			t.Errorf("no window over the limit: the regions shared the limit, which a default-mode global table cannot do")
		}
		if rep.admitted <= rep.exact {
			t.Errorf("admitted %d, not above the exact %d", rep.admitted, rep.exact)
		}
	})
	t.Run("shares", func(t *testing.T) {
		d := regionDemand{Name: "shares/98/1/1", Split: []float64{0.98, 0.01, 0.01}, Rate: 1.2 * regionRate, Duration: 8 * time.Second}
		rep, stats := runShares(t, g, table, eps, d)
		t.Logf("shares, %s: %v", d.Name, rep)
		t.Logf("agents: %+v", stats)
		if rep.failed > 0 {
			t.Errorf("%d decisions failed; the first: %v", rep.failed, rep.firstErr)
		}
		for _, v := range rep.over {
			t.Errorf("over the limit: %v", v)
		}
	})
}

// BenchmarkRegionsEventualShares reports the regional shares' figures on
// the default-mode harness (lag 1 s, 30 s per run, 1.2 times the steady
// rate; run with -benchtime=1x): share of exact, worst window, requests
// per decision.
func BenchmarkRegionsEventualShares(b *testing.B) {
	g, table, eps := startEventual(b)
	for _, s := range []struct {
		name        string
		split, then []float64
	}{
		{"98/1/1", []float64{0.98, 0.01, 0.01}, nil},
		{"60/30/10", []float64{0.6, 0.3, 0.1}, nil},
		{"33/33/33", []float64{1. / 3, 1. / 3, 1. / 3}, nil},
		{"98/1/1-then-1/1/98", []float64{0.98, 0.01, 0.01}, []float64{0.01, 0.01, 0.98}},
	} {
		b.Run(s.name, func(b *testing.B) {
			for i := range b.N {
				d := regionDemand{Name: fmt.Sprintf("shares/%s/%d-%d", s.name, i, time.Now().UnixNano()), Split: s.split, Then: s.then,
					Rate: 1.2 * regionRate, Duration: 30 * time.Second}
				if s.then != nil {
					d.Duration /= 2
				}
				rep, stats := runShares(b, g, table, eps, d)
				b.Logf("shares %s: %v; agents %+v", s.name, rep, stats)
				reportRegions(b, rep)
			}
		})
	}
}

// BenchmarkRegionsEventualSharesPartition: regional shares (33/33/33, 1.2
// times the steady rate, 50 s) with region 2 cut off from replication
// from 10 s to 40 s. It reports the share of exact and the worst window
// over the whole run, and what each region admitted during the partition
// as a share of its demand then (-benchtime=1x).
func BenchmarkRegionsEventualSharesPartition(b *testing.B) {
	g, table, eps := startEventual(b)
	const from, to = 10 * time.Second, 40 * time.Second
	for i := range b.N {
		d := regionDemand{Name: fmt.Sprintf("shares/partition/%d-%d", i, time.Now().UnixNano()), Split: []float64{1. / 3, 1. / 3, 1. / 3},
			Rate: 1.2 * regionRate, Duration: 50 * time.Second}
		begin := time.Now()
		cut := time.AfterFunc(from, func() { g.Partition(2) })
		heal := time.AfterFunc(to, func() { g.Heal(2) })
		rep, stats := runShares(b, g, table, eps, d)
		cut.Stop()
		if heal.Stop() {
			g.Heal(2)
		}
		b.Logf("shares with region 2 cut off %v-%v: %v; agents %+v", from, to, rep, stats)
		reportRegions(b, rep)
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
			b.Logf("region %d during the partition: %d of %d decisions admitted (%.2f a second)", r, got, asked, float64(got)/(to-from).Seconds())
			b.ReportMetric(float64(got)/(to-from).Seconds(), fmt.Sprintf("region%d-admitted/s-cut", r))
		}
	}
}
