package memcached_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestFenceRefused: memcached keeps no fence (it is not a
// storage.Fencer), so a sliding window on it refuses a fenced item and
// RaiseFence, and the store's batch path refuses a fenced step rather
// than add without the fence.
func TestFenceRefused(t *testing.T) {
	s := newStore(t, memcached.Config{})
	if _, ok := any(s).(storage.Fencer); ok {
		t.Fatal("memcached.Store is a storage.Fencer: this test is out of date")
	}
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "w", Limit: 10, Window: time.Second, Representation: limiter.SubWindowCounters})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var out [1]limiter.Outcome
	if _, err := limiter.Decide(ctx, time.Now(), []limiter.Item{{Limit: w, Key: "fence", N: 1, Fence: 1}}, out[:]); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Errorf("a fenced item: %v, want ErrInvalidConfig", err)
	}
	if err := w.RaiseFence(ctx, "fence", 1); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Errorf("RaiseFence: %v, want ErrInvalidConfig", err)
	}
	var res [1]storage.StepResult
	s.Do(ctx, []storage.Step{{Kind: storage.StepAdd, Key: storage.Key{Space: "fence", Name: "k"}, Idx: 1, Span: 2, N: 1, TTL: time.Minute, Fence: 1}}, res[:])
	if !errors.Is(res[0].Err, storage.ErrUnsupported) {
		t.Errorf("a fenced step sent to the store: %v, want ErrUnsupported", res[0].Err)
	}
	// A bucket's fenced take too (the limiter refuses the item first; a
	// caller of Do, such as a wrapper, gets this).
	take := storage.BucketOp{Mode: storage.ModeTake, N: 1, Now: time.Now().UnixNano(), MaxAmount: 10, RefillAmount: 1, RefillTime: time.Second}
	if !take.Take() {
		t.Fatal("the op is not a take: this test is out of date")
	}
	s.Do(ctx, []storage.Step{{Kind: storage.StepBucket, Key: storage.Key{Space: "fence", Name: "b"}, Bucket: take, TTL: time.Minute, Fence: 1}}, res[:])
	if !errors.Is(res[0].Err, storage.ErrUnsupported) {
		t.Errorf("a fenced bucket take sent to the store: %v, want ErrUnsupported", res[0].Err)
	}
}
