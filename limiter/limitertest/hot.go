package limitertest

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// HotOptions configures [RunHot]: processes deciding one hot key, each
// with a limiter of its own (its own store client and leases, as Lambda
// containers have).
type HotOptions struct {
	// Key is the hot key.
	Key string
	// Rate is the decisions a second offered, over all processes.
	Rate float64
	// Uneven gives process 0 half of Rate; the others share the rest.
	// Otherwise every process gets Rate/len(limiters).
	Uneven bool
	// Open makes each process's arrivals an open loop: every decision
	// starts at its scheduled time in a goroutine of its own, so a slow
	// decision delays none after it and a process may have several
	// decisions of the key in flight. Otherwise a process decides one
	// at a time, and a slow decision delays the next ones (which then
	// come back to back, stamped late).
	Open bool
	// Duration is how long the processes call.
	Duration time.Duration
	// Prefill, with Prefiller, takes that many units of the key at the
	// run's start in one call of Prefiller (a limiter of the same limit,
	// without leases), so that the run meets the limit sooner: it is the
	// first of the report's Calls (Worker -1).
	Prefill   int64
	Prefiller limiter.Limiter
}

// HotReport is what became of a [RunHot]'s decisions.
type HotReport struct {
	// Calls are the decisions, as the history checkers take them
	// (Reached is false for one answered without a store request).
	Calls []Call
	// Admitted counts the admitted units (one a decision, and the
	// prefill's); Leased the decisions answered from a
	// capacity lease, Cached the deny cache's denials, Throttled those the
	// store throttled, ThrottledLate those of them stamped after the
	// run's first second, Failed those whose store failed (decided by no
	// fail mode: they are errors).
	Admitted, Leased, Cached, Throttled, ThrottledLate, Failed int64
	// Leases sums the limiters' lease counters.
	Leases limiter.LeaseStats
	// ThrottledAt are the throttled decisions' times since the start.
	ThrottledAt []time.Duration
	// FirstErr is the first failed decision's error.
	FirstErr error
	// Kinds tells, for each of Calls, how it was decided (HotLoss
	// compares them with exact's decisions).
	Kinds []HotKind
	// Begin is the run's start (the wall clock): see Offset.
	Begin time.Time
}

// Offset is how far into its slot of the wall clock (a window's slot, a
// bucket's lease epoch: slots of that length from the Unix epoch) the
// run began. A run's store requests depend on it: a new process whose
// first calls come near a window slot's end leases later than one
// whose first calls come early in it (docs/leases.md).
func (rep HotReport) Offset(slot time.Duration) time.Duration {
	return time.Duration(rep.Begin.UnixNano() % int64(slot))
}

// HotKind is how a [RunHot] decision was decided.
type HotKind uint8

const (
	HotStore     HotKind = iota // the store decided it (admitted or denied)
	HotLeased                   // answered from a capacity lease
	HotCached                   // denied by the deny cache
	HotThrottled                // the store throttled the key: denied
	HotFailed                   // failed
)

// RunHot has each of limiters (one per process) decide opt.Key at a
// steady pace, all at once, for opt.Duration, with [limiter.Decide] and a
// cost of 1, stamped with the wall clock, and reports the decisions.
func RunHot(ctx context.Context, limiters []limiter.Limiter, opt HotOptions) HotReport {
	n := len(limiters)
	var (
		mu  sync.Mutex
		rep HotReport
		wg  sync.WaitGroup
	)
	begin := time.Now()
	rep.Begin = begin
	if opt.Prefill > 0 {
		rep.prefill(ctx, opt, begin)
	}
	for i, l := range limiters {
		wg.Go(func() {
			r := runProcess(ctx, l, i, n, opt, begin)
			mu.Lock()
			defer mu.Unlock()
			rep.add(&r)
		})
	}
	wg.Wait()
	for _, l := range limiters {
		if s, ok := l.(interface{ LeaseStats() limiter.LeaseStats }); ok {
			rep.Leases = rep.Leases.Add(s.LeaseStats())
		}
	}
	return rep
}

// prefill takes opt.Prefill units with opt.Prefiller at begin: the
// report's first call.
func (rep *HotReport) prefill(ctx context.Context, opt HotOptions, begin time.Time) {
	d, err := opt.Prefiller.AllowN(ctx, opt.Key, begin, opt.Prefill)
	rep.Calls = append(rep.Calls, Call{Worker: -1, Key: opt.Key, Stamp: begin, Cost: opt.Prefill, End: time.Since(begin),
		Reached: true, Allowed: err == nil && d.Allowed, Remaining: d.Remaining, Err: err})
	rep.Kinds = append(rep.Kinds, HotStore)
	if err != nil {
		rep.Failed++
		rep.FirstErr = err
		rep.Kinds[len(rep.Kinds)-1] = HotFailed
	} else if d.Allowed {
		rep.Admitted += opt.Prefill
	}
}

