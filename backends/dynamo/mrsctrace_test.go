package dynamo_test

import (
	"cmp"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// A bucket run's trace (regionDemand.Probe): what the store's bucket
// holds free for a take, read every probeEvery during the run straight
// from DynamoDB Local (no proxy: neither counted in the run's requests
// nor delayed, and a read never conflicts), against what the serialized
// bucket replaying the same calls holds at the same instants. It
// decomposes a run's loss against exact (logBucketTrace).

// traceMRSC turns the trace on (go test ... -args -mrsc.trace, or
// -mrsc.trace on a test binary): the probes add reads to the shared
// DynamoDB Local, and the leases are returned after the run.
var traceMRSC = flag.Bool("mrsc.trace", false, "trace BenchmarkRegionsMRSC's bucket runs (mrsctrace_test.go)")

// openMRSC makes BenchmarkRegionsMRSC's bucket runs open loops
// (limitertest.HotOptions.Open): -mrsc.open.
var openMRSC = flag.Bool("mrsc.open", false, "BenchmarkRegionsMRSC's bucket runs as open loops (each decision at its time, several in flight in a process)")

// probeEvery is how often a traced run reads its bucket.
const probeEvery = 100 * time.Millisecond

// probe is the bucket's free tokens at an instant (Get's Remaining).
type probe struct {
	at   time.Time
	free int64
	ring dynamo.RingProbe
}

// probeBucket reads d.Name's bucket through endpoint every probeEvery
// until stop is closed, then once more: the probes.
func probeBucket(tb testing.TB, table, endpoint string, d regionDemand, stop <-chan struct{}) []probe {
	tb.Helper()
	st, err := dynamo.New(newClient(endpoint), dynamo.Config{Table: table, Timeout: regionTimeout})
	if err != nil {
		tb.Fatal(err)
	}
	l := scaledLimiter(tb, d.Alg, st, false, d.Scale).(*limiter.TokenBucket)
	cfg := l.Config()
	var ps []probe
	get := func() {
		now := time.Now()
		dec, err := l.Get(tb.Context(), d.Name, now)
		if err != nil {
			tb.Errorf("probe: %v", err)
			return
		}
		op := storage.BucketOp{MaxAmount: cfg.MaxAmount, RefillTime: cfg.RefillTime, RefillAmount: cfg.RefillAmount, Now: now.UnixNano()}
		ring, err := dynamo.ProbeRing(tb.Context(), st, storage.Key{Space: l.Space(), Name: d.Name}, op)
		if err != nil {
			tb.Errorf("probe: %v", err)
			return
		}
		ps = append(ps, probe{at: now, free: dec.Remaining, ring: ring})
	}
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			get()
			return ps
		case <-tick.C:
			get()
		}
	}
}

// returnAll ends the processes' leases (a bucket's), as a process
// that shuts down does.
func returnAll(tb testing.TB, procs [][]limiter.Limiter) {
	tb.Helper()
	for _, ls := range procs {
		for _, l := range ls {
			if b, ok := l.(*limiter.TokenBucket); ok {
				if err := b.ReturnLeases(tb.Context(), time.Now()); err != nil {
					tb.Logf("returning leases: %v", err)
				}
			}
		}
	}
}

// leasesAfter is the processes' lease counters once the returns sent
// without waiting are done (they time out after a second).
func leasesAfter(procs [][]limiter.Limiter) limiter.LeaseStats {
	time.Sleep(1500 * time.Millisecond)
	var sum limiter.LeaseStats
	for _, ls := range procs {
		for _, l := range ls {
			if b, ok := l.(*limiter.TokenBucket); ok {
				sum = sum.Add(b.LeaseStats())
			}
		}
	}
	return sum
}

// exactTrace replays calls in stamp order on the serialized bucket, with
// a Get at each probe's instant: which calls it admits (by index into
// calls) and what it holds free at each probe.
func exactTrace(tb testing.TB, d regionDemand, calls []limitertest.Call, probes []probe) (admits []bool, free []int64) {
	tb.Helper()
	mem, err := memory.New(memory.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	l := scaledLimiter(tb, d.Alg, mem, false, d.Scale).(*limiter.TokenBucket)
	order := make([]int, len(calls))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return calls[a].Stamp.Compare(calls[b].Stamp) })
	admits, free = make([]bool, len(calls)), make([]int64, len(probes))
	ctx, p := tb.Context(), 0
	getUntil := func(t time.Time) {
		for ; p < len(probes) && !probes[p].at.After(t); p++ {
			dec, err := l.Get(ctx, calls[order[0]].Key, probes[p].at)
			if err != nil {
				tb.Fatal(err)
			}
			free[p] = dec.Remaining
		}
	}
	for _, i := range order {
		c := calls[i]
		getUntil(c.Stamp)
		if c.Err != nil {
			continue
		}
		dec, err := l.AllowN(ctx, c.Key, c.Stamp, c.Cost)
		if err != nil {
			tb.Fatal(err)
		}
		admits[i] = dec.Allowed
	}
	getUntil(probes[len(probes)-1].at.Add(time.Hour))
	return admits, free
}

