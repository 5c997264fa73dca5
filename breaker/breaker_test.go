package breaker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// fakeStore answers every call with err() (nil: an empty success), after
// block returns when it is set; calls counts the calls that reached it.
type fakeStore struct {
	calls atomic.Int64
	err   func() error
	block func(ctx context.Context)
}

func (f *fakeStore) answer(ctx context.Context) error {
	f.calls.Add(1)
	if f.block != nil {
		f.block(ctx)
	}
	if f.err == nil {
		return nil
	}
	return f.err()
}

func (f *fakeStore) Add(ctx context.Context, _ storage.Key, _ int64, _ int, _ int64, _ time.Duration) (storage.Counts, error) {
	return storage.Counts{}, f.answer(ctx)
}
func (f *fakeStore) Sub(ctx context.Context, _ storage.Key, _, _ int64) error { return f.answer(ctx) }
func (f *fakeStore) UpdateBucket(ctx context.Context, _ storage.Key, _ storage.BucketOp, _ time.Duration) (storage.Decision, error) {
	return storage.Decision{Allowed: true}, f.answer(ctx)
}
func (f *fakeStore) UpdateLog(ctx context.Context, _ storage.Key, _ storage.LogOp, _ time.Duration) (storage.Decision, error) {
	return storage.Decision{Allowed: true}, f.answer(ctx)
}

var (
	down      = fmt.Errorf("store: connection refused: %w", storage.ErrUnavailable)
	throttled = fmt.Errorf("store: slow down: %w", storage.ErrThrottled)
	key       = storage.Key{Space: "s", Name: "k"}
)

// errOf returns a fake store error function reading *e.
func errOf(mu *sync.Mutex, e *error) func() error {
	return func() error { mu.Lock(); defer mu.Unlock(); return *e }
}

func wrap(t *testing.T, f *fakeStore, cfg breaker.Config) *breaker.Store {
	t.Helper()
	s, err := breaker.Wrap(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// call makes one call of each kind in turn (by i), on a key of its own
// (by i, modulo 8: the breaker opens on failures across distinct keys),
// and returns its error.
func call(s *breaker.Store, i int) error {
	ctx := context.Background()
	key := storage.Key{Space: key.Space, Name: fmt.Sprint(key.Name, i%8)}
	switch i % 4 {
	case 0:
		_, err := s.Add(ctx, key, 1, 2, 1, time.Minute)
		return err
	case 1:
		return s.Sub(ctx, key, 1, 1)
	case 2:
		_, err := s.UpdateBucket(ctx, key, storage.BucketOp{}, time.Minute)
		return err
	default:
		_, err := s.UpdateLog(ctx, key, storage.LogOp{}, time.Minute)
		return err
	}
}

// Failures in a row open the breaker, through every method; then calls
// fail at once, without reaching the store, with an error wrapping
// ErrOpen and storage.ErrUnavailable.
func TestOpensAfterFailures(t *testing.T) {
	for _, cause := range []error{down} {
		t.Run(cause.Error(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeStore{err: func() error { return cause }}
				s := wrap(t, f, breaker.Config{Name: "mc", Failures: 4, OpenFor: time.Second})
				for i := range 4 {
					if s.Breaker().State() != breaker.Closed {
						t.Fatalf("open after %d failures", i)
					}
					if err := call(s, i); !errors.Is(err, cause) || errors.Is(err, breaker.ErrOpen) {
						t.Fatalf("call %d: %v, want the store's error", i, err)
					}
				}
				if s.Breaker().State() != breaker.Open {
					t.Fatalf("state %v after 4 failures", s.Breaker().State())
				}
				for i := range 8 {
					err := call(s, i)
					if !errors.Is(err, breaker.ErrOpen) || !errors.Is(err, storage.ErrUnavailable) || !strings.Contains(err.Error(), "mc") {
						t.Errorf("open, call %d: %v", i, err)
					}
				}
				if n := f.calls.Load(); n != 4 {
					t.Errorf("the store got %d calls, want the 4 before the breaker opened", n)
				}
				st := s.Breaker().Stats()
				if st != (breaker.Stats{State: breaker.Open, Opens: 1, Rejected: 8, Failures: 4}) {
					t.Errorf("stats %+v", st)
				}
			})
		})
	}
}

