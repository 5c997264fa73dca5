package limitertest

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// expiringBuckets is exactStore whose buckets are dropped ttl/div after
// their last write, by the wall clock (div 1: the store contract, the
// memory store's rule; a denial that changes nothing writes nothing).
// While a pause is on, the bucket calls that reach it wait (a process
// stalled between handing a call over and the store running it).
//
// why hand-written: a store whose expiry a test sets, to prove the checker
// passes the contract and fails an early drop.
type expiringBuckets struct {
	*exactStore
	div     time.Duration
	written map[storage.Key]time.Time
	dropped int
	gate    sync.RWMutex // held for writing while a pause is on
}

func newExpiringBuckets(div time.Duration) *expiringBuckets {
	return &expiringBuckets{exactStore: newExactStore(), div: div, written: map[storage.Key]time.Time{}}
}

func (s *expiringBuckets) UpdateBucket(_ context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration) (storage.Decision, error) {
	s.gate.RLock()
	s.gate.RUnlock() //nolint:staticcheck // only waits out a pause
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	cur, found := s.buckets[k]
	if found && now.Sub(s.written[k]) >= ttl/s.div {
		cur, found = storage.BucketState{}, false
		s.dropped++
	}
	next, d, write := op.Apply(cur, found)
	if write {
		s.buckets[k], s.written[k] = next, now
	}
	return d, nil
}

// pause holds every bucket call that reaches s for d, from after on.
func (s *expiringBuckets) pause(after, d time.Duration) {
	go func() {
		time.Sleep(after)
		s.gate.Lock()
		time.Sleep(d)
		s.gate.Unlock()
	}()
}

func (s *expiringBuckets) drops() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// markIdleByArrivals marks the calls the checker let find their bucket
// expired before: those that reached a key no call had reached for half the
// TTL (the DelayStore's rule then).
func markIdleByArrivals(calls []Call, ttl time.Duration) int {
	idx := make([]int, 0, len(calls))
	for i, c := range calls {
		if c.Reached {
			idx = append(idx, i)
		}
	}
	slices.SortFunc(idx, func(a, b int) int { return int(calls[a].Arrived - calls[b].Arrived) })
	last := map[string]time.Duration{}
	n := 0
	for _, i := range idx {
		c := &calls[i]
		if at, ok := last[c.Key]; ok && c.Arrived-at >= ttl/2 {
			c.Idle = true
			n++
		}
		last[c.Key] = c.Arrived
	}
	return n
}

// rcall is a call of cost n stamped at that reached the store at arrived
// and returned at returned (ms of the run).
func rcall(at time.Duration, n int64, arrived, returned time.Duration, allowed bool, remaining int64) Call {
	return Call{Key: "k", Stamp: Base.Add(at), Cost: n, Start: arrived, End: returned, Reached: true, Arrived: arrived, Returned: returned,
		Allowed: allowed, Remaining: remaining}
}

