package dynamo_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
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
	return scaledLimiter(tb, alg, st, leases, 1)
}

// scaledWindow and scaledBucket are the window's limit and the bucket
// scaled: scale times the units, the same windows and refill times.
func scaledWindow(scale float64) int64 { return int64(float64(regionLimit) * cmp.Or(scale, 1)) }

func scaledBucket(scale float64) limiter.TokenBucketConfig {
	b := regionBucket
	scale = cmp.Or(scale, 1)
	b.MaxAmount, b.RefillAmount = int64(float64(b.MaxAmount)*scale), int64(float64(b.RefillAmount)*scale)
	return b
}

// scaledLimiter is regionLimiter with the limit scaled.
func scaledLimiter(tb testing.TB, alg regionAlg, st any, leases bool, scale float64) limiter.Limiter {
	tb.Helper()
	var l limiter.Limiter
	var err error
	switch alg {
	case regionAlgBucket:
		cfg := scaledBucket(scale)
		cfg.Leases = leases
		l, err = limiter.NewTokenBucket(st.(storage.BucketStore), cfg)
	default:
		l, err = limiter.NewSlidingWindow(st.(storage.Counter), limiter.SlidingWindowConfig{Name: "global", Limit: scaledWindow(scale), Window: regionWindow,
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
	// More are phases after those, each with its split and length:
	// demand that moves in steps.
	More []regionPhase
	// Began, if set, is called as each phase begins (0: the first).
	Began func(phase int, at time.Time)
	// Alg is the limit's algorithm (the window by default).
	Alg regionAlg
	// Scale multiplies the limit (the window's units, the bucket's
	// amounts; 0 means 1): Rate is then to be scaled alike.
	Scale float64
	// Timeout bounds a decision (0 means regionTimeout).
	Timeout time.Duration
	// MRSC: the table is the MRSC harness's; the processes' stores are
	// configured for it (dynamo.Config.CrossRegion: leases sized by the
	// round trip).
	MRSC bool
	// Open: each process's arrivals are an open loop
	// (limitertest.HotOptions.Open).
	Open bool
	// Probe, if set (a bucket's run), is an endpoint of the table read
	// without the harness's proxies: the run is traced (probeBucket).
	Probe string
}

// regionPhase is a phase of a run's demand: its split, for Duration.
type regionPhase struct {
	Split    []float64
	Duration time.Duration
}

// regionReport is what became of a run's decisions over the union of
// regions.
type regionReport struct {
	alg                      regionAlg
	calls                    []limitertest.Call
	byRegion                 [][]limitertest.Call
	decisions                int64
	admitted, leased, failed int64
	// throttled are the decisions denied because the store throttled the
	// key or every write met a conflict (limiter.Outcome.Throttled);
	// cached those the deny cache denied.
	throttled, cached int64
	// leases sums the processes' lease counters (Lost: units taken and
	// never spent nor given back).
	leases   limiter.LeaseStats
	firstErr error
	// exact is what one serialized limiter admits on the same calls.
	exact int64
	// over are the windows (intervals) of stamps over the limit (the
	// bucket's bound); worst the most units admitted in one window of
	// stamps (the window only).
	over  []limitertest.Violation
	worst int64
	// limit is the window's limit (scaled).
	limit int64
	// probes are a traced run's (regionDemand.Probe); throttledAt the
	// throttled decisions' times since start, the run's.
	probes      []probe
	throttledAt []time.Duration
	throttledBy []int64 // per region
	// leasesAfter: the lease counters once every lease was returned.
	leasesAfter limiter.LeaseStats
	start       time.Time
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
		s += fmt.Sprintf("worst window %d of %d (%d windows over)", r.worst, cmp.Or(r.limit, regionLimit), len(r.over))
	}
	s += fmt.Sprintf("; %d store requests (%.3f a decision); %d denied as throttled, %d by the deny cache; leases: %d takes, %d units lost",
		r.requests, float64(r.requests)/float64(r.decisions), r.throttled, r.cached, r.leases.Takes, r.leases.Lost)
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
			st, err := dynamo.New(newClient(ep), dynamo.Config{Table: table, Timeout: cmp.Or(d.Timeout, regionTimeout), CrossRegion: d.MRSC})
			if err != nil {
				tb.Fatal(err)
			}
			if newProc != nil {
				procs[i] = append(procs[i], newProc(i, st))
			} else {
				procs[i] = append(procs[i], scaledLimiter(tb, d.Alg, st, true, d.Scale))
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
	if d.Prefill > 0 && newProc == nil {
		prefill(tb, &rep, d, endpoints[0], table)
	}
	probed := make(chan []probe, 1)
	if d.Probe != "" {
		go func() { probed <- probeBucket(tb, table, d.Probe, d, stopc) }()
	}
	rep.start = time.Now()
	began := 0
	phase := func(split []float64, dur time.Duration) {
		if d.Began != nil {
			d.Began(began, time.Now())
		}
		began++
		var runs sync.WaitGroup
		for i, ls := range procs {
			if split[i] == 0 {
				continue
			}
			opt := limitertest.HotOptions{Key: d.Name, Rate: d.Rate * split[i], Duration: dur, Open: d.Open}
			runs.Go(func() {
				h := limitertest.RunHot(ctx, ls, opt)
				mu.Lock()
				defer mu.Unlock()
				rep.calls = append(rep.calls, h.Calls...)
				rep.byRegion[i] = append(rep.byRegion[i], h.Calls...)
				rep.admitted += h.Admitted
				rep.leased += h.Leased
				rep.failed += h.Failed
				rep.throttled += h.Throttled
				rep.cached += h.Cached
				rep.leases = rep.leases.Add(h.Leases)
				rep.throttledAt = append(rep.throttledAt, h.ThrottledAt...)
				for len(rep.throttledBy) <= i {
					rep.throttledBy = append(rep.throttledBy, 0)
				}
				rep.throttledBy[i] += h.Throttled
				if rep.firstErr == nil {
					rep.firstErr = h.FirstErr
				}
			})
		}
		runs.Wait()
	}
	phase(d.Split, d.Duration)
	if d.Then != nil {
		phase(d.Then, d.Duration)
	}
	for _, p := range d.More {
		phase(p.Split, p.Duration)
	}
	rep.requests = requests() - mark
	if d.Probe != "" {
		returnAll(tb, procs) // the trace's last probe sees no lease
	}
	close(stopc)
	wg.Wait()
	if d.Probe != "" {
		rep.probes = <-probed
		rep.leasesAfter = leasesAfter(procs)
	}

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
	if rep.exact, err = limitertest.ExactAdmitted(ctx, scaledLimiter(tb, d.Alg, mem, false, d.Scale), rep.calls); err != nil {
		tb.Fatal(err)
	}
	rep.limit = scaledWindow(d.Scale)
	if d.Alg == regionAlgBucket {
		rep.over = limitertest.CheckBucketBound(rep.calls, scaledBucket(d.Scale))
		return rep
	}
	rep.over = limitertest.CheckTrailingWindow(rep.calls, rep.limit, regionWindow)
	for _, v := range limitertest.CheckTrailingWindow(rep.calls, 0, regionWindow) {
		rep.worst = max(rep.worst, v.Units) // every window of stamps with an admission
	}
	return rep
}

// prefill takes d.Prefill units of d.Name in region 0 (endpoint) before
// the run, with a limiter of the same limit without leases, retried until
// the store answers (on MRSC a write conflict, or a slow server, could
// otherwise leave the run without it while the exact replay counts it):
// the report's first call (Worker -1).
func prefill(tb testing.TB, rep *regionReport, d regionDemand, endpoint, table string) {
	tb.Helper()
	st, err := dynamo.New(newClient(endpoint), dynamo.Config{Table: table, Timeout: regionTimeout})
	if err != nil {
		tb.Fatal(err)
	}
	l := scaledLimiter(tb, d.Alg, st, false, d.Scale)
	for attempt := 0; ; attempt++ {
		now := time.Now()
		dec, err := l.AllowN(tb.Context(), d.Name, now, d.Prefill)
		if err == nil {
			rep.calls = append(rep.calls, limitertest.Call{Worker: -1, Key: d.Name, Stamp: now, Cost: d.Prefill, Reached: true, Allowed: dec.Allowed})
			rep.byRegion[0] = append(rep.byRegion[0], rep.calls[len(rep.calls)-1])
			if dec.Allowed {
				rep.admitted += d.Prefill
			}
			return
		}
		if attempt == 10 {
			tb.Fatalf("prefill: %v", err)
		}
	}
}

// startEventual starts the default-mode harness with a replicated table,
// and warms it: warmWrites writes to each region (a JVM's first requests
// are slow), replicated to the others (the replicator's first rounds).
// The regions are set up and warmed at once, each region's writes from
// warmWorkers goroutines: the same writes as one after another, sooner.
func startEventual(tb testing.TB) (*testserver.Regions, string, []string) {
	tb.Helper()
	g := testserver.StartRegions(tb, testserver.RegionsConfig{Lag: time.Second})
	table := fmt.Sprintf("sluice-regions-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(tb.Context(), time.Minute)
	defer cancel()
	eps := make([]string, g.Len())
	for i := range eps {
		eps[i] = g.Endpoint(i)
	}
	eachRegion(tb, eps, 1, func(i, _ int, c *dynamodb.Client) error { return dynamo.CreateTable(ctx, c, table) })
	if err := g.Replicate(ctx, table); err != nil {
		tb.Fatal(err)
	}
	eachRegion(tb, eps, warmWorkers, func(i, w int, c *dynamodb.Client) error {
		for j := w; j < warmWrites; j += warmWorkers {
			if err := rawUpdateOn(ctx, c, table, fmt.Sprintf("warm-%d", (i+j)%3)); err != nil {
				return err
			}
		}
		return nil
	})
	if err := g.Settle(ctx); err != nil {
		tb.Fatal(err)
	}
	return g, table, eps
}

// The warm-up of startEventual: writes per region, and the goroutines
// that make them.
const (
	warmWrites  = 200
	warmWorkers = 4
)

// eachRegion runs f(i, w, client of region i) for each region i and each
// w below workers, all at once, and fails tb with their errors.
func eachRegion(tb testing.TB, eps []string, workers int, f func(i, w int, c *dynamodb.Client) error) {
	tb.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(eps)*workers)
	for i, ep := range eps {
		c := newClient(ep)
		for w := range workers {
			wg.Go(func() { errs[i*workers+w] = f(i, w, c) })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		tb.Fatal(err)
	}
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
	for i := range ds {
		ds[i].MRSC = true
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
// as metrics). The runs (keys of their own, paced by the wall clock) go
// two at a time: the store requests logged are then both runs'.
func TestRegionsMRSCLeases(t *testing.T) {
	if testing.Short() {
		t.Skip("15 s against DynamoDB Local")
	}
	m, table, eps, raw := startMRSC(t)
	ds := append(mrscDemands(3*time.Second, false), regionDemand{Name: "bucket/33/33/33/over", Split: []float64{1. / 3, 1. / 3, 1. / 3},
		Rate: 1.2 * regionRate, Duration: 3 * time.Second, Prefill: regionBucket.MaxAmount / 2, Alg: regionAlgBucket, MRSC: true})
	for _, d := range ds {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			rep := runRegions(t, table, eps, m.Requests, raw, d, nil)
			t.Logf("mrsc %s: %v; harness: %v", d.Name, rep, m.Stats())
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
// multiple of the limit (never above 1), store requests, write conflicts
// and decisions denied as throttled per decision, p50 decision latency in
// ms and as a multiple of a regional round trip measured in the same run,
// and p99 (reportMRSC).
func BenchmarkRegionsMRSC(b *testing.B) {
	m, table, eps, raw := startMRSC(b)
	for _, d := range mrscDemands(10*time.Second, true) {
		b.Run(d.Name, func(b *testing.B) {
			for i := range b.N {
				run := d
				run.Name = fmt.Sprintf("%s/%d-%d", d.Name, i, time.Now().UnixNano()) // a key of its own
				if d.Alg == regionAlgBucket && *traceMRSC {
					run.Probe = testserver.DynamoDBLocal(b)
				}
				run.Open = d.Alg == regionAlgBucket && *openMRSC
				mark := m.Stats()
				rep := runRegions(b, table, eps, m.Requests, raw, run, nil)
				reportMRSC(b, m, mark, d.Name, rep)
				logBucketTrace(b, run, rep)
			}
		})
	}
}

// reportMRSC logs and reports an MRSC run's figures: reportRegions',
// the harness's write conflicts per decision since mark, the decisions
// denied as throttled (their writes met conflicts until the retryer gave
// up) per decision, and the p50 and p99 decision latency against a
// regional round trip.
func reportMRSC(b *testing.B, m *testserver.MRSC, mark testserver.MRSCStats, name string, rep regionReport) {
	b.Helper()
	conflicts := conflictsSince(m, mark)
	b.Logf("mrsc %s: %v; %d write conflicts (%.3f a decision)", name, rep, conflicts, float64(conflicts)/float64(rep.decisions))
	reportRegions(b, rep)
	b.ReportMetric(float64(conflicts)/float64(rep.decisions), "conflicts/decision")
	b.ReportMetric(float64(rep.throttled)/float64(rep.decisions), "throttled/decision")
	b.ReportMetric(float64(rep.p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(rep.p50Raw.Microseconds())/1000, "p50-regional-ms")
	b.ReportMetric(float64(rep.p50)/float64(rep.p50Raw), "p50-ratio")
	b.ReportMetric(float64(rep.p99.Microseconds())/1000, "p99-ms")
}

func reportRegions(b *testing.B, rep regionReport) {
	b.ReportMetric(rep.share(), "exact-share")
	if rep.alg != regionAlgBucket {
		b.ReportMetric(float64(rep.worst)/float64(cmp.Or(rep.limit, regionLimit)), "worst-window/limit")
	}
	b.ReportMetric(float64(len(rep.over)), "over")
	b.ReportMetric(float64(rep.requests)/float64(rep.decisions), "requests/decision")
	if rep.failed > 0 {
		b.Errorf("%d decisions failed; the first: %v", rep.failed, rep.firstErr)
	}
}

// testRegionsEventual runs a global window with leases on the
// default-mode harness (three regions, lag 1 s) without shares, as
// TestRegionShares' last subtest (one harness: its three JVMs take
// longer to start than the run; last, so that the shares' runs meet the
// harness as fresh as before):
//
//   - eventual/shared: one key written in every region, demand split
//     evenly and each region offering the whole limit's rate. Each
//     region's conditional writes see its own copy only and whole items
//     replace each other (last writer wins), so the regions together
//     admit up to three times the limit: the test asserts that the
//     history checker over the union of regions finds windows over the
//     limit (it must, or the harness does not replicate as DynamoDB
//     does). This is the baseline regional shares must fix.
//
// It asserts that no decision failed.
func testRegionsEventual(t *testing.T, g *testserver.Regions, table string, eps []string) {
	t.Run("eventual/shared", func(t *testing.T) {
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
}

// mrscScale is the MRSC hot-key runs' scale: a window of 10,000 per 4 s
// and a bucket of 2,000 a second with a second's burst, both 2,000 a
// second steadily, so that each of the 12 processes decides a key hot
// enough to lease (a process's fair share is far above a lease's
// minimum) and the whole still fits 2 cores.
const mrscScale = 10

// mrscHotDemands are the MRSC hot-key runs of alg at mrscScale: 98/1/1,
// 60/30/10 and 33/33/33 under the limit (0.8 of its steady rate) and over
// it (1.2, half the limit taken at the start), and demand moving from
// region 0 to region 2 halfway, over the limit.
func mrscHotDemands(alg regionAlg, d time.Duration) []regionDemand {
	rate := regionRate * mrscScale
	prefill := scaledWindow(mrscScale) / 2
	if alg == regionAlgBucket {
		prefill = scaledBucket(mrscScale).MaxAmount / 2
	}
	var ds []regionDemand
	for _, s := range []struct {
		name  string
		split []float64
	}{
		{"98/1/1", []float64{0.98, 0.01, 0.01}},
		{"60/30/10", []float64{0.6, 0.3, 0.1}},
		{"33/33/33", []float64{1. / 3, 1. / 3, 1. / 3}},
	} {
		ds = append(ds,
			regionDemand{Name: string(alg) + "/" + s.name + "/under", Split: s.split, Rate: 0.8 * rate, Duration: d, Alg: alg, Scale: mrscScale},
			regionDemand{Name: string(alg) + "/" + s.name + "/over", Split: s.split, Rate: 1.2 * rate, Duration: d, Prefill: prefill, Alg: alg, Scale: mrscScale})
	}
	ds = append(ds, regionDemand{Name: string(alg) + "/98/1/1-then-1/1/98/over", Split: []float64{0.98, 0.01, 0.01}, Then: []float64{0.01, 0.01, 0.98},
		Rate: 1.2 * rate, Duration: d / 2, Prefill: prefill, Alg: alg, Scale: mrscScale})
	for i := range ds {
		ds[i].MRSC = true
	}
	return ds
}

// conflictsSince is the harness's write conflicts since mark (a Stats).
func conflictsSince(m *testserver.MRSC, mark testserver.MRSCStats) int64 {
	var n int64
	for i, c := range m.Stats().Conflicts {
		n += c - mark.Conflicts[i]
	}
	return n
}

// BenchmarkRegionsMRSCHot reports the MRSC figures of a hot key
// (mrscHotDemands for the window and the bucket, 10 s each; run with
// -benchtime=1x): share of exact, never over, store requests and write
// conflicts per decision, p50 and p99 decision latency against a
// regional round trip measured in the same run. The harness answers
// ReplicatedWriteConflictException as mrsc.go describes; the store's
// retryer retries it.
func BenchmarkRegionsMRSCHot(b *testing.B) {
	m, table, eps, raw := startMRSC(b)
	for _, d := range append(mrscHotDemands(regionAlgWindow, 10*time.Second), mrscHotDemands(regionAlgBucket, 10*time.Second)...) {
		b.Run(d.Name, func(b *testing.B) {
			for i := range b.N {
				run := d
				run.Name = fmt.Sprintf("%s/%d-%d", d.Name, i, time.Now().UnixNano()) // a key of its own
				mark := m.Stats()
				rep := runRegions(b, table, eps, m.Requests, raw, run, nil)
				reportMRSC(b, m, mark, d.Name, rep)
			}
		})
	}
}

// conflictRun is what became of runConflicts' decisions.
type conflictRun struct {
	calls                             []limitertest.Call
	decisions, admitted, lost, failed int64
	// conflicts is the write conflicts the harness answered.
	conflicts int64
	firstErr  error
}

// runConflicts has 2 processes in each MRSC region decide one key of a
// window without leases (every decision the deny cache does not answer
// is a write of the key's item), 6 a second each, for 3 s: concurrent
// writers of one item in three regions. retried says whether their
// stores' retryer retries (dynamo.NewRetryer) or not (one attempt). lost
// counts the decisions whose write ended in ReplicatedWriteConflictException.
func runConflicts(t *testing.T, m *testserver.MRSC, table string, eps []string, retried bool, scale float64) conflictRun {
	t.Helper()
	const procs, rate, dur = 2, 6, 3 * time.Second
	key := limitertest.Key(t)
	mark := m.Stats()
	var (
		mu  sync.Mutex
		run conflictRun
		wg  sync.WaitGroup
	)
	begin := time.Now()
	for i, ep := range eps {
		for p := range procs {
			cfg := dynamo.Config{Table: table, Timeout: regionTimeout}
			if !retried {
				cfg.Retryer = dynamo.NewRetryer(dynamo.RetryerConfig{MaxAttempts: 1, ConflictAttempts: 1})
			}
			st, err := dynamo.New(newClient(ep), cfg)
			if err != nil {
				t.Fatal(err)
			}
			l := scaledLimiter(t, regionAlgWindow, st, false, scale)
			worker := i*procs + p
			wg.Go(func() {
				pace := time.Second / rate
				next := begin.Add(time.Duration(worker) * pace / (procs * testserver.MRSCRegions))
				out := make([]limiter.Outcome, 1)
				for next.Before(begin.Add(dur)) {
					time.Sleep(time.Until(next))
					next = next.Add(pace)
					now := time.Now()
					start := now.Sub(begin)
					_, err := limiter.Decide(t.Context(), now, []limiter.Item{{Limit: l, Key: key, N: 1}}, out)
					o := out[0]
					var rc *types.ReplicatedWriteConflictException
					mu.Lock()
					run.decisions++
					switch {
					case err != nil:
						run.failed++
						if run.firstErr == nil {
							run.firstErr = err
						}
					case errors.As(o.Err, &rc):
						run.lost++ // denied (Throttled): its units were not counted
					case o.Decision.Allowed:
						run.admitted++
					}
					run.calls = append(run.calls, limitertest.Call{Worker: worker, Key: key, Stamp: now, Cost: 1, Start: start, End: time.Since(begin),
						Reached: !o.Cached, Allowed: err == nil && o.Decision.Allowed, Cached: o.Cached, Err: err})
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	run.conflicts = conflictsSince(m, mark)
	return run
}

// TestRegionsMRSCConflicts: concurrent writers of one item in three MRSC
// regions meet ReplicatedWriteConflictException (the harness answers it
// as mrsc.go describes) and the store's retryer retries it: each decision
// that still ended in the error made its attempts (so it met
// dynamo.DefaultConflictAttempts conflicts at the harness), none failed, and the
// window is never over its limit over the union of regions (the checker
// on stamps). The same run with a retryer that does not retry fails
// that: every conflict ends a decision (lost == conflicts), a denial the
// limit did not make. The window (80 per 4 s, 16 a second steadily) is
// offered 36 a second, so it binds. The two runs go at once, each on an
// MRSC harness of its own (conflicts are counted at the harness).
func TestRegionsMRSCConflicts(t *testing.T) {
	if testing.Short() {
		t.Skip("4 s against DynamoDB Local")
	}
	const scale = 0.08
	limit := scaledWindow(scale)
	for _, retried := range []bool{true, false} {
		t.Run(fmt.Sprintf("retried=%v", retried), func(t *testing.T) {
			t.Parallel()
			m, table, eps, _ := startMRSC(t)
			run := runConflicts(t, m, table, eps, retried, scale)
			over := limitertest.CheckTrailingWindow(run.calls, limit, regionWindow)
			mem, err := memory.New(memory.Config{})
			if err != nil {
				t.Fatal(err)
			}
			exact, err := limitertest.ExactAdmitted(t.Context(), scaledLimiter(t, regionAlgWindow, mem, false, scale), run.calls)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("retried %v: %d decisions, %d admitted (exact %d: %.3f), %d lost to a write conflict, %d conflicts at the harness, %d failed; harness %v",
				retried, run.decisions, run.admitted, exact, float64(run.admitted)/float64(max(exact, 1)), run.lost, run.conflicts, run.failed, m.Stats())
			for _, v := range over {
				t.Errorf("over the limit: %v", v)
			}
			if run.failed > 0 {
				t.Errorf("%d decisions failed; the first: %v", run.failed, run.firstErr)
			}
			if run.conflicts == 0 {
				t.Fatalf("no write conflict met: the harness does not emulate them, or the writers did not overlap")
			}
			if retried {
				if run.lost*dynamo.DefaultConflictAttempts > run.conflicts {
					t.Errorf("%d decisions lost to a conflict, but only %d conflicts: not every lost decision made its %d attempts",
						run.lost, run.conflicts, dynamo.DefaultConflictAttempts)
				}
			} else if run.lost == 0 || run.lost*dynamo.DefaultConflictAttempts <= run.conflicts {
				t.Errorf("without retries, %d decisions lost to %d conflicts: want every conflict to end a decision", run.lost, run.conflicts)
			}
		})
	}
}

// partitionRegion is what one region's decisions did while region cut
// was cut off, [from, to) after the run's start.
type partitionRegion struct {
	asked, admitted, leased, failed int64
	// lastLeased is the stamp (since the cut) of the last admission from
	// a lease; maxFail the longest decision that failed.
	lastLeased, maxFail time.Duration
	firstErr            error
}

func (p partitionRegion) add(o partitionRegion) partitionRegion {
	p.asked, p.admitted, p.leased, p.failed = p.asked+o.asked, p.admitted+o.admitted, p.leased+o.leased, p.failed+o.failed
	p.lastLeased, p.maxFail, p.firstErr = max(p.lastLeased, o.lastLeased), max(p.maxFail, o.maxFail), cmp.Or(p.firstErr, o.firstErr)
	return p
}

func (p partitionRegion) String() string {
	return fmt.Sprintf("%d decisions, %d admitted (%d from leases, the last %v into the cut), %d failed (the longest %v)",
		p.asked, p.admitted, p.leased, p.lastLeased.Round(time.Millisecond), p.failed, p.maxFail.Round(time.Millisecond))
}

// duringCut sums each region's decisions stamped in [from, to) after
// begin.
func duringCut(rep regionReport, begin time.Time, from, to time.Duration) []partitionRegion {
	out := make([]partitionRegion, len(rep.byRegion))
	for r, calls := range rep.byRegion {
		p := &out[r]
		for _, c := range calls {
			at := c.Stamp.Sub(begin)
			if c.Worker < 0 || at < from || at >= to {
				continue
			}
			p.asked++
			switch {
			case c.Err != nil:
				p.failed++
				p.maxFail = max(p.maxFail, c.End-c.Start)
				if p.firstErr == nil {
					p.firstErr = c.Err
				}
			case c.Allowed:
				p.admitted++
				if !c.Reached && !c.Cached {
					p.leased++
					p.lastLeased = max(p.lastLeased, at-from)
				}
			}
		}
	}
	return out
}

// mrscPartitionDeadline bounds a decision in the partition runs, as an
// authorizer's deadline would (the store's Timeout, its default): long
// enough for a live region's write to meet several conflicts in a row.
const mrscPartitionDeadline = dynamo.DefaultTimeout

// runPartition runs d on the MRSC harness with region 2 cut off from the
// quorum (PartitionHang) from from to to after the start.
func runPartition(tb testing.TB, m *testserver.MRSC, table string, eps []string, raw func(context.Context) error, d regionDemand,
	from, to time.Duration) (regionReport, []partitionRegion, time.Time) {
	tb.Helper()
	d.Timeout = mrscPartitionDeadline
	begin := time.Now()
	cut := time.AfterFunc(from, func() { m.Partition(2, testserver.PartitionHang) })
	heal := time.AfterFunc(to, func() { m.Heal(2) })
	rep := runRegions(tb, table, eps, m.Requests, raw, d, nil)
	cut.Stop()
	heal.Stop()
	m.Heal(2)
	return rep, duringCut(rep, begin, from, to), begin
}

// TestRegionsMRSCPartition: a global window with leases on the MRSC
// harness (twice the limit of the other tests, 33/33/33, 0.8 of its
// steady rate, 4 s) with region 2 cut off
// from the quorum from 1 s to 3 s (its writes hang: mrsc.go). It asserts
// that the window is never over over the union of regions; that region
// 2's decisions not answered from a lease fail at the store's deadline
// with ErrUnavailable (the rule's fail mode then decides), and that none
// is admitted more than a lease's life (MaxLeaseLife) after the cut began
// (unless held until the heal): what it admits meanwhile comes from
// leases taken before; and that the other regions keep deciding without
// failures (at most one decision in ten, over the two).
func TestRegionsMRSCPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("5 s against DynamoDB Local")
	}
	m, table, eps, raw := startMRSC(t)
	const from, to = time.Second, 3 * time.Second
	d := regionDemand{Name: limitertest.Key(t), Split: []float64{1. / 3, 1. / 3, 1. / 3}, Rate: 0.8 * regionRate * 2, Duration: 4 * time.Second, Scale: 2, MRSC: true}
	rep, cut, begin := runPartition(t, m, table, eps, raw, d, from, to)
	t.Logf("mrsc, region 2 cut off %v-%v: %v; harness %v", from, to, rep, m.Stats())
	for r, p := range cut {
		t.Logf("region %d during the cut: %v", r, p)
	}
	for _, v := range rep.over {
		t.Errorf("over the limit: %v", v)
	}
	// A live region's write may meet conflicts until its deadline (a few
	// such failures are the model's, not the cut's), and one live region
	// may starve the other for a while (mrsc.go: the first writer wins).
	if live := cut[0].add(cut[1]); live.failed*10 > live.asked || live.admitted == 0 {
		t.Errorf("regions 0 and 1 (live) during the cut: %v; want admissions and few failures (the first: %v)", live, live.firstErr)
	}
	if p := cut[2]; p.failed == 0 || p.lastLeased >= storage.MaxLeaseLife {
		t.Errorf("region 2 (cut off): %v; want failures and no lease answer after %v", p, storage.MaxLeaseLife)
	}
	for _, c := range rep.byRegion[2] {
		if c.Err != nil && !errors.Is(c.Err, storage.ErrUnavailable) {
			t.Errorf("region 2's decision failed with %v, want an error wrapping storage.ErrUnavailable", c.Err)
			break
		}
	}
	for _, c := range rep.byRegion[2] {
		// A decision whose request was held until the heal (within its
		// deadline) is carried out then: not an admission during the cut.
		if at := c.Stamp.Sub(begin); c.Allowed && at >= from+storage.MaxLeaseLife && at+c.End-c.Start < to {
			t.Errorf("region 2 admitted a decision %v into the cut, after its leases expired: %+v", at-from, c)
			break
		}
	}
}

// BenchmarkRegionsMRSCPartition: a global window and a global bucket with
// leases on the MRSC harness at mrscScale (33/33/33, 1.2 times the
// steady rate, 50 s) with region 2 cut off from the quorum from 10 s to
// 40 s (-benchtime=1x). It reports the share of exact and whether any
// window was over over the whole run, and what each region admitted
// during the cut, a second, and how region 2's decisions ended.
func BenchmarkRegionsMRSCPartition(b *testing.B) {
	m, table, eps, raw := startMRSC(b)
	const from, to = 10 * time.Second, 40 * time.Second
	for _, alg := range []regionAlg{regionAlgWindow, regionAlgBucket} {
		b.Run(string(alg), func(b *testing.B) {
			for i := range b.N {
				d := regionDemand{Name: fmt.Sprintf("partition/%s/%d-%d", alg, i, time.Now().UnixNano()), Split: []float64{1. / 3, 1. / 3, 1. / 3},
					Rate: 1.2 * regionRate * mrscScale, Duration: 50 * time.Second, Alg: alg, Scale: mrscScale, MRSC: true}
				rep, cut, _ := runPartition(b, m, table, eps, raw, d, from, to)
				b.Logf("mrsc %s, region 2 cut off %v-%v: %v; harness %v", alg, from, to, rep, m.Stats())
				b.ReportMetric(rep.share(), "exact-share")
				b.ReportMetric(float64(len(rep.over)), "over")
				for r, p := range cut {
					b.Logf("region %d during the cut: %v; the first failure: %v", r, p, p.firstErr)
					b.ReportMetric(float64(p.admitted)/(to-from).Seconds(), fmt.Sprintf("region%d-admitted/s-cut", r))
				}
				b.ReportMetric(float64(cut[2].leased), "region2-leased-cut")
				b.ReportMetric(float64(cut[2].lastLeased.Milliseconds()), "region2-last-leased-ms")
				b.ReportMetric(float64(cut[2].maxFail.Milliseconds()), "region2-max-fail-ms")
			}
		})
	}
}

// TestRegionsMRSCColdKey: one process in one region of the MRSC harness
// (40 ms added to every request) decides a window key and a bucket key,
// each every 300 ms (about 3 a second, under the smallest lease of a
// regional store, 8 units), 12 times each. With dynamo.Config.CrossRegion
// (the store says its writes cross regions) the keys lease from 2 or 3
// units (a lease saves 100 ms of round trips), so the harness answers
// fewer requests than decisions; without it the same slow store is a
// regional one and every decision is a request, as on a store a few
// milliseconds away. Counted at the harness's proxies: each run has a
// harness of its own, so that the two run at once (they wait on their
// ticks).
func TestRegionsMRSCColdKey(t *testing.T) {
	if testing.Short() {
		t.Skip("4 s against DynamoDB Local")
	}
	const decisions, every = 12, 300 * time.Millisecond
	for _, far := range []bool{false, true} {
		name := "regional"
		if far {
			name = "cross-region"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m, table, eps, _ := startMRSC(t)
			st, err := dynamo.New(newClient(eps[0]), dynamo.Config{Table: table, Timeout: regionTimeout, CrossRegion: far})
			if err != nil {
				t.Fatal(err)
			}
			if got := storage.WritesCrossRegions(st); got != far {
				t.Fatalf("the store says its writes cross regions: %v, want %v", got, far)
			}
			window, err := limiter.NewSlidingWindow(st, limiter.SlidingWindowConfig{Name: "cold", Limit: 1000, Window: time.Minute,
				Representation: limiter.SubWindowCounters, Leases: true})
			if err != nil {
				t.Fatal(err)
			}
			bucket, err := limiter.NewTokenBucket(st, limiter.TokenBucketConfig{Name: "cold", MaxAmount: 1000, RefillTime: time.Second, RefillAmount: 100, Leases: true})
			if err != nil {
				t.Fatal(err)
			}
			key := limitertest.Key(t)
			mark := m.Requests()
			var wg sync.WaitGroup
			for _, l := range []limiter.Limiter{window, bucket} {
				wg.Go(func() {
					tick := time.NewTicker(every)
					defer tick.Stop()
					for i := range decisions {
						d, err := l.AllowN(t.Context(), key, time.Now(), 1)
						if err != nil {
							t.Error(err)
							return
						}
						if !d.Allowed {
							t.Errorf("decision %d denied", i)
						}
						<-tick.C
					}
				})
			}
			wg.Wait()
			requests := m.Requests() - mark
			ls := window.LeaseStats().Add(bucket.LeaseStats())
			t.Logf("%s: %d decisions, %d requests at the harness, %d answered from leases; leases %+v", name, 2*decisions, requests, ls.Decisions, ls)
			switch {
			case !far && (requests < 2*decisions || ls.Takes != 0):
				t.Errorf("regional: %d requests and %d lease takes for %d decisions; want a request a decision and no lease", requests, ls.Takes, 2*decisions)
			case far && (requests >= 2*decisions || ls.Decisions == 0):
				t.Errorf("cross-region: %d requests for %d decisions, %d from leases; want fewer requests than decisions", requests, 2*decisions, ls.Decisions)
			}
		})
	}
}
