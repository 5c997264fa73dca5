package memcached_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// limiters returns one limiter of each algorithm on s, with limits high
// enough never to deny during the fault tests.
func limiters(t *testing.T, s *memcached.Store) map[string]limiter.Limiter {
	t.Helper()
	sw, err1 := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1 << 40, Window: time.Minute, SubWindows: 12})
	fw, err2 := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 1 << 40, Window: time.Minute})
	tb, err3 := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 1 << 40, RefillTime: time.Hour})
	sl, err4 := limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Limit: storage.MaxLogLimit, Window: time.Millisecond})
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		t.Fatal(err)
	}
	return map[string]limiter.Limiter{"SlidingWindow": sw, "FixedWindow": fw, "TokenBucket": tb, "SlidingLog": sl}
}

// TestServerStopsMidRun: memcached is killed while 16 goroutines make
// decisions. Every failure is typed (ErrUnavailable, or ErrConflict for a
// bucket that lost CAS races until its deadline) and comes within the
// deadline (no hang, no panic); after a restart decisions resume on the
// same Store.
func TestServerStopsMidRun(t *testing.T) {
	srv := testserver.StartMemcached(t)
	const timeout = 300 * time.Millisecond
	s := newStore(t, memcached.Config{Addrs: []string{srv.Addr()}, Timeout: timeout})
	ls := limiters(t, s)
	key := limitertestKey(t)

	var phase atomic.Int32 // 0: up, 1: stopped, 2: restarted
	var ok [3]atomic.Int64
	var failed atomic.Int64
	var slowest atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 64)
	for i := range 16 {
		for name, l := range ls {
			if i%4 != 0 && name == "SlidingLog" {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					p := phase.Load()
					start := time.Now()
					_, err := l.AllowN(context.Background(), key, time.Now(), 1)
					el := time.Since(start)
					for {
						s := slowest.Load()
						if int64(el) <= s || slowest.CompareAndSwap(s, int64(el)) {
							break
						}
					}
					switch {
					case err == nil:
						ok[p].Add(1)
					case !errors.Is(err, memcached.ErrUnavailable) && !errors.Is(err, storage.ErrConflict):
						// (A bucket that lost CAS races until its deadline
						// fails with ErrConflict: typed too.)
						select {
						case errs <- err:
						default:
						}
						return
					default:
						failed.Add(1)
						if p != 1 {
							// Connections in flight when the server went
							// away or came back: keep going, but not long.
							time.Sleep(time.Millisecond)
						}
					}
				}
			}()
		}
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("decisions", func() bool { return ok[0].Load() > 200 })
	srv.Stop()
	phase.Store(1)
	waitFor("failures", func() bool { return failed.Load() > 200 })
	phase.Store(2)
	srv.Restart()
	waitFor("decisions after the restart", func() bool { return ok[2].Load() > 200 })
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("an error that is neither ErrUnavailable nor ErrConflict: %v", err)
	}
	t.Logf("ok before/while stopped/after restart: %d/%d/%d, failed %d, slowest call %v (timeout %v)",
		ok[0].Load(), ok[1].Load(), ok[2].Load(), failed.Load(), time.Duration(slowest.Load()), timeout)
	// Generous: -race on a shared machine. A hang would be far longer.
	if sl := time.Duration(slowest.Load()); sl > timeout+2*time.Second {
		t.Fatalf("slowest call took %v with a %v timeout", sl, timeout)
	}
}

// TestDeadPooledConnections: the server restarts while the Store holds idle
// connections to it. The next decisions find them dead, drop the pool and
// retry once on a fresh connection: no error reaches the caller.
func TestDeadPooledConnections(t *testing.T) {
	srv := testserver.StartMemcached(t)
	s := newStore(t, memcached.Config{Addrs: []string{srv.Addr()}, Timeout: 2 * time.Second})
	ls := limiters(t, s)
	key := limitertestKey(t)
	parallel := func() error {
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for range 8 {
			for _, l := range ls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := l.AllowN(context.Background(), key, time.Now(), 1); err != nil {
						errs <- err
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	if err := parallel(); err != nil { // fills the idle pool
		t.Fatal(err)
	}
	for round := range 3 {
		srv.Restart()
		if err := parallel(); err != nil {
			t.Fatalf("round %d: first decisions after a restart: %v", round, err)
		}
	}
}

// TestHungServer: a server that accepts connections and never answers.
// Calls fail with ErrUnavailable wrapping context.DeadlineExceeded at the
// Store's Timeout or the caller's earlier deadline.
func TestHungServer(t *testing.T) {
	addr := testserver.Hung(t)
	const timeout = 200 * time.Millisecond
	s := newStore(t, memcached.Config{Addrs: []string{addr}, Timeout: timeout})
	for name, l := range limiters(t, s) {
		for _, c := range []struct {
			deadline time.Duration // the caller's; 0: none
			want     time.Duration
		}{{0, timeout}, {50 * time.Millisecond, 50 * time.Millisecond}} {
			// start before the deadline is set: a goroutine descheduled
			// between the two (a loaded machine) must not make the call
			// look early.
			start := time.Now()
			ctx := context.Background()
			if c.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.deadline)
				defer cancel()
			}
			_, err := l.AllowN(ctx, "k", time.Now(), 1)
			el := time.Since(start)
			if !errors.Is(err, memcached.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s on a hung server: %v, want ErrUnavailable and DeadlineExceeded", name, err)
			}
			if el < c.want || el > c.want+2*time.Second {
				t.Fatalf("%s on a hung server failed after %v, deadline %v", name, el, c.want)
			}
		}
	}
}

// TestCancelInterrupts: cancelling the caller's context interrupts a call
// blocked on a server that does not answer.
func TestCancelInterrupts(t *testing.T) {
	addr := testserver.Hung(t)
	s := newStore(t, memcached.Config{Addrs: []string{addr}, Timeout: time.Minute})
	for name, l := range limiters(t, s) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		_, err := l.AllowN(ctx, "k", time.Now(), 1)
		if !errors.Is(err, context.Canceled) || !errors.Is(err, memcached.ErrUnavailable) {
			t.Fatalf("%s cancelled on a hung server: %v", name, err)
		}
		if el := time.Since(start); el > 10*time.Second {
			t.Fatalf("%s: cancel took effect after %v", name, el)
		}
	}
}

// TestRefusedConnection: nothing listens. Errors are typed and immediate.
func TestRefusedConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := newStore(t, memcached.Config{Addrs: []string{addr}, Timeout: time.Second})
	for name, l := range limiters(t, s) {
		if _, err := l.AllowN(context.Background(), "k", time.Now(), 1); !errors.Is(err, memcached.ErrUnavailable) {
			t.Fatalf("%s with nothing listening: %v, want ErrUnavailable", name, err)
		}
		if err := l.Refund(context.Background(), "k", time.Now(), 1); !errors.Is(err, memcached.ErrUnavailable) {
			t.Fatalf("%s refund with nothing listening: %v, want ErrUnavailable", name, err)
		}
	}
}
