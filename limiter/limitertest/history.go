package limitertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

const (
	// SeedEnv names the environment variable that fixes the seed of
	// [RunHistory].
	SeedEnv = "SLUICE_HISTORY_SEED"
	// HistoryDirEnv names the environment variable of a directory where
	// [RunHistory] writes the history of every failed run, as JSON (one
	// object per call), for a closer look.
	HistoryDirEnv = "SLUICE_HISTORY_DIR"
)

// Clock is a stamp source of a history run.
type Clock uint8

const (
	// WallClock stamps each call with time.Now(), read by its goroutine
	// before the call (and before its delay).
	WallClock Clock = iota
	// SharedClock stamps each call from one clock shared by all
	// goroutines, strictly increasing (the wall clock, bumped by 1 ns when
	// it would repeat or go back): stamps are then in the order the calls
	// started, and disorder comes only from delays and scheduling.
	SharedClock
	// SkewedClock stamps each call with the wall clock plus an offset
	// fixed per goroutine, drawn uniformly in [-Skew, +Skew] (the
	// scenario's, or one sub-window of a sliding window, or a tenth of a
	// fixed window or log): hosts whose clocks disagree.
	SkewedClock
)

func (c Clock) String() string {
	switch c {
	case WallClock:
		return "wall"
	case SharedClock:
		return "shared"
	case SkewedClock:
		return "skewed"
	}
	return "clock(" + strconv.Itoa(int(c)) + ")"
}

// Scenario is one algorithm's history run. Exactly one of Fixed, Sliding,
// Log and Bucket is set.
type Scenario struct {
	Name    string
	Fixed   *limiter.FixedWindowConfig
	Sliding *limiter.SlidingWindowConfig // Bounded: Interpolated is not exact, and is refused
	Log     *limiter.SlidingLogConfig
	Bucket  *limiter.TokenBucketConfig
	// Duration is how long the goroutines keep calling.
	Duration time.Duration
	// MaxDelay bounds the DelayStore's random delays.
	MaxDelay time.Duration
	// MaxPause, when positive, makes each goroutine wait a random time
	// below it between two calls (outside the calls).
	MaxPause time.Duration
	// Skew bounds the offsets of SkewedClock; zero means one sub-window
	// of a sliding window, a tenth of a fixed window or log, 5 ms for a
	// bucket.
	Skew time.Duration
	// MaxCost is the largest cost: one call in four costs 2..MaxCost, the
	// others 1. Zero or one means every call costs 1.
	MaxCost int64
	// Keys, when positive, overrides HistoryOptions.Keys. More keys make
	// fewer calls per key open at once: a store whose calls take long
	// (queued behind the others) leaves a linearizability check many
	// orders to try on one key.
	Keys int
}

// DefaultScenarios returns the scenarios RunHistory runs by default, sized so
// that the limit is reached and window boundaries are crossed many times
// while every delay stays well inside the store contract's horizon:
//
//   - FixedWindow: 200 per 200 ms window, delays below 50 ms, 3 s;
//   - SlidingWindow: 200 per 1 s, 20 sub-windows of 50 ms (the defaults),
//     delays below one sub-window, 3 s;
//   - SlidingLog: 50 per 200 ms, delays below 20 ms, 1 s;
//   - TokenBucket: 50 tokens, 1 every 5 ms, delays below 5 ms, 1 s, with
//     pauses below 20 ms between a goroutine's calls (still 25 times the
//     refill rate), so that the CPU is not saturated: a goroutine that
//     waits for a CPU holds its call open, and every open call multiplies
//     the orders the linearizability check must try;
//   - TokenBucketStrict: the same in strict mode (where the pauses also let
//     refills happen at all).
//
// The buckets run on 8 keys (8 goroutines each: fewer calls open at once
// per key keep the linearizability check fast on a loaded machine, where 16
// per key once ran out of its 30 s), the others on
// HistoryOptions.Keys. The windows also run with SkewedClock (callers whose
// clocks disagree by up to one sub-window, a tenth of a fixed window).
func DefaultScenarios() []Scenario {
	return []Scenario{
		{Name: "FixedWindow", Fixed: &limiter.FixedWindowConfig{Name: "history-fixed", Limit: 200, Window: 200 * time.Millisecond},
			Duration: 3 * time.Second, MaxDelay: 50 * time.Millisecond, MaxCost: 3},
		{Name: "SlidingWindow", Sliding: &limiter.SlidingWindowConfig{Name: "history-sliding", Limit: 200, Window: time.Second},
			Duration: 3 * time.Second, MaxDelay: 50 * time.Millisecond, MaxCost: 3},
		{Name: "SlidingLog", Log: &limiter.SlidingLogConfig{Name: "history-log", Limit: 50, Window: 200 * time.Millisecond},
			Duration: time.Second, MaxDelay: 20 * time.Millisecond, MaxCost: 3},
		{Name: "TokenBucket", Bucket: &limiter.TokenBucketConfig{Name: "history-bucket", MaxAmount: 50, RefillTime: 5 * time.Millisecond},
			Keys: 8, Duration: time.Second, MaxDelay: 5 * time.Millisecond, MaxPause: 20 * time.Millisecond, MaxCost: 3},
		{Name: "TokenBucketStrict", Bucket: &limiter.TokenBucketConfig{Name: "history-strict", MaxAmount: 50, RefillTime: 5 * time.Millisecond, Strict: true},
			Keys: 8, Duration: time.Second, MaxDelay: 5 * time.Millisecond, MaxPause: 20 * time.Millisecond, MaxCost: 3},
	}
}

