package memory_test

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"testing"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

func newStore(t testing.TB, cfg memory.Config) *memory.Store {
	t.Helper()
	s, err := memory.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	limitertest.Run(t, newStore(t, memory.Config{}))
}

// clock is a settable expiry clock.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func TestExpiry(t *testing.T) {
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	s := newStore(t, memory.Config{Clock: c.Now})
	// No deny cache: the same caller time is replayed to see the store's
	// own state, which a cached denial would hide.
	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 1, RefillTime: time.Hour, NoDenyCache: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	at := limitertest.Base
	if d, _ := b.Allow(ctx, "k", at); !d.Allowed {
		t.Fatal("first request denied")
	}
	if got := s.Stats().Keys; got != 1 {
		t.Fatalf("%d keys held, want 1", got)
	}
	// Within the TTL (refill from empty + one refill period = 2h) the state
	// is kept: a second request at the same caller time is denied.
	c.now = c.now.Add(2*time.Hour - time.Second)
	if d, _ := b.Allow(ctx, "k", at); d.Allowed {
		t.Fatal("state lost before its TTL")
	}
	// After the TTL the store forgets the key (reads as absent).
	c.now = c.now.Add(2*time.Hour + time.Second)
	if d, _ := b.Allow(ctx, "k", at); !d.Allowed {
		t.Fatal("state kept after its TTL")
	}
	if st := s.Stats(); st.Expired != 1 {
		t.Fatalf("stats %+v, want 1 expired", st)
	}
}

func TestBoundedMemory(t *testing.T) {
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	const maxKeys = 64 * 16 // 16 per shard
	s := newStore(t, memory.Config{MaxKeys: maxKeys, Clock: c.Now})
	w, err := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 10, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 10 * maxKeys {
		if _, err := w.Allow(ctx, "key-"+strconv.Itoa(i), limitertest.Base); err != nil {
			t.Fatal(err)
		}
		if n := s.Stats().Keys; n > maxKeys {
			t.Fatalf("after %d keys the store holds %d, cap %d", i+1, n, maxKeys)
		}
	}
	st := s.Stats()
	if st.Evictions == 0 || st.Keys != maxKeys {
		t.Fatalf("stats %+v: want a full store and live evictions", st)
	}
	// Expired keys are evicted before live ones: let everything expire,
	// add 64 new keys (about one per shard, far below any shard's cap of
	// 16), and no live key is evicted.
	c.now = c.now.Add(time.Hour)
	before := s.Stats().Evictions
	for i := range 64 {
		if _, err := w.Allow(ctx, "fresh-"+strconv.Itoa(i), limitertest.Base); err != nil {
			t.Fatal(err)
		}
	}
	if after := s.Stats(); after.Evictions != before || after.Expired == 0 {
		t.Fatalf("stats %+v: expired keys should have made room, not %d live evictions", after, after.Evictions-before)
	}
}

func TestLRUKeepsHotKeys(t *testing.T) {
	s := newStore(t, memory.Config{MaxKeys: 64 * 8})
	w, err := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 1, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if d, _ := w.Allow(ctx, "hot", limitertest.Base); !d.Allowed {
		t.Fatal("first request denied")
	}
	for i := range 5000 {
		// The hot key is used between every cold one, so it is never the
		// least recently used in its shard.
		if d, _ := w.Allow(ctx, "hot", limitertest.Base); d.Allowed {
			t.Fatalf("hot key evicted after %d cold keys", i)
		}
		if _, err := w.Allow(ctx, "cold-"+strconv.Itoa(i), limitertest.Base); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNewRejectsNegativeCap(t *testing.T) {
	if _, err := memory.New(memory.Config{MaxKeys: -1}); err == nil {
		t.Fatal("negative MaxKeys accepted")
	}
}

// TestConformanceLeased runs the suite with capacity leases on every
// token bucket and sliding window.
func TestConformanceLeased(t *testing.T) {
	limitertest.RunLeased(t, newStore(t, memory.Config{}))
}

// A bucket whose TTL is near the largest Duration (a large bucket refilled
// slowly) is kept: its expiry saturates rather than wrapping to the past.
func TestBucketLongTTL(t *testing.T) {
	s := newStore(t, memory.Config{})
	ctx, k := context.Background(), storage.Key{Space: "long", Name: "k"}
	op := storage.BucketOp{MaxAmount: 10, RefillTime: time.Hour, RefillAmount: 1, Now: 1, N: 1}
	for want := int64(9); want >= 7; want-- {
		d, err := s.UpdateBucket(ctx, k, op, time.Duration(math.MaxInt64))
		if err != nil || d.Remaining != want {
			t.Fatalf("take: %v, %d left, want %d (the bucket was forgotten)", err, d.Remaining, want)
		}
	}
}
