package regions

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// simLedger is an in-memory ledger whose reads see each region's entry
// as published lag ago on the simulated clock.
type simLedger struct {
	hist [][]State
	lag  time.Duration
	now  *time.Time
}

func (l *simLedger) Publish(_ context.Context, r int, st State) error {
	st.Given = slices.Clone(st.Given)
	st.Future = slices.Clone(st.Future)
	st.Tokens = slices.Clone(st.Tokens)
	l.hist[r] = append(l.hist[r], st)
	return nil
}

func (l *simLedger) Read(_ context.Context, r int) (State, bool, error) {
	h := l.hist[r]
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].At+int64(l.lag) <= l.now.UnixNano() {
			return h[i], true, nil
		}
	}
	return State{}, false, nil
}

// simCut is a region cut off from the others' replication from at for
// dur (simulated time): across the cut each side reads the other's
// entries as they were when it began.
type simCut struct {
	region  int
	at, dur time.Duration
}

// simView is reader's view of l across cut (if any).
type simView struct {
	l      *simLedger
	reader int
	cut    *simCut
}

func (v simView) Publish(ctx context.Context, r int, st State) error { return v.l.Publish(ctx, r, st) }

func (v simView) Read(ctx context.Context, r int) (State, bool, error) {
	c := v.cut
	if c == nil || (v.reader != c.region) == (r != c.region) {
		return v.l.Read(ctx, r)
	}
	from := simStart.Add(c.at)
	if v.l.now.Before(from) || !v.l.now.Before(from.Add(c.dur)) {
		return v.l.Read(ctx, r)
	}
	h := v.l.hist[r]
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].At+int64(v.l.lag) <= from.UnixNano() {
			return h[i], true, nil
		}
	}
	return State{}, false, nil
}