// traceBin is one second of a traced run.
type traceBin struct {
	decisions, admitted, exact, cached, throttled int
	// ourDeniedExactAdmits: denied here (throttled, cached or by the
	// store) where the serialized bucket admitted.
	ourDeniedExactAdmits          int
	freeSum, exactFreeSum, probes int64
	// levelSum and unsettledSum: the ring's level (refill less tat) and
	// s; capped the probes whose level was above MaxAmount (refill
	// dropped unless s is settled first).
	levelSum, unsettledSum, capped int64
	// exactFull: the probes where the serialized bucket was full.
	exactFull int64
}

// traceBins sorts a traced run's decisions and probes into seconds
// since its start; first and last bound the decisions' stamps, and
// lossBy counts the decisions decided otherwise than by the serialized
// bucket (admits), by what decided them here.
func traceBins(rep regionReport, admits []bool, exactFree []int64, maxAmount int64) (bins []traceBin, first, last time.Time, lossBy map[string]int) {
	at := func(t time.Time) *traceBin {
		i := max(int(t.Sub(rep.start)/time.Second), 0)
		for len(bins) <= i {
			bins = append(bins, traceBin{})
		}
		return &bins[i]
	}
	lossBy = map[string]int{}
	for i, c := range rep.calls {
		if c.Worker < 0 {
			continue
		}
		if first.IsZero() || c.Stamp.Before(first) {
			first = c.Stamp
		}
		if c.Stamp.After(last) {
			last = c.Stamp
		}
		b := at(c.Stamp)
		b.decisions++
		b.admitted += boolInt(c.Allowed)
		b.exact += boolInt(admits[i])
		b.cached += boolInt(c.Cached)
		switch {
		case c.Allowed == admits[i]:
		case c.Allowed:
			lossBy["admitted here, denied there"]--
		case c.Cached:
			lossBy["denied by the deny cache"]++
		default:
			b.ourDeniedExactAdmits++
			lossBy["denied by the store or throttled"]++
		}
	}
	for _, t := range rep.throttledAt {
		at(rep.start.Add(t)).throttled++
	}
	for i, p := range rep.probes {
		b := at(p.at)
		b.freeSum += p.free
		b.exactFreeSum += exactFree[i]
		b.probes++
		b.levelSum += p.ring.Level
		b.unsettledSum += p.ring.Unsettled
		b.capped += int64(boolInt(p.ring.Level > maxAmount))
		b.exactFull += int64(boolInt(exactFree[i] >= maxAmount))
	}
	return bins, first, last, lossBy
}