// rate is process i's decisions a second, of n.
func (opt HotOptions) rate(i, n int) float64 {
	if opt.Uneven && n > 1 {
		if i == 0 {
			return opt.Rate / 2
		}
		return opt.Rate / 2 / float64(n-1)
	}
	return opt.Rate / float64(n)
}

// runProcess is process i's decisions with l.
func runProcess(ctx context.Context, l limiter.Limiter, i, n int, opt HotOptions, begin time.Time) HotReport {
	var r HotReport
	end := begin.Add(opt.Duration)
	pace := time.Duration(float64(time.Second) / opt.rate(i, n))
	// Stagger the processes over one pace interval.
	next := begin.Add(time.Duration(i) * pace / time.Duration(n))
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for next.Before(end) && ctx.Err() == nil {
		time.Sleep(time.Until(next))
		next = next.Add(pace)
		if !opt.Open {
			r.decide(ctx, l, i, opt.Key, begin, nil)
			continue
		}
		wg.Go(func() { r.decide(ctx, l, i, opt.Key, begin, &mu) })
	}
	wg.Wait()
	return r
}

// decide is one decision of key by process i at the time it is called,
// recorded in r (under mu, if set).
func (r *HotReport) decide(ctx context.Context, l limiter.Limiter, i int, key string, begin time.Time, mu *sync.Mutex) {
	var out [1]limiter.Outcome
	now := time.Now()
	start := now.Sub(begin)
	_, err := limiter.Decide(ctx, now, []limiter.Item{{Limit: l, Key: key, N: 1}}, out[:])
	o := out[0]
	if mu != nil {
		mu.Lock()
		defer mu.Unlock()
	}
	kind := HotStore
	switch {
	case err != nil:
		kind = HotFailed
		r.Failed++
		if r.FirstErr == nil {
			r.FirstErr = err
		}
	case o.Throttled:
		kind = HotThrottled
		r.Throttled++
		r.ThrottledAt = append(r.ThrottledAt, start)
		if start > time.Second {
			r.ThrottledLate++
		}
	case o.Cached:
		kind = HotCached
		r.Cached++
	case o.Decision.Allowed:
		r.Admitted++
		if o.Leased {
			kind = HotLeased
			r.Leased++
		}
	}
	r.Kinds = append(r.Kinds, kind)
	r.Calls = append(r.Calls, Call{Worker: i, Key: key, Stamp: now, Cost: 1, Start: start, End: time.Since(begin),
		Reached: !o.Cached && !o.Leased, Allowed: err == nil && o.Decision.Allowed, Remaining: o.Decision.Remaining,
		Cached: o.Cached, Err: err})
}

// LongestGap is the longest time a process of the run went without
// beginning a decision, between two of its decisions: the host or the
// store stood still (a process decides one at a time unless Open, so a
// store that stands still stops each process once its lease runs out).
func (rep HotReport) LongestGap() time.Duration {
	starts := map[int][]time.Duration{}
	for _, c := range rep.Calls {
		if c.Worker >= 0 {
			starts[c.Worker] = append(starts[c.Worker], c.Start)
		}
	}
	var gap time.Duration
	for _, s := range starts {
		slices.Sort(s)
		for i := 1; i < len(s); i++ {
			gap = max(gap, s[i]-s[i-1])
		}
	}
	return gap
}

// add adds a process's report to rep.
func (rep *HotReport) add(r *HotReport) {
	rep.Calls = append(rep.Calls, r.Calls...)
	rep.Kinds = append(rep.Kinds, r.Kinds...)
	rep.Admitted += r.Admitted
	rep.Leased += r.Leased
	rep.Cached += r.Cached
	rep.Throttled += r.Throttled
	rep.ThrottledLate += r.ThrottledLate
	rep.Failed += r.Failed
	if rep.FirstErr == nil {
		rep.FirstErr = r.FirstErr
	}
	rep.ThrottledAt = append(rep.ThrottledAt, r.ThrottledAt...)
}

// ExactAdmitted replays calls in stamp order, one at a time, on exact (a
// limiter without leases, on a store of its own) and returns the units it
// admits: what a serialized limiter admits on the same calls. A call that
// failed (Err) is not replayed: it reached no decision to compare with
// (the report counts it in Failed).
func ExactAdmitted(ctx context.Context, exact limiter.Limiter, calls []Call) (int64, error) {
	cs := slices.Clone(calls)
	slices.SortStableFunc(cs, func(a, b Call) int { return a.Stamp.Compare(b.Stamp) })
	var admitted int64
	for _, c := range cs {
		if c.Err != nil {
			continue
		}
		d, err := exact.AllowN(ctx, c.Key, c.Stamp, c.Cost)
		if err != nil {
			return admitted, err
		}
		if d.Allowed {
			admitted += c.Cost
		}
	}
	return admitted, nil
}