// PackedScenario is the history run of a packed sliding window
// (limiter.Packed, storage.PackedCounter): 200 per 400 ms at the default
// resolution of 160 slots of 2.5 ms, whose level boundaries fall every 4,
// 16, 64 and 256 slots (10 ms, 40 ms, 160 ms, 640 ms); delays below 50 ms
// (20 slots) and, with SkewedClock, clocks up to 20 ms apart (8 slots), so
// that arrivals reorder across slot and level boundaries (the run fails
// unless some late arrival crossed a boundary of every level); 3 s. It is
// not among DefaultScenarios: stores without PackedCounter cannot run it.
func PackedScenario() Scenario {
	return Scenario{Name: "SlidingWindowPacked",
		Sliding:  &limiter.SlidingWindowConfig{Name: "history-packed", Limit: 200, Window: 400 * time.Millisecond, Representation: limiter.Packed},
		Duration: 3 * time.Second, MaxDelay: 50 * time.Millisecond, Skew: 20 * time.Millisecond, MaxCost: 3}
}

// window is the window of a window or log scenario, 0 for a bucket: a
// store that forgets by age (memcached) is exact for calls that reach it
// within a window of their stamps in real time (the store contract).
func (sc Scenario) window() time.Duration {
	switch {
	case sc.Fixed != nil:
		return sc.Fixed.Window
	case sc.Sliding != nil:
		return sc.Sliding.Window
	case sc.Log != nil:
		return sc.Log.Window
	}
	return 0
}

// skew is the bound of SkewedClock's offsets.
func (sc Scenario) skew() time.Duration {
	switch {
	case sc.Skew > 0:
		return sc.Skew
	case sc.Sliding != nil:
		k := sc.Sliding.SubWindows
		if k == 0 {
			k = limiter.DefaultSubWindows
		}
		return sc.Sliding.Window / time.Duration(k)
	case sc.Fixed != nil:
		return sc.Fixed.Window / 10
	case sc.Log != nil:
		return sc.Log.Window / 10
	}
	return 5 * time.Millisecond
}

// HistoryOptions configures [RunHistory] and [RunScenario]. The zero value
// runs the defaults.
type HistoryOptions struct {
	// Workers is the number of goroutines; zero means 64.
	Workers int
	// Keys is the number of hot keys they share; zero means 2.
	Keys int
	// Seed seeds every random draw. Zero means the value of
	// SLUICE_HISTORY_SEED, or one derived from the time.
	Seed uint64
	// Scenarios to run; nil means DefaultScenarios().
	Scenarios []Scenario
	// Clocks to run each scenario with; nil means WallClock, SharedClock
	// and SkewedClock.
	Clocks []Clock
	// CheckTimeout bounds each linearizability check; zero means 30 s.
	CheckTimeout time.Duration
	// Parallel runs each scenario and clock in a parallel subtest (their
	// keys are their own): for a store whose calls wait more than they
	// compute. RunHistory then returns before they run.
	Parallel bool
}

