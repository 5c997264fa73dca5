package limiter_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

func decideFenced(ctx context.Context, at time.Time, items ...limiter.Item) ([]limiter.Outcome, error) {
	out := make([]limiter.Outcome, len(items))
	_, err := limiter.Decide(ctx, at, items, out)
	return out, err
}

func peekRemaining(t *testing.T, w *limiter.SlidingWindow, key string, at time.Time) int64 {
	t.Helper()
	d, err := w.Peek(context.Background(), key, at)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

func fenceBucket(t *testing.T, s storage.BucketStore, max int64, leases bool) *limiter.TokenBucket {
	t.Helper()
	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: max, RefillTime: time.Hour, Leases: leases})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func bucketTokens(t *testing.T, b *limiter.TokenBucket, key string, at time.Time) int64 {
	t.Helper()
	d, err := b.Get(context.Background(), key, at)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// fenceLimiter is a limit that takes a fence.
type fenceLimiter interface {
	limiter.Limiter
	RaiseFence(ctx context.Context, key string, f int64) error
}

// fencedLimit is a limit that takes a fence, and what it has left of a
// key at an instant.
type fencedLimit struct {
	name  string
	limit fenceLimiter
	left  func(key string, at time.Time) int64
}

// fencedLimits are a window with sub-window counters and a token bucket
// of 100, each on a memory store of its own.
func fencedLimits(t *testing.T) []fencedLimit {
	w := capWindow(t, 100, false)
	b := fenceBucket(t, newStore(t), 100, false)
	return []fencedLimit{
		{"window", w, func(key string, at time.Time) int64 { return peekRemaining(t, w, key, at) }},
		{"bucket", b, func(key string, at time.Time) int64 { return bucketTokens(t, b, key, at) }},
	}
}

// A fenced item below the key's fence takes nothing: Decide returns an
// error wrapping storage.ErrFenced (also in the item's Outcome.Err), its
// Fail does not decide it, and what the batch's other items took is given
// back. At or above the fence, or unfenced, it passes; the fence never
// goes down; a fenced refusal leaves no cached denial; a refund is never
// fenced. For a window and a token bucket.
func TestFenceDecide(t *testing.T) {
	for _, fl := range fencedLimits(t) {
		t.Run(fl.name, func(t *testing.T) {
			ctx := context.Background()
			l, other := fl.limit, capWindow(t, 100, false)
			at := time.Unix(1000, 0)
			allow := limiter.Decision{Allowed: true}
			if _, err := decideFenced(ctx, at, limiter.Item{Limit: l, Key: "k", N: 1, Fence: 1}); err != nil {
				t.Fatalf("fenced on a key without a fence: %v", err)
			}
			if err := l.RaiseFence(ctx, "k", 5); err != nil {
				t.Fatal(err)
			}
			out, err := decideFenced(ctx, at, limiter.Item{Limit: other, Key: "k", N: 3}, limiter.Item{Limit: l, Key: "k", N: 1, Fence: 3, Fail: &allow})
			if !errors.Is(err, storage.ErrFenced) || !errors.Is(out[1].Err, storage.ErrFenced) || out[1].Failed || out[1].Decision.Allowed {
				t.Fatalf("fenced below the key's fence: err %v, outcome %+v; want ErrFenced, not Failed, not allowed", err, out[1])
			}
			if !out[0].Refunded || peekRemaining(t, other, "k", at) != 100 || fl.left("k", at) != 99 {
				t.Errorf("the batch's other take was not given back (%+v), or the fenced one taken: left %d and %d, want 100 and 99",
					out[0], peekRemaining(t, other, "k", at), fl.left("k", at))
			}
			for _, f := range []int64{5, 6, 0} {
				if out, err := decideFenced(ctx, at, limiter.Item{Limit: l, Key: "k", N: 1, Fence: f}); err != nil || !out[0].Decision.Allowed {
					t.Errorf("fence %d against 5: %v %+v, want allowed", f, err, out[0])
				}
			}
			if err := l.RaiseFence(ctx, "k", 2); err != nil {
				t.Fatal(err)
			}
			if _, err := decideFenced(ctx, at, limiter.Item{Limit: l, Key: "k", N: 1, Fence: 4}); !errors.Is(err, storage.ErrFenced) {
				t.Errorf("fence 4 after a raise to 2 over 5: %v, want ErrFenced (a raise never lowers)", err)
			}
			// A key with nothing left: the fenced refusal is not a
			// denial, and caches none.
			if _, err := decideFenced(ctx, at, limiter.Item{Limit: l, Key: "k", N: 96, Fence: 5}); err != nil {
				t.Fatal(err)
			}
			if err := l.RaiseFence(ctx, "k", 9); err != nil {
				t.Fatal(err)
			}
			if _, err := decideFenced(ctx, at, limiter.Item{Limit: l, Key: "k", N: 1, Fence: 5}); !errors.Is(err, storage.ErrFenced) {
				t.Fatalf("fence 5 after a raise to 9: %v, want ErrFenced", err)
			}
			if out, err := decideFenced(ctx, at, limiter.Item{Limit: l, Key: "k", N: 1, Fence: 9}); err != nil || out[0].Decision.Allowed || out[0].Cached {
				t.Errorf("fence 9 with nothing left: %v %+v, want denied by the store, not cached", err, out[0])
			}
			if err := l.Refund(ctx, "k", at, 3); err != nil || fl.left("k", at) != 3 {
				t.Errorf("refund after the raise: %v, %d left, want 3", err, fl.left("k", at))
			}
		})
	}
}

// A limit other than a window with sub-window counters on a
// storage.Fencer, or a token bucket on a storage.BucketFencer, refuses a
// fence, and so does RaiseFence.
func TestFenceRefused(t *testing.T) {
	s := newStore(t)
	b, err := limiter.NewTokenBucket(windowFencer{s, s}, limiter.TokenBucketConfig{Name: "b", MaxAmount: 10, RefillTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	bplain, err := limiter.NewTokenBucket(plainStore{s}, limiter.TokenBucketConfig{Name: "bplain", MaxAmount: 10, RefillTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	bok, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "bok", MaxAmount: 10, RefillTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	fw, err := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "f", Limit: 10, Window: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "p", Limit: 10, Window: time.Second, Representation: limiter.Packed})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := limiter.NewSlidingWindow(plainStore{s}, limiter.SlidingWindowConfig{Name: "plain", Limit: 10, Window: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		l     limiter.Limiter
		fence int64
	}{{"token bucket on a Fencer without BucketFencer", b, 1}, {"token bucket on a store without Fencer", bplain, 1}, {"negative fence on a bucket", bok, -1}, {"fixed window", fw, 1}, {"packed window", p, 1}, {"store without Fencer", plain, 1}, {"negative fence", capWindow(t, 10, false), -1}}
	for _, c := range cases {
		_, err := decideFenced(context.Background(), time.Unix(0, 0), limiter.Item{Limit: c.l, Key: "k", N: 1, Fence: c.fence})
		if !errors.Is(err, limiter.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", c.name, err)
		}
	}
	for _, w := range []*limiter.SlidingWindow{p, plain} {
		if err := w.RaiseFence(context.Background(), "k", 1); !errors.Is(err, limiter.ErrInvalidConfig) {
			t.Errorf("RaiseFence on %q: %v, want ErrInvalidConfig", w.Config().Name, err)
		}
	}
	for _, c := range []struct {
		b *limiter.TokenBucket
		f int64
	}{{b, 1}, {bplain, 1}, {bok, 0}} {
		if err := c.b.RaiseFence(context.Background(), "k", c.f); !errors.Is(err, limiter.ErrInvalidConfig) {
			t.Errorf("RaiseFence(%d) on bucket %q: %v, want ErrInvalidConfig", c.f, c.b.Config().Name, err)
		}
	}
}

// plainStore is a store of every kind that is not a storage.Fencer.
type plainStore struct{ storage.Store }

// windowFencer is a store of every kind that fences windows only (a
// storage.Fencer, not a storage.BucketFencer).
type windowFencer struct {
	storage.Store
	storage.Fencer
}

// fenceRecorder is the memory store, recording its fenced lease takes (a
// window's adds of more than one unit, a bucket's ModeLease ops) and the
// fenced takes that landed below the raised fence.
type fenceRecorder struct {
	*memory.Store
	mu                        sync.Mutex
	raised                    int64 // the fence raised so far
	leaseTakes, refusedLeases int
	landedBelow               int // fenced takes below the raised fence that landed
}

func (r *fenceRecorder) AddFenced(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration, fence int64) (storage.Counts, error) {
	raised := r.fence()
	c, err := r.Store.AddFenced(ctx, k, cur, span, n, ttl, fence)
	r.record(err, n > 1, n > 0, fence, raised)
	return c, err
}

func (r *fenceRecorder) UpdateBucketFenced(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration, fence int64) (storage.Decision, error) {
	raised := r.fence()
	d, err := r.Store.UpdateBucketFenced(ctx, k, op, ttl, fence)
	r.record(err, op.Mode == storage.ModeLease, op.Take(), fence, raised)
	return d, err
}

// fence is the fence raised so far.
func (r *fenceRecorder) fence() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.raised
}

// record counts a fenced op's answer err: a lease take (lease), a take
// (take) with fence, sent when the raised fence was raised.
func (r *fenceRecorder) record(err error, lease, take bool, fence, raised int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if lease {
		r.leaseTakes++
		if errors.Is(err, storage.ErrFenced) {
			r.refusedLeases++
		}
	}
	if err == nil && take && fence < raised {
		r.landedBelow++
	}
}

func (r *fenceRecorder) RaiseFence(ctx context.Context, k storage.Key, f int64, ttl time.Duration) error {
	err := r.Store.RaiseFence(ctx, k, f, ttl)
	r.mu.Lock()
	r.raised = max(r.raised, f)
	r.mu.Unlock()
	return err
}

// A hot key's lease takes carry the item's fence: after the fence rose,
// the calls with the old fence are answered from the leases taken before
// while they last, and every lease take after is refused (ErrFenced). For
// a window and a token bucket.
func TestFenceLeaseTake(t *testing.T) {
	for _, c := range []struct {
		name  string
		limit func(t *testing.T, rec *fenceRecorder) fenceLimiter
	}{
		{"window", func(t *testing.T, rec *fenceRecorder) fenceLimiter {
			w, err := limiter.NewSlidingWindow(rec, limiter.SlidingWindowConfig{Name: "w", Limit: 3000, Window: time.Second, SubWindows: 10,
				Representation: limiter.SubWindowCounters, Leases: true})
			if err != nil {
				t.Fatal(err)
			}
			return w
		}},
		{"bucket", func(t *testing.T, rec *fenceRecorder) fenceLimiter { return fenceBucket(t, rec, 1<<30, true) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &fenceRecorder{Store: newStore(t)}
			checkFenceLeaseTake(t, rec, c.limit(t, rec))
		})
	}
}

// checkFenceLeaseTake makes 1,500 calls with fence 1 on l, 1,000 a second
// (a third of a window's limit), raising the fence to 2 at call 1,050.
func checkFenceLeaseTake(t *testing.T, rec *fenceRecorder, l fenceLimiter) {
	ctx := context.Background()
	start := time.Unix(2000, 0)
	fenced, leased := 0, 0
	for i := range 1500 {
		at := start.Add(time.Duration(i) * time.Millisecond)
		if i == 1050 {
			if err := l.RaiseFence(ctx, "k", 2); err != nil {
				t.Fatal(err)
			}
		}
		out, err := decideFenced(ctx, at, limiter.Item{Limit: l, Key: "k", N: 1, Fence: 1})
		switch {
		case i >= 1050 && errors.Is(err, storage.ErrFenced):
			fenced++
		case err != nil:
			t.Fatalf("call %d: %v", i, err)
		case i >= 1050 && out[0].Leased:
			leased++
		}
	}
	before := rec.leaseTakes - rec.refusedLeases
	t.Logf("lease takes %d (%d refused), after the raise: %d calls fenced, %d answered from a lease", rec.leaseTakes, rec.refusedLeases, fenced, leased)
	if before == 0 || rec.refusedLeases == 0 || rec.landedBelow > 0 {
		t.Errorf("lease takes %d landed, %d refused after the raise; %d fenced takes below the fence landed: want some, some, none",
			before, rec.refusedLeases, rec.landedBelow)
	}
	if out, err := decideFenced(ctx, start.Add(1500*time.Millisecond), limiter.Item{Limit: l, Key: "k", N: 1, Fence: 2}); err != nil || !out[0].Decision.Allowed {
		t.Errorf("a call with the new fence: %v %+v, want allowed", err, out[0])
	}
}
