package limitertest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// LeaseScenario is one limit run with capacity leases by [LeaseHistory]:
// Processes limiters of it (Leases on), each its own process, on one
// store behind a [DelayStore] (arrivals reordered), deciding one hot key
// at Rate decisions a second each, for Duration, far over the limit.
type LeaseScenario struct {
	Name      string
	Sliding   *limiter.SlidingWindowConfig
	Bucket    *limiter.TokenBucketConfig
	Processes int
	Rate      float64 // per process
	Duration  time.Duration
	MaxDelay  time.Duration
}

// LeaseScenarios are the scenarios [RunLeaseHistory] runs: a window of
// sub-window counters (500 ms sub-windows), a packed window (slots of
// 500 ms) where the store serves one, and a token bucket where the store
// keeps lease rings ([storage.LeaseKeeper]). Each offers about four times
// its limit from 4 processes, so that leases are taken, drained and
// returned at the limit.
//
// A window's lease lasts at most to the end of its sub-window or slot, and
// is taken only when the process's rate fills the regional minimum (8
// units) in it: with slots of 100 ms, a loaded host whose processes
// decided 30-60 a second instead of 200 took no lease at all (DynamoDB,
// in the whole -race suite); with 500 ms, 15 a second suffice.
func LeaseScenarios(s Store) []LeaseScenario {
	sc := []LeaseScenario{{
		Name:    "window",
		Sliding: &limiter.SlidingWindowConfig{Name: "lw", Limit: 400, Window: 2 * time.Second, SubWindows: 4, Representation: limiter.SubWindowCounters, Leases: true},
	}}
	if storage.ServesPacked(s) {
		sc = append(sc, LeaseScenario{
			Name:    "packed",
			Sliding: &limiter.SlidingWindowConfig{Name: "lp", Limit: 1600, Window: 32 * time.Second, Slots: 64, Representation: limiter.Packed, Leases: true},
		})
	}
	if k, ok := s.(storage.LeaseKeeper); ok && k.KeepsLeased() {
		sc = append(sc, LeaseScenario{
			Name:   "bucket",
			Bucket: &limiter.TokenBucketConfig{Name: "lb", MaxAmount: 100, RefillTime: 5 * time.Millisecond, Leases: true},
		})
	}
	for i := range sc {
		sc[i].Processes, sc[i].Rate, sc[i].Duration, sc[i].MaxDelay = 4, 200, 3*time.Second, 5*time.Millisecond
	}
	return sc
}

// LeaseReport is what [LeaseHistory] found.
type LeaseReport struct {
	Hot        HotReport
	Exact      int64 // units the same limit without leases admits on the calls, serially
	Violations []Violation
}

// LeaseHistory runs sc on s and checks the admitted units against the
// limit with the history checkers (CheckTrailingWindow, CheckBucketBound),
// whatever order the calls reached the store in. exactStore is a store of
// its own for the serial replay without leases.
func LeaseHistory(ctx context.Context, s, exactStore Store, sc LeaseScenario, seed uint64) (LeaseReport, error) {
	delayed := NewDelayStore(s, sc.MaxDelay, seed)
	build := func(st Store, leases bool) (limiter.Limiter, error) {
		switch {
		case sc.Sliding != nil:
			cfg := *sc.Sliding
			cfg.Leases = leases
			return limiter.NewSlidingWindow(st, cfg)
		case sc.Bucket != nil:
			cfg := *sc.Bucket
			cfg.Leases = leases
			return limiter.NewTokenBucket(st, cfg)
		}
		return nil, fmt.Errorf("lease scenario %q: no limit", sc.Name)
	}
	ls := make([]limiter.Limiter, sc.Processes)
	for i := range ls {
		l, err := build(delayed, true)
		if err != nil {
			return LeaseReport{}, err
		}
		ls[i] = l
	}
	var rep LeaseReport
	rep.Hot = RunHot(ctx, ls, HotOptions{Key: "hot-" + sc.Name, Rate: sc.Rate * float64(sc.Processes), Duration: sc.Duration})
	exact, err := build(exactStore, false)
	if err != nil {
		return rep, err
	}
	if rep.Exact, err = ExactAdmitted(ctx, exact, rep.Hot.Calls); err != nil {
		return rep, err
	}
	switch {
	case sc.Sliding != nil:
		rep.Violations = CheckTrailingWindow(rep.Hot.Calls, sc.Sliding.Limit, sc.Sliding.Window)
	default:
		rep.Violations = CheckBucketBound(rep.Hot.Calls, *sc.Bucket)
	}
	return rep, nil
}