func (o HistoryOptions) withDefaults() HistoryOptions {
	if o.Workers == 0 {
		o.Workers = 64
	}
	if o.Keys == 0 {
		o.Keys = 2
	}
	if o.Scenarios == nil {
		o.Scenarios = DefaultScenarios()
	}
	if o.Clocks == nil {
		o.Clocks = []Clock{WallClock, SharedClock, SkewedClock}
	}
	if o.CheckTimeout == 0 {
		o.CheckTimeout = 30 * time.Second
	}
	return o
}

// HistorySeed returns the seed a history run uses when none is given:
// SLUICE_HISTORY_SEED if set (an error if it does not parse), else one
// derived from the time, so that every run draws differently.
func HistorySeed() (uint64, error) {
	if v := os.Getenv(SeedEnv); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil || seed == 0 {
			return 0, fmt.Errorf("limitertest: %s=%q: want a positive integer", SeedEnv, v)
		}
		return seed, nil
	}
	return uint64(time.Now().UnixNano())&(1<<53-1) | 1, nil
}

// RunHistory is the history checker, Jepsen and Porcupine style:
//
//	func TestHistory(t *testing.T) { limitertest.RunHistory(t, store, limitertest.HistoryOptions{}) }
//
// For each scenario (by default one per algorithm: FixedWindow,
// SlidingWindow with the Bounded estimator and 20 sub-windows, SlidingLog,
// TokenBucket plain and strict; see [DefaultScenarios]) and each stamp
// source ([WallClock], [SharedClock]), a subtest named Scenario/clock runs
// 64 goroutines on 2 hot keys for a few seconds through a [DelayStore],
// whose random delays make calls stamped earlier reach s after calls
// stamped later, on top of real concurrency. Every call is recorded (key,
// stamp, cost, real start and end, when it reached and left the store,
// decision, error) and the history is checked against the exact model:
//
//   - FixedWindow: the units admitted per key and calendar window of stamps
//     never exceed the limit ([CheckFixedWindow]);
//   - SlidingWindow and SlidingLog: the units admitted per key in any
//     window-length interval of stamps never exceed the limit
//     ([CheckTrailingWindow]);
//   - TokenBucket: the decisions (allowed, remaining) are linearizable:
//     some order of the calls consistent with their real times explains
//     every one on a serialized Smyte bucket, written here from the
//     documentation ([CheckTokenBucket], with porcupine).
//
// The store contract promises exactness within its horizon only
// (storage.Horizon): a window over the limit that holds an admitted call
// that may have reached the store past the horizon is printed, not failed.
// A subtest whose calls never reached the limit (too slow a machine for
// the scenario's pace) is run again with a tighter limit (Tightened), up
// to twice. A subtest also fails when it proves nothing: no late arrival (no call
// reached the store after one stamped in a newer sub-window, or for buckets
// and logs with a newer stamp), the limit never reached, no window boundary
// crossed, or a linearizability check without a verdict within
// opt.CheckTimeout. Each subtest logs one line with the counts: calls,
// decisions, late arrivals, refunds after a roll, calls past the horizon.
// Failed calls are counted and printed, not failed: they were not admitted,
// and the bucket model lets them have happened or not.
//
// Seeds change every run. RunHistory logs its seed first and every failure
// repeats it; SLUICE_HISTORY_SEED=<seed> replays the same random draws
// (keys, costs, delays, pauses). The interleaving itself still depends on
// the scheduler, so a failure reproduces in kind, not call for call. With
// SLUICE_HISTORY_DIR=<dir>, the history of every failed subtest is written
// there as JSON.
func RunHistory(t *testing.T, s Store, opt HistoryOptions) {
	t.Helper()
	opt = opt.withDefaults()
	if opt.Seed == 0 {
		seed, err := HistorySeed()
		if err != nil {
			t.Fatal(err)
		}
		opt.Seed = seed
	}
	t.Logf("history seed %d (reproduce the draws with %s=%d)", opt.Seed, SeedEnv, opt.Seed)
	for i, sc := range opt.Scenarios {
		for _, clock := range opt.Clocks {
			if clock == SkewedClock && sc.Sliding == nil && sc.Fixed == nil {
				continue // skew is checked on the windows
			}
			t.Run(sc.Name+"/"+clock.String(), func(t *testing.T) {
				if opt.Parallel {
					t.Parallel()
				}
				o := opt
				o.Seed = subSeed(opt.Seed, i, clock)
				keys := o.Keys
				if sc.Keys > 0 {
					keys = sc.Keys
				}
				t.Logf("seed %d: scenario %s, clock %s, %d goroutines on %d keys for %v", opt.Seed, sc.Name, clock, o.Workers, keys, sc.Duration)
				rep, err := RunScenario(context.Background(), s, sc, clock, o)
				// A run whose calls never reached the limit checks nothing
				// (rep.Err says so); on a machine too slow for the
				// scenario's pace, run it again with a tighter limit, up
				// to twice. A run that found a violation is not rerun.
				run := sc
				for try := 1; try <= 2 && err == nil && rep.Denied == 0 && len(rep.Violations) == 0; try++ {
					run = Tightened(run)
					t.Logf("no call denied (%d allowed, %d failed): the calls were too slow to reach the limit here; again with a limit %dx tighter", rep.Allowed, rep.Failed, 1<<(2*try))
					rep, err = RunScenario(context.Background(), s, run, clock, o)
				}
				// A run that found nothing wrong but left something
				// unchecked (e.g. no late arrival across a level-4
				// boundary, three of which a 2 s packed run crosses) is
				// run again with other draws, up to twice; it must still
				// cover everything to pass.
				for try := 1; try <= 2 && err == nil && rep.Uncovered > 0 && rep.Uncovered == len(rep.Problems); try++ {
					o.Seed++
					t.Logf("the run left something unchecked (%s); again with other draws (derived seed %d)", strings.Join(rep.Problems, "; "), o.Seed)
					rep, err = RunScenario(context.Background(), s, run, clock, o)
				}
				if err != nil {
					t.Fatalf("seed %d: %v", opt.Seed, err)
				}
				rep.Seed = opt.Seed // the seed to set to replay, not the derived one
				t.Log(rep.Summary())
				if err := rep.Err(); err != nil {
					t.Error(err)
					if dir := os.Getenv(HistoryDirEnv); dir != "" {
						path := filepath.Join(dir, fmt.Sprintf("%s-%s-%d.json", sc.Name, clock, opt.Seed))
						if werr := writeHistory(path, rep); werr != nil {
							t.Errorf("writing the history: %v", werr)
						} else {
							t.Logf("history written to %s", path)
						}
					}
				}
			})
		}
	}
}