// Only failures in a row count: an answer from the store (a success, a
// lost race, corrupt state) resets the count; a caller's error neither
// counts nor resets.
func TestWhatCounts(t *testing.T) {
	for _, tt := range []struct {
		between error
		open    bool // after 2 failures, the in-between error, 2 failures
	}{
		{nil, false},
		{fmt.Errorf("x: %w", storage.ErrConflict), false},
		{fmt.Errorf("x: %w", storage.ErrCorruptState), false},
		{fmt.Errorf("x: %w", storage.ErrThrottled), false},
		{fmt.Errorf("x: %w", storage.ErrFenced), false},
		{fmt.Errorf("x: %w", limiter.ErrInvalidCost), true},
		{errors.New("an error of no kind"), true},
		{down, true},
	} {
		t.Run(fmt.Sprint(tt.between), func(t *testing.T) {
			var mu sync.Mutex
			cur := down
			f := &fakeStore{err: errOf(&mu, &cur)}
			s := wrap(t, f, breaker.Config{Failures: 4})
			set := func(e error) { mu.Lock(); cur = e; mu.Unlock() }
			call(s, 0)
			call(s, 1)
			set(tt.between)
			call(s, 2)
			set(down)
			call(s, 3)
			if s.Breaker().State() != breaker.Closed && tt.between != down {
				t.Fatalf("open too early")
			}
			call(s, 0)
			if got := s.Breaker().State() == breaker.Open; got != tt.open {
				t.Errorf("open = %v, want %v", got, tt.open)
			}
		})
	}
}

// After OpenFor, one probe at a time goes through; calls during it fail at
// once; its success closes the breaker. The backend's return is noticed
// within one OpenFor: traffic every 10 ms, the backend back 300 ms after
// the breaker opened, the breaker closed at OpenFor after it opened.
func TestProbeClosesWithinOpenFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const openFor = time.Second
		var mu sync.Mutex
		cur := down
		release := make(chan struct{})
		var holdProbe atomic.Bool
		f := &fakeStore{err: errOf(&mu, &cur), block: func(ctx context.Context) {
			if holdProbe.Load() {
				<-release
			}
		}}
		var changes []string
		s := wrap(t, f, breaker.Config{Name: "ddb", Failures: 3, OpenFor: openFor, OnChange: func(name string, from, to breaker.State) {
			changes = append(changes, name+":"+from.String()+">"+to.String())
		}})
		for i := 0; ; i++ {
			call(s, i)
			if s.Breaker().State() == breaker.Open {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		opened := time.Now()
		time.Sleep(10 * time.Millisecond)
		storeCalls := f.calls.Load()

		// Traffic every 10 ms; the backend comes back 300 ms later.
		var closedAt time.Time
		for i := 0; closedAt.IsZero(); i++ {
			if time.Since(opened) >= 300*time.Millisecond {
				mu.Lock()
				cur = nil
				mu.Unlock()
			}
			if time.Since(opened) == openFor {
				// The probe: hold it in the store while others call.
				holdProbe.Store(true)
				done := make(chan error)
				go func() { done <- call(s, i) }()
				synctest.Wait()
				if s.Breaker().State() != breaker.HalfOpen {
					t.Fatalf("state %v during the probe", s.Breaker().State())
				}
				for j := range 5 {
					if err := call(s, j); !errors.Is(err, breaker.ErrOpen) {
						t.Errorf("call during the probe: %v, want ErrOpen", err)
					}
				}
				holdProbe.Store(false)
				close(release)
				if err := <-done; err != nil {
					t.Fatalf("probe: %v", err)
				}
			} else if err := call(s, i); err == nil && s.Breaker().State() != breaker.Closed {
				t.Fatalf("a call succeeded with the breaker %v", s.Breaker().State())
			}
			if s.Breaker().State() == breaker.Closed {
				closedAt = time.Now()
			}
			time.Sleep(10 * time.Millisecond)
		}
		if got := closedAt.Sub(opened); got != openFor {
			t.Errorf("closed %v after opening, want %v (one probe interval)", got, openFor)
		}
		if n := f.calls.Load() - storeCalls; n != 1 {
			t.Errorf("%d store calls while open, want the one probe", n)
		}
		for i := range 4 {
			if err := call(s, i); err != nil {
				t.Errorf("closed, call %d: %v", i, err)
			}
		}
		want := []string{"ddb:closed>open", "ddb:open>half-open", "ddb:half-open>closed"}
		if fmt.Sprint(changes) != fmt.Sprint(want) {
			t.Errorf("changes %v, want %v", changes, want)
		}
		if st := s.Breaker().Stats(); st.Opens != 1 || st.Closes != 1 || st.Probes != 1 || st.State != breaker.Closed {
			t.Errorf("stats %+v", st)
		}
	})
}