// logBucketTrace logs a traced bucket run second by second and its loss
// decomposed: the stamps' span, the denials here that the serialized
// bucket admitted, the free tokens at the end here and there, and the
// refill each dropped: the serialized bucket's when full; here, besides,
// while the ring's level (refill less tat) is above MaxAmount with
// unsettled and leased units inside, and the units of leases that
// expired unspent. With R the refill since the prefill and every lease
// returned, admitted = MaxAmount + R - (min(level, MaxAmount) - s) -
// dropped, so dropped = MaxAmount + R - min(level, MaxAmount) + s -
// admitted, plus the spent units of leases still held at the end (0 to
// h - s).
func logBucketTrace(tb testing.TB, d regionDemand, rep regionReport) {
	tb.Helper()
	if len(rep.probes) == 0 {
		return
	}
	cfg := scaledBucket(d.Scale)
	admits, exactFree := exactTrace(tb, d, rep.calls, rep.probes)
	bins, first, last, lossBy := traceBins(rep, admits, exactFree, cfg.MaxAmount)
	var sb strings.Builder
	fmt.Fprintf(&sb, "trace %s: stamps span %v (first %v after the start); per second: decisions, admitted here/there, throttled, cached, "+
		"denied here admitted there, mean free here/there, ring level (uncapped) and s, probes with the level above MaxAmount:\n",
		d.Name, last.Sub(first).Round(time.Millisecond), first.Sub(rep.start).Round(time.Millisecond))
	for i, b := range bins {
		n := float64(max(b.probes, 1))
		fmt.Fprintf(&sb, "  s%-2d %4d %4d/%-4d thr %3d cached %3d lost %3d free %5.1f/%5.1f level %5.1f s %5.1f capped %d/%d (full there %d)\n", i, b.decisions, b.admitted, b.exact,
			b.throttled, b.cached, b.ourDeniedExactAdmits, float64(b.freeSum)/n, float64(b.exactFreeSum)/n, float64(b.levelSum)/n, float64(b.unsettledSum)/n, b.capped, b.probes, b.exactFull)
	}
	fin, exactEnd := rep.probes[len(rep.probes)-1], exactFree[len(exactFree)-1]
	refill := int64(fin.at.Sub(rep.calls[0].Stamp)/cfg.RefillTime) * cfg.RefillAmount
	dropped := cfg.MaxAmount + refill - min(fin.ring.Level, cfg.MaxAmount) + fin.ring.Unsettled - rep.admitted
	fmt.Fprintf(&sb, "  loss %d (exact %d - admitted %d); decisions decided otherwise: %v; refill since the prefill %d; dropped here %d to %d, there %d; "+
		"free at the end here %d, there %d; at the end here level %d, s %d, h %d, settlements %d\n",
		rep.exact-rep.admitted, rep.exact, rep.admitted, lossBy, refill, dropped, dropped+fin.ring.Held-fin.ring.Unsettled,
		cfg.MaxAmount+refill-exactEnd-rep.exact, fin.free, exactEnd, fin.ring.Level, fin.ring.Unsettled, fin.ring.Held, fin.ring.Settled)
	fmt.Fprintf(&sb, "  decisions that reached the store (throttled included), by latency under 50 ms, 50-200 ms, 200-500 ms, over: admitted %v, denied %v\n",
		storeLatencies(rep.calls, true), storeLatencies(rep.calls, false))
	behind, behindReached := behindWrites(rep.byRegion)
	fmt.Fprintf(&sb, "  decisions that started while their process had a store step of the key in flight: %d, %d of them store steps themselves\n", behind, behindReached)
	ls := rep.leasesAfter
	fmt.Fprintf(&sb, "  leases: %d takes granted %d, %d decisions, %d returns gave back %d, %d lost (after the returns); throttled by region %v, decisions by region",
		ls.Takes, ls.Granted, ls.Decisions, ls.Returns, ls.Returned, ls.Lost, rep.throttledBy)
	for _, cs := range rep.byRegion {
		fmt.Fprintf(&sb, " %d", len(cs))
	}
	tb.Log(sb.String())
}

// behindWrites counts the decisions that started while a store step of
// their process (a decision that reached the store) was in flight, and
// how many of them reached the store themselves.
func behindWrites(byRegion [][]limitertest.Call) (behind, reached int) {
	for _, cs := range byRegion {
		byWorker := map[int][]limitertest.Call{}
		for _, c := range cs {
			if c.Worker >= 0 {
				byWorker[c.Worker] = append(byWorker[c.Worker], c)
			}
		}
		for _, ws := range byWorker {
			slices.SortFunc(ws, func(a, b limitertest.Call) int { return cmp.Compare(a.Start, b.Start) })
			var until time.Duration // the latest end of a store step so far
			for _, c := range ws {
				if c.Start < until {
					behind++
					reached += boolInt(c.Reached)
				}
				if c.Reached {
					until = max(until, c.End)
				}
			}
		}
	}
	return behind, reached
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// storeLatencies counts the decisions that reached the store and were
// admitted (or denied), by latency: under 50 ms, 50-200 ms, 200-500 ms,
// over.
func storeLatencies(calls []limitertest.Call, admitted bool) [4]int {
	var n [4]int
	for _, c := range calls {
		if c.Worker < 0 || !c.Reached || c.Allowed != admitted || c.Err != nil {
			continue
		}
		switch d := c.End - c.Start; {
		case d < 50*time.Millisecond:
			n[0]++
		case d < 200*time.Millisecond:
			n[1]++
		case d < 500*time.Millisecond:
			n[2]++
		default:
			n[3]++
		}
	}
	return n
}