// Tightened returns sc with a limit four times tighter, for a machine too
// slow to reach sc's: a bucket holds a quarter of the tokens and refills
// four times slower, a window or a log allows a quarter of the units; never
// fewer than the scenario's largest cost. The configs are copies.
func Tightened(sc Scenario) Scenario {
	least := max(sc.MaxCost, 1)
	quarter := func(n int64) int64 { return max(n/4, least) }
	if c := sc.Fixed; c != nil {
		c2 := *c
		c2.Limit = quarter(c.Limit)
		sc.Fixed = &c2
	}
	if c := sc.Sliding; c != nil {
		c2 := *c
		c2.Limit = quarter(c.Limit)
		sc.Sliding = &c2
	}
	if c := sc.Log; c != nil {
		c2 := *c
		c2.Limit = quarter(c.Limit)
		sc.Log = &c2
	}
	if c := sc.Bucket; c != nil {
		c2 := *c
		c2.MaxAmount = quarter(c.MaxAmount)
		c2.RefillTime = 4 * c.RefillTime
		sc.Bucket = &c2
	}
	return sc
}

// subSeed derives a scenario's seed from the run's.
func subSeed(seed uint64, i int, c Clock) uint64 {
	return mrand.New(mrand.NewPCG(seed, uint64(i)<<8|uint64(c))).Uint64() | 1
}

// HistoryReport is what one scenario run recorded and found.
type HistoryReport struct {
	Scenario string
	Clock    Clock
	Seed     uint64
	// Calls is the history, in no particular order.
	Calls    []Call
	Arrivals ArrivalStats
	// Allowed, Denied and Failed count the calls; AllowedUnits sums the
	// allowed calls' costs.
	Allowed, Denied, Failed int
	AllowedUnits            int64
	// Boundaries counts, over all keys, the (sub-)window boundaries the
	// stamps crossed (refill periods for a bucket); AtLimit counts the
	// (key, window or period) pairs in which a call was denied.
	Boundaries, AtLimit int
	// LateInRealTime counts window and log calls that returned more than a
	// window after their stamps (a stalled process): counted as past the
	// horizon, so a window of stamps over the limit holding one is
	// excused.
	LateInRealTime int
	// Violations are the windows of stamps over the limit; Excused those
	// over the limit that hold an admitted call past the store contract's
	// horizon (where it promises no exactness): printed, not failed.
	Violations, Excused []Violation
	// FirstErr is the first failed call's error, if any.
	FirstErr error
	// CheckTime is how long the linearizability check took (buckets).
	CheckTime time.Duration
	// Problems lists every reason the run fails, in words; empty when it
	// passes.
	Problems []string
	// Uncovered counts the Problems that say the run checked nothing
	// somewhere (no late arrivals, none across a level's boundary, the
	// limit never reached, no boundary crossed): other draws may cover it.
	Uncovered int
}

