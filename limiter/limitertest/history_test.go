package limitertest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

const ms = time.Millisecond

// call builds an admitted (or denied) call of cost n at Base+at for the
// window checks.
func call(key string, at time.Duration, n int64, allowed bool) Call {
	return Call{Key: key, Stamp: Base.Add(at), Cost: n, Allowed: allowed}
}

func TestCheckFixedWindow(t *testing.T) {
	const limit, window = 3, time.Second
	for _, c := range []struct {
		name  string
		calls []Call
		want  []string // substrings of the violations, in order
	}{
		{name: "at the limit in each window", calls: []Call{
			call("a", 0, 1, true), call("a", 999*ms, 2, true), call("a", 1000*ms, 3, true),
			call("a", 500*ms, 3, false), // denied calls never count
			call("b", 10*ms, 3, true),   // nor do other keys
		}},
		{name: "over in one window", calls: []Call{
			call("a", 100*ms, 1, true), call("a", 1100*ms, 2, true), call("a", 1999*ms, 2, true), call("a", 2000*ms, 3, true),
		}, want: []string{`key "a": 4 units admitted (2 calls) with stamps in the calendar window [00:00:01.000000, 00:00:02.000000), limit 3 (+1)`}},
		{name: "arrival order is irrelevant, failed calls never count", calls: []Call{
			call("k", 1500*ms, 2, true), call("k", 1200*ms, 2, true), {Key: "k", Stamp: Base.Add(1300 * ms), Cost: 3, Allowed: true, Err: errors.New("x")},
		}, want: []string{`key "k": 4 units admitted (2 calls) with stamps in the calendar window [00:00:01.000000, 00:00:02.000000)`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkViolations(t, CheckFixedWindow(c.calls, limit, window), c.want)
		})
	}
}

func TestCheckTrailingWindow(t *testing.T) {
	const limit, window = 3, time.Second
	for _, c := range []struct {
		name  string
		calls []Call
		want  []string
	}{
		{name: "a unit leaves the window exactly one window later", calls: []Call{
			call("a", 0, 1, true), call("a", 10*ms, 2, true), call("a", 1000*ms, 1, true), call("a", 1010*ms, 2, true),
		}},
		{name: "four in (10ms, 1010ms]", calls: []Call{
			// The sequence (40 ms, 40 ms, 1051 ms, then 1010 ms
			// allowed), with a limit of 3 and one more call at 1010 ms.
			call("a", 40*ms, 1, true), call("a", 40*ms, 1, true), call("a", 1051*ms, 1, true), call("a", 1010*ms, 1, true),
			call("a", 1010*ms, 1, true),
		}, want: []string{`key "a": 4 units admitted (4 calls) with stamps in the trailing window (00:00:00.010000, 00:00:01.010000], limit 3 (+1)`}},
		{name: "overlapping windows over the limit are reported once, by the worst", calls: []Call{
			call("a", 0, 2, true), call("a", 100*ms, 2, true), call("a", 200*ms, 1, true), call("a", 2000*ms, 3, true), call("a", 2500*ms, 1, true),
		}, want: []string{`key "a": 5 units admitted (3 calls)`, `key "a": 4 units admitted (2 calls) with stamps in the trailing window (00:00:01.500000, 00:00:02.500000]`}},
		{name: "equal stamps count together", calls: []Call{
			call("a", 500*ms, 2, true), call("a", 500*ms, 2, true),
		}, want: []string{`key "a": 4 units admitted (2 calls) with stamps in the trailing window (23:59:59.500000, 00:00:00.500000]`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkViolations(t, CheckTrailingWindow(c.calls, limit, window), c.want)
		})
	}
}

func checkViolations(t *testing.T, got []Violation, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d violations, want %d: %v", len(got), len(want), got)
	}
	for i, v := range got {
		if !strings.Contains(v.String(), want[i]) {
			t.Errorf("violation %d:\n got %s\nwant it to contain %s", i, v, want[i])
		}
	}
}

