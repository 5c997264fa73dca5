package limitertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// RunLeases runs the conformance suite of lease stores (the
// concurrent-requests limiter and the fleet-usage shedder) against s:
//
//	func TestLeases(t *testing.T) { limitertest.RunLeases(t, store) }
//
// It reproduces Stripe's test of the concurrent-requests limiter, checks that
// lost releases free their capacity after the lease TTL, that 64 goroutines
// contending for a capacity of 10 never hold more than 10 leases at once,
// that critical traffic is never shed by a saturated fleet shedder, and
// covers retried acquires, time going backwards, hostile keys, cancelled
// calls and acquires cut short by their deadline after their write landed
// (the limiter gives the slot back). Keys and limit names are fresh per run.
func RunLeases(t *testing.T, s storage.LeaseStore) { RunLeasesWith(t, s, LeaseOptions{}) }

// LeaseOptions tunes [RunLeasesWith].
type LeaseOptions struct {
	// ContentionWorkers is how many goroutines contend for one
	// concurrency item in the Contention scenario (64 when 0).
	ContentionWorkers int
}

// RunLeasesWith runs RunLeases' scenarios with opt.
func RunLeasesWith(t *testing.T, s storage.LeaseStore, opt LeaseOptions) {
	if opt.ContentionWorkers == 0 {
		opt.ContentionWorkers = 64
	}
	t.Run("Stripe", func(t *testing.T) { testLeaseStripe(t, s) })
	t.Run("LostRelease", func(t *testing.T) { testLeaseLostRelease(t, s) })
	t.Run("Release", func(t *testing.T) { testLeaseRelease(t, s) })
	t.Run("RetriedAcquire", func(t *testing.T) { testLeaseRetried(t, s) })
	t.Run("BackwardsTime", func(t *testing.T) { testLeaseBackwards(t, s) })
	t.Run("Contention", func(t *testing.T) { testLeaseContention(t, s, opt.ContentionWorkers) })
	t.Run("FleetCritical", func(t *testing.T) { testFleetCritical(t, s) })
	t.Run("HostileKeys", func(t *testing.T) { testLeaseHostileKeys(t, s) })
	t.Run("Cancelled", func(t *testing.T) { testLeaseCancelled(t, s) })
	t.Run("UnknownOutcome", func(t *testing.T) { testLeaseUnknownOutcome(t, s) })
}

func concurrency(t testing.TB, s storage.LeaseStore, capacity int64, ttl time.Duration) *limiter.Concurrency {
	t.Helper()
	// The name is part of the stored key: a fresh one per run.
	return must[*limiter.Concurrency](t)(limiter.NewConcurrency(s, limiter.ConcurrencyConfig{Name: Key(t), Capacity: capacity, LeaseTTL: ttl}))
}

func acquire(t testing.TB, c *limiter.Concurrency, key string, at time.Time) (limiter.Lease, limiter.Decision) {
	t.Helper()
	l, d, err := c.Acquire(ctx(t), key, at)
	if err != nil {
		t.Fatalf("Acquire(%q, %v): %v", key, at.Sub(Base), err)
	}
	if d.Allowed != l.Held() {
		t.Fatalf("Acquire(%q, %v): allowed=%v but lease held=%v", key, at.Sub(Base), d.Allowed, l.Held())
	}
	return l, d
}

func release(t testing.TB, c *limiter.Concurrency, l limiter.Lease) {
	t.Helper()
	if err := c.Release(ctx(t), l); err != nil {
		t.Fatalf("Release(%+v): %v", l, err)
	}
}