// Err returns nil when the run passed, otherwise an error listing its
// problems and the seed.
func (r *HistoryReport) Err() error {
	if len(r.Problems) == 0 {
		return nil
	}
	return fmt.Errorf("history %s/%s (seed %d, %s=%d to replay the draws) failed:\n\t%s",
		r.Scenario, r.Clock, r.Seed, SeedEnv, r.Seed, strings.Join(r.Problems, "\n\t"))
}

// Summary is one line on the run: calls, decisions, late arrivals.
func (r *HistoryReport) Summary() string {
	a := r.Arrivals
	behind := fmt.Sprintf("at most %d sub-windows behind", a.MaxBehind)
	if a.LateAcrossLevel[0] > 0 {
		behind = fmt.Sprintf("at most %d slots behind; across level 1-4 boundaries: %v", a.MaxBehind, a.LateAcrossLevel)
	}
	if a.MaxBehind == 0 {
		behind = fmt.Sprintf("at most %v behind", a.MaxBehindTime)
	}
	check := ""
	if r.FirstErr != nil {
		check = fmt.Sprintf("; first error: %v", r.FirstErr)
	}
	if r.CheckTime > 0 {
		check += fmt.Sprintf("; linearizability checked in %v", r.CheckTime.Round(time.Millisecond))
	}
	if r.LateInRealTime > 0 {
		check += fmt.Sprintf("; returned more than a window after their stamps: %d", r.LateInRealTime)
	}
	return fmt.Sprintf("%s/%s: %d calls (%d allowed for %d units, %d denied, %d failed); %d boundaries crossed, limit reached in %d windows; "+
		"late arrivals: %d (%s), late refunds: %d, past the horizon: %d, after an idle TTL/2: %d; %d windows over the limit (%d more holding calls past the horizon)%s",
		r.Scenario, r.Clock, len(r.Calls), r.Allowed, r.AllowedUnits, r.Denied, r.Failed, r.Boundaries, r.AtLimit,
		a.Late, behind, a.LateRefunds, a.PastHorizon, a.Idle, len(r.Violations), len(r.Excused), check)
}

// sharedClock is a strictly increasing clock shared by goroutines.
//
// why hand-written: a few lines of compare-and-swap.
type sharedClock struct{ last atomic.Int64 }

func (c *sharedClock) now() time.Time {
	for {
		last := c.last.Load()
		next := max(time.Now().UnixNano(), last+1)
		if c.last.CompareAndSwap(last, next) {
			return time.Unix(0, next)
		}
	}
}

// RunScenario runs one scenario against s with one clock and checks the
// history; the report says what was recorded and found (see
// [HistoryReport.Err]). It returns an error only when the scenario cannot
// run (a bad configuration). opt.Seed must be set (see [HistorySeed]).
func RunScenario(ctx context.Context, s Store, sc Scenario, clock Clock, opt HistoryOptions) (*HistoryReport, error) {
	opt = opt.withDefaults()
	if opt.Seed == 0 {
		return nil, errors.New("limitertest: RunScenario needs a seed")
	}
	if sc.Duration <= 0 {
		return nil, fmt.Errorf("limitertest: scenario %s: duration %v", sc.Name, sc.Duration)
	}
	ds := NewDelayStore(s, sc.MaxDelay, opt.Seed)
	lim, boundary, err := sc.limiter(s, ds)
	if err != nil {
		return nil, err
	}
	if sc.Keys > 0 {
		opt.Keys = sc.Keys
	}
	keys, err := sc.keys(clock, opt.Keys)
	if err != nil {
		return nil, err
	}
	perWorker, late := sc.run(ctx, lim, keys, sc.stamper(clock, opt), opt)
	rep := &HistoryReport{Scenario: sc.Name, Clock: clock, Seed: opt.Seed, Arrivals: ds.Arrivals(), LateInRealTime: late}
	for _, cs := range perWorker {
		rep.Calls = append(rep.Calls, cs...)
	}
	rep.tally(boundary)
	rep.check(s, sc, opt)
	return rep, nil
}

