package limiter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// outcomeLeases is a lease store (a map under a lock) whose first acquire
// writes and then answers like a store call cut short: with landed, the write is
// applied and the call answers with its context's error once the context
// is done (the caller's deadline passed while the reply was on its way);
// with late, the call answers context.DeadlineExceeded at once and the
// write lands late after it (the store still serving it), closing
// lateLanded (made in the test's bubble). err, when set, is what every acquire answers, writing
// nothing. block makes releases wait for their context (a store that is
// down).
type outcomeLeases struct {
	landed     bool
	late       time.Duration
	lateLanded chan struct{}
	err        error
	block      bool

	mu    sync.Mutex
	sets  map[storage.Key][]storage.LeaseEntry
	calls int
}

// first reports whether this is the store's first acquire.
func (s *outcomeLeases) first() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sets == nil {
		s.sets = map[storage.Key][]storage.LeaseEntry{}
	}
	s.calls++
	return s.calls == 1
}

func (s *outcomeLeases) apply(k storage.Key, op storage.LeaseOp) storage.Decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, d, _ := op.Apply(s.sets[k])
	s.sets[k] = next
	return d
}

func (s *outcomeLeases) AcquireLease(ctx context.Context, k storage.Key, op storage.LeaseOp) (storage.Decision, error) {
	first := s.first()
	switch {
	case s.err != nil:
		return storage.Decision{}, s.err
	case !first:
	case s.landed:
		d := s.apply(k, op)
		<-ctx.Done()
		return d, ctx.Err()
	case s.late > 0:
		go func() {
			time.Sleep(s.late)
			s.apply(k, op)
			close(s.lateLanded)
		}()
		return storage.Decision{}, fmt.Errorf("fake store: %w", context.DeadlineExceeded)
	}
	return s.apply(k, op), nil
}