func memStore(t testing.TB) *memory.Store {
	t.Helper()
	s, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sim is a run of the shares on memory stores (one per region) with a
// simulated clock: Poisson arrivals at rate a second split by split (then
// by then for the second half, if set), each region's agent ticking
// every 250 ms, its ledger a lag old.
type sim struct {
	cfg         Config
	split, then []float64
	rate        float64
	dur, lag    time.Duration
	procs       int
	seed        uint64
	trace       testing.TB // logs the shares every 500 ms
	broken      bool       // the agents' broken grants
	brokenTok   bool       // the agents' broken tokens carried
	brokenAcc   bool       // the agents' broken tokens accrued in transit
	brokenOffer bool       // the agents' parts of offers taken early
	brokenGive  bool       // the agents' offers not withheld
	// splits, if set, are the demand's splits in turn, each for every
	// (overrides split and then).
	splits [][]float64
	every  time.Duration
	// stalls are stalls of a region's store (simStall).
	stalls []simStall
	// tick is the agents' tick (0: 250 ms), their first ticks a third of
	// it apart.
	tick time.Duration
	// cut, if set, cuts a region off from the others' replication.
	cut *simCut
}

// simStall is a stall of region's store from at for dur: its processes'
// calls wait (each decided at the stall's end, its stamp then, and its
// unit counted offered then), and its agent's requests for the first
// seen of it (their ticks wait until then: Agent.storeWait).
type simStall struct {
	region        int
	at, dur, seen time.Duration
}

// agentWait is how long region r's agent's tick at now waits on its
// store (a stall's first seen).
func (s sim) agentWait(r int, now time.Time) time.Duration {
	for _, st := range s.stalls {
		from := simStart.Add(st.at)
		if st.region == r && !now.Before(from) && now.Before(from.Add(st.seen)) {
			return from.Add(st.seen).Sub(now)
		}
	}
	return 0
}

// stalled reports whether region r's store is in a stall at now.
func (s sim) stalled(r int, now time.Time) bool {
	for _, st := range s.stalls {
		from := simStart.Add(st.at)
		if st.region == r && !now.Before(from) && now.Before(from.Add(st.dur)) {
			return true
		}
	}
	return false
}

// withStalls returns s with four stalls of its busiest region's store
// (the second half's, if demand moves), at a fifth of the run apart (and
// up to a tick later), each of 0.3-1 s (from the seed), its agent's requests waiting the first seen
// of each (a share: 1, the whole stall).
func (s sim) withStalls(seen float64) sim {
	rng := rand.New(rand.NewPCG(s.seed, 4))
	for k := 1; k <= 4; k++ {
		at := time.Duration(k) * s.dur / 5
		split := s.split
		if s.then != nil && at >= s.dur/2 {
			split = s.then
		}
		busy := 0
		for r, x := range split {
			if x > split[busy] {
				busy = r
			}
		}
		at += time.Duration(rng.Int64N(int64(250 * time.Millisecond))).Round(time.Millisecond) // any phase of the ticks
		dur := 300*time.Millisecond + time.Duration(rng.Int64N(int64(700*time.Millisecond)))
		dur = dur.Round(time.Millisecond)
		s.stalls = append(s.stalls, simStall{region: busy, at: at, dur: dur, seen: time.Duration(seen * float64(dur)).Round(time.Millisecond)})
	}
	return s
}

// tickEvery is the agents' tick: tick, or 250 ms.
func (s sim) tickEvery() time.Duration {
	if s.tick > 0 {
		return s.tick
	}
	return 250 * time.Millisecond
}

type simResult struct {
	calls              []limitertest.Call
	admitted, exact    int64
	over               []limitertest.Violation
	stats              []AgentStats
	sumAbove           int64 // the most the shares in force summed above the units
	cutAsked, cutAdmit []int64
	oldestOffer        time.Duration // the oldest offer not settled at the end
	// receivedFell is the ticks after which an agent's Stats().Received,
	// a running total, was below its value before.
	receivedFell int
	// leases sums the processes' lease counts at the end; leaseFell is
	// the ticks after which a region's processes' lease takes, a running
	// total, were fewer than before.
	leases    limiter.LeaseStats
	leaseFell int
}

func (r simResult) share() float64 { return float64(r.admitted) / float64(max(r.exact, 1)) }

func (s sim) run(t testing.TB) simResult {
	t.Helper()
	ctx := context.Background()
	start := simStart
	now := start
	ledger := &simLedger{hist: make([][]State, s.cfg.Regions), lag: s.lag, now: &now}
	agents := make([]*Agent, s.cfg.Regions)
	procs := make([][]*Limiter, s.cfg.Regions)
	for r := range agents {
		st := memStore(t)
		a, err := NewAgent(s.cfg, r, simView{ledger, r, s.cut}, st)
		if err != nil {
			t.Fatal(err)
		}
		a.ahead = 0 // one goroutine: no decision is under way during a tick
		a.broken = s.broken
		a.brokenTokens = s.brokenTok
		a.brokenAccrue = s.brokenAcc
		a.brokenOffer, a.brokenGive = s.brokenOffer, s.brokenGive
		a.storeWait = func(at time.Time) time.Duration { return s.agentWait(r, at) } // the memory store's: none, or a stall's
		agents[r] = a
		for range s.procs {
			l, err := a.NewLimiter(st)
			if err != nil {
				t.Fatal(err)
			}
			procs[r] = append(procs[r], l)
		}
	}
	rng := rand.New(rand.NewPCG(s.seed, 2))
	var res simResult
	nextTick := make([]time.Time, len(agents))
	for r := range nextTick {
		nextTick[r] = start.Add(time.Duration(r) * (s.tickEvery() / 3).Truncate(time.Millisecond))
	}
	end := start.Add(s.dur)
	next := make([]time.Time, len(agents))
	for r := range next {
		next[r] = start
	}
	waiting := make([]int, len(agents)) // calls waiting on a stalled store
	decide := func(r int, at time.Time) {
		l := procs[r][rng.IntN(len(procs[r]))]
		d, err := l.AllowN(ctx, s.cfg.Key, at, 1)
		if err != nil {
			t.Fatal(err)
		}
		res.calls = append(res.calls, limitertest.Call{Key: "k", Cost: 1, Stamp: at, Allowed: d.Allowed, Reached: true})
		if d.Allowed {
			res.admitted++
		}
	}
	for now.Before(end) {
		split := s.split
		if s.splits != nil {
			i := int(now.Sub(start) / s.every)
			split = s.splits[i%len(s.splits)]
			if now.Sub(start)%s.every == 0 {
				for r := range next {
					next[r] = now
				}
			}
		} else if s.then != nil && now.Sub(start) >= s.dur/2 {
			if now.Sub(start) == s.dur/2 {
				for r := range next { // the second phase's arrivals
					next[r] = now
				}
			}
			split = s.then
		}
		for r, a := range agents {
			for !nextTick[r].After(now) {
				before, takes := a.Stats().Received, leaseTakes(procs[r])
				if err := a.Tick(ctx, now); err != nil {
					t.Fatal(err)
				}
				if a.Stats().Received < before {
					res.receivedFell++
				}
				if leaseTakes(procs[r]) < takes {
					res.leaseFell++
				}
				nextTick[r] = nextTick[r].Add(s.tickEvery())
			}
		}
		var sum int64
		for _, a := range agents {
			sh, _ := a.Share()
			sum += sh
		}
		res.sumAbove = max(res.sumAbove, sum-s.cfg.units())
		if s.trace != nil && now.Sub(start)%(500*time.Millisecond) == 0 {
			line := fmt.Sprintf("%5.1fs", now.Sub(start).Seconds())
			var adm [3]int
			for _, c := range res.calls {
				if c.Allowed && now.Sub(c.Stamp) < 500*time.Millisecond {
					adm[0]++
				}
			}
			for r, a := range agents {
				sh, p := a.Share()
				line += fmt.Sprintf(" | r%d share %4d pend %4d demand %6.1f", r, sh, p, a.states[r].Demand)
			}
			s.trace.Logf("%s | admitted/s %d", line, adm[0]*2)
		}
		for r := range agents {
			stalled := s.stalled(r, now)
			for ; !stalled && waiting[r] > 0; waiting[r]-- {
				decide(r, now) // the calls that waited, at the stall's end
			}
			// Poisson arrivals: exponential gaps.
			for next[r].Before(now.Add(time.Millisecond)) {
				at := next[r]
				if stalled {
					waiting[r]++
				} else {
					decide(r, at)
				}
				if rate := s.rate * split[r]; rate > 0 {
					next[r] = at.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
				} else {
					next[r] = end
				}
			}
		}
		now = now.Add(time.Millisecond)
	}
	mem := memStore(t)
	var exact limiter.Limiter
	var err error
	if b := s.cfg.Bucket; b != nil {
		exact, err = limiter.NewTokenBucket(mem, *b)
		res.over = limitertest.CheckBucketBound(res.calls, *b)
	} else {
		exact, err = limiter.NewSlidingWindow(mem, limiter.SlidingWindowConfig{Name: "exact", Limit: s.cfg.Limit, Window: s.cfg.Window,
			SubWindows: s.cfg.SubWindows, Representation: limiter.SubWindowCounters})
		res.over = limitertest.CheckTrailingWindow(res.calls, s.cfg.Limit, s.cfg.Window)
	}
	if err != nil {
		t.Fatal(err)
	}
	if res.exact, err = limitertest.ExactAdmitted(ctx, exact, res.calls); err != nil {
		t.Fatal(err)
	}
	for r, a := range agents {
		for _, l := range procs[r] {
			res.leases = res.leases.Add(l.LeaseStats())
		}
		res.stats = append(res.stats, a.Stats())
		for _, m := range a.offers() {
			res.oldestOffer = max(res.oldestOffer, end.Sub(time.Unix(0, m.Tau)))
		}
	}
	return res
}

var (
	simStart  = time.Unix(1_000_000_000, 0)
	simWindow = Config{Regions: 3, Key: "k", Limit: 1000, Window: 4 * time.Second, SubWindows: 4, Leases: true, Offers: true}
	simBucket = Config{Regions: 3, Key: "k", Bucket: &limiter.TokenBucketConfig{Name: "global", MaxAmount: 200, RefillTime: 10 * time.Millisecond,
		RefillAmount: 2}, Leases: true, Offers: true}
	simSplits = []struct {
		name        string
		split, then []float64
	}{
		{"98/1/1", []float64{0.98, 0.01, 0.01}, nil},
		{"60/30/10", []float64{0.6, 0.3, 0.1}, nil},
		{"33/33/33", []float64{1. / 3, 1. / 3, 1. / 3}, nil},
		{"98/1/1-then-1/1/98", []float64{0.98, 0.01, 0.01}, []float64{0.01, 0.01, 0.98}},
	}
)

// TestSharesSim: the shares of a window and of a bucket on memory
// stores, lag 1 s, every split at 1.2 times the steady rate for 20 s of
// simulated time: never over the limit (the history checkers over the
// union of regions), the shares in force never sum above the limit, and
// the share of exact reported (asserted only loosely, at least 70%: a
// move costs about two lags of the rate; BenchmarkSharesSim).
func TestSharesSim(t *testing.T) {
	for _, alg := range []struct {
		name string
		cfg  Config
		rate float64
	}{{"window", simWindow, 1.2 * 200}, {"bucket", simBucket, 1.2 * 200}} {
		for _, sp := range simSplits {
			t.Run(alg.name+"/"+sp.name, func(t *testing.T) {
				seed := uint64(time.Now().UnixNano())
				res := sim{cfg: alg.cfg, split: sp.split, then: sp.then, rate: alg.rate, dur: 20 * time.Second, lag: time.Second, procs: 2, seed: seed}.run(t)
				t.Logf("seed %d: admitted %d, exact %d: %.3f of exact; agents %+v", seed, res.admitted, res.exact, res.share(), res.stats)
				for _, v := range res.over {
					t.Errorf("seed %d: over the limit: %v", seed, v)
				}
				if res.sumAbove > 0 {
					t.Errorf("seed %d: the shares in force summed to %d above the units", seed, res.sumAbove)
				}
				if res.share() < 0.7 {
					t.Errorf("seed %d: %.3f of exact", seed, res.share())
				}
			})
		}
	}
}

// TestSharesSimFailsBroken: the checker sees a bucket's giver that keeps
// its rate and capacity, one that carries a token with every unit it
// gives whether it saved it or not, and a receiver that takes a grant as
// if it had been in transit for an hour (full, refilled or not): at three
// times the steady rate and a lag of 250 ms, the split 60/30/10 for 30 s
// (for the tokens, 10 s of demand re-split every 1.5 s, one region idle)
// then puts intervals of stamps over the bucket's bound. (The window's counterpart: TestSharesGiveOnlyFree.)
func TestSharesSimFailsBroken(t *testing.T) {
	resplit := [][]float64{{0.6, 0.4, 0}, {0, 0.3, 0.7}, {0.5, 0, 0.5}}
	for _, c := range []struct {
		name                           string
		broken, brokenToken, brokenAcc bool
		splits                         [][]float64
		dur                            time.Duration
	}{
		{"bucket/rate", true, false, false, nil, 30 * time.Second},
		{"bucket/tokens", false, true, false, resplit, 10 * time.Second},
		{"bucket/accrued", false, false, true, resplit, 10 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			sp := simSplits[1]
			// On the plan that gives in proportion to demand alone
			// (brokenKeep): at three times the rate each region with
			// demand uses its share and keeps it (planRate), so too few
			// grants are made for the checker to catch the broken ones.
			// And without offers, which would give most of what the
			// grants do (TestSharesOffersFailBroken checks those).
			cfg := simBucket
			cfg.brokenKeep, cfg.Offers = true, false
			res := sim{cfg: cfg, split: sp.split, splits: c.splits, every: 1500 * time.Millisecond, rate: 600, dur: c.dur,
				lag: 250 * time.Millisecond, procs: 2, seed: seed, broken: c.broken, brokenTok: c.brokenToken, brokenAcc: c.brokenAcc}.run(t)
			if len(res.over) == 0 {
				t.Errorf("seed %d: broken grants, yet no window over the limit (%.3f of exact)", seed, res.share())
			} else {
				t.Logf("seed %d: broken grants: %v", seed, res.over[0])
			}
		})
	}
}

