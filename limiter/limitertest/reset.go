package limitertest

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// ResetStore is what RunReset needs: a Store that forgets a limit's state
// ([storage.Resetter]) and reads a log without writing
// ([storage.LogReader]).
type ResetStore interface {
	Store
	storage.Resetter
	storage.LogReader
}

// inspectCase is one limit RunReset checks: made on the store, with the
// capacity a fresh key has.
type inspectCase struct {
	name  string
	make  func(t *testing.T, s ResetStore) limiter.Inspector
	limit int64
	// exact: a denial's RetryAfter is exact, so a peek's equals it (a
	// packed window's is a lower bound; a peek's, which cannot split the
	// field that holds now, may be lower still).
	exact bool
}

func inspectCases() []inspectCase {
	return []inspectCase{
		{"TokenBucket", func(t *testing.T, s ResetStore) limiter.Inspector {
			return must[*limiter.TokenBucket](t)(limiter.NewTokenBucket(s, leaseBucket(limiter.TokenBucketConfig{Name: "tb", MaxAmount: 5, RefillTime: time.Minute})))
		}, 5, true},
		{"SlidingWindowPacked", func(t *testing.T, s ResetStore) limiter.Inspector {
			return must[*limiter.SlidingWindow](t)(limiter.NewSlidingWindow(s, leaseWindow(limiter.SlidingWindowConfig{Name: "swp", Limit: 5, Window: time.Minute, Representation: limiter.Packed})))
		}, 5, false},
		{"SlidingWindow", func(t *testing.T, s ResetStore) limiter.Inspector {
			return must[*limiter.SlidingWindow](t)(limiter.NewSlidingWindow(s, leaseWindow(limiter.SlidingWindowConfig{Name: "sw", Limit: 5, Window: time.Minute, Representation: limiter.SubWindowCounters})))
		}, 5, true},
		{"Interpolated", func(t *testing.T, s ResetStore) limiter.Inspector {
			return must[*limiter.SlidingWindow](t)(limiter.NewSlidingWindow(s, leaseWindow(limiter.SlidingWindowConfig{Name: "swi", Limit: 5, Window: time.Minute, SubWindows: 6, Estimator: limiter.Interpolated})))
		}, 5, true},
		{"FixedWindow", func(t *testing.T, s ResetStore) limiter.Inspector {
			return must[*limiter.FixedWindow](t)(limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "fw", Limit: 5, Window: time.Minute}))
		}, 5, true},
		{"SlidingLog", func(t *testing.T, s ResetStore) limiter.Inspector {
			return must[*limiter.SlidingLog](t)(limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Name: "sl", Limit: 5, Window: time.Minute}))
		}, 5, true},
	}
}

// RunReset checks every algorithm's Peek and Reset on s:
//
//   - Peek takes nothing: a key read many times keeps what it had, and
//     the next request sees it (a peek that counted would show).
//   - Peek reports a fresh key full (ResetAfter 0), a used one's
//     remaining units, and an exhausted one denied with the RetryAfter a
//     denied request gets at the same time and a ResetAfter.
//   - Reset of an exhausted key: Peek shows it full again and the next
//     request is allowed, in the same process (whose deny cache held the
//     denial) and in another one (another limiter on the store).
//   - Resetting one limit of a key leaves the key's other limits as they
//     were (DynamoDB keeps every limit of a key Name in one item).
func RunReset(t *testing.T, s ResetStore) {
	now := Base.Add(17*time.Second + 250*time.Millisecond) // mid-window
	for _, c := range inspectCases() {
		t.Run(c.name, func(t *testing.T) { testResetCase(t, s, c, now) })
	}
	t.Run("Concurrent", func(t *testing.T) { testResetConcurrent(t, s, now) })
	t.Run("OneLimitOfAKey", func(t *testing.T) { testResetOneLimit(t, s, now) })
}