// RunLeaseHistory runs [LeaseScenarios] on s (exactStore: a store of its
// own for the serial replay) and fails t on any window of stamps over the
// limit, on a failed decision, or when no decision came from a lease. It
// logs the admitted share of exact and the leases' counters. A run that
// took no lease proves nothing: on a host too loaded to keep the offered
// pace the processes decide too slowly for a lease to pay (the leaser is
// right not to lease), so such a run is made again on keys of its own, up
// to twice, before it fails; a violation or a failed decision fails at
// once.
func RunLeaseHistory(t *testing.T, s, exactStore Store) {
	for i, sc := range LeaseScenarios(s) {
		t.Run(sc.Name, func(t *testing.T) {
			name := sc.Name
			for again := 0; ; again++ {
				rep, err := LeaseHistory(t.Context(), s, exactStore, sc, uint64(i+1))
				if err != nil {
					t.Fatal(err)
				}
				h := rep.Hot
				t.Logf("%s: %d decisions, %d admitted (%d from leases), exact %d (%.3f), %d cached, %d throttled; stamps over %v for %v offered; leases %+v",
					sc.Name, len(h.Calls), h.Admitted, h.Leased, rep.Exact, float64(h.Admitted)/float64(max(rep.Exact, 1)), h.Cached, h.Throttled,
					stampSpan(h.Calls), sc.Duration, h.Leases)
				if h.Failed > 0 {
					t.Errorf("%d decisions failed; the first: %v", h.Failed, h.FirstErr)
				}
				for _, v := range rep.Violations {
					t.Errorf("over the limit: %v", v)
				}
				if h.Leased > 0 || t.Failed() {
					return
				}
				if again == 2 {
					t.Error("no decision came from a lease in 3 runs: the runs did not test leases")
					return
				}
				t.Logf("no decision came from a lease (the host did not keep the pace?): run again on keys of its own")
				sc.Name = fmt.Sprintf("%s-again%d", name, again+1)
			}
		})
	}
}

// stampSpan is the time from the first call's stamp to the last's.
func stampSpan(calls []Call) time.Duration {
	if len(calls) == 0 {
		return 0
	}
	lo, hi := calls[0].Stamp, calls[0].Stamp
	for _, c := range calls {
		if c.Stamp.Before(lo) {
			lo = c.Stamp
		}
		if c.Stamp.After(hi) {
			hi = c.Stamp
		}
	}
	return hi.Sub(lo)
}

// DropLeasedUnits returns s with a defect that only leases expose: an Add
// of more than one unit (a lease take, in a scenario whose calls cost 1)
// counts one. The leased units are then spent without being counted,
// and [LeaseHistory] must find windows over the limit. It serves
// sub-window counters only (not PackedCounter).
func DropLeasedUnits(s Store) Store { return dropLeased{s} }

type dropLeased struct{ Store }

func (d dropLeased) Add(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration) (storage.Counts, error) {
	return d.Store.Add(ctx, k, cur, span, min(n, 1), ttl)
}

// ForgetfulBuckets is a bucket store with a defect that only leases
// expose: it claims to keep [storage.BucketState.Leased] and drops it, so
// a lease's units are back in the bucket when its epoch has not even
// ended. [LeaseHistory] must find intervals over the bucket's bound. It
// serves buckets only.
type ForgetfulBuckets struct {
	mu sync.Mutex
	m  map[storage.Key]storage.BucketState
}

// NewForgetfulBuckets returns an empty ForgetfulBuckets.
func NewForgetfulBuckets() *ForgetfulBuckets {
	return &ForgetfulBuckets{m: map[storage.Key]storage.BucketState{}}
}

// KeepsLeased claims what the store does not do.
func (f *ForgetfulBuckets) KeepsLeased() bool { return true }

// UpdateBucket applies op under a lock and stores the state without its
// leased units.
func (f *ForgetfulBuckets) UpdateBucket(_ context.Context, k storage.Key, op storage.BucketOp, _ time.Duration) (storage.Decision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, found := f.m[k]
	next, d, write := op.Apply(cur, found)
	if write {
		next.Leased = [2]storage.LeaseSlot{}
		f.m[k] = next
	}
	return d, nil
}

// Add, Sub and UpdateLog are not served.
func (f *ForgetfulBuckets) Add(context.Context, storage.Key, int64, int, int64, time.Duration) (storage.Counts, error) {
	return storage.Counts{}, fmt.Errorf("%w: buckets only", limiter.ErrInvalidConfig)
}

// Sub is not served.
func (f *ForgetfulBuckets) Sub(context.Context, storage.Key, int64, int64) error {
	return fmt.Errorf("%w: buckets only", limiter.ErrInvalidConfig)
}

// UpdateLog is not served.
func (f *ForgetfulBuckets) UpdateLog(context.Context, storage.Key, storage.LogOp, time.Duration) (storage.Decision, error) {
	return storage.Decision{}, fmt.Errorf("%w: buckets only", limiter.ErrInvalidConfig)
}

// RunColdLeases checks that leases change nothing for a cold key: the
// same calls (a few a second, stamps given) on two keys of s, one through
// limits with Leases and one through the same limits without, get the
// same decisions and the same number of store calls, one per decision.
func RunColdLeases(t *testing.T, s Store) { RunColdLeasesWire(t, s, nil) }