// TestSharesGiveOnlyFree: two regions of a window of 100 a second.
// Region 0 uses its whole base share (50), then its demand stops and
// region 1's starts: region 0 gives its share away, but its 50 units are
// in view, so the grant is in force only from when they leave it (a
// window and a sub-window after their sub-window's start), and region 1,
// deciding 100 units in the same second, gets 50: the window is never
// over; from then on region 1 holds the grant. A broken giver that
// ignores its count gives them at once, and region 1's 99 units put the
// second over the limit (the checker sees it).
func TestSharesGiveOnlyFree(t *testing.T) {
	cfg := Config{Regions: 2, Key: "k", Limit: 100, Window: time.Second, SubWindows: 10}
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			ctx := context.Background()
			now := time.Unix(5000, 0)
			ledger := &simLedger{hist: make([][]State, 2), now: &now}
			var agents [2]*Agent
			var procs [2]*Limiter
			for r := range agents {
				st := memStore(t)
				a, err := NewAgent(cfg, r, ledger, st)
				if err != nil {
					t.Fatal(err)
				}
				a.broken = broken
				agents[r] = a
				if procs[r], err = a.NewLimiter(st); err != nil {
					t.Fatal(err)
				}
			}
			var calls []limitertest.Call
			decide := func(r, n int) int {
				got := 0
				for range n {
					d, err := procs[r].AllowN(ctx, "k", now, 1)
					if err != nil {
						t.Fatal(err)
					}
					calls = append(calls, limitertest.Call{Key: "k", Cost: 1, Stamp: now, Allowed: d.Allowed, Reached: true})
					if d.Allowed {
						got++
					}
				}
				return got
			}
			tick := func() {
				for _, a := range agents {
					if err := a.Tick(ctx, now); err != nil {
						t.Fatal(err)
					}
				}
			}
			tick()
			if got := decide(0, 50); got != 50 {
				t.Fatalf("region 0 admitted %d of its base share 50", got)
			}
			for range 4 { // region 0 idle, region 1 asking 400 a second
				now = now.Add(50 * time.Millisecond)
				agents[1].offered.Add(100)
				tick()
			}
			sh0, _ := agents[0].Share()
			sh1, _ := agents[1].Share()
			got := decide(1, 100)
			future := agents[0].states[0].Future
			t.Logf("region 0: share %d, grants to come %+v; region 1: share %d, admitted %d of 100", sh0, future, sh1, got)
			over := limitertest.CheckTrailingWindow(calls, cfg.Limit, cfg.Window)
			if broken {
				if len(over) == 0 {
					t.Errorf("a giver that ignores its count: no window over the limit (region 1 admitted %d)", got)
				}
				return
			}
			for _, v := range over {
				t.Errorf("over the limit: %v", v)
			}
			leave := time.Unix(5000, 0).Add(1100 * time.Millisecond).UnixNano() // region 0's sub-window leaves its view
			var coming int64
			for _, f := range future {
				if f.At < leave {
					t.Errorf("a grant in force at %v, before region 0's units leave its view at %v", time.Unix(0, f.At), time.Unix(0, leave))
				}
				coming += f.Units
			}
			if coming < 45 || sh1 != 50 || got != 50 {
				t.Errorf("region 0 gives %d later; region 1 holds %d and admitted %d: want 45 or more, 50 and 50", coming, sh1, got)
			}
			// Once region 0's units have left its view, region 1 holds
			// the grant.
			now = time.Unix(0, leave)
			if got := decide(1, 60); got < 40 {
				t.Errorf("after region 0's units left its view, region 1 admitted %d of 60, want 40 or more", got)
			}
			tick()
			if sh1, _ := agents[1].Share(); sh1 < 90 {
				t.Errorf("after region 0's units left its view, region 1 holds %d, want 90 or more", sh1)
			}
			for _, v := range limitertest.CheckTrailingWindow(calls, cfg.Limit, cfg.Window) {
				t.Errorf("over the limit: %v", v)
			}
		})
	}
}

