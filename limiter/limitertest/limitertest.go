// Package limitertest is the conformance suite every limiter store runs:
//
//	func TestConformance(t *testing.T) { limitertest.Run(t, store) }
//
// It covers every algorithm's semantics on the store (the seeds' worked
// examples), concurrency on one hot key, expiry, time going backwards,
// hostile keys and bad arguments, and requests that reach the store out of
// order. Each subtest uses fresh random keys, so the suite can run against a
// long-lived server and run twice.
//
// RunHistory is the history checker: many goroutines on hot keys, arrivals
// reordered on purpose by a DelayStore, every call recorded and checked
// against the exact model (admitted units per window of stamps for the
// windows and the log; linearizability, with porcupine, against a
// serialized Smyte bucket for buckets). It fails a run without late
// arrivals, and SLUICE_HISTORY_SEED replays a seed's draws.
package limitertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// Store is what a backend must implement to run the suite.
type Store interface {
	storage.Counter
	storage.BucketStore
	storage.LogStore
}

// Base is the suite's fixed "now": a whole minute, so sub-window arithmetic
// in the worked examples is exact.
var Base = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

// opTimeout bounds every store call made by the suite.
const opTimeout = 10 * time.Second

// hammerTimeout bounds each call of [Hammer]. A storm's calls queue at one
// item, behind each other and behind lost races, so a call's time is the
// server's throughput under the storm, not the store's correctness: at
// loads 23-36 DynamoDB Local answered the conformance suite's 64-writer
// log storm about 6-12 requests a second, and 57-124 of its 128 calls ran
// out opTimeout in one UpdateItem, having lost few races. This bound only
// stops a store that hangs.
const hammerTimeout = 2 * time.Minute

// Run runs the whole suite against s.
func Run(t *testing.T, s Store) {
	runSuite(t, s)
	t.Run("ColdLeases", func(t *testing.T) { RunColdLeases(t, s) })
}

func runSuite(t *testing.T, s Store) {
	t.Run("TokenBucket", func(t *testing.T) { testTokenBucket(t, s) })
	t.Run("SlidingWindow", func(t *testing.T) { testSlidingWindow(t, s) })
	t.Run("FixedWindow", func(t *testing.T) { testFixedWindow(t, s) })
	t.Run("SlidingLog", func(t *testing.T) { testSlidingLog(t, s) })
	t.Run("Stack", func(t *testing.T) { testStack(t, s) })
	t.Run("OutOfOrder", func(t *testing.T) { testOutOfOrder(t, s) })
	t.Run("Packed", func(t *testing.T) { testPacked(t, s) })
	t.Run("Merged", func(t *testing.T) { testMerged(t, s) })
	t.Run("Concurrency", func(t *testing.T) { testConcurrency(t, s) })
	t.Run("HostileKeys", func(t *testing.T) { testHostileKeys(t, s) })
	t.Run("BadArguments", func(t *testing.T) { testBadArguments(t, s) })
}

// Key returns a fresh key, unique across runs, for t.
func Key(t testing.TB) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(t.Name(), "/", ".") + "." + hex.EncodeToString(b[:])
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return c
}

// allow takes n at `at` and fails the test on error.
func allow(t testing.TB, l limiter.Limiter, key string, at time.Time, n int64) limiter.Decision {
	t.Helper()
	d, err := l.AllowN(ctx(t), key, at, n)
	if err != nil {
		t.Fatalf("AllowN(%q, %v, %d): %v", key, at.Sub(Base), n, err)
	}
	return d
}

// step is one request of a step table: at Base+at, cost n (1 when zero),
// expecting allowed and (when checkRemaining) the remaining count.
type step struct {
	at        time.Duration
	n         int64
	allowed   bool
	remaining int64
	retry     time.Duration // checked when non-zero
}

func runSteps(t *testing.T, l limiter.Limiter, key string, steps []step) {
	t.Helper()
	for i, st := range steps {
		n := st.n
		if n == 0 {
			n = 1
		}
		d := allow(t, l, key, Base.Add(st.at), n)
		if d.Allowed != st.allowed || d.Remaining != st.remaining {
			t.Fatalf("step %d (at %v, n %d): allowed=%v remaining=%d, want allowed=%v remaining=%d",
				i, st.at, n, d.Allowed, d.Remaining, st.allowed, st.remaining)
		}
		if st.retry != 0 && d.RetryAfter != st.retry {
			t.Fatalf("step %d (at %v): RetryAfter=%v, want %v", i, st.at, d.RetryAfter, st.retry)
		}
		if d.Allowed && d.RetryAfter != 0 {
			t.Fatalf("step %d: allowed with RetryAfter %v", i, d.RetryAfter)
		}
		if !d.Allowed && d.RetryAfter <= 0 {
			t.Fatalf("step %d: denied without RetryAfter", i)
		}
	}
}

