package limitertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// testMerged: several limits on one key in one batch (limiter.Decide), as
// a store that keeps a key's limits in one item writes them together,
// mixed with single-step calls on the same key, with arrivals reordered.
// Whatever the store does with the takes of a batch that a bucket denies
// (not sent, or sent and given back), none stays counted.
func testMerged(t *testing.T, s Store) {
	ms := time.Millisecond
	w := sliding(t, s, limiter.SlidingWindowConfig{Name: "w", Limit: 3, Window: time.Second, SubWindows: 10, NoDenyCache: true})
	b := bucket(t, s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 2, RefillTime: time.Hour, NoDenyCache: true})
	f := fixed(t, s, limiter.FixedWindowConfig{Name: "f", Limit: 4, Window: time.Second, NoDenyCache: true})
	key := Key(t)
	batch := func(at time.Duration, allowed bool, decider int) {
		t.Helper()
		items := []limiter.Item{{Limit: w, Key: key, N: 1}, {Limit: b, Key: key, N: 1}, {Limit: f, Key: key, N: 1}}
		out := make([]limiter.Outcome, len(items))
		i, err := limiter.Decide(ctx(t), Base.Add(at), items, out)
		if err != nil {
			t.Fatalf("batch at %v: %v", at, err)
		}
		for j, o := range out {
			if o.Err != nil {
				t.Fatalf("batch at %v: item %d: %v", at, j, o.Err)
			}
		}
		if got := i >= 0 && out[i].Decision.Allowed; got != allowed || (!allowed && decider >= 0 && i != decider) {
			t.Fatalf("batch at %v: decider %d %+v, want allowed=%v (decider %d); outcomes %+v", at, i, out[max(i, 0)], allowed, decider, out)
		}
	}
	single := func(l limiter.Limiter, at time.Duration, allowed bool, remaining int64) {
		t.Helper()
		runSteps(t, l, key, []step{{at: at, allowed: allowed, remaining: remaining}})
	}
	batch(100*ms, true, -1)    // w 1, b 1 left, f 1
	single(b, 150*ms, true, 0) // b empty
	batch(200*ms, false, 1)    // the bucket denies: w and f keep nothing
	single(w, 300*ms, true, 1) // w 2
	single(f, 300*ms, true, 2) // f 2
	if err := b.Refund(ctx(t), key, Base.Add(150*ms), 1); err != nil {
		t.Fatal(err)
	}
	batch(1150*ms, true, -1)    // w 3 in (150, 1150]: 0 left; b empty; f 1 in [1 s, 2 s)
	batch(950*ms, false, -1)    // late: the bucket denies (and the window)
	single(w, 950*ms, false, 0) // (-50, 950] holds 2, and 1150 is ahead: 3
	single(f, 950*ms, true, 1)  // [0, 1 s) holds 2: the late batch kept nothing
	batch(1200*ms, false, 1)    // the bucket is empty (the window has 1 left in (200, 1200])
	single(f, 1300*ms, true, 2) // [1 s, 2 s) holds 1, from the batch at 1150 ms
	single(w, 1300*ms, true, 0) // (300, 1300] holds 2 (300 ms is the oldest sub-window, counted in full)
}

// MergedScenario is a history run of three limits on one key, decided
// together: a bounded sliding window (20 sub-windows), a token bucket and
// a fixed window, each call a batch of the three (limiter.Decide) or, one
// call in four, one of them alone (a single-step call on the same key).
type MergedScenario struct {
	Window limiter.SlidingWindowConfig
	Bucket limiter.TokenBucketConfig
	Fixed  limiter.FixedWindowConfig
	// Duration, MaxDelay and Keys as in Scenario.
	Duration, MaxDelay time.Duration
	Keys               int
}

// DefaultMergedScenario: a window of 60 per second, a bucket of 20
// refilled 1 every 20 ms, a fixed window of 15 per 200 ms, on 2 keys,
// delays below 50 ms (one sub-window), 2 s: each limit denies some calls.
func DefaultMergedScenario() MergedScenario {
	return MergedScenario{
		Window:   limiter.SlidingWindowConfig{Name: "merged-window", Limit: 60, Window: time.Second, Representation: limiter.SubWindowCounters},
		Bucket:   limiter.TokenBucketConfig{Name: "merged-bucket", MaxAmount: 20, RefillTime: 20 * time.Millisecond},
		Fixed:    limiter.FixedWindowConfig{Name: "merged-fixed", Limit: 15, Window: 200 * time.Millisecond},
		Duration: 2 * time.Second, MaxDelay: 50 * time.Millisecond, Keys: 2,
	}
}