// TestSharesSimRandom: both limits, demand at three times the steady rate
// re-split at random every 1.5 s (one region idle each time), a random
// lag up to 1.5 s: never over the limit, and the shares in force never
// sum above it. (The share of exact is low and only logged: demand that
// moves faster than two lags leaves the shares behind.)
func TestSharesSimRandom(t *testing.T) {
	for _, alg := range []struct {
		name string
		cfg  Config
	}{{"window", simWindow}, {"bucket", simBucket}} {
		t.Run(alg.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			s := simRandom(alg.cfg, seed)
			lag := s.lag
			res := s.run(t)
			t.Logf("seed %d, lag %v: %.3f of exact", seed, lag, res.share())
			for _, v := range res.over {
				t.Errorf("seed %d: over the limit: %v", seed, v)
			}
			if res.sumAbove > 0 {
				t.Errorf("seed %d: the shares in force summed to %d above the units", seed, res.sumAbove)
			}
		})
	}
}

// TestSharesOffersFailBroken: the checkers see offers (Config.Offers)
// misused, in TestSharesSimRandom's runs cut to 9 s (demand at three times
// the rate re-split at random every 1.5 s, a random lag up to 1.5 s): a giver that
// does not withhold what it offers puts the history over the limit; a
// recipient that takes its part as soon as it reads the offer, split by
// the marks it has read by then rather than as of the offer's stamp (so
// the regions' splits differ), puts the history over the limit or the
// shares in force above the units, in one of up to 16 runs (of 30 seeds,
// 14 caught it for the window, 18 for the bucket: a miss in 16 is about
// 1 in 25,000).
func TestSharesOffersFailBroken(t *testing.T) {
	for _, alg := range []struct {
		name string
		cfg  Config
	}{{"window", simWindow}, {"bucket", simBucket}} {
		for _, give := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/give=%v", alg.name, give), func(t *testing.T) {
				seed := uint64(time.Now().UnixNano())
				for k := range uint64(16) {
					s := simRandom(alg.cfg, seed+k)
					s.brokenGive, s.brokenOffer = give, !give
					s.dur = 9 * time.Second
					res := s.run(t)
					t.Logf("seed %d, lag %v: %.3f of exact, %d windows over, shares in force %d above", seed+k, s.lag, res.share(), len(res.over), res.sumAbove)
					if len(res.over) > 0 || !give && res.sumAbove > 0 {
						return
					}
				}
				t.Errorf("seeds %d to %d: broken offers, yet never over", seed, seed+15)
			})
		}
	}
}

// TestSharesOffersCut: offers where a region is cut off from the others'
// replication for 10 s of 20 (from 3 s), demand 98/1/1, 1/1/98 from 6 s
// (into the cut region), 98/1/1 again from 12 s, 1/1/98 from 18 s: never
// over (the history checkers), the shares in force never sum above the
// units, and, 7 s after the heal, no offer older than 5 s unsettled
// (what no region took back with its giver).
func TestSharesOffersCut(t *testing.T) {
	for _, alg := range []struct {
		name string
		cfg  Config
	}{{"window", simWindow}, {"bucket", simBucket}} {
		t.Run(alg.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			s := sim{cfg: alg.cfg, splits: [][]float64{{0.98, 0.01, 0.01}, {0.01, 0.01, 0.98}}, every: 6 * time.Second, rate: 240,
				dur: 20 * time.Second, lag: time.Second, procs: 2, seed: seed, cut: &simCut{region: 2, at: 3 * time.Second, dur: 10 * time.Second}}
			res := s.run(t)
			t.Logf("seed %d: %.3f of exact; the oldest offer not settled at the end %v; agents %+v", seed, res.share(), res.oldestOffer, res.stats)
			for _, v := range res.over {
				t.Errorf("seed %d: over the limit: %v", seed, v)
			}
			if res.sumAbove > 0 {
				t.Errorf("seed %d: the shares in force summed to %d above the units", seed, res.sumAbove)
			}
			if res.oldestOffer > 5*time.Second {
				t.Errorf("seed %d: an offer %v old not settled at the end (the cut healed 7 s before)", seed, res.oldestOffer)
			}
		})
	}
}

// TestSharesReceivedRunningTotal: an agent's Received (and so the
// shares' metrics, which report its growth a tick) is a running total of
// the grants and the offers' parts it took, never falling, in
// TestSharesOffersCut's bucket runs (demand moving between regions:
// parts taken both ways); brokenReceived, which counted the grants only,
// lost the parts at the next tick.
func TestSharesReceivedRunningTotal(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			brokenReceived = broken
			defer func() { brokenReceived = false }()
			seed := uint64(time.Now().UnixNano())
			s := sim{cfg: simBucket, splits: [][]float64{{0.98, 0.01, 0.01}, {0.01, 0.01, 0.98}}, every: 3 * time.Second, rate: 240,
				dur: 12 * time.Second, lag: time.Second, procs: 2, seed: seed}
			res := s.run(t)
			t.Logf("seed %d: Received fell after %d ticks; agents %+v", seed, res.receivedFell, res.stats)
			if fell := res.receivedFell > 0; fell != broken {
				t.Errorf("seed %d: Received fell after %d ticks; want it to fall %v", seed, res.receivedFell, broken)
			}
		})
	}
}

// leaseTakes sums ls's lease takes.
func leaseTakes(ls []*Limiter) int64 {
	var n int64
	for _, l := range ls {
		n += l.LeaseStats().Takes
	}
	return n
}

