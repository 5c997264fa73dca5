package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// ttlStore is a memory store that records the TTL of the last bucket
// write, and reports whether it keeps leases as told.
type ttlStore struct {
	*memory.Store
	keeps bool
	ttl   time.Duration
}

func (s *ttlStore) UpdateBucket(ctx context.Context, key storage.Key, op storage.BucketOp, ttl time.Duration) (storage.Decision, error) {
	s.ttl = ttl
	return s.Store.UpdateBucket(ctx, key, op, ttl)
}

func (s *ttlStore) KeepsLeased() bool { return s.keeps }

// TestBucketTTL: TokenBucket.TTL is the TTL the bucket gives its store:
// the time to refill from empty plus a refill period, and three lease
// epochs for a leasing bucket on a store that keeps leases.
func TestBucketTTL(t *testing.T) {
	for _, c := range []struct {
		name  string
		cfg   limiter.TokenBucketConfig
		keeps bool
		want  time.Duration
	}{
		{"5 by 2 a second", limiter.TokenBucketConfig{MaxAmount: 5, RefillAmount: 2, RefillTime: time.Second}, true, 4 * time.Second},
		{"2 by 1 every 10 ms", limiter.TokenBucketConfig{MaxAmount: 2, RefillTime: 10 * time.Millisecond}, true, 30 * time.Millisecond},
		{"leasing", limiter.TokenBucketConfig{MaxAmount: 2, RefillTime: 10 * time.Millisecond, Leases: true}, true, 3 * storage.LeaseEpoch},
		{"leasing, store keeps no leases", limiter.TokenBucketConfig{MaxAmount: 2, RefillTime: 10 * time.Millisecond, Leases: true}, false, 30 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &ttlStore{Store: newStore(t), keeps: c.keeps}
			c.cfg.Name = "tb"
			b, err := limiter.NewTokenBucket(s, c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Get(t.Context(), "k", time.Unix(100, 0)); err != nil {
				t.Fatal(err)
			}
			if b.TTL() != c.want || s.ttl != c.want {
				t.Errorf("TTL %v, the store was given %v; want %v", b.TTL(), s.ttl, c.want)
			}
		})
	}
}