// limiter returns the scenario's limiter on ds (which delays the calls to
// s) and the period whose boundaries the report counts.
func (sc Scenario) limiter(s Store, ds *DelayStore) (limiter.Limiter, time.Duration, error) {
	var (
		lim      limiter.Limiter
		err      error
		boundary time.Duration // for Boundaries and AtLimit
		kinds    int
	)
	if c := sc.Fixed; c != nil {
		kinds++
		lim, err = limiter.NewFixedWindow(ds, *c)
		boundary = c.Window
	}
	if c := sc.Sliding; c != nil {
		kinds++
		if c.Estimator != limiter.Bounded {
			return nil, 0, fmt.Errorf("limitertest: scenario %s: the %v estimator is not exact; only Bounded is checked", sc.Name, c.Estimator)
		}
		if _, ok := s.(storage.PackedCounter); c.Representation == limiter.Packed && !ok {
			return nil, 0, fmt.Errorf("limitertest: scenario %s: the store %T does not implement storage.PackedCounter", sc.Name, s)
		}
		var w *limiter.SlidingWindow
		if w, err = limiter.NewSlidingWindow(ds, leaseWindow(*c)); err == nil {
			lim = w
			cfg := w.Config()
			if cfg.Representation == limiter.Packed {
				boundary = cfg.Window / time.Duration(cfg.Slots)
			} else {
				boundary = cfg.Window / time.Duration(cfg.SubWindows)
			}
		}
	}
	if c := sc.Log; c != nil {
		kinds++
		lim, err = limiter.NewSlidingLog(ds, *c)
		boundary = c.Window
	}
	if c := sc.Bucket; c != nil {
		kinds++
		lim, err = limiter.NewTokenBucket(ds, leaseBucket(*c))
		boundary = c.RefillTime
	}
	if kinds != 1 {
		return nil, 0, fmt.Errorf("limitertest: scenario %s: set exactly one of Fixed, Sliding, Log and Bucket (%d set)", sc.Name, kinds)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("limitertest: scenario %s: %w", sc.Name, err)
	}
	return lim, boundary, nil
}

// keys returns n keys of the scenario, new for every run.
func (sc Scenario) keys(clock Clock, n int) ([]string, error) {
	keys := make([]string, n)
	for i := range keys {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		keys[i] = "history." + sc.Name + "." + clock.String() + "." + strconv.Itoa(i) + "." + hex.EncodeToString(b[:])
	}
	return keys, nil
}

// stamper returns each worker's clock: the machine's, one shared strictly
// increasing clock, or the machine's skewed per worker.
func (sc Scenario) stamper(clock Clock, opt HistoryOptions) func(worker int) time.Time {
	var shared sharedClock
	stamp := func(int) time.Time { return time.Now() }
	switch clock {
	case SharedClock:
		stamp = func(int) time.Time { return shared.now() }
	case SkewedClock:
		skew := sc.skew()
		offsets := make([]time.Duration, opt.Workers)
		r := mrand.New(mrand.NewPCG(opt.Seed, 0))
		for w := range offsets {
			offsets[w] = time.Duration(r.Int64N(2*int64(skew)+1)) - skew
		}
		stamp = func(w int) time.Time { return time.Now().Add(offsets[w]) }
	}

	return stamp
}