// TestSharesLimiterCountsLeases: a Limiter's lease counts (LeaseStats,
// which limitertest.RunHot and the benchmarks sum: "0 takes" before it)
// are running totals over every item of the region's bucket, a rebase's
// replaced ones included, in TestSharesReceivedRunningTotal's runs
// (demand moving between regions: rebases both ways); brokenRetire, which
// dropped a replaced item's counts with its bucket, lowers them at a
// rebase.
func TestSharesLimiterCountsLeases(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			brokenRetire = broken
			defer func() { brokenRetire = false }()
			seed := uint64(time.Now().UnixNano())
			s := sim{cfg: simBucket, splits: [][]float64{{0.98, 0.01, 0.01}, {0.01, 0.01, 0.98}}, every: 3 * time.Second, rate: 240,
				dur: 12 * time.Second, lag: time.Second, procs: 2, seed: seed}
			res := s.run(t)
			var rebases int64
			for _, a := range res.stats {
				rebases += a.Rebases
			}
			t.Logf("seed %d: leases %+v; lease takes fell after %d ticks; %d rebases", seed, res.leases, res.leaseFell, rebases)
			if res.leases.Takes == 0 || rebases == 0 {
				t.Fatalf("seed %d: %d lease takes, %d rebases: the run cannot tell", seed, res.leases.Takes, rebases)
			}
			if fell := res.leaseFell > 0; fell != broken {
				t.Errorf("seed %d: lease takes fell after %d ticks; want them to fall %v", seed, res.leaseFell, broken)
			}
		})
	}
}

// simRandom is TestSharesSimRandom's run of cfg for seed.
func simRandom(cfg Config, seed uint64) sim {
	rng := rand.New(rand.NewPCG(seed, 3))
	var splits [][]float64
	for range 10 {
		sp := []float64{rng.Float64(), rng.Float64(), rng.Float64()}
		sp[rng.IntN(3)] = 0
		var sum float64
		for _, x := range sp {
			sum += x
		}
		for i := range sp {
			sp[i] /= max(sum, 1e-9)
		}
		splits = append(splits, sp)
	}
	lag := time.Duration(rng.Int64N(int64(1500 * time.Millisecond)))
	return sim{cfg: cfg, splits: splits, every: 1500 * time.Millisecond, rate: 600, dur: 15 * time.Second, lag: lag, procs: 2, seed: seed}
}

func TestSharesConfig(t *testing.T) {
	ledger := &simLedger{hist: make([][]State, 3), now: new(time.Time)}
	st := memStore(t)
	for _, c := range []Config{
		{Regions: 1, Key: "k", Limit: 10, Window: time.Second, SubWindows: 1},
		{Regions: 3, Key: "k", Limit: 2, Window: time.Second, SubWindows: 1},
		{Regions: 3, Key: "k", Limit: 10, Window: 0, SubWindows: 1},
		{Regions: 3, Key: "k", Limit: 10, Window: time.Second},
		{Regions: 3, Limit: 10, Window: time.Second, SubWindows: 1},
		{Regions: 3, Key: "k", Bucket: &limiter.TokenBucketConfig{MaxAmount: 5, RefillTime: time.Second, RefillAmount: 1}},
	} {
		if _, err := NewAgent(c, 0, ledger, st); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", c, err)
		}
	}
	ok := Config{Regions: 3, Key: "k", Limit: 10, Window: time.Second, SubWindows: 1}
	if _, err := NewAgent(ok, 3, ledger, st); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("region 3 of 3: %v, want ErrInvalidConfig", err)
	}
	if _, err := NewAgent(ok, 0, ledger, fmt.Sprint("not a store")); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a string as the store: %v, want ErrInvalidConfig", err)
	}
}

// TestSharesAccrued: a bucket's grant in transit refills at the rate of
// its units (197 units of 200 a second here: 97 units refill 98.5 a
// second) from its giver's stamp, up to its units less the tokens it
// carried, counted whole; a receiver takes it once, and nothing of a
// grant to another region or stamped after its clock.
func TestSharesAccrued(t *testing.T) {
	ledger := &simLedger{hist: make([][]State, 3), now: new(time.Time)}
	a, err := NewAgent(simBucket, 2, ledger, memStore(t))
	if err != nil {
		t.Fatal(err)
	}
	at := simStart.UnixNano()
	moves := []Move{{To: 2, Units: 97, Tokens: 10, At: at, Upto: 97}, {To: 1, Units: 50, At: at, Upto: 50}}
	for _, c := range []struct {
		from  int64
		after time.Duration
		want  int64
	}{
		{0, -time.Millisecond, 0},
		{0, 0, 0},
		{0, 10 * time.Millisecond, 0}, // 0.985
		{0, 500 * time.Millisecond, 49},
		{0, 800 * time.Millisecond, 78},
		{0, time.Second, 87}, // 98.5, less the 10 carried
		{0, time.Hour, 87},
		{97, time.Second, 0}, // taken
	} {
		if got := a.accrued(moves, c.from, at+int64(c.after)); got != c.want {
			t.Errorf("from %d, %v after: %d accrued, want %d", c.from, c.after, got, c.want)
		}
	}
}