// RunColdLeasesWire is [RunColdLeases] that also compares the requests
// the store sent, as wire counts (a running total of requests on the
// wire, or at the server) before and after each half.
func RunColdLeasesWire(t *testing.T, s Store, wire func() int64) {
	scs := LeaseScenarios(s)
	for _, sc := range scs {
		t.Run(sc.Name, func(t *testing.T) {
			var decisions [2][]limiter.Decision
			var calls, sent [2]int64
			at := time.Now()
			for i, leases := range []bool{true, false} {
				if wire != nil {
					sent[i] = -wire()
				}
				cs := NewCountingStore(s)
				var l limiter.Limiter
				var err error
				if sc.Sliding != nil {
					cfg := *sc.Sliding
					cfg.Leases, cfg.Limit = leases, 5 // a limit a cold key reaches
					l, err = limiter.NewSlidingWindow(cs, cfg)
				} else {
					cfg := *sc.Bucket
					cfg.Leases, cfg.MaxAmount, cfg.RefillTime = leases, 5, time.Second
					l, err = limiter.NewTokenBucket(cs, cfg)
				}
				if err != nil {
					t.Fatal(err)
				}
				key := fmt.Sprintf("cold-%s-%v-%d", sc.Name, leases, at.UnixNano())
				for n := range 60 {
					// Three calls a second, in bursts of two 10 ms apart.
					stamp := at.Add(time.Duration(n/2)*667*time.Millisecond + time.Duration(n%2)*10*time.Millisecond)
					d, err := l.AllowN(t.Context(), key, stamp, 1)
					if err != nil {
						t.Fatal(err)
					}
					decisions[i] = append(decisions[i], d)
				}
				calls[i] = cs.calls.Load()
				if wire != nil {
					sent[i] += wire()
				}
			}
			for n := range decisions[0] {
				a, b := decisions[0][n], decisions[1][n]
				if a.Allowed != b.Allowed || a.Remaining != b.Remaining || a.RetryAfter != b.RetryAfter {
					t.Fatalf("call %d: with leases %+v, without %+v", n, a, b)
				}
			}
			if calls[0] != calls[1] {
				t.Errorf("%d store calls with leases, %d without", calls[0], calls[1])
			}
			if wire != nil && sent[0] != sent[1] {
				t.Errorf("%d requests on the wire with leases, %d without", sent[0], sent[1])
			}
			t.Logf("%s: 60 calls, identical decisions, %d store calls each (wire: %d requests with leases, %d without)", sc.Name, calls[0], sent[0], sent[1])
		})
	}
}

// CountingStore counts the store calls made through it (Calls), forwarding
// the packed, lease-keeping and cross-region abilities of the store it
// wraps (as breaker.Store does): a test's count of store requests at the
// store's interface, for stores that have no wire to count at (the memory
// store). It is not a Batcher: a batch reaches it one step at a time.
type CountingStore struct {
	Store
	calls atomic.Int64
}

// NewCountingStore returns s counted.
func NewCountingStore(s Store) *CountingStore { return &CountingStore{Store: s} }

// Calls is the number of store calls so far.
func (c *CountingStore) Calls() int64 { return c.calls.Load() }

func (c *CountingStore) Add(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration) (storage.Counts, error) {
	c.calls.Add(1)
	return c.Store.Add(ctx, k, cur, span, n, ttl)
}

func (c *CountingStore) Sub(ctx context.Context, k storage.Key, idx, n int64) error {
	c.calls.Add(1)
	return c.Store.Sub(ctx, k, idx, n)
}

func (c *CountingStore) UpdateBucket(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration) (storage.Decision, error) {
	c.calls.Add(1)
	return c.Store.UpdateBucket(ctx, k, op, ttl)
}

func (c *CountingStore) UpdateLog(ctx context.Context, k storage.Key, op storage.LogOp, ttl time.Duration) (storage.Decision, error) {
	c.calls.Add(1)
	return c.Store.UpdateLog(ctx, k, op, ttl)
}

// ServesPacked reports whether the wrapped store serves packed windows
// ([storage.ServesPacked]): a window of representation Auto is packed
// through a CountingStore only where it would be without it.
func (c *CountingStore) ServesPacked() bool { return storage.ServesPacked(c.Store) }

func (c *CountingStore) AddPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) (storage.PackedCounts, error) {
	c.calls.Add(1)
	p, ok := c.Store.(storage.PackedCounter)
	if !ok {
		return storage.PackedCounts{}, fmt.Errorf("limitertest: %T does not implement storage.PackedCounter", c.Store)
	}
	return p.AddPacked(ctx, k, op)
}

func (c *CountingStore) SubPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) error {
	c.calls.Add(1)
	p, ok := c.Store.(storage.PackedCounter)
	if !ok {
		return fmt.Errorf("limitertest: %T does not implement storage.PackedCounter", c.Store)
	}
	return p.SubPacked(ctx, k, op)
}

func (c *CountingStore) KeepsLeased() bool {
	k, ok := c.Store.(storage.LeaseKeeper)
	return ok && k.KeepsLeased()
}

// WritesCrossRegions reports what the wrapped store does
// ([storage.CrossRegionWriter]).
func (c *CountingStore) WritesCrossRegions() bool { return storage.WritesCrossRegions(c.Store) }