// run runs the workers' calls for the scenario's duration and returns
// each worker's calls, and how many returned more than a window after
// their stamps.
func (sc Scenario) run(ctx context.Context, lim limiter.Limiter, keys []string, stamp func(int) time.Time, opt HistoryOptions) ([][]Call, int) {
	// Each goroutine records into its own slice: no lock on the hot path.
	perWorker := make([][]Call, opt.Workers)
	var lateInRealTime atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	origin := time.Now()
	for w := range opt.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := mrand.New(mrand.NewPCG(opt.Seed, uint64(w)+1))
			<-start
			for time.Since(origin) < sc.Duration {
				if sc.MaxPause > 0 {
					time.Sleep(time.Duration(r.Int64N(int64(sc.MaxPause))))
				}
				key := keys[r.IntN(len(keys))]
				cost := int64(1)
				if sc.MaxCost > 1 && r.IntN(4) == 0 {
					cost = 2 + r.Int64N(sc.MaxCost-1)
				}
				var tr Trace
				cctx, cancel := context.WithTimeout(WithTrace(WithDelayRand(ctx, r), &tr), opTimeout)
				c := Call{Worker: w, Key: key, Cost: cost}
				c.Start = time.Since(origin)
				c.Stamp = stamp(w)
				d, err := lim.AllowN(cctx, key, c.Stamp, cost)
				c.End = time.Since(origin)
				cancel()
				c.Allowed, c.Remaining, c.Err = d.Allowed && err == nil, d.Remaining, err
				c.Reached, c.Late, c.PastHorizon, c.Idle = tr.Reached, tr.Late, tr.PastHorizon, tr.Idle
				// Answered without reaching the store: the deny cache.
				c.Cached = err == nil && !tr.Reached && !d.Allowed
				if win := sc.window(); tr.Reached && win > 0 && tr.Returned.Sub(c.Stamp) > win && !c.PastHorizon {
					// Returned more than a window after its stamp: it may
					// have taken effect past the horizon in real time (the
					// process stalled: no call moved the newest on meanwhile),
					// where a store that forgets by age may have let the
					// counter it adds to expire.
					c.PastHorizon = true
					lateInRealTime.Add(1)
				}
				if tr.Reached {
					c.Arrived, c.Returned = tr.Arrived.Sub(origin), tr.Returned.Sub(origin)
					if tr.Narrowed && err == nil { // a failed call may have taken effect in an earlier request
						c.Arrived = max(c.Arrived, tr.From.Sub(origin))
						c.Returned = min(c.Returned, tr.To.Sub(origin))
					}
				}
				perWorker[w] = append(perWorker[w], c)
			}
		}()
	}
	close(start)
	wg.Wait()

	return perWorker, int(lateInRealTime.Load())
}

// check checks the calls against the model of the scenario's algorithm,
// and says what the run did not cover.
func (rep *HistoryReport) check(s Store, sc Scenario, opt HistoryOptions) {
	// A failed call is not a failure of the check: it was not admitted,
	// and the bucket model lets it have happened or not. Safety is what is
	// checked here; the count and the first error are in the summary.
	for _, c := range rep.Calls {
		if c.Err != nil {
			rep.FirstErr = c.Err
			break
		}
	}
	switch {
	case sc.Fixed != nil:
		rep.Violations = CheckFixedWindow(rep.Calls, sc.Fixed.Limit, sc.Fixed.Window)
	case sc.Sliding != nil:
		rep.Violations = CheckTrailingWindow(rep.Calls, sc.Sliding.Limit, sc.Sliding.Window)
	case sc.Log != nil:
		rep.Violations = CheckTrailingWindow(rep.Calls, sc.Log.Limit, sc.Log.Window)
	case sc.Bucket != nil:
		rep.checkBucket(s, *sc.Bucket, opt)
	}
	// The contract promises exactness within the horizon only: a window
	// over the limit that holds an admitted call past the horizon is
	// reported, not failed.
	var failing []Violation
	for _, v := range rep.Violations {
		if v.PastHorizon > 0 {
			rep.Excused = append(rep.Excused, v)
		} else {
			failing = append(failing, v)
		}
	}
	rep.Violations = failing
	if n := len(failing); n > 0 {
		worst := failing[0]
		for _, v := range failing {
			if v.Units-v.Limit > worst.Units-worst.Limit {
				worst = v
			}
		}
		rep.problem("the store over-admitted in %d windows of stamps; worst: %v", n, worst)
		for i, v := range failing {
			if i == 5 {
				rep.problem("... and %d more windows over the limit", n-5)
				break
			}
			rep.problem("over the limit: %v", v)
		}
	}
	if rep.Arrivals.Late == 0 {
		rep.uncovered("no late arrivals (%d calls reached the store, none stamped older than one before it): a run without late arrivals checks nothing", rep.Arrivals.Arrivals)
	}
	if c := sc.Sliding; c != nil && c.Representation == limiter.Packed {
		for l, n := range rep.Arrivals.LateAcrossLevel {
			if n == 0 {
				rep.uncovered("no late arrival across a boundary of level %d (every %d slots): the run checks nothing there", l+1, 1<<(2*(l+1)))
			}
		}
	}
	if rep.Denied == 0 {
		rep.uncovered("the limit was never reached (no call denied): the run checks nothing")
	}
	if rep.Boundaries == 0 {
		rep.uncovered("the stamps crossed no window boundary: the run checks nothing across boundaries")
	}
}