// TestSharesStaleDemand: three regions of a window of 1,000 (memory
// ledger, lag 250 ms, ticks every 250 ms, no decisions: the demand is
// offered to the agents). Regions 0 and 1 ask 100 a second; region 2
// asks 100 a second for its first second, then its agent stops (its
// entry, showing 100 a second, stops changing). At stop, region 0's
// demand stops: its surplus is given to the regions short of their
// targets. While region 2's entry is within StaleEntry of its
// publication, the others' plans count its demand (its target, as
// regions 0 and 1 read it, stays near a third) and region 0 gives it a
// part; past it, they count none (its target falls to the floor) and
// region 0 gives it nothing: all goes to region 1. With the plans
// counting a stale entry's demand (brokenStale, as before), region 0
// gives region 2 a part past the bound too.
func TestSharesStaleDemand(t *testing.T) {
	const lastTick = time.Second // region 2's agent's last tick
	for _, c := range []struct {
		name   string
		stop   time.Duration // region 0's demand stops
		broken bool
		toDead bool // region 0 gives region 2 units after stop
	}{
		{"before-the-bound", 5 * time.Second, false, true},
		{"past-the-bound", lastTick + StaleEntry + 2*time.Second, false, false},
		{"past-the-bound/broken", lastTick + StaleEntry + 2*time.Second, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			now := simStart
			ledger := &simLedger{hist: make([][]State, 3), lag: 250 * time.Millisecond, now: &now}
			var agents [3]*Agent
			for r := range agents {
				a, err := NewAgent(simWindow, r, ledger, memStore(t))
				if err != nil {
					t.Fatal(err)
				}
				a.brokenStale = c.broken
				agents[r] = a
			}
			units := float64(simWindow.units())
			var givenAtStop, freshTicks, staleTicks int64
			end := c.stop + 3*time.Second
			for at := time.Duration(0); at < end; at += 250 * time.Millisecond {
				now = simStart.Add(at)
				if at == c.stop {
					givenAtStop = agents[0].states[0].Given[2]
				}
				for r, a := range agents {
					if r == 2 && at > lastTick {
						continue // stopped
					}
					if r != 0 || at < c.stop {
						a.offered.Add(25) // 100 a second
					}
					if err := a.Tick(ctx, now); err != nil {
						t.Fatal(err)
					}
				}
				// The targets regions 0 and 1 plan by.
				published := agents[2].states[2].At
				for _, r := range []int{0, 1} {
					a := agents[r]
					read := a.states[2]
					if read.Demand == 0 {
						continue // not yet estimated
					}
					tg := simWindow.targets(a.planView(now))[2]
					stale := now.UnixNano()-read.At > int64(StaleEntry)
					if read.At != published && at > lastTick+ledger.lag {
						t.Fatalf("%v: region %d read region 2's entry of %v, not its last", at, r, time.Unix(0, read.At).Sub(simStart))
					}
					if stale {
						staleTicks++
					} else {
						freshTicks++
					}
					switch {
					case !stale && tg < units/5:
						t.Errorf("%v: region %d plans region 2's target %.0f, its entry %v old (within the bound)", at, r, tg, now.Sub(time.Unix(0, read.At)))
					case stale && !c.broken && tg > 0.02*units:
						t.Errorf("%v: region %d plans region 2's target %.0f, its entry %v old (past the bound)", at, r, tg, now.Sub(time.Unix(0, read.At)))
					case stale && c.broken && tg < units/5:
						t.Errorf("%v: counting stale demand, region %d plans region 2's target %.0f", at, r, tg)
					}
				}
			}
			gave := agents[0].states[0].Given
			toDead := gave[2] - givenAtStop
			t.Logf("region 0 gave %v in all, %d to region 2 after its demand stopped at %v; region 2's entry published at %v; shares %d %d %d; targets checked on %d ticks within the bound, %d past",
				gave, toDead, c.stop, time.Unix(0, agents[2].states[2].At).Sub(simStart), agents[0].owned, agents[1].owned, agents[2].owned, freshTicks, staleTicks)
			if freshTicks == 0 || c.stop > lastTick+StaleEntry && staleTicks == 0 {
				t.Fatalf("targets checked on %d ticks within the bound, %d past it", freshTicks, staleTicks)
			}
			if gave[1] == 0 {
				t.Fatalf("region 0 gave region 1 nothing: %+v", agents[0].Stats())
			}
			if c.toDead && toDead == 0 {
				t.Errorf("region 0 gave region 2 nothing after %v (its entry within the bound, or counted as before)", c.stop)
			}
			if !c.toDead && toDead != 0 {
				t.Errorf("region 0 gave region 2, stopped %v before, %d units after %v", c.stop-lastTick, toDead, c.stop)
			}
		})
	}
}

// TestSharesDemandBlip: a region's demand estimate (Agent.estimate) at 80
// units a second, ticked every 250 ms, through one tick that counts 260
// (its processes' calls that waited on a slow store, or their counts
// written late) and one that counts none: the estimate stays near 80
// and an even split's plan gives nothing (before, a single tick far from
// the estimate replaced it: 1,040 a second, and the other regions gave
// it most of their units, to give them back a tick or two later). Two
// far ticks in a row on the same side are demand that moved: taken at
// once. Fails with brokenJump.
func TestSharesDemandBlip(t *testing.T) {
	for _, broken := range []bool{false, true} {
		cfg := Config{Regions: 3, Key: "k", Bucket: &limiter.TokenBucketConfig{MaxAmount: 200, RefillTime: 10 * time.Millisecond, RefillAmount: 2}}
		ledger := &simLedger{hist: make([][]State, 3), now: new(time.Time)}
		a, err := NewAgent(cfg, 1, ledger, memStore(t))
		if err != nil {
			t.Fatal(err)
		}
		a.brokenJump = broken
		now := time.Unix(1000, 0)
		tick := func(n int64) float64 {
			a.offered.Store(n)
			now = now.Add(250 * time.Millisecond)
			a.estimate(now, 0)
			return a.Stats().Demand
		}
		for range 40 {
			tick(20)
		}
		var worst float64
		gave := false
		for _, n := range []int64{260, 20, 20, 0, 20, 20} {
			d := tick(n)
			if dev := max(d-80, 80-d); dev > worst {
				worst = dev
			}
			states := make([]State, 3)
			for r := range states {
				states[r] = State{Demand: 80, Given: make([]int64, 3)}
			}
			states[1].Demand = d
			// The proportional plan (brokenKeep): region 0 at 80 a
			// second would keep its share whatever region 1's estimate
			// (planRate; TestSharesEvenDemand), and the blip's
			// estimate would not show in it.
			prop := cfg
			prop.brokenKeep = true
			g := prop.plan(0, states, false)
			gave = gave || g != nil
			if g != nil && !broken {
				t.Errorf("a tick of %d: estimate %.1f, region 0's plan gives %v at an even split", n, d, g)
			}
		}
		if !broken && worst > 20 {
			t.Errorf("the estimate strayed %.1f from 80 a second after single ticks far from it", worst)
		}
		if broken && (worst < 500 || !gave) {
			t.Errorf("brokenJump: the estimate strayed only %.1f, the plan gave: %v (the test cannot fail)", worst, gave)
		}
		if broken {
			continue
		}
		tick(100)
		if d := tick(100); d != 400 {
			t.Errorf("two ticks of 100 in a row: estimate %.1f, want 400 (demand that moved)", d)
		}
		for range 4 {
			tick(100)
		}
		tick(0)
		if d := tick(0); d != 0 {
			t.Errorf("two ticks of none in a row: estimate %.1f, want 0", d)
		}
	}
}