// testLeaseStripe is Stripe's test_check_concurrent_requests_limiter with
// its numbers (CAPACITY 100, TTL 60 s) on a fixed clock: pounding the server
// is fine as long as requests finish, but CAPACITY concurrent requests hold
// every slot and the next is refused.
func testLeaseStripe(t *testing.T, s storage.LeaseStore) {
	const capacity = 100
	const ttl = 60 * time.Second
	c := concurrency(t, s, capacity, ttl)
	key := Key(t)
	// "Pounding the server is fine as long as you finish the request":
	// for i in 0..CAPACITY*10 (inclusive), do_request.
	for i := 0; i <= capacity*10; i++ {
		at := Base.Add(time.Duration(i) * time.Millisecond)
		l, d := acquire(t, c, key, at)
		if !d.Allowed || d.Remaining != capacity-1 {
			t.Fatalf("request %d of a sequence of finished requests: %+v, want allowed with %d remaining", i, d, capacity-1)
		}
		release(t, c, l)
	}
	// "But concurrent is not": CAPACITY held requests, then one more.
	now := Base.Add(time.Hour)
	for i := 0; i < capacity; i++ {
		_, d := acquire(t, c, key, now)
		if !d.Allowed || d.Remaining != int64(capacity-1-i) || d.Limit != capacity {
			t.Fatalf("concurrent request %d: %+v, want allowed with %d remaining", i, d, capacity-1-i)
		}
	}
	_, d := acquire(t, c, key, now)
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != ttl || d.ResetAfter != ttl {
		t.Fatalf("request %d while %d are in flight: %+v, want denied, RetryAfter and ResetAfter %v", capacity+1, capacity, d, ttl)
	}
}

// testLeaseLostRelease: a "crashed" holder never releases; its leases stop
// counting exactly at the lease TTL.
func testLeaseLostRelease(t *testing.T, s storage.LeaseStore) {
	const ttl = time.Minute
	c := concurrency(t, s, 3, ttl)
	key := Key(t)
	for i := range 3 {
		l, _ := acquire(t, c, key, Base.Add(time.Duration(i)*time.Second))
		if want := Base.Add(time.Duration(i)*time.Second + ttl); !l.Expires.Equal(want) {
			t.Fatalf("lease %d expires at %v, want %v", i, l.Expires, want)
		}
		// The holder crashes: no release.
	}
	steps := []struct {
		at        time.Duration
		allowed   bool
		remaining int64
		retry     time.Duration
	}{
		{at: 30 * time.Second, allowed: false, retry: 30 * time.Second},
		{at: ttl - time.Millisecond, allowed: false, retry: time.Millisecond},
		{at: ttl, allowed: true, remaining: 0},                 // lease 0 lapsed, its slot reused
		{at: ttl, allowed: false, retry: time.Second},          // lease 1 lapses at ttl+1s
		{at: ttl + 2*time.Second, allowed: true, remaining: 1}, // leases 1 and 2 lapsed
		{at: 3 * ttl, allowed: true, remaining: 2},             // everything lapsed
		{at: 3 * ttl, allowed: true, remaining: 1},
	}
	for i, st := range steps {
		_, d := acquire(t, c, key, Base.Add(st.at))
		if d.Allowed != st.allowed || d.Remaining != st.remaining || (!st.allowed && d.RetryAfter != st.retry) {
			t.Fatalf("step %d (at %v): %+v, want allowed=%v remaining=%d retry=%v", i, st.at, d, st.allowed, st.remaining, st.retry)
		}
	}
}

func testLeaseRelease(t *testing.T, s storage.LeaseStore) {
	c := concurrency(t, s, 2, time.Minute)
	key := Key(t)
	a, _ := acquire(t, c, key, Base)
	b, _ := acquire(t, c, key, Base)
	if _, d := acquire(t, c, key, Base); d.Allowed {
		t.Fatalf("third lease of 2 allowed: %+v", d)
	}
	if a.ID == b.ID {
		t.Fatalf("two leases share the ID %q", a.ID)
	}
	release(t, c, a)
	release(t, c, a) // twice: nothing more is freed
	release(t, c, limiter.Lease{})
	release(t, c, limiter.Lease{Key: key, ID: "never-acquired"})
	release(t, c, limiter.Lease{Key: Key(t), ID: "unknown-key"})
	if _, d := acquire(t, c, key, Base); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after one release: %+v, want allowed with 0 remaining", d)
	}
	if _, d := acquire(t, c, key, Base); d.Allowed {
		t.Fatalf("a double release freed two slots: %+v", d)
	}
	// A lease passed as text (authorizer to integration) releases too.
	p, err := limiter.ParseLease(b.String())
	if err != nil {
		t.Fatal(err)
	}
	release(t, c, p)
	if _, d := acquire(t, c, key, Base); !d.Allowed {
		t.Fatalf("release of a parsed lease freed nothing: %+v", d)
	}
	// Releasing an expired lease is harmless.
	release(t, c, a)
}