// checkBucket checks rep's calls against the bucket model.
//
// A store drops a bucket one TTL after its last write, by the wall clock,
// and a dropped bucket reads as full. A call whose process stalled for
// longer than the TTL between its stamp and its answer may have found it
// dropped, which no order of the stamps explains (the bucket was empty at
// its stamp): outside what the scenario means to check, as a window's
// call past the horizon. Such a run is made again with other draws, and
// must pass without such a stall.
func (rep *HistoryReport) checkBucket(s Store, cfg limiter.TokenBucketConfig, opt HistoryOptions) {
	t0 := time.Now()
	defer func() { rep.CheckTime = time.Since(t0) }()
	err := checkBucketHistory(s, rep.Calls, cfg, opt.CheckTimeout)
	if err == nil {
		return
	}
	ttl, terr := historyBucketTTL(s, leaseBucket(cfg))
	if terr != nil {
		rep.problem("%v; the bucket's TTL: %v", err, terr)
		return
	}
	if n := stalledPast(rep.Calls, ttl); n > 0 {
		rep.uncovered("%v; %d calls answered more than the bucket's TTL (%v) after their stamps (a stalled process: the store may have dropped the bucket meanwhile), so the run checked nothing there", err, n, ttl)
		return
	}
	rep.problem("%v", err)
}

// historyBucketTTL is the TTL limiter.NewTokenBucket gives c's bucket on
// s (TokenBucket.TTL); with no store (nil), on one that keeps no leases.
func historyBucketTTL(s Store, c limiter.TokenBucketConfig) (time.Duration, error) {
	var bs storage.BucketStore = noBucketStore{}
	if s != nil {
		bs = s
	}
	b, err := limiter.NewTokenBucket(bs, c)
	if err != nil {
		return 0, err
	}
	return b.TTL(), nil
}

// noBucketStore is a bucket store that keeps no leases and answers
// nothing: the store of a TTL asked without one.
type noBucketStore struct{}

func (noBucketStore) UpdateBucket(context.Context, storage.Key, storage.BucketOp, time.Duration) (storage.Decision, error) {
	return storage.Decision{}, errors.New("limitertest: no store")
}

// stalledPast counts the calls that reached the store and were answered
// there more than d after they began (and were stamped).
func stalledPast(calls []Call, d time.Duration) int {
	n := 0
	for _, c := range calls {
		if c.Reached && c.Returned-c.Start > d {
			n++
		}
	}
	return n
}

// writeHistory writes rep's calls to path as JSON.
func writeHistory(path string, rep *HistoryReport) error {
	type call struct {
		Call
		Stamp int64  // Unix ns
		Err   string `json:",omitempty"`
	}
	out := make([]call, len(rep.Calls))
	for i, c := range rep.Calls {
		out[i] = call{Call: c, Stamp: c.Stamp.UnixNano()}
		if c.Err != nil {
			out[i].Err = c.Err.Error()
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func (r *HistoryReport) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// uncovered records a problem that says the run checked nothing somewhere.
func (r *HistoryReport) uncovered(format string, args ...any) {
	r.problem(format, args...)
	r.Uncovered++
}

// tally counts decisions, boundaries crossed and windows at the limit.
func (r *HistoryReport) tally(boundary time.Duration) {
	type win struct {
		key string
		idx int64
	}
	seen := map[win]bool{}
	denied := map[win]bool{}
	perKey := map[string]int{}
	for _, c := range r.Calls {
		w := win{c.Key, floorDiv(c.Stamp.UnixNano(), int64(boundary))}
		if !seen[w] {
			seen[w] = true
			perKey[c.Key]++
		}
		switch {
		case c.Err != nil:
			r.Failed++
		case c.Allowed:
			r.Allowed++
			r.AllowedUnits += c.Cost
		default:
			r.Denied++
			denied[w] = true
		}
	}
	for _, n := range perKey {
		r.Boundaries += n - 1
	}
	r.AtLimit = len(denied)
}