// TestSharesDemandCap: a region's plan counts another region's demand at
// most the limit's rate. Regions hold a bucket's units at 60/30/10 of
// 144, 72 and 24 a second (1.2 times the rate of 200) when region 1's
// estimate jumps to 3,021 a second (as one did through the table, a
// stalled process's calls arriving at once over two ticks). Counted at the
// rate, region 0 gives region 1 what a demand of 200 a second calls for
// (41 units of its 118); counted as it is (brokenCap), nearly all it holds
// (109). With no demand above the rate the plans are the same.
func TestSharesDemandCap(t *testing.T) {
	// On the proportional plan (brokenKeep): region 0 at 144 a second
	// uses its 118 units and keeps them whatever region 1's estimate
	// (planRate), so the cap shows only where the targets decide.
	cfg := Config{Regions: 3, Key: "k", Bucket: &limiter.TokenBucketConfig{MaxAmount: 200, RefillTime: 10 * time.Millisecond, RefillAmount: 2},
		brokenKeep: true}
	now := time.Unix(1000, 0)
	plan := func(broken bool, d1 float64) []int64 {
		ledger := &simLedger{hist: make([][]State, 3), now: &now}
		a, err := NewAgent(cfg, 0, ledger, memStore(t))
		if err != nil {
			t.Fatal(err)
		}
		a.brokenCap = broken
		// Shares 118, 59, 19 of 196: region 1 gave region 0 6 units,
		// region 2 gave it 46.
		a.states = []State{
			{Demand: 144, Given: []int64{0, 0, 0}, Seq: 9, At: now.UnixNano()},
			{Demand: d1, Given: []int64{6, 0, 0}, Seq: 9, At: now.UnixNano()},
			{Demand: 24, Given: []int64{46, 0, 0}, Seq: 9, At: now.UnixNano()},
		}
		if s := cfg.share(0, a.states); s != 118 {
			t.Fatalf("region 0's share %d, want 118", s)
		}
		return a.planNow(now, false)
	}
	gives := func(g []int64) int64 {
		var s int64
		for _, u := range g {
			s += u
		}
		return s
	}
	capped, broken := gives(plan(false, 3021)), gives(plan(true, 3021))
	// Targets at 144:200:24 of 196: region 0's 76.7, so a surplus of 41.3.
	if capped < 35 || capped > 42 {
		t.Errorf("counted at the rate, region 0 gives %d units, want 35-42 (its surplus over a target of 144:200:24)", capped)
	}
	if broken < 100 {
		t.Errorf("brokenCap: region 0 gives %d units, want 100 or more (the test cannot fail)", broken)
	}
	if a, b := plan(false, 150), plan(true, 150); a == nil || !slices.Equal(a, b) {
		t.Errorf("region 1 at 150 a second, below the rate: the plan %v, want %v (and some)", a, b)
	}
	t.Logf("region 0 gives %d counted at the rate, %d counted as estimated", capped, broken)
}

// TestSharesDemandStall: region 0 of a bucket's three regions asks 200
// units a second (50 a tick of 250 ms), the others 2 (their entries in
// the ledger, fresh, showing they gave region 0 their units: it holds
// all 197). Its store stalls: three ticks count none, their reads
// taking 700, 450 and 200 ms (usually 2 ms), two more count none, the
// agent's requests quick again but not yet its processes', and the next
// counts the 250 calls that waited with its own 50. The estimate holds
// (within 20 of 200) and region 0 gives nothing; with brokenStall (a
// slow tick's count weighed as any other's, as before) two ticks of none
// drop it to 0 and region 0 gives nearly all its units to the idle
// regions. Demand that leaves is followed: within two ticks with the
// reads as usual, within holdMax, holdAfter and two ticks while they
// stay slow.
func TestSharesDemandStall(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			ctx := t.Context()
			now := simStart
			ledger := &simLedger{hist: make([][]State, 3), now: &now}
			a, err := NewAgent(simBucket, 0, ledger, memStore(t))
			if err != nil {
				t.Fatal(err)
			}
			a.ahead = 0
			a.brokenStall = broken
			a.states[0].Demand = 200 // as estimated before
			took := 2 * time.Millisecond
			a.storeWait = func(time.Time) time.Duration { return took }
			seq := int64(0)
			tick := func(n int64, reads time.Duration) float64 {
				t.Helper()
				now = now.Add(250 * time.Millisecond)
				seq++
				for r := 1; r < 3; r++ {
					// Region r gave region 0 its base.
					gave := []int64{simBucket.base(r), 0, 0}
					ledger.Publish(ctx, r, State{Demand: 2, Given: gave, Seq: seq, At: now.UnixNano()}) //nolint:errcheck // memory
				}
				a.offered.Add(n)
				took = reads
				if err := a.Tick(ctx, now); err != nil {
					t.Fatal(err)
				}
				return a.Stats().Demand
			}
			for range 40 {
				tick(50, 2*time.Millisecond)
			}
			var low float64 = 200
			for _, c := range []struct {
				n     int64
				reads time.Duration
			}{{0, 700 * time.Millisecond}, {0, 450 * time.Millisecond}, {0, 200 * time.Millisecond}, {0, 3 * time.Millisecond}, {0, 2 * time.Millisecond},
				{300, 2 * time.Millisecond}} {
				low = min(low, tick(c.n, c.reads))
			}
			for range 4 {
				low = min(low, tick(50, 2*time.Millisecond))
			}
			st := a.Stats()
			t.Logf("through the stall: the estimate at least %.1f, now %.1f; region 0 gave %d units, holds %d; %d ticks held", low, st.Demand, st.Given, st.Share, st.Held)
			if broken {
				if low > 20 || st.Given < 40 {
					t.Errorf("brokenStall: the estimate fell only to %.1f and region 0 gave %d units (the test cannot fail)", low, st.Given)
				}
				return
			}
			if low < 180 || st.Given != 0 || st.Held != 3+holdAfter {
				t.Errorf("a stall: the estimate fell to %.1f, region 0 gave %d units, %d ticks held; want 180 or more, none, %d", low, st.Given, st.Held, 3+holdAfter)
			}
			// Demand that leaves, the reads as usual: two ticks.
			for i := range 2 {
				tick(0, 2*time.Millisecond)
				if d := a.Stats().Demand; i == 1 && d > 1 {
					t.Errorf("demand that left: the estimate %.1f two ticks later, want 0", d)
				}
			}
			if a.Stats().Given < 40 {
				t.Errorf("demand that left: region 0 gave %d units, want 40 or more", a.Stats().Given)
			}
			// Back, then gone while the reads stay slow (400 ms).
			for range 8 {
				tick(50, 2*time.Millisecond)
			}
			most := int(holdMax/(250*time.Millisecond)) + holdAfter + 2
			ticks := 0
			for ticks < most && a.Stats().Demand > 1 {
				tick(0, 400*time.Millisecond)
				ticks++
			}
			if d := a.Stats().Demand; d > 1 {
				t.Errorf("demand that left, the reads slow: the estimate %.1f after %d ticks, want 0", d, ticks)
			}
			t.Logf("demand that left while the reads were slow: followed in %d ticks", ticks)
		})
	}
}