// MergedReport is what a merged history run recorded and found.
type MergedReport struct {
	// Window, Bucket and Fixed are each limit's history: a batch allowed
	// is admitted by all three, a single-step call by its own limit.
	Window, Bucket, Fixed []Call
	Arrivals              ArrivalStats
	// Batches, Allowed and Denied count the batches; Skipped the items a
	// store's denial left unsent (Outcome.Skipped).
	Batches, Allowed, Denied, Skipped, Failed int
	// Violations per limit; Problems as in HistoryReport.
	Violations []Violation
	Problems   []string
	// Uncovered counts the Problems that say the run checked nothing
	// somewhere (no late arrival, a limit that never denied).
	Uncovered int
	FirstErr  error
}

// Err returns nil when the run passed.
func (r *MergedReport) Err() error {
	if len(r.Problems) == 0 {
		return nil
	}
	return fmt.Errorf("merged history failed:\n\t%s", joinLines(r.Problems))
}

func joinLines(ss []string) string {
	out := ""
	for i, s := range ss {
		if i > 0 {
			out += "\n\t"
		}
		out += s
	}
	return out
}

// Summary is one line on the run.
func (r *MergedReport) Summary() string {
	first := ""
	if r.FirstErr != nil {
		first = fmt.Sprintf("; first error: %v", r.FirstErr)
	}
	return fmt.Sprintf("%d batches (%d allowed, %d denied, %d failed), %d items skipped by a store's denial; single-step and batch calls per limit: window %d, bucket %d, fixed %d; late arrivals %d (at most %d sub-windows behind), past the horizon %d; %d windows of stamps over a limit%s",
		r.Batches, r.Allowed, r.Denied, r.Failed, r.Skipped, len(r.Window), len(r.Bucket), len(r.Fixed), r.Arrivals.Late, r.Arrivals.MaxBehind, r.Arrivals.PastHorizon, len(r.Violations), first)
}

// RunMergedScenario runs sc on s through a [DelayStore] that holds each
// batch back as a whole (MergeBatches), 64 goroutines (opt.Workers) on
// sc.Keys keys, stamps from clock, and checks every limit's history: the
// window's and the fixed window's admitted units per window of stamps
// ([CheckTrailingWindow], [CheckFixedWindow]), the bucket's per interval
// of stamps ([CheckBucketBound]). Failed calls are counted, not failed. A
// run without late arrivals or without denials by each kind of limit
// fails: it checks nothing there.
func RunMergedScenario(ctx context.Context, s Store, sc MergedScenario, clock Clock, opt HistoryOptions) (*MergedReport, error) {
	opt = opt.withDefaults()
	if opt.Seed == 0 {
		return nil, errors.New("limitertest: RunMergedScenario needs a seed")
	}
	ds := NewDelayStore(s, sc.MaxDelay, opt.Seed)
	ds.MergeBatches()
	w, err1 := limiter.NewSlidingWindow(ds, leaseWindow(sc.Window))
	b, err2 := limiter.NewTokenBucket(ds, leaseBucket(sc.Bucket))
	f, err3 := limiter.NewFixedWindow(ds, sc.Fixed)
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, err
	}
	if w.Config().Estimator != limiter.Bounded {
		return nil, errors.New("limitertest: a merged scenario's window must be Bounded")
	}
	keys := make([]string, max(sc.Keys, 1))
	for i := range keys {
		var r [8]byte
		if _, err := rand.Read(r[:]); err != nil {
			return nil, err
		}
		keys[i] = "merged." + clock.String() + "." + strconv.Itoa(i) + "." + hex.EncodeToString(r[:])
	}
	var shared sharedClock
	stamp := func() time.Time {
		if clock == SharedClock {
			return shared.now()
		}
		return time.Now()
	}
	recs := sc.run(ctx, [3]limiter.Limiter{w, b, f}, keys, stamp, opt)
	rep := &MergedReport{Arrivals: ds.Arrivals()}
	denied := rep.gather(recs)
	rep.check(sc, denied)
	return rep, nil
}

// mergedRecord is what one worker of a merged scenario recorded: each
// limit's calls, its counts, and the denials each limit decided (batches
// and single calls).
type mergedRecord struct {
	calls  [3][]Call
	rep    MergedReport
	denied [3]int
}