// testResetCase: Peek and Reset of one algorithm (see RunReset).
func testResetCase(t *testing.T, s ResetStore, c inspectCase, now time.Time) {
	l := c.make(t, s)
	key := Key(t)
	peek := func(at time.Time) limiter.Decision {
		t.Helper()
		d, err := l.Peek(ctx(t), key, at)
		if err != nil {
			t.Fatalf("Peek: %v", err)
		}
		return d
	}
	if d := peek(now); !d.Allowed || d.Remaining != c.limit || d.Limit != c.limit || d.ResetAfter != 0 || d.RetryAfter != 0 {
		t.Fatalf("fresh key: Peek = %+v; want allowed, %d remaining, no reset or retry", d, c.limit)
	}
	allow(t, l, key, now, 3)
	for i := range 20 {
		if d := peek(now); !d.Allowed || d.Remaining != c.limit-3 || d.ResetAfter <= 0 {
			t.Fatalf("peek %d after taking 3: %+v; want allowed, %d remaining, a ResetAfter", i, d, c.limit-3)
		}
	}
	if d := allow(t, l, key, now, 1); !d.Allowed || d.Remaining != c.limit-4 {
		t.Fatalf("a request after 20 peeks: %+v; want allowed with %d remaining: a peek took something", d, c.limit-4)
	}
	allow(t, l, key, now, 1)
	denied := allow(t, l, key, now, 1)
	if denied.Allowed {
		t.Fatalf("the sixth request was allowed: %+v", denied)
	}
	d := peek(now)
	if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || d.ResetAfter < d.RetryAfter {
		t.Fatalf("exhausted: Peek = %+v; want denied, 0 remaining, 0 < RetryAfter <= ResetAfter", d)
	}
	if c.exact && d.RetryAfter != denied.RetryAfter || !c.exact && d.RetryAfter > denied.RetryAfter {
		t.Fatalf("exhausted: Peek's RetryAfter %v, a denied request's %v", d.RetryAfter, denied.RetryAfter)
	}

	if err := l.Reset(ctx(t), key, now); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if d := peek(now); !d.Allowed || d.Remaining != c.limit || d.ResetAfter != 0 {
		t.Fatalf("after Reset: Peek = %+v; want full", d)
	}
	other := c.make(t, s) // another process: no deny cache of its own
	if d := allow(t, other, key, now, 1); !d.Allowed || d.Remaining != c.limit-1 {
		t.Fatalf("after Reset, another limiter's request: %+v; want allowed with %d remaining", d, c.limit-1)
	}
	if d := allow(t, l, key, now, 1); !d.Allowed || d.Remaining != c.limit-2 {
		t.Fatalf("after Reset, this limiter's request (its deny cache forgot the key): %+v; want allowed with %d remaining", d, c.limit-2)
	}
	// A later reset, where the key's counters are no longer the
	// current (sub-)window's: still all of them.
	if err := l.Reset(ctx(t), key, now.Add(45*time.Second)); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if d := peek(now); d.Remaining != c.limit {
		t.Fatalf("after a Reset 45s later: Peek at the take's time = %+v; want full", d)
	}
}

// testResetOneLimit: every limit on one key Name, all exhausted;
// resetting each leaves the others exhausted.
func testResetOneLimit(t *testing.T, s ResetStore, now time.Time) {
	key := Key(t)
	cases := inspectCases()
	ls := make([]limiter.Inspector, len(cases))
	for i, c := range cases {
		ls[i] = c.make(t, s)
		allow(t, ls[i], key, now, c.limit)
	}
	for i, c := range cases {
		if err := ls[i].Reset(ctx(t), key, now); err != nil {
			t.Fatalf("Reset %s: %v", c.name, err)
		}
		for j, o := range cases {
			d, err := ls[j].Peek(ctx(t), key, now)
			if err != nil {
				t.Fatalf("Peek %s: %v", o.name, err)
			}
			want := int64(0)
			if j <= i {
				want = o.limit
			}
			if d.Remaining != want {
				t.Fatalf("after resetting %s: %s has %d remaining, want %d", cases[i].name, o.name, d.Remaining, want)
			}
		}
	}
}

// testResetConcurrent resets keys while requests run on them, every
// algorithm: no call fails but for a lost race (ErrConflict), the state
// is never corrupt, each key admits at most as if it were new after each
// reset (its capacity per reset, plus the units of denials whose refunds
// may land on the new state), and a last reset leaves it full.
func testResetConcurrent(t *testing.T, s ResetStore, now time.Time) {
	const workers, calls, resets = 4, 8, 3
	for _, c := range inspectCases() {
		t.Run(c.name, func(t *testing.T) {
			l := c.make(t, s)
			key := Key(t)
			var admitted, denied atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, workers*calls+resets)
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					other := c.make(t, s) // a process of its own
					for range calls {
						d, err := other.AllowN(ctx(t), key, now, 1)
						switch {
						case errors.Is(err, storage.ErrConflict):
						case err != nil:
							errs <- err
						case d.Allowed:
							admitted.Add(1)
						default:
							denied.Add(1)
						}
					}
				}()
			}
			for range resets {
				if err := l.Reset(ctx(t), key, now); err != nil {
					errs <- err
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("under concurrent resets: %v", err)
			}
			if bound := c.limit*(resets+1) + denied.Load(); admitted.Load() > bound {
				t.Errorf("admitted %d with %d resets and %d denials: more than %d", admitted.Load(), resets, denied.Load(), bound)
			}
			if d, err := l.Peek(ctx(t), key, now); err != nil || d.Remaining < 0 || d.Remaining > c.limit {
				t.Fatalf("after the run: Peek = %+v, %v", d, err)
			}
			if err := l.Reset(ctx(t), key, now); err != nil {
				t.Fatal(err)
			}
			if d, err := l.Peek(ctx(t), key, now); err != nil || d.Remaining != c.limit {
				t.Fatalf("after a last reset: Peek = %+v, %v; want full", d, err)
			}
		})
	}
}