// bcall is a bucket call on key "k" at Base+at (the stamp), running from
// start to end (ms since the run began), with its decision.
func bcall(at time.Duration, n int64, start, end int, allowed bool, remaining int64) Call {
	return Call{Key: "k", Stamp: Base.Add(at), Cost: n, Start: time.Duration(start) * ms, End: time.Duration(end) * ms,
		Allowed: allowed, Remaining: remaining}
}

func TestCheckTokenBucket(t *testing.T) {
	smyte := limiter.TokenBucketConfig{MaxAmount: 2, RefillTime: time.Minute, RefillAmount: 1}
	sec := time.Second
	for _, c := range []struct {
		name  string
		cfg   limiter.TokenBucketConfig
		calls []Call
		want  string // "" for linearizable, else a substring of the error
	}{
		{name: "Smyte's example, one after another", cfg: smyte, calls: []Call{
			bcall(0, 1, 0, 1, true, 1), bcall(0, 1, 2, 3, true, 0), bcall(0, 1, 4, 5, false, 0),
			bcall(59*sec, 1, 6, 7, false, 0), bcall(60*sec, 1, 8, 9, true, 0), bcall(180*sec, 2, 10, 11, true, 0),
		}},
		{name: "a third take in the same minute", cfg: smyte, calls: []Call{
			bcall(0, 1, 0, 1, true, 1), bcall(0, 1, 2, 3, true, 0), bcall(30*sec, 1, 4, 5, true, 0),
		}, want: `token bucket history of 3 calls is not linearizable`},
		{name: "concurrent calls explained in another order than they started", cfg: smyte, calls: []Call{
			// The later-stamped call took effect first (it refilled 2 up to
			// 120 s), so the one stamped 61 s, which started first, found
			// nothing to refill.
			bcall(0, 2, 0, 1, true, 0),
			bcall(61*sec, 1, 5, 20, false, 0),
			bcall(120*sec, 2, 6, 10, true, 0),
		}},
		{name: "the same calls one after the other", cfg: smyte, calls: []Call{
			bcall(0, 2, 0, 1, true, 0),
			bcall(61*sec, 1, 5, 6, false, 0),
			bcall(120*sec, 2, 7, 10, true, 0),
		}, want: `not linearizable`},
		{name: "a late stamp refills nothing", cfg: smyte, calls: []Call{
			bcall(0, 2, 0, 1, true, 0), bcall(90*sec, 1, 2, 3, true, 0), bcall(70*sec, 1, 4, 5, true, 0),
		}, want: `longest explainable prefix has 2 calls`},
		{name: "strict: a denial with a newer stamp restarts the timer", cfg: limiter.TokenBucketConfig{MaxAmount: 1, RefillTime: time.Minute, Strict: true}, calls: []Call{
			bcall(0, 1, 0, 1, true, 0), bcall(50*sec, 1, 2, 3, false, 0), bcall(70*sec, 1, 4, 5, false, 0),
			bcall(129*sec, 1, 6, 7, false, 0), // 59 s after the last denial: still blocked (and restarted)
			bcall(189*sec, 1, 8, 9, true, 0),
		}},
		{name: "not strict: a denial does not restart the timer", cfg: limiter.TokenBucketConfig{MaxAmount: 1, RefillTime: time.Minute}, calls: []Call{
			bcall(0, 1, 0, 1, true, 0), bcall(50*sec, 1, 2, 3, false, 0), bcall(70*sec, 1, 4, 5, false, 0),
		}, want: `not linearizable`},
		{name: "a failed call may have taken a token", cfg: smyte, calls: []Call{
			bcall(0, 1, 0, 1, true, 1),
			{Key: "k", Stamp: Base, Cost: 1, Start: 2 * ms, End: 3 * ms, Reached: true, Arrived: 2 * ms, Returned: 3 * ms, Err: errors.New("timeout")},
			bcall(0, 1, 4, 5, false, 0),
		}},
		{name: "a failed call that never reached the store took nothing", cfg: smyte, calls: []Call{
			bcall(0, 1, 0, 1, true, 1),
			{Key: "k", Stamp: Base, Cost: 1, Start: 2 * ms, End: 3 * ms, Err: errors.New("canceled during its delay")},
			bcall(0, 1, 4, 5, false, 0),
		}, want: `not linearizable`},
		{name: "an idle key may have expired", cfg: smyte, calls: []Call{
			bcall(0, 2, 0, 1, true, 0),
			{Key: "k", Stamp: Base.Add(61 * sec), Cost: 1, Start: 2 * ms, End: 3 * ms, Allowed: true, Remaining: 1, Idle: true},
		}},
		{name: "a key that was not idle has not expired", cfg: smyte, calls: []Call{
			bcall(0, 2, 0, 1, true, 0),
			{Key: "k", Stamp: Base.Add(61 * sec), Cost: 1, Start: 2 * ms, End: 3 * ms, Allowed: true, Remaining: 1},
		}, want: `not linearizable`},
		{name: "a cached denial the model also makes", cfg: smyte, calls: []Call{
			bcall(0, 2, 0, 1, true, 0), bcall(10*sec, 1, 2, 3, false, 0),
			{Key: "k", Stamp: Base.Add(30 * sec), Cost: 1, Start: 4 * ms, End: 5 * ms, Cached: true},
			bcall(60*sec, 1, 6, 7, true, 0), // the cached denial took nothing
		}},
		{name: "a cached denial after capacity came back (a stale deny cache)", cfg: smyte, calls: []Call{
			bcall(0, 2, 0, 1, true, 0), bcall(10*sec, 1, 2, 3, false, 0),
			{Key: "k", Stamp: Base.Add(70 * sec), Cost: 1, Start: 4 * ms, End: 5 * ms, Cached: true},
		}, want: `from the deny cache`},
		{name: "a cached call that was allowed (a cache never admits)", cfg: smyte, calls: []Call{
			{Key: "k", Stamp: Base, Cost: 1, Start: 0, End: 1 * ms, Allowed: true, Cached: true},
		}, want: `not linearizable`},
		{name: "keys are separate buckets", cfg: smyte, calls: []Call{
			bcall(0, 2, 0, 1, true, 0),
			{Key: "other", Stamp: Base, Cost: 2, Start: 2 * ms, End: 3 * ms, Allowed: true},
			{Key: "other", Stamp: Base, Cost: 1, Start: 4 * ms, End: 5 * ms, Allowed: true},
		}, want: `key "other" (2 calls)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := CheckTokenBucket(c.calls, c.cfg, 10*time.Second)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("want linearizable: %v", err)
			case c.want != "" && err == nil:
				t.Fatalf("linearizable, want an error containing %q", c.want)
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Fatalf("error %q\nwant it to contain %q", err, c.want)
			}
		})
	}
}

// A check that times out is a failure, not a pass.
func TestBucketVerdictTimeout(t *testing.T) {
	err := bucketVerdict(porcupine.Unknown, func() string { return "" }, 10, time.Second)
	if !errors.Is(err, errCheckTimeout) || !strings.Contains(err.Error(), "not a pass") {
		t.Fatalf("Unknown gave %v", err)
	}
	if err := bucketVerdict(porcupine.Ok, nil, 10, time.Second); err != nil {
		t.Fatalf("Ok gave %v", err)
	}
}

// The model follows the documented semantics step by step (the worked
// examples of the conformance suite).
func TestBucketStep(t *testing.T) {
	cfg := limiter.TokenBucketConfig{MaxAmount: 10, RefillTime: 10 * time.Second, RefillAmount: 3}
	s, o := bucketStep(cfg, bucketModelState{}, 0, 10)
	if !o.allowed || o.remaining != 0 || s.updated != 0 {
		t.Fatalf("new bucket, take 10: %+v %+v", s, o)
	}
	for _, c := range []struct {
		at   time.Duration
		want int64
	}{{9 * time.Second, 0}, {10 * time.Second, 3}, {25 * time.Second, 6}, {400 * time.Second, 10}} {
		_, o := bucketStep(cfg, s, int64(c.at), 100) // a take too big to pass: a read
		if o.allowed || o.remaining != c.want {
			t.Errorf("at %v: %+v, want %d tokens", c.at, o, c.want)
		}
	}
	s, _ = bucketStep(cfg, s, int64(25*time.Second), 100) // refills up to 20 s: 6 tokens, 5 s kept
	if s.tokens != 6 || s.updated != int64(20*time.Second) {
		t.Fatalf("after 25 s: %+v, want 6 tokens refilled up to 20 s", s)
	}
	if _, o := bucketStep(cfg, s, int64(15*time.Second), 7); o.allowed || o.remaining != 6 {
		t.Fatalf("a clock behind the last refill: %+v, want nothing refilled", o)
	}
}

// --- Stores for the harness's own tests -------------------------------------

// exactStore is an exact in-test store: window counters are never
// forgotten, buckets and logs are applied under one lock.
//
// why hand-written: a reference small enough to be obviously right.
type exactStore struct {
	mu      sync.Mutex
	counts  map[storage.Key]map[int64]int64
	buckets map[storage.Key]storage.BucketState
	logs    map[storage.Key][]int64
}

func newExactStore() *exactStore {
	return &exactStore{counts: map[storage.Key]map[int64]int64{}, buckets: map[storage.Key]storage.BucketState{}, logs: map[storage.Key][]int64{}}
}

func (s *exactStore) Add(_ context.Context, k storage.Key, cur int64, span int, n int64, _ time.Duration) (storage.Counts, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.counts[k]
	if m == nil {
		m = map[int64]int64{}
		s.counts[k] = m
	}
	m[cur] += n
	var c storage.Counts
	for j := range span {
		c.C[j] = m[cur-int64(j)]
	}
	for idx := cur + 1; idx <= cur+storage.Ahead(span); idx++ {
		c.Later += m[idx]
	}
	return c, nil
}

func (s *exactStore) Sub(_ context.Context, k storage.Key, idx int64, n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[k][idx] = max(s.counts[k][idx]-n, 0)
	return nil
}

func (s *exactStore) UpdateBucket(_ context.Context, k storage.Key, op storage.BucketOp, _ time.Duration) (storage.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, found := s.buckets[k]
	next, d, write := op.Apply(cur, found)
	if write {
		s.buckets[k] = next
	}
	return d, nil
}

func (s *exactStore) UpdateLog(_ context.Context, k storage.Key, op storage.LogOp, _ time.Duration) (storage.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, d, write := op.Apply(s.logs[k])
	if write {
		s.logs[k] = next
	}
	return d, nil
}

// clampRing is the memory store's window ring as it was at a7cc8dc: exactly
// span slots per key, so a late writer's oldest sub-windows are gone, a
// write from before the ring is clamped onto its oldest slot, and a refund
// that arrives after the roll is clamped onto the newest windows.
//
// why hand-written: a known-broken store, to prove the checker fails on it.
type clampRing struct {
	*exactStore
	rmu  sync.Mutex
	ring map[storage.Key]*ringEntry
}

type ringEntry struct {
	slots  []int64
	newest int64
}

func newClampRing() *clampRing {
	return &clampRing{exactStore: newExactStore(), ring: map[storage.Key]*ringEntry{}}
}

func (s *clampRing) Add(_ context.Context, k storage.Key, cur int64, span int, n int64, _ time.Duration) (storage.Counts, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	e := s.ring[k]
	if e == nil || len(e.slots) != span {
		e = &ringEntry{slots: make([]int64, span), newest: cur}
		s.ring[k] = e
	}
	size := int64(span)
	if cur > e.newest {
		for i := e.newest + 1; i <= cur && i <= e.newest+size; i++ {
			e.slots[floorMod(i, size)] = 0
		}
		e.newest = cur
	}
	oldest := e.newest - size + 1
	e.slots[floorMod(max(cur, oldest), size)] += n
	var c storage.Counts
	for j := int64(0); j < size && cur-j >= oldest; j++ {
		c.C[j] = e.slots[floorMod(cur-j, size)]
	}
	for idx := max(cur+1, oldest); idx <= e.newest; idx++ {
		c.Later += e.slots[floorMod(idx, size)]
	}
	return c, nil
}

func (s *clampRing) Sub(_ context.Context, k storage.Key, idx int64, n int64) error {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	e := s.ring[k]
	if e == nil || idx > e.newest {
		return nil
	}
	size := int64(len(e.slots))
	i := floorMod(max(idx, e.newest-size+1), size)
	e.slots[i] = max(e.slots[i]-n, 0)
	return nil
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }

// racyBucket reads the bucket, waits racyGap, then writes what it computed
// without checking that nothing changed: a lost update whenever another
// call on the key reads within the gap. (It yielded the CPU instead once:
// on the fake clock, where a call alone at its instant has no one to yield
// to, that lost no update.)
//
// why hand-written: a known-broken store, to prove the checker fails on it.
type racyBucket struct{ *exactStore }

// racyGap is how long racyBucket holds a state it read before writing.
const racyGap = ms

func (s racyBucket) UpdateBucket(_ context.Context, k storage.Key, op storage.BucketOp, _ time.Duration) (storage.Decision, error) {
	s.mu.Lock()
	cur, found := s.buckets[k]
	s.mu.Unlock()
	time.Sleep(racyGap)
	next, d, write := op.Apply(cur, found)
	if write {
		s.mu.Lock()
		s.buckets[k] = next
		s.mu.Unlock()
	}
	return d, nil
}

// newestLog keeps only the entries in the newest writer's window, as the
// sliding log did at a7cc8dc: a late writer finds the entries it still
// needs gone.
//
// why hand-written: a known-broken store, to prove the checker fails on it.
type newestLog struct {
	*exactStore
	newest map[storage.Key]int64
}

func (s newestLog) UpdateLog(_ context.Context, k storage.Key, op storage.LogOp, _ time.Duration) (storage.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.newest[k] = max(s.newest[k], op.Now)
	next, d, _ := op.Apply(s.logs[k])
	cut := 0
	for cut < len(next) && next[cut] <= s.newest[k]-int64(op.Window) {
		cut++
	}
	s.logs[k] = append([]int64(nil), next[cut:]...)
	return d, nil
}

// --- The harness, end to end ------------------------------------------------

func historySeed(t *testing.T) uint64 {
	t.Helper()
	seed, err := HistorySeed()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("history seed %d (%s=%d to replay the draws)", seed, SeedEnv, seed)
	return seed
}

func scenario(t *testing.T, name string) Scenario {
	t.Helper()
	for _, sc := range DefaultScenarios() {
		if sc.Name == name {
			return sc
		}
	}
	t.Fatalf("no scenario %s", name)
	return Scenario{}
}

// The checker fails on stores known to over-admit when arrivals reorder.
// Each run is made on the fake clock of testing/synctest (fakeTimeScenario):
// stamps, delays and arrivals are then functions of the seed, not of how
// much CPU the goroutines got. On the wall clock, a loaded machine made too
// few calls to reach the limit, or moved most late writers past the
// horizon, and a broken store went uncaught.
func TestHistoryFailsOnBrokenStores(t *testing.T) {
	seed := historySeed(t)
	short := func(sc Scenario, d time.Duration) Scenario { sc.Duration = d; return sc }
	// Late writers that lose more of their view over-admit more: delays
	// up to 3 sub-windows (the horizon is 21) make the failure certain.
	slidingLate := short(scenario(t, "SlidingWindow"), 2500*ms)
	slidingLate.MaxDelay = 150 * ms
	for _, c := range []struct {
		name  string
		store func() Store
		sc    Scenario
		want  string
	}{
		{"FixedWindow/clampRing", func() Store { return newClampRing() }, short(scenario(t, "FixedWindow"), 1500*ms), "the store over-admitted"},
		{"SlidingWindow/clampRing", func() Store { return newClampRing() }, slidingLate, "the store over-admitted"},
		{"SlidingLog/newestLog", func() Store { return newestLog{newExactStore(), map[storage.Key]int64{}} }, scenario(t, "SlidingLog"), "the store over-admitted"},
		{"TokenBucket/racyBucket", func() Store { return racyBucket{newExactStore()} }, scenario(t, "TokenBucket"), "token bucket history"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := fakeTimeRun(t, c.store(), fakeTimeScenario(c.sc), seed)
			if err == nil {
				t.Fatalf("the checker passed a broken store (seed %d)", seed)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("failed for another reason than %q: %v", c.want, err)
			}
			t.Logf("as expected: %v", err)
		})
	}
}

// fakeTimeRun runs sc against s with the wall clock of a synctest bubble
// and returns what the checker found (nil: nothing wrong).
func fakeTimeRun(t *testing.T, s Store, sc Scenario, seed uint64) error {
	t.Helper()
	var err error
	synctest.Test(t, func(t *testing.T) {
		rep, rerr := RunScenario(context.Background(), s, sc, WallClock, HistoryOptions{Seed: seed, CheckTimeout: 20 * time.Second})
		if rerr != nil {
			t.Fatal(rerr)
		}
		t.Log(rep.Summary())
		err = rep.Err()
	})
	return err
}

// fakeTimeScenario returns sc without its deny cache, for a run on the
// fake clock: there a goroutine answered by the deny cache never blocks,
// so the clock would never move on, and a call stamped before a window's
// end would never reach the store after one stamped in the next (no late
// arrival). The configs are copies.
func fakeTimeScenario(sc Scenario) Scenario {
	if c := sc.Fixed; c != nil {
		c2 := *c
		c2.NoDenyCache = true
		sc.Fixed = &c2
	}
	if c := sc.Sliding; c != nil {
		c2 := *c
		c2.NoDenyCache = true
		sc.Sliding = &c2
	}
	if c := sc.Log; c != nil {
		c2 := *c
		c2.NoDenyCache = true
		sc.Log = &c2
	}
	if c := sc.Bucket; c != nil {
		c2 := *c
		c2.NoDenyCache = true
		sc.Bucket = &c2
	}
	return sc
}

// The checker passes an exact store, for every default scenario (shortened).
func TestHistoryPassesExactStore(t *testing.T) {
	seed := historySeed(t)
	var scs []Scenario
	for _, sc := range DefaultScenarios() {
		sc.Duration = min(sc.Duration, 600*ms)
		scs = append(scs, sc)
	}
	RunHistory(t, newExactStore(), HistoryOptions{Seed: seed, Scenarios: scs, Clocks: []Clock{WallClock}})
}

// A run without late arrivals fails: it checks nothing.
func TestHistoryWithoutLateArrivalsFails(t *testing.T) {
	sc := scenario(t, "FixedWindow")
	sc.Duration, sc.MaxDelay = 500*ms, 0
	rep, err := RunScenario(context.Background(), newExactStore(), sc, SharedClock, HistoryOptions{Seed: historySeed(t), Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(rep.Summary())
	if err := rep.Err(); err == nil || !strings.Contains(err.Error(), "a run without late arrivals checks nothing") {
		t.Fatalf("one goroutine, no delays, one clock: %v", err)
	}
}

// SLUICE_HISTORY_SEED fixes the seed; without it, seeds change every run.
func TestHistorySeed(t *testing.T) {
	t.Setenv(SeedEnv, "")
	a, err := HistorySeed()
	if err != nil || a == 0 {
		t.Fatalf("derived seed %d, %v", a, err)
	}
	time.Sleep(time.Microsecond)
	if b, _ := HistorySeed(); b == a {
		t.Fatalf("the same seed %d twice", a)
	}
	t.Setenv(SeedEnv, "12345")
	if s, err := HistorySeed(); err != nil || s != 12345 {
		t.Fatalf("%s=12345: %d, %v", SeedEnv, s, err)
	}
	for _, bad := range []string{"0", "-1", "x"} {
		t.Setenv(SeedEnv, bad)
		if _, err := HistorySeed(); err == nil {
			t.Errorf("%s=%q accepted", SeedEnv, bad)
		}
	}
}

// TestTightened: a scenario rerun on a slow machine gets a limit four times
// tighter on copies of its configs, never below its largest cost.
func TestTightened(t *testing.T) {
	for _, sc := range DefaultScenarios() {
		tt := Tightened(sc)
		switch {
		case sc.Bucket != nil:
			if tt.Bucket == sc.Bucket || tt.Bucket.MaxAmount != max(sc.Bucket.MaxAmount/4, sc.MaxCost) || tt.Bucket.RefillTime != 4*sc.Bucket.RefillTime {
				t.Errorf("%s: %+v from %+v", sc.Name, *tt.Bucket, *sc.Bucket)
			}
		case sc.Fixed != nil:
			if tt.Fixed == sc.Fixed || tt.Fixed.Limit != sc.Fixed.Limit/4 {
				t.Errorf("%s: %+v from %+v", sc.Name, *tt.Fixed, *sc.Fixed)
			}
		case sc.Sliding != nil:
			if tt.Sliding == sc.Sliding || tt.Sliding.Limit != sc.Sliding.Limit/4 {
				t.Errorf("%s: %+v from %+v", sc.Name, *tt.Sliding, *sc.Sliding)
			}
		case sc.Log != nil:
			if tt.Log == sc.Log || tt.Log.Limit != sc.Log.Limit/4 {
				t.Errorf("%s: %+v from %+v", sc.Name, *tt.Log, *sc.Log)
			}
		}
	}
	small := Scenario{Bucket: &limiter.TokenBucketConfig{MaxAmount: 5, RefillTime: time.Millisecond}, MaxCost: 3}
	if got := Tightened(Tightened(small)).Bucket; got.MaxAmount != 3 || got.RefillTime != 16*time.Millisecond || small.Bucket.MaxAmount != 5 {
		t.Errorf("twice tightened: %+v (the original now %+v); want 3 tokens every 16 ms", *got, *small.Bucket)
	}
}

// TestBucketStallPastTTLIsUnchecked: a bucket history that no order
// explains fails the run, unless a call was answered more than the
// bucket's TTL after it began (a stalled process, which may have found the
// bucket dropped, hence full): then the run says it checked nothing there,
// and is made again with other draws. A bucket of 2 refilling one every
// 10 ms (TTL 30 ms): one call takes both tokens, the next, stamped 2 ms
// later, is admitted from a full bucket.
func TestBucketStallPastTTLIsUnchecked(t *testing.T) {
	cfg := limiter.TokenBucketConfig{MaxAmount: 2, RefillTime: 10 * ms}
	if ttl, err := historyBucketTTL(nil, cfg); err != nil || ttl != 30*ms {
		t.Fatalf("TTL %v (%v), want 30ms (as limiter.NewTokenBucket)", ttl, err)
	}
	for _, c := range []struct {
		name      string
		returned  time.Duration
		uncovered bool
	}{{"answered in 3 ms", 5 * ms, false}, {"answered after 48 ms", 50 * ms, true}} {
		t.Run(c.name, func(t *testing.T) {
			a := bcall(0, 2, 0, 1, true, 0)
			b := bcall(2*ms, 1, 2, int(c.returned/ms), true, 1)
			a.Reached, a.Returned, b.Reached, b.Returned = true, 1*ms, true, c.returned
			rep := &HistoryReport{Calls: []Call{a, b}}
			rep.check(nil, Scenario{Name: "stall", Bucket: &cfg}, HistoryOptions{CheckTimeout: 5 * time.Second})
			var linear string
			for _, p := range rep.Problems {
				if strings.Contains(p, "not linearizable") {
					linear = p
				}
			}
			if linear == "" {
				t.Fatalf("no linearizability problem: %q", rep.Problems)
			}
			if got := rep.Uncovered == len(rep.Problems); got != c.uncovered {
				t.Errorf("every problem says the run checked nothing: %v, want %v (%d of %q)", got, c.uncovered, rep.Uncovered, rep.Problems)
			}
		})
	}
}