// run runs the workers' calls on the three limits (window, bucket, fixed
// window) for the scenario's duration: a batch of all three, or one in
// four calls a single limit's AllowN.
func (sc MergedScenario) run(ctx context.Context, limits [3]limiter.Limiter, keys []string, stamp func() time.Time, opt HistoryOptions) []mergedRecord {
	recs := make([]mergedRecord, opt.Workers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	origin := time.Now()
	for wk := range opt.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := mrand.New(mrand.NewPCG(opt.Seed, uint64(wk)+1))
			rec := &recs[wk]
			<-start
			for time.Since(origin) < sc.Duration {
				rec.call(ctx, limits, keys[r.IntN(len(keys))], r, wk, origin, stamp)
			}
		}()
	}
	close(start)
	wg.Wait()
	return recs
}

// call makes one call of worker wk on key and records it.
func (rec *mergedRecord) call(ctx context.Context, limits [3]limiter.Limiter, key string, r *mrand.Rand, wk int, origin time.Time, stamp func() time.Time) {
	var tr Trace
	cctx, cancel := context.WithTimeout(WithTrace(WithDelayRand(ctx, r), &tr), opTimeout)
	c := Call{Worker: wk, Key: key, Cost: 1}
	c.Start = time.Since(origin)
	c.Stamp = stamp()
	one := -1
	var allowed [3]bool
	var err error
	if r.IntN(4) == 0 {
		one = r.IntN(3)
		var d limiter.Decision
		d, err = limits[one].AllowN(cctx, key, c.Stamp, 1)
		allowed[one] = err == nil && d.Allowed
		if err == nil && !d.Allowed {
			rec.denied[one]++
		}
	} else {
		var ok bool
		ok, err = rec.batch(cctx, limits, key, c.Stamp)
		allowed = [3]bool{ok, ok, ok}
	}
	c.End = time.Since(origin)
	cancel()
	if err != nil && rec.rep.FirstErr == nil {
		rec.rep.FirstErr = err
	}
	c.Err = err
	c.Reached, c.Late, c.PastHorizon = tr.Reached, tr.Late, tr.PastHorizon
	if tr.Reached {
		c.Arrived, c.Returned = tr.Arrived.Sub(origin), tr.Returned.Sub(origin)
	}
	for j := range limits {
		if one >= 0 && j != one {
			continue
		}
		cj := c
		cj.Allowed = allowed[j]
		rec.calls[j] = append(rec.calls[j], cj)
	}
}

// batch decides the three limits as one batch on key at stamp and counts
// the outcome.
func (rec *mergedRecord) batch(ctx context.Context, limits [3]limiter.Limiter, key string, stamp time.Time) (bool, error) {
	var out [3]limiter.Outcome
	items := []limiter.Item{{Limit: limits[0], Key: key, N: 1}, {Limit: limits[1], Key: key, N: 1}, {Limit: limits[2], Key: key, N: 1}}
	dec, err := limiter.Decide(ctx, stamp, items, out[:])
	rec.rep.Batches++
	for j := range out {
		if out[j].Skipped {
			rec.rep.Skipped++
		}
		if out[j].Err != nil && err == nil {
			err = out[j].Err
		}
	}
	ok := err == nil && dec >= 0 && out[dec].Decision.Allowed
	switch {
	case err != nil:
		rec.rep.Failed++
	case ok:
		rec.rep.Allowed++
	default:
		rec.rep.Denied++
		rec.denied[dec]++
	}
	return ok, err
}

// gather adds up the workers' records into rep, and returns the denials
// each limit decided.
func (rep *MergedReport) gather(recs []mergedRecord) (denied [3]int) {
	for i := range recs {
		rec := &recs[i]
		rep.Window = append(rep.Window, rec.calls[0]...)
		rep.Bucket = append(rep.Bucket, rec.calls[1]...)
		rep.Fixed = append(rep.Fixed, rec.calls[2]...)
		rep.Batches += rec.rep.Batches
		rep.Allowed += rec.rep.Allowed
		rep.Denied += rec.rep.Denied
		rep.Skipped += rec.rep.Skipped
		rep.Failed += rec.rep.Failed
		if rep.FirstErr == nil {
			rep.FirstErr = rec.rep.FirstErr
		}
		for j := range denied {
			denied[j] += rec.denied[j]
		}
	}
	return denied
}

