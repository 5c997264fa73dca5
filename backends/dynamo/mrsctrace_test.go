package dynamo_test

import (
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
}

// logBucketTrace logs a traced bucket run second by second and its loss
// decomposed: the stamps' span, the denials here that the serialized
// bucket admitted (throttled, cached, denied by the store), the free
// tokens at the end here and there, and the units of leases still held.
func logBucketTrace(tb testing.TB, d regionDemand, rep regionReport) {
	tb.Helper()
	if len(rep.probes) == 0 {
		return
	}
	admits, exactFree := exactTrace(tb, d, rep.calls, rep.probes)
	t0 := rep.start
	bin := func(t time.Time) int { return max(int(t.Sub(t0)/time.Second), 0) }
	var bins []traceBin
	at := func(i int) *traceBin {
		for len(bins) <= i {
			bins = append(bins, traceBin{})
		}
		return &bins[i]
	}
	var first, last time.Time
	lossBy := map[string]int{}
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
		b := at(bin(c.Stamp))
		b.decisions++
		b.admitted += boolInt(c.Allowed)
		b.exact += boolInt(admits[i])
		b.cached += boolInt(c.Cached)
		if !c.Allowed && admits[i] {
			b.ourDeniedExactAdmits++
		}
		switch {
		case c.Allowed == admits[i]:
		case c.Allowed:
			lossBy["admitted here, denied there"]--
		case c.Cached:
			lossBy["deny cache"]++
		case !c.Reached:
			lossBy["denied unreached"]++
		default:
			lossBy["denied by the store or throttled"]++
		}
	}
	for _, t := range rep.throttledAt {
		at(bin(rep.start.Add(t))).throttled++
	}
	for i, p := range rep.probes {
		b := at(bin(p.at))
		b.freeSum += p.free
		b.exactFreeSum += exactFree[i]
		b.probes++
		b.levelSum += p.ring.Level
		b.unsettledSum += p.ring.Unsettled
		if p.ring.Level > scaledBucket(d.Scale).MaxAmount {
			b.capped++
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "trace %s: stamps span %v (first %v after the start); per second: decisions, admitted here/there, throttled, cached, denied here admitted there, mean free here/there:\n",
		d.Name, last.Sub(first).Round(time.Millisecond), first.Sub(rep.start).Round(time.Millisecond))
	for i, b := range bins {
		n := float64(max(b.probes, 1))
		fmt.Fprintf(&sb, "  s%-2d %4d %4d/%-4d thr %3d cached %3d lost %3d free %5.1f/%5.1f level %5.1f s %5.1f capped %d/%d\n", i, b.decisions, b.admitted, b.exact,
			b.throttled, b.cached, b.ourDeniedExactAdmits, float64(b.freeSum)/n, float64(b.exactFreeSum)/n, float64(b.levelSum)/n, float64(b.unsettledSum)/n, b.capped, b.probes)
	}
	cfg := scaledBucket(d.Scale)
	span := rep.probes[len(rep.probes)-1].at.Sub(rep.calls[0].Stamp)
	refill := int64(span/cfg.RefillTime) * cfg.RefillAmount
	fin := rep.probes[len(rep.probes)-1]
	exactDropped := cfg.MaxAmount + refill - exactFree[len(exactFree)-1] - rep.exact
	ourDropped := cfg.MaxAmount + refill - fin.ring.Level + fin.ring.Unsettled - rep.admitted
	fmt.Fprintf(&sb, "  refill %d over %v; dropped (or expired in leases) here %d, there %d; at the end here level %d, s %d, h %d\n",
		refill, span.Round(time.Millisecond), ourDropped, exactDropped, fin.ring.Level, fin.ring.Unsettled, fin.ring.Held)
	ls := rep.leases
	open := ls.Granted - ls.Takes - ls.Decisions - ls.Returned - ls.Lost
	end := rep.probes[len(rep.probes)-1]
	fmt.Fprintf(&sb, "  loss %d (exact %d - admitted %d): per decision %v; free at the end %d here, %d there; leases: %d granted in %d takes, %d decisions, %d returned, %d lost, %d still held at the end",
		rep.exact-rep.admitted, rep.exact, rep.admitted, lossBy, end.free, exactFree[len(exactFree)-1], ls.Granted, ls.Takes, ls.Decisions, ls.Returned, ls.Lost, open)
	fmt.Fprintf(&sb, "; %d settlements; throttled by region %v, decisions by region", end.ring.Settled, rep.throttledBy)
	for _, cs := range rep.byRegion {
		fmt.Fprintf(&sb, " %d", len(cs))
	}
	tb.Log(sb.String())
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