// countAllowed makes tries requests of cost 1 at `at` and counts the allowed.
func countAllowed(t testing.TB, l limiter.Limiter, key string, at time.Time, tries int) int {
	t.Helper()
	n := 0
	for range tries {
		if allow(t, l, key, at, 1).Allowed {
			n++
		}
	}
	return n
}

func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func bucket(t testing.TB, s Store, cfg limiter.TokenBucketConfig) *limiter.TokenBucket {
	b := must[*limiter.TokenBucket](t)(limiter.NewTokenBucket(s, leaseBucket(cfg)))
	if leasesOn {
		leased = append(leased, b)
	}
	return b
}

func sliding(t testing.TB, s Store, cfg limiter.SlidingWindowConfig) *limiter.SlidingWindow {
	w := must[*limiter.SlidingWindow](t)(limiter.NewSlidingWindow(s, leaseWindow(cfg)))
	if leasesOn {
		leased = append(leased, w)
	}
	return w
}

func fixed(t testing.TB, s Store, cfg limiter.FixedWindowConfig) *limiter.FixedWindow {
	return must[*limiter.FixedWindow](t)(limiter.NewFixedWindow(s, cfg))
}

func slidingLog(t testing.TB, s Store, cfg limiter.SlidingLogConfig) *limiter.SlidingLog {
	return must[*limiter.SlidingLog](t)(limiter.NewSlidingLog(s, cfg))
}

// Hammer runs workers goroutines, released together, each making tries
// requests of cost 1 on key at `at`, and returns how many were allowed. Any
// error fails the test, a call past hammerTimeout too. Backends use it for
// their own contention tests.
func Hammer(t *testing.T, l limiter.Limiter, key string, at time.Time, workers, tries int) int64 {
	t.Helper()
	var allowed, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range tries {
				c, cancel := context.WithTimeout(context.Background(), hammerTimeout)
				d, err := l.AllowN(c, key, at, 1)
				cancel()
				switch {
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				case d.Allowed:
					allowed.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d concurrent requests failed; first error: %v", f, workers*tries, firstErr.Load())
	}
	return allowed.Load()
}

func isInvalidCost(err error) bool { return errors.Is(err, limiter.ErrInvalidCost) }

// leasesOn is set while [RunLeased] runs: the suite's token buckets and
// sliding windows then take capacity leases. (The suite's tests do not
// run in parallel with one another, so a package variable suffices.)
var leasesOn bool

// leased are the limiters the suite's helpers made during a run, whose
// lease counters RunLeased sums.
var leased []interface{ LeaseStats() limiter.LeaseStats }

// leaseBucket turns Leases on in c while RunLeased runs, where a bucket
// takes them (not strict).
func leaseBucket(c limiter.TokenBucketConfig) limiter.TokenBucketConfig {
	c.Leases = c.Leases || leasesOn && !c.Strict
	return c
}

// leaseWindow turns Leases on in c while RunLeased runs, where a window
// takes them (bounded, refunding denials).
func leaseWindow(c limiter.SlidingWindowConfig) limiter.SlidingWindowConfig {
	c.Leases = c.Leases || leasesOn && c.Estimator == limiter.Bounded && !c.CountDenied
	return c
}

// RunLeased runs the suite (but ColdLeases) with Leases on every token
// bucket and sliding window it makes: leases must not change any of its
// worked examples, exactness checks or histories. Not safe to run in
// parallel with another run of the suite in the same process.
func RunLeased(t *testing.T, s Store) {
	leasesOn, leased = true, nil
	defer func() { leasesOn, leased = false, nil }()
	runSuite(t, s)
	var st limiter.LeaseStats
	for _, l := range leased {
		st = st.Add(l.LeaseStats())
	}
	t.Logf("leases of the suite's %d bucket and window limiters: %+v", len(leased), st)
	if st.Takes == 0 {
		t.Error("no lease was taken: the run did not test leases")
	}
}