func (s *outcomeLeases) ReleaseLease(ctx context.Context, k storage.Key, op storage.ReleaseOp) error {
	if s.block {
		<-ctx.Done()
		return ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sets[k], _ = op.Apply(s.sets[k])
	return nil
}

// freedWithin polls c (every 100 ms, on the test's fake clock) until key
// has a free slot, for at most bound, and reports whether it had one.
func freedWithin(t *testing.T, c *Concurrency, key string, bound time.Duration) (bool, time.Duration) {
	t.Helper()
	for waited := time.Duration(0); waited <= bound; waited += 100 * time.Millisecond {
		if _, d, err := c.Acquire(context.Background(), key, time.Now()); err != nil {
			t.Fatalf("acquire after %v: %v", waited, err)
		} else if d.Allowed {
			return true, waited
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false, bound
}

// unknownOutcome runs one acquire whose store call is cut short on s (a
// capacity of 1, a lease TTL of a minute) and reports whether its slot
// was free again within 30 s, when, and the limit's counters.
func unknownOutcomeRun(t *testing.T, s *outcomeLeases) (bool, time.Duration, ConcurrencyStats) {
	var freed bool
	var after time.Duration
	var st ConcurrencyStats
	synctest.Test(t, func(t *testing.T) {
		s.lateLanded = make(chan struct{}) // in the bubble: waiting on it lets time pass
		c, err := NewConcurrency(s, ConcurrencyConfig{Name: "cleanup", Capacity: 1, LeaseTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Microsecond)
		defer cancel()
		if l, _, err := c.Acquire(ctx, "k", time.Now()); !errors.Is(err, context.DeadlineExceeded) || l.Held() {
			t.Fatalf("acquire past its deadline: %+v %v, want DeadlineExceeded", l, err)
		}
		synctest.Wait() // the clean-up's first release, if any, is done
		if s.late > 0 {
			<-s.lateLanded
		}
		freed, after = freedWithin(t, c, "k", 30*time.Second)
		time.Sleep(cleanupAgain + 2*cleanupTimeout) // the clean-up ends
		st = c.Stats()
	})
	return freed, after, st
}

// An acquire whose write landed but whose call failed on the caller's
// deadline gives its slot back: at once when the write landed before the
// error, at the second release when it landed after the first (here 10 ms
// after the error; the first release ran at once). With brokenCleanup
// (no release, as before) the slot stays taken until the lease TTL, past
// the 30 s the test waits.
func TestConcurrencyUnknownOutcomeReleased(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func() *outcomeLeases
		want  time.Duration // when the poll finds the slot free
	}{
		{"landed before the error", func() *outcomeLeases { return &outcomeLeases{landed: true} }, 0},
		{"landed after the first release", func() *outcomeLeases {
			return &outcomeLeases{late: 10 * time.Millisecond}
		}, cleanupAgain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			freed, after, st := unknownOutcomeRun(t, tc.store())
			brokenCleanup = true
			freedBroken, _, stBroken := unknownOutcomeRun(t, tc.store())
			brokenCleanup = false
			t.Logf("freed %v after %v (%+v); without the clean-up freed %v (%+v)", freed, after, st, freedBroken, stBroken)
			if !freed || after > tc.want {
				t.Errorf("slot freed %v after %v, want freed within %v", freed, after, tc.want)
			}
			if want := (ConcurrencyStats{Unknown: 1, Releases: 2}); st != want {
				t.Errorf("stats %+v, want %+v", st, want)
			}
			if freedBroken {
				t.Errorf("without the clean-up the slot was freed: the test cannot fail")
			}
		})
	}
}

// Only an acquire whose store call may have written is cleaned up: a
// deadline, a cancellation, a timeout or a store that did not answer, but
// not a breaker that refused the call, nor a store that answered.
func TestConcurrencyUnknownOutcomeErrors(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	live := context.Background()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"deadline", live, fmt.Errorf("store: %w", context.DeadlineExceeded), true},
		{"cancelled", live, fmt.Errorf("store: %w", context.Canceled), true},
		{"socket timeout", live, fmt.Errorf("store: %w", os.ErrDeadlineExceeded), true},
		{"no answer", live, fmt.Errorf("store: %w: 500", storage.ErrUnavailable), true},
		{"caller's context done", done, errors.New("use of closed network connection"), true},
		{"breaker open", live, fmt.Errorf("%w: %w", storage.ErrBreakerOpen, storage.ErrUnavailable), false},
		{"breaker open, context done", done, fmt.Errorf("%w: %w", storage.ErrBreakerOpen, storage.ErrUnavailable), false},
		{"lost races", live, fmt.Errorf("store: %w", storage.ErrConflict), false},
		{"throttled", live, fmt.Errorf("store: %w", storage.ErrThrottled), false},
		{"corrupt", live, fmt.Errorf("store: %w", storage.ErrCorruptState), false},
		{"fenced", live, fmt.Errorf("store: %w", storage.ErrFenced), false},
		{"other", live, errors.New("store: no"), false},
	} {
		c, err := NewConcurrency(&outcomeLeases{err: tc.err}, ConcurrencyConfig{Name: "errors", Capacity: 1, LeaseTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		brokenCleanup = true // count, release nothing
		_, _, err = c.Acquire(tc.ctx, "k", time.Now())
		brokenCleanup = false
		if !errors.Is(err, tc.err) {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.err)
		}
		if got := c.Stats().Unknown == 1; got != tc.want {
			t.Errorf("%s: cleaned up %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Clean-ups are bounded: with the store down (every acquire past its
// deadline, every release waiting for its own timeout), 1000 acquires
// start maxCleanups releases and skip the rest; those end within their
// timeout, the second releases a second later are bounded alike, and
// once they end the next acquire is cleaned up again.
func TestConcurrencyCleanupBounded(t *testing.T) {
	// The bubble's goroutines are counted, not the process's: parallel
	// tests and an earlier test's clean-up timers ran beside it (a
	// fresh-clone make test counted 97 with runtime.NumGoroutine, whose
	// stats were exact; the bubble's count is exact). An unbounded clean-up
	// starts about 936 more.
	synctest.Test(t, func(t *testing.T) {
		s := &outcomeLeases{err: fmt.Errorf("store: %w", context.DeadlineExceeded), block: true}
		c, err := NewConcurrency(s, ConcurrencyConfig{Name: "down", Capacity: 1, LeaseTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		before := bubbleGoroutines()
		const n = 1000
		for range n {
			c.Acquire(context.Background(), "k", time.Now())
		}
		check := func(when string, want ConcurrencyStats) {
			t.Helper()
			synctest.Wait()
			grown, st := bubbleGoroutines()-before, c.Stats()
			t.Logf("%s: %d goroutines more, %+v", when, grown, st)
			if st != want || grown > maxCleanups {
				t.Fatalf("%s: %d goroutines more, stats %+v; want at most %d more, %+v", when, grown, st, maxCleanups, want)
			}
		}
		check("1000 acquires with the store down", ConcurrencyStats{Unknown: n, Releases: maxCleanups, Skipped: n - maxCleanups})
		time.Sleep(cleanupAgain)
		check("their second releases", ConcurrencyStats{Unknown: n, Releases: 2 * maxCleanups, Failed: maxCleanups, Skipped: 2 * (n - maxCleanups)})
		time.Sleep(cleanupTimeout)
		check("all ended", ConcurrencyStats{Unknown: n, Releases: 2 * maxCleanups, Failed: 2 * maxCleanups, Skipped: 2 * (n - maxCleanups)})
		c.Acquire(context.Background(), "k", time.Now())
		check("one more acquire", ConcurrencyStats{Unknown: n + 1, Releases: 2*maxCleanups + 1, Failed: 2 * maxCleanups, Skipped: 2 * (n - maxCleanups)})
		time.Sleep(cleanupAgain + cleanupTimeout)
	})
}

// bubbleGoroutines counts the goroutines of the caller's synctest bubble,
// from the traceback headers ("goroutine 7 [sleep (durable), synctest
// bubble 1]:"): runtime.NumGoroutine counts the whole process, and no
// runtime API counts a bubble.
func bubbleGoroutines() int {
	var self [256]byte
	head, _, _ := strings.Cut(string(self[:runtime.Stack(self[:], false)]), "\n")
	_, id, ok := strings.Cut(head, "synctest bubble ")
	if !ok {
		panic("bubbleGoroutines: not in a synctest bubble: " + head)
	}
	id = "synctest bubble " + strings.TrimSuffix(id, "]:") + "]:"
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for line := range strings.Lines(string(buf)) {
		if strings.HasPrefix(line, "goroutine ") && strings.HasSuffix(strings.TrimSpace(line), id) {
			count++
		}
	}
	return count
}