// TestSharesSmallSurplus: the plan of a small region of a bucket gives a
// surplus of a unit or more, under minSurplus of the units, when the
// regions short lack minSurplus of the units altogether (the table's
// 98/1/1 after its first grants: shares 189, 4, 4 against targets of
// 192.4, 2.3, 2.3); brokenSmall, as before, gives nothing, and the
// region keeps the rate of 1.7 units unused.
func TestSharesSmallSurplus(t *testing.T) {
	cfg := Config{Regions: 3, Key: "k", Bucket: &limiter.TokenBucketConfig{MaxAmount: 200, RefillTime: 10 * time.Millisecond, RefillAmount: 2}}
	states := func(g1, g2 int64) []State {
		return []State{
			{Demand: 200, Given: []int64{0, 0, 0}},
			{Demand: 2.4, Given: []int64{g1, 0, 0}},
			{Demand: 2.4, Given: []int64{g2, 0, 0}},
		}
	}
	st := states(62, 61)
	if s := []int64{cfg.share(0, st), cfg.share(1, st), cfg.share(2, st)}; !slices.Equal(s, []int64{189, 4, 4}) {
		t.Fatalf("shares %v, want [189 4 4]", s)
	}
	if g := cfg.plan(1, st, false); !slices.Equal(g, []int64{1, 0, 0}) {
		t.Errorf("region 1 at 4 units, target 2.3: the plan %v, want [1 0 0]", g)
	}
	broken := cfg
	broken.brokenSmall = true
	if g := broken.plan(1, st, false); g != nil {
		t.Errorf("brokenSmall: region 1 at 4 units gives %v, want nothing (the test cannot fail)", g)
	}
	// Once both gave a unit: surpluses of 0.7, and region 0 lacks 1.4.
	if g := cfg.plan(1, states(63, 62), false); g != nil {
		t.Errorf("region 1 at 3 units, target 2.3: the plan %v, want nothing", g)
	}
	// A window keeps the hysteresis: the same shares give nothing.
	win := Config{Regions: 3, Key: "k", Limit: 197, Window: time.Second, SubWindows: 10}
	if g := win.plan(1, states(62, 61), false); g != nil {
		t.Errorf("a window: region 1 at 4 units gives %v, want nothing", g)
	}
}

// TestSharesEvenDemand: a region does not give units its demand uses
// (planRate). Three regions of a bucket of 200 a second (197 units:
// shares 66, 66, 65), and of a window of 1,000 per 4 s (200 a second
// with its sub-window: 334, 333, 333). (1) Even demand over the rate, as
// the estimates showed it on the loaded MRSC harness (70, 120 and 90 a
// second: each above its share's rate): no region gives; the
// proportional plan (brokenKeep) has region 0 give 16 units of the
// bucket's (84 of the window's) to region 1, which uses them no more
// than region 0 did. (2) The start, as traced: region 0's estimate 35
// while its last tick counted 75 a second (the others 78 and 41): region
// 0 gives nothing; brokenKeep gives 21 units. (3) What a region
// does not use still goes: at 98/1/1 over the rate region 1 (2.4 a
// second, 66 units) gives 63 to region 0, and at 60/30/10 region 2 (24 a
// second) gives 43 of its 65 (the proportional plan 45).
func TestSharesEvenDemand(t *testing.T) {
	bucket := Config{Regions: 3, Key: "k", Bucket: &limiter.TokenBucketConfig{MaxAmount: 200, RefillTime: 10 * time.Millisecond, RefillAmount: 2}}
	window := Config{Regions: 3, Key: "k", Limit: 1000, Window: 4 * time.Second, SubWindows: 4}
	now := time.Unix(1000, 0)
	// plan is what region r's plan gives at demands d (shares even), r's
	// last tick's rate own, on cfg (brokenKeep: broken).
	plan := func(cfg Config, broken bool, r int, d []float64, own float64) int64 {
		t.Helper()
		cfg.brokenKeep = broken
		a, err := NewAgent(cfg, r, &simLedger{hist: make([][]State, 3), now: &now}, memStore(t))
		if err != nil {
			t.Fatal(err)
		}
		a.states = make([]State, 3)
		for o := range a.states {
			a.states[o] = State{Demand: d[o], Given: make([]int64, 3), Seq: 9, At: now.UnixNano()}
		}
		a.lastRate = own
		var sum int64
		for _, u := range a.planNow(now, false) {
			sum += u
		}
		return sum
	}
	for _, c := range []struct {
		name        string
		cfg         Config
		r           int
		d           []float64
		own         float64
		want        int64
		brokenAbove int64 // brokenKeep gives at least this
	}{
		{"bucket/even-over", bucket, 0, []float64{70, 120, 90}, 0, 0, 10},
		{"window/even-over", window, 0, []float64{70, 120, 90}, 0, 0, 50},
		{"bucket/start", bucket, 0, []float64{35, 78, 41}, 75, 0, 10},
		{"bucket/98-1-1", bucket, 1, []float64{200, 2.4, 2.4}, 2, 63, 60},
		{"bucket/60-30-10", bucket, 2, []float64{144, 72, 24}, 24, 43, 40},
	} {
		got, broken := plan(c.cfg, false, c.r, c.d, c.own), plan(c.cfg, true, c.r, c.d, c.own)
		t.Logf("%s: region %d gives %d, %d on the proportional plan", c.name, c.r, got, broken)
		if got < c.want || got > c.want+1 {
			t.Errorf("%s: region %d gives %d units, want %d", c.name, c.r, got, c.want)
		}
		if broken < c.brokenAbove {
			t.Errorf("%s: brokenKeep: region %d gives %d units, want %d or more (the test cannot fail)", c.name, c.r, broken, c.brokenAbove)
		}
	}
}