// testLeaseRetried: an acquire retried with the same ID (its first write
// landed but the reply was lost) takes one slot, not two.
func testLeaseRetried(t *testing.T, s storage.LeaseStore) {
	id := "retried-" + fmt.Sprint(time.Now().UnixNano())
	c := must[*limiter.Concurrency](t)(limiter.NewConcurrency(s, limiter.ConcurrencyConfig{
		Name: Key(t), Capacity: 2, LeaseTTL: time.Minute, NewID: func() string { return id },
	}))
	key := Key(t)
	for i := range 3 {
		_, d := acquire(t, c, key, Base)
		if !d.Allowed || d.Remaining != 1 {
			t.Fatalf("attempt %d with the same ID: %+v, want allowed with 1 remaining", i, d)
		}
	}
}

// testLeaseBackwards: a caller whose clock is behind sees leases live for
// longer, never shorter: time going backwards frees nothing.
func testLeaseBackwards(t *testing.T, s storage.LeaseStore) {
	const ttl = time.Minute
	c := concurrency(t, s, 2, ttl)
	key := Key(t)
	acquire(t, c, key, Base.Add(time.Hour))
	acquire(t, c, key, Base.Add(time.Hour))
	for _, at := range []time.Duration{0, time.Hour - time.Second, time.Hour + ttl - time.Nanosecond} {
		if _, d := acquire(t, c, key, Base.Add(at)); d.Allowed {
			t.Fatalf("at %v (clock behind the holders'): allowed %+v", at, d)
		}
	}
	if _, d := acquire(t, c, key, Base.Add(time.Hour+ttl)); !d.Allowed {
		t.Fatalf("after the leases expired: %+v", d)
	}
}

// testLeaseContention: workers goroutines (64 by default) contend for a
// capacity of 10. Each
// counts itself in an atomic "held" counter after its acquire returns and
// out before it releases; the counter's maximum must never pass 10. Once
// they are done every slot is free again (no lease was lost or leaked).
// releaseHard releases l, retrying a busy store within the deadline: a
// lost release would hold its slot for the TTL (an hour) and fail the
// contention check.
func releaseHard(c *limiter.Concurrency, l limiter.Lease) error {
	cx, cancel := context.WithTimeout(context.Background(), 3*opTimeout)
	defer cancel()
	for {
		err := c.Release(cx, l)
		if err == nil {
			return nil
		}
		if cx.Err() != nil || !busy(err) {
			return fmt.Errorf("release: %w", err)
		}
		backOff()
	}
}

