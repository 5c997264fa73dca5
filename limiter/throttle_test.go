package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// throttling is a memory store that refuses the key named hot for
// capacity, as DynamoDB refuses a partition past its cap, and counts the
// calls that reached it.
type throttling struct {
	*memory.Store
	hot   string
	calls atomic.Int64
}

var errThrottled = fmt.Errorf("test store: throughput exceeded: %w", storage.ErrThrottled)

func (s *throttling) Add(ctx context.Context, key storage.Key, cur int64, span int, n int64, ttl time.Duration) (storage.Counts, error) {
	s.calls.Add(1)
	if key.Name == s.hot {
		return storage.Counts{}, errThrottled
	}
	return s.Store.Add(ctx, key, cur, span, n, ttl)
}

func (s *throttling) UpdateBucket(ctx context.Context, key storage.Key, op storage.BucketOp, ttl time.Duration) (storage.Decision, error) {
	s.calls.Add(1)
	switch key.Name {
	case s.hot:
		return storage.Decision{}, errThrottled
	case "contended":
		return storage.Decision{}, fmt.Errorf("test store: %w after 8 attempts", storage.ErrConflict)
	}
	return s.Store.UpdateBucket(ctx, key, op, ttl)
}

// A throttled key is denied, never decided by the fail mode (which would
// admit it uncounted under fail-open): Outcome.Throttled, RetryAfter
// ThrottledRetryAfter, the limit's name and capacity; the batch's other
// takes are given back; and the deny cache keeps the process from asking
// the store about the key again until RetryAfter has passed. Another key
// on the same store is decided as usual.
func TestDecideThrottled(t *testing.T) {
	ctx := context.Background()
	s := &throttling{Store: newStore(t), hot: "hot"}
	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "burst", MaxAmount: 50, RefillTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "per-minute", Limit: 5, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	failOpen := &limiter.Decision{Allowed: true}
	now := time.Unix(1e9, 0)
	out := make([]limiter.Outcome, 2)

	// The window on another key takes a unit; the bucket's key is throttled.
	items := []limiter.Item{{Limit: w, Key: "victim", N: 1, Fail: failOpen}, {Limit: b, Key: "hot", N: 1, Fail: failOpen}}
	i, err := limiter.Decide(ctx, now, items, out)
	if err != nil {
		t.Fatal(err)
	}
	if i != 1 {
		t.Fatalf("decider %d, want the throttled item 1", i)
	}
	o := out[1]
	if o.Decision.Allowed || !o.Throttled || o.Failed || !errors.Is(o.Err, storage.ErrThrottled) {
		t.Fatalf("throttled item: %+v, want denied, Throttled, not Failed, Err ErrThrottled", o)
	}
	if want := (limiter.Decision{Limit: 50, RetryAfter: limiter.ThrottledRetryAfter, ResetAfter: limiter.ThrottledRetryAfter, Name: "burst"}); o.Decision != want {
		t.Errorf("throttled decision %+v, want %+v", o.Decision, want)
	}
	if !out[0].Decision.Allowed || !out[0].Refunded {
		t.Errorf("the other item: %+v, want allowed and refunded (the batch was denied)", out[0])
	}

	// Within RetryAfter: denied from the deny cache, no store request.
	before := s.calls.Load()
	if _, err := limiter.Decide(ctx, now.Add(limiter.ThrottledRetryAfter/2), items[1:], out[:1]); err != nil {
		t.Fatal(err)
	}
	if !out[0].Cached || out[0].Decision.Allowed || s.calls.Load() != before {
		t.Errorf("within RetryAfter: %+v, %d store calls; want a cached denial and none", out[0], s.calls.Load()-before)
	}
	// After it, the store is asked again (and throttles again).
	if _, err := limiter.Decide(ctx, now.Add(limiter.ThrottledRetryAfter), items[1:], out[:1]); err != nil {
		t.Fatal(err)
	}
	if out[0].Cached || !out[0].Throttled || s.calls.Load() != before+1 {
		t.Errorf("after RetryAfter: %+v, %d store calls; want the store asked once", out[0], s.calls.Load()-before)
	}

	// The victim alone: its limit of 5 holds (the refunded take is back).
	allowed := 0
	for range 8 {
		if _, err := limiter.Decide(ctx, now, items[:1], out[:1]); err != nil {
			t.Fatal(err)
		}
		if out[0].Decision.Allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Errorf("victim: %d of 8 allowed, want its limit of 5", allowed)
	}

	// A shadow item that is throttled does not deny the batch.
	items = []limiter.Item{{Limit: w, Key: "other", N: 1, Fail: failOpen}, {Limit: b, Key: "hot", N: 1, Fail: failOpen, Shadow: true}}
	if i, err := limiter.Decide(ctx, now.Add(time.Second), items, out); err != nil || i != 0 || !out[0].Decision.Allowed || !out[1].Throttled {
		t.Errorf("shadow throttled: decider %d, %+v, %v", i, out, err)
	}
}

// A key whose conditional writes lost every race within their retries
// (ErrConflict) is busy, as a throttled one is: denied, never decided by
// the fail mode, since nothing was counted.
func TestDecideContended(t *testing.T) {
	s := &throttling{Store: newStore(t), hot: "hot"}
	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "burst", MaxAmount: 50, RefillTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]limiter.Outcome, 1)
	items := []limiter.Item{{Limit: b, Key: "contended", N: 1, Fail: &limiter.Decision{Allowed: true}}}
	if _, err := limiter.Decide(context.Background(), time.Unix(1e9, 0), items, out); err != nil {
		t.Fatal(err)
	}
	if o := out[0]; o.Decision.Allowed || !o.Throttled || o.Failed || !errors.Is(o.Err, storage.ErrConflict) {
		t.Fatalf("contended: %+v, want denied, Throttled, not Failed", o)
	}
}