// check checks each limit's history and says what the run did not cover
// (denied: the denials each limit decided).
func (rep *MergedReport) check(sc MergedScenario, denied [3]int) {
	var vs []Violation
	vs = append(vs, CheckTrailingWindow(rep.Window, sc.Window.Limit, sc.Window.Window)...)
	vs = append(vs, CheckBucketBound(rep.Bucket, sc.Bucket)...)
	vs = append(vs, CheckFixedWindow(rep.Fixed, sc.Fixed.Limit, sc.Fixed.Window)...)
	for _, v := range vs {
		if v.PastHorizon == 0 {
			rep.Violations = append(rep.Violations, v)
		}
	}
	for i, v := range rep.Violations {
		if i == 5 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("... and %d more", len(rep.Violations)-5))
			break
		}
		rep.Problems = append(rep.Problems, "over the limit: "+v.String())
	}
	if rep.Arrivals.Late == 0 {
		rep.Problems = append(rep.Problems, "no late arrivals: the run checks nothing")
		rep.Uncovered++
	}
	for j, name := range []string{"window", "bucket", "fixed window"} {
		if denied[j] == 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("the %s denied nothing: the run checks nothing there", name))
			rep.Uncovered++
		}
	}
}

// RunMergedHistory runs DefaultMergedScenario on s with the wall and the
// shared clock and fails on any problem. The seed is logged.
func RunMergedHistory(t *testing.T, s Store) {
	t.Helper()
	seed, err := HistorySeed()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("history seed %d (%s=%d to replay the draws)", seed, SeedEnv, seed)
	// A store whose server answers slowly at first (DynamoDB Local's JIT)
	// would hold the first calls back past the horizon: a short run
	// first, not checked.
	warm := DefaultMergedScenario()
	warm.Duration = 500 * time.Millisecond
	if _, err := RunMergedScenario(context.Background(), s, warm, SharedClock, HistoryOptions{Seed: seed}); err != nil {
		t.Fatal(err)
	}
	for _, clock := range []Clock{WallClock, SharedClock} {
		t.Run(clock.String(), func(t *testing.T) {
			o := HistoryOptions{Seed: subSeed(seed, 0, clock)}
			sc := DefaultMergedScenario()
			rep, err := RunMergedScenario(context.Background(), s, sc, clock, o)
			// A run that found nothing wrong but left something unchecked
			// (a limit that never denied: on a loaded machine a batch's
			// lost races and throttles deny it before the window fills)
			// is run again with other draws, up to twice, as RunHistory
			// does; it must still cover everything to pass.
			// A window that never denied is tightened 4x for the rerun:
			// a loaded machine's store may take fewer batches a second
			// than its limit (make test once saw 97 a key, limit 60 a
			// second over 2 s, three runs in a row).
			for try := 1; try <= 2 && err == nil && rep.Uncovered > 0 && rep.Uncovered == len(rep.Problems); try++ {
				o.Seed++
				if strings.Contains(strings.Join(rep.Problems, "\n"), "the window denied nothing") {
					sc.Window.Limit = max(sc.Window.Limit/4, 4)
				}
				t.Logf("the run left something unchecked (%s); again with other draws (derived seed %d, window limit %d)", strings.Join(rep.Problems, "; "), o.Seed, sc.Window.Limit)
				rep, err = RunMergedScenario(context.Background(), s, sc, clock, o)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Log(rep.Summary())
			if err := rep.Err(); err != nil {
				t.Errorf("seed %d: %v", seed, err)
			}
		})
	}
}

// CheckBucketBound checks a token bucket's admitted units against the
// bound that holds whatever the arrival order (the at-stamp semantics of
// BucketsAtStamp, and Smyte's in stamp order): per key, the units admitted
// with stamps in any interval [a, b] never exceed MaxAmount plus the
// refills of at most floor((b-a)/RefillTime)+1 grid steps. Strict mode is
// not supported (a strict denial restarts the grid later, never earlier:
// the bound still holds).
func CheckBucketBound(calls []Call, cfg limiter.TokenBucketConfig) []Violation {
	ra := max(cfg.RefillAmount, 1)
	var out []Violation
	byKey := admitted(calls)
	for _, key := range sortedKeys(byKey) {
		cs := byKey[key] // by stamp
		worst := Violation{}
		for i := range cs {
			var units int64
			for j := i; j < len(cs); j++ {
				units += cs[j].Cost
				d := cs[j].Stamp.Sub(cs[i].Stamp)
				bound := cfg.MaxAmount + ra*(int64(d/cfg.RefillTime)+1)
				if units > bound && units-bound > worst.Units-worst.Limit {
					worst = Violation{Key: key, Trailing: true, From: cs[i].Stamp, To: cs[j].Stamp, Units: units, Limit: bound, Calls: j - i + 1,
						PastHorizon: countPastHorizon(cs[i : j+1])}
				}
			}
		}
		if worst.Calls > 0 {
			out = append(out, worst)
		}
	}
	return out
}