func testLeaseContention(t *testing.T, s storage.LeaseStore, workers int) {
	const capacity, rounds = 10, 8
	c := concurrency(t, s, capacity, time.Hour)
	key := Key(t)
	var held, peak, allowed, denied, refused atomic.Int64
	errs := make(chan error, workers*rounds*2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range workers {
		wg.Go(func() {
			<-start
			for range rounds {
				cx, cancel := context.WithTimeout(context.Background(), opTimeout)
				l, d, err := c.Acquire(cx, key, Base)
				cancel()
				if busy(err) {
					// The store refused the hot item: its partition's
					// capacity (a real DynamoDB's 1,000 write units a
					// second, which failed conditional writes use too) or
					// races lost until the deadline. Nothing was
					// acquired: a refusal, not a failure.
					refused.Add(1)
					backOff()
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("acquire: %w", err)
					continue
				}
				if !d.Allowed {
					denied.Add(1)
					backOff()
					continue
				}
				allowed.Add(1)
				n := held.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(time.Duration(rand.IntN(5000)) * time.Microsecond) // the "work"
				held.Add(-1)
				if err := releaseHard(c, l); err != nil {
					errs <- err
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if len(all) > 0 {
		t.Fatalf("%d of %d calls failed; first: %v", len(all), workers*rounds, all[0])
	}
	t.Logf("%d allowed, %d denied, %d refused by a busy store, at most %d held at once", allowed.Load(), denied.Load(), refused.Load(), peak.Load())
	if p := peak.Load(); p > capacity {
		t.Fatalf("%d leases held at once, capacity %d", p, capacity)
	}
	if allowed.Load() < capacity {
		t.Fatalf("only %d acquires allowed in all", allowed.Load())
	}
	for i := range capacity {
		if _, d := acquire(t, c, key, Base); !d.Allowed {
			t.Fatalf("after the storm, slot %d of %d is not free: %+v (a lease was leaked)", i, capacity, d)
		}
	}
	if _, d := acquire(t, c, key, Base); d.Allowed {
		t.Fatalf("after the storm, %d slots were free: %+v", capacity+1, d)
	}
}

// testFleetCritical saturates a fleet shedder with non-critical traffic,
// from many goroutines, while critical requests keep coming: every critical
// request passes, non-critical requests never hold more than their share,
// and they are shed once it is full.
func testFleetCritical(t *testing.T, s storage.LeaseStore) {
	const capacity, workers = 10, 32
	f := must[*limiter.FleetShedder](t)(limiter.NewFleetShedder(s, limiter.FleetShedderConfig{
		Name: Key(t), Capacity: capacity, Reserve: 0.2, LeaseTTL: time.Hour,
	}))
	share := f.Limit(limiter.PriorityNormal)
	if share != 8 {
		t.Fatalf("non-critical share of 10 with a 20%% reserve: %d, want 8", share)
	}
	var held, peak, shed, critical atomic.Int64
	var failures atomic.Value
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// Non-critical holders that never release: they fill the share.
	for range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				cx, cancel := context.WithTimeout(context.Background(), opTimeout)
				p := []limiter.Priority{limiter.PriorityLow, limiter.PriorityNormal, limiter.PriorityHigh}[i%3]
				_, d, err := f.Acquire(cx, p, Base)
				cancel()
				switch {
				case err != nil:
					failures.CompareAndSwap(nil, err)
				case d.Allowed:
					n := held.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
				default:
					shed.Add(1)
					runtime.Gosched()
				}
			}
		})
	}
	for i := 0; i < 200 || shed.Load() < workers; i++ {
		l, d, err := f.Acquire(ctx(t), limiter.PriorityCritical, Base)
		if err != nil || !d.Allowed || l.Held() {
			close(stop)
			wg.Wait()
			t.Fatalf("critical request %d: %+v, %v: critical traffic must always pass, uncounted", i, d, err)
		}
		critical.Add(1)
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	if err := failures.Load(); err != nil {
		t.Fatalf("non-critical acquire failed: %v", err)
	}
	t.Logf("%d critical allowed; non-critical: %d held, %d shed", critical.Load(), held.Load(), shed.Load())
	if held.Load() != share || peak.Load() > share {
		t.Fatalf("non-critical traffic holds %d slots (peak %d), want exactly its share %d", held.Load(), peak.Load(), share)
	}
	if _, d, err := f.Acquire(ctx(t), limiter.PriorityHigh, Base); err != nil || d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("non-critical request on a saturated fleet: %+v, %v; want shed with a RetryAfter", d, err)
	}
}

func testLeaseHostileKeys(t *testing.T, s storage.LeaseStore) {
	keys := []string{
		"", " ", "a b", "a\r\nflush_all", "a\r\nset x 0 0 1\r\n1\r\n", "\x00", "a\x00b", "a\x00c",
		"\xff\xfe\xfd", "ünïcödé", "a\tb", strings.Repeat("k", 250), strings.Repeat("k", 251),
		strings.Repeat("k", 10<<10), strings.Repeat("k", 10<<10-1) + "l", "#name", ":v", "a.b",
	}
	c := concurrency(t, s, 1, time.Hour)
	for i, k := range keys {
		if _, d := acquire(t, c, k, Base); !d.Allowed {
			t.Fatalf("key %d (%.20q) was already held: it collides with another key", i, k)
		}
	}
	for i, k := range keys {
		if _, d := acquire(t, c, k, Base); d.Allowed {
			t.Fatalf("key %d (%.20q) held twice: its lease was lost", i, k)
		}
	}
}

func testLeaseCancelled(t *testing.T, s storage.LeaseStore) {
	c := concurrency(t, s, 1, time.Hour)
	key := Key(t)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := c.Acquire(cancelled, key, Base); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire on a cancelled context: %v, want context.Canceled", err)
	}
	l, d := acquire(t, c, key, Base)
	if !d.Allowed {
		t.Fatalf("a cancelled acquire took the slot: %+v", d)
	}
	if err := c.Release(cancelled, l); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release on a cancelled context: %v, want context.Canceled", err)
	}
}