// A failed probe opens the breaker for another OpenFor; a probe whose
// caller never reports lets another through after OpenFor.
func TestFailedAndLostProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{err: func() error { return down }}
		s := wrap(t, f, breaker.Config{Failures: 1, OpenFor: time.Second})
		b := s.Breaker()
		call(s, 0)
		time.Sleep(time.Second)
		if err := call(s, 0); !errors.Is(err, down) || errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("probe: %v, want the store's error", err)
		}
		if b.State() != breaker.Open {
			t.Fatalf("state %v after a failed probe", b.State())
		}
		time.Sleep(time.Second - time.Nanosecond)
		if err := call(s, 0); !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("before OpenFor after a failed probe: %v", err)
		}
		time.Sleep(time.Nanosecond)
		probe, err := b.Allow() // a probe that is never reported
		if !probe || err != nil {
			t.Fatalf("Allow = %v, %v; want a probe", probe, err)
		}
		if p, err := b.Allow(); p || !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("second Allow during a probe = %v, %v", p, err)
		}
		time.Sleep(time.Second)
		if p, err := b.Allow(); !p || err != nil {
			t.Fatalf("Allow after a lost probe = %v, %v; want another probe", p, err)
		}
		b.Done(true, nil)
		if b.State() != breaker.Closed {
			t.Errorf("state %v after a successful probe", b.State())
		}
		if st := b.Stats(); st.Opens != 2 || st.Closes != 1 || st.Probes != 3 {
			t.Errorf("stats %+v", st)
		}
	})
}

// Transitions are logged.
func TestLogs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		var fail atomic.Bool
		fail.Store(true)
		f := &fakeStore{err: func() error {
			if fail.Load() {
				return down
			}
			return nil
		}}
		s := wrap(t, f, breaker.Config{Name: "memcached", Failures: 1, Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
		call(s, 0)
		time.Sleep(breaker.DefaultOpenFor)
		call(s, 0)
		time.Sleep(breaker.DefaultOpenFor)
		fail.Store(false)
		call(s, 0)
		out := buf.String()
		for _, want := range []string{
			`"level":"WARN","msg":"circuit breaker open","backend":"memcached","failures":1,"open_for":"1s","error":"store: connection refused: storage: store unavailable"`,
			`"level":"WARN","msg":"circuit breaker probe failed; open again","backend":"memcached"`,
			`"level":"INFO","msg":"circuit breaker closed","backend":"memcached"`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("log lacks %s:\n%s", want, out)
			}
		}
	})
}

func TestConfig(t *testing.T) {
	if _, err := breaker.Wrap(nil, breaker.Config{}); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Errorf("nil store: %v", err)
	}
	if _, err := breaker.New(breaker.Config{Failures: -1}); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Errorf("negative failures: %v", err)
	}
	if _, err := breaker.New(breaker.Config{OpenFor: -1}); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Errorf("negative OpenFor: %v", err)
	}
}

// A fault on one key is that key's: failures of one key, however many in a
// row, never open the breaker for the others, and a throttle (the store
// refused a key for capacity) is an answer, not a failure: it resets the
// run. Failures from Config.Keys distinct keys open it; so does a refused
// connection, which is about the backend as a whole.
func TestOneKeyNeverOpens(t *testing.T) {
	ctx := context.Background()
	slow := fmt.Errorf("store: %w: %w", storage.ErrUnavailable, context.DeadlineExceeded)
	refusedErr := fmt.Errorf("store: %w: %w", storage.ErrUnavailable,
		&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	for _, tt := range []struct {
		name string
		err  error
		keys []string // the keys of the failing calls, in order
		open bool
	}{
		{"one key's timeouts", slow, []string{"hot", "hot", "hot", "hot", "hot", "hot", "hot", "hot", "hot", "hot"}, false},
		{"two keys' timeouts", slow, []string{"hot", "warm", "hot", "warm", "hot", "warm", "hot", "warm"}, false},
		{"throttles on many keys", throttled, []string{"a", "b", "c", "d", "e", "f", "g", "h"}, false},
		{"three keys' timeouts", slow, []string{"hot", "hot", "a", "hot", "b"}, true},
		{"one key's refused connections", refusedErr, []string{"hot", "hot", "hot", "hot", "hot"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			cur := tt.err
			f := &fakeStore{err: errOf(&mu, &cur)}
			s := wrap(t, f, breaker.Config{Failures: 5, OpenFor: time.Hour})
			for _, k := range tt.keys {
				if _, err := s.UpdateBucket(ctx, storage.Key{Space: "s", Name: k}, storage.BucketOp{}, time.Minute); errors.Is(err, breaker.ErrOpen) {
					break
				}
			}
			if got := s.Breaker().State() == breaker.Open; got != tt.open {
				t.Fatalf("open = %v after failures on %v, want %v", got, tt.keys, tt.open)
			}
			if tt.open {
				return
			}
			// Another key is still served by the store.
			mu.Lock()
			cur = nil
			mu.Unlock()
			before := f.calls.Load()
			if _, err := s.UpdateBucket(ctx, storage.Key{Space: "s", Name: "victim"}, storage.BucketOp{}, time.Minute); err != nil || f.calls.Load() != before+1 {
				t.Fatalf("another key: %v, %d calls reached the store", err, f.calls.Load()-before)
			}
		})
	}
}

// Keys is validated and bounded by Failures.
func TestKeysConfig(t *testing.T) {
	if _, err := breaker.New(breaker.Config{Keys: -1}); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Errorf("negative Keys: %v", err)
	}
	// Keys above Failures is Failures: two failures of two keys open it.
	f := &fakeStore{err: func() error { return down }}
	s := wrap(t, f, breaker.Config{Failures: 2, Keys: 10, OpenFor: time.Hour})
	call(s, 0)
	call(s, 1)
	if s.Breaker().State() != breaker.Open {
		t.Errorf("Failures 2, Keys 10: %v after 2 failures of 2 keys, want open", s.Breaker().State())
	}
}