// A store may drop a bucket its TTL after the last write, and not before:
// the checker lets a call find the bucket expired when it may have taken
// effect a TTL after the arrival of the last call that changed the bucket,
// whatever calls reached the key meanwhile.
func TestCheckTokenBucketExpiry(t *testing.T) {
	// TTL 30 ms: 2 tokens, one every 10 ms.
	cfg := limiter.TokenBucketConfig{MaxAmount: 2, RefillTime: 10 * ms}
	strict := cfg
	strict.Strict = true
	// Two tokens taken at 0, then denials that refill nothing (stamps
	// within the first period) and write nothing.
	drained := []Call{rcall(0, 2, 0, 1*ms, true, 0), rcall(1*ms, 1, 5*ms, 6*ms, false, 0), rcall(2*ms, 1, 10*ms, 11*ms, false, 0),
		rcall(3*ms, 1, 20*ms, 21*ms, false, 0), rcall(4*ms, 1, 28*ms, 29*ms, false, 0)}
	for _, c := range []struct {
		name  string
		cfg   limiter.TokenBucketConfig
		calls []Call
		want  string // "" for linearizable, else a substring of the error
	}{
		{name: "a call a TTL after the last write finds a new bucket, though denials reached the key", cfg: cfg,
			calls: append(slices.Clone(drained), rcall(9*ms, 1, 35*ms, 36*ms, true, 1))},
		{name: "a call that returned a TTL after the last write may have found it dropped (stalled in the store)", cfg: cfg,
			calls: append(slices.Clone(drained), rcall(9*ms, 1, 25*ms, 31*ms, true, 1))},
		{name: "a call within a TTL of the last write finds the bucket kept", cfg: cfg,
			calls: append(slices.Clone(drained), rcall(9*ms, 1, 25*ms, 29*ms, true, 1)), want: "not linearizable"},
		{name: "a denial that refilled wrote: the bucket is kept a TTL after it", cfg: cfg, calls: []Call{
			rcall(0, 2, 0, 1*ms, true, 0),
			rcall(12*ms, 2, 10*ms, 11*ms, false, 1), // refilled 1 at 10 ms: a write
			rcall(13*ms, 1, 32*ms, 33*ms, true, 1),  // 32 ms after the take, 22 ms after the refill
		}, want: "not linearizable"},
		{name: "the same a TTL after the refill", cfg: cfg, calls: []Call{
			rcall(0, 2, 0, 1*ms, true, 0),
			rcall(12*ms, 2, 10*ms, 11*ms, false, 1),
			rcall(13*ms, 1, 40*ms, 41*ms, true, 1),
		}},
		{name: "strict: a denial that restarts the timer wrote", cfg: strict, calls: []Call{
			rcall(0, 2, 0, 1*ms, true, 0),
			rcall(5*ms, 1, 10*ms, 11*ms, false, 0), // restarts the timer at 5 ms: a write
			rcall(6*ms, 1, 32*ms, 33*ms, true, 1),
		}, want: "not linearizable"},
		{name: "a failed call may take effect late, a TTL after the write", cfg: cfg, calls: []Call{
			rcall(0, 2, 0, 1*ms, true, 0),
			{Key: "k", Stamp: Base.Add(1 * ms), Cost: 1, Start: 2 * ms, End: 3 * ms, Reached: true, Arrived: 2 * ms, Returned: 3 * ms, Err: context.DeadlineExceeded},
			rcall(2*ms, 1, 4*ms, 5*ms, false, 0),
		}},
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
	// The rule before (a call finds the bucket expired only when no call
	// reached the key for half the TTL) fails the first history: the
	// store kept the contract.
	idleMarksOnly = true
	defer func() { idleMarksOnly = false }()
	calls := append(slices.Clone(drained), rcall(9*ms, 1, 35*ms, 36*ms, true, 1))
	marked := markIdleByArrivals(calls, bucketTTL(cfg))
	err := CheckTokenBucket(calls, cfg, 10*time.Second)
	if err == nil {
		t.Fatalf("the rule before passed a bucket dropped a TTL after its last write (%d calls marked idle)", marked)
	}
	t.Logf("the rule before (%d calls marked idle): %v", marked, err)
}

// The checker fails a store that drops a bucket a quarter of its TTL after
// the last write, and passes one that keeps it the TTL, on the same
// scenario (BucketExpiryScenario).
func TestHistoryBucketExpiry(t *testing.T) {
	seed := historySeed(t)
	sc := BucketExpiryScenario()
	for _, c := range []struct {
		name string
		div  time.Duration
		want string // "" to pass
	}{
		{"TTL", 1, ""},
		{"TTL/4", 4, "token bucket history"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newExpiringBuckets(c.div)
			rep, err := RunScenario(context.Background(), s, sc, WallClock, HistoryOptions{Seed: seed, CheckTimeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s; %d buckets dropped", rep.Summary(), s.drops())
			err = rep.Err()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("a store that keeps a bucket its TTL failed: %v", err)
			case c.want != "" && err == nil:
				t.Fatalf("the checker passed a store that drops a bucket at TTL/%d (seed %d, %d drops)", c.div, seed, s.drops())
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Fatalf("failed for another reason than %q: %v", c.want, err)
			case c.want != "":
				t.Logf("as expected: %v", err)
			}
		})
	}
}

// A process that stalls for longer than the TTL while its calls wait to
// reach the store (they reached the DelayStore, not the store) finds its
// drained bucket dropped after the pause, stamps from before it: the
// checker passes the store that keeps the contract; the rule before fails
// it.
func TestHistoryBucketStall(t *testing.T) {
	seed := historySeed(t)
	// Drained all along: 8 goroutines a key on 10 tokens refilled every
	// 20 ms (TTL 220 ms); a pause of 400 ms from 400 ms on.
	sc := Scenario{Name: "TokenBucketStall", Bucket: &limiter.TokenBucketConfig{Name: "history-stall", MaxAmount: 10, RefillTime: 20 * ms},
		Keys: 2, Workers: 16, Duration: 1200 * ms, MaxDelay: 5 * ms, MaxPause: 5 * ms, MaxCost: 3}
	s := newExpiringBuckets(1)
	s.pause(400*ms, 400*ms)
	rep, err := RunScenario(context.Background(), s, sc, WallClock, HistoryOptions{Seed: seed, CheckTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s; %d buckets dropped", rep.Summary(), s.drops())
	if err := rep.Err(); err != nil {
		t.Fatalf("a store that keeps a bucket its TTL failed after a pause: %v", err)
	}
	if s.drops() == 0 {
		t.Fatalf("no bucket dropped after a pause of 400 ms: the run checks nothing")
	}
	idleMarksOnly = true
	defer func() { idleMarksOnly = false }()
	calls := slices.Clone(rep.Calls)
	marked := markIdleByArrivals(calls, bucketTTL(*sc.Bucket))
	err = CheckTokenBucket(calls, *sc.Bucket, 20*time.Second)
	if err == nil {
		t.Fatalf("the rule before passed the history (%d calls marked idle, %d buckets dropped)", marked, s.drops())
	}
	t.Logf("the rule before (%d calls marked idle): %v", marked, err)
}