// RunGauges runs the conformance suite of gauge stores (published values
// such as the fleet's utilization) against s.
func RunGauges(t *testing.T, s storage.GaugeStore) {
	t.Run("PutGet", func(t *testing.T) {
		k := storage.Key{Space: "gauge", Name: Key(t)}
		if _, found, err := s.GetGauge(ctx(t), k); err != nil || found {
			t.Fatalf("GetGauge of a fresh key: found=%v err=%v", found, err)
		}
		for _, g := range []storage.Gauge{{Value: 0.25, At: Base.UnixNano()}, {Value: 1, At: Base.UnixNano() + 1}, {Value: 0, At: -5}, {Value: 0.123456789012345, At: 1<<63 - 1}} {
			if err := s.PutGauge(ctx(t), k, g, time.Minute); err != nil {
				t.Fatal(err)
			}
			got, found, err := s.GetGauge(ctx(t), k)
			if err != nil || !found || got != g {
				t.Fatalf("GetGauge after PutGauge(%+v): %+v found=%v err=%v", g, got, found, err)
			}
		}
	})
	t.Run("HostileKeys", func(t *testing.T) {
		suffix := Key(t)
		keys := []string{"", " ", "a\r\nflush_all", "\x00", "a\x00b", "\xff", strings.Repeat("k", 10<<10)}
		for i, k := range keys {
			if err := s.PutGauge(ctx(t), storage.Key{Space: "gauge", Name: k + suffix}, storage.Gauge{Value: float64(i), At: int64(i)}, time.Minute); err != nil {
				t.Fatalf("key %d: %v", i, err)
			}
		}
		for i, k := range keys {
			g, found, err := s.GetGauge(ctx(t), storage.Key{Space: "gauge", Name: k + suffix})
			if err != nil || !found || g.Value != float64(i) {
				t.Fatalf("key %d (%.20q): %+v found=%v err=%v: it collides with another key", i, k, g, found, err)
			}
		}
	})
	t.Run("Published", func(t *testing.T) {
		now := time.Now()
		p := &limiter.PublishedUtilization{Store: s, Name: Key(t), MaxAge: time.Minute, Clock: limiter.ClockFunc(func() time.Time { return now })}
		if _, err := p.Utilization(ctx(t)); !errors.Is(err, limiter.ErrStaleUtilization) {
			t.Fatalf("nothing published: %v, want ErrStaleUtilization", err)
		}
		if err := p.Publish(ctx(t), 0.9, now); err != nil {
			t.Fatal(err)
		}
		if u, err := p.Utilization(ctx(t)); err != nil || u != 0.9 {
			t.Fatalf("published 0.9: read %v, %v", u, err)
		}
		now = now.Add(time.Minute + time.Second)
		if _, err := p.Utilization(ctx(t)); !errors.Is(err, limiter.ErrStaleUtilization) {
			t.Fatalf("published 61 s ago with MaxAge 1m: %v, want ErrStaleUtilization", err)
		}
	})
}

// backOff pauses a refused caller 1 to 10 ms, as a client told to retry
// would: 64 goroutines retrying a full concurrency item at once would
// otherwise keep its partition over DynamoDB's cap (every denial and
// failed condition is a billed write there), and the calls that could
// succeed time out behind them (a fresh-clone make test: 31 of 512).
func backOff() { time.Sleep(time.Duration(1+rand.IntN(10)) * time.Millisecond) }

// busy reports a store that refused a hot item for capacity or contention
// (storage.ErrThrottled, storage.ErrConflict): nothing was done.
func busy(err error) bool {
	return errors.Is(err, storage.ErrThrottled) || errors.Is(err, storage.ErrConflict)
}