// The bound on recovery: a backend that answers again within the deadline
// at time R is used again, the breaker closed, by R + OpenFor + deadline
// + the gap between two requests. The worst case is a return just after
// a probe left for the still-hung backend: that probe fails at its
// deadline, the breaker opens for another OpenFor, and the next probe
// closes it. (A backend that still misses the deadline after its return,
// a cold server, is not back: each such probe adds OpenFor + deadline.)
func TestRecoveryBound(t *testing.T) {
	const (
		openFor  = time.Second
		deadline = 250 * time.Millisecond
		gap      = 10 * time.Millisecond
	)
	for _, after := range []time.Duration{0, time.Millisecond, deadline / 2, deadline, openFor / 2, openFor + deadline/2} {
		t.Run(fmt.Sprint("return ", after, " after a probe left"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// A hung backend: a call that reaches it while it hangs
				// fails at its deadline, whenever the backend returns.
				var hung atomic.Bool
				hung.Store(true)
				f := &fakeStore{}
				f.err = func() error { return nil }
				f.block = func(ctx context.Context) {
					if hung.Load() {
						<-ctx.Done()
					}
				}
				s, err := breaker.Wrap(&hangStore{fakeStore: f, hung: &hung}, breaker.Config{Failures: 3, OpenFor: openFor})
				if err != nil {
					t.Fatal(err)
				}
				b := s.Breaker()
				decide := func(i int) {
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					defer cancel()
					s.UpdateBucket(ctx, storage.Key{Space: "s", Name: fmt.Sprint(i % 8)}, storage.BucketOp{}, time.Minute)
				}
				// Traffic every gap, each request on its own goroutine (a
				// hung call does not hold the others back).
				var wg sync.WaitGroup
				var returned, closed time.Time
				start := time.Now()
				for i := 0; closed.IsZero(); i++ {
					if time.Since(start) > time.Minute {
						t.Fatal("never closed")
					}
					wg.Go(func() { decide(i) })
					time.Sleep(gap)
					// The backend returns `after` once the first probe has
					// left (the breaker is half-open, its probe in flight).
					if returned.IsZero() && b.Stats().Probes > 0 {
						time.Sleep(after)
						hung.Store(false)
						returned = time.Now()
					}
					if !returned.IsZero() && b.State() == breaker.Closed {
						closed = time.Now()
					}
				}
				wg.Wait()
				bound := openFor + deadline + gap
				took := closed.Sub(returned)
				t.Logf("closed %v after the backend's return (bound %v)", took, bound)
				if took > bound {
					t.Errorf("closed %v after the return, above OpenFor + deadline + gap = %v", took, bound)
				}
			})
		})
	}
}

// hangStore is a fakeStore whose UpdateBucket fails with ErrUnavailable
// at ctx's deadline when it reached the store while hung was set.
type hangStore struct {
	*fakeStore
	hung *atomic.Bool
}

func (h *hangStore) UpdateBucket(ctx context.Context, key storage.Key, op storage.BucketOp, ttl time.Duration) (storage.Decision, error) {
	if h.hung.Load() {
		h.calls.Add(1)
		<-ctx.Done()
		return storage.Decision{}, fmt.Errorf("store: %w: %w", storage.ErrUnavailable, ctx.Err())
	}
	return h.fakeStore.UpdateBucket(ctx, key, op, ttl)
}
