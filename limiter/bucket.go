package limiter

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// TokenBucketConfig configures a [TokenBucket].
type TokenBucketConfig struct {
	// Name identifies the limit in decisions and metrics.
	Name string
	// Tag, when not empty, is added to the key space the parameters name
	// (as "#" Tag), so that two limits of the same parameters on one
	// store keep their own state for the same keys (the policy tags the
	// second of two such limits of one rule with its name).
	Tag string
	// MaxAmount is the capacity of the bucket; a new bucket starts full.
	MaxAmount int64
	// RefillTime is the time between refills.
	RefillTime time.Duration
	// RefillAmount is the number of tokens each refill adds (capped at
	// MaxAmount). Zero means 1.
	RefillAmount int64
	// Strict keeps a bucket blocked while traffic continues: a denied
	// request restarts the refill timer (Smyte's STRICT).
	Strict bool
	// NoDenyCache turns off the limit's deny cache (docs/consistency.md, "The deny cache"),
	// which is on by default (not for a Strict bucket, whose denials move its refill time): a key the store denied is denied again
	// without a store request until the denial's RetryAfter has passed.
	NoDenyCache bool
	// Leases lets a hot key be decided in this process from capacity
	// leases: tokens taken in one store step and spent here within
	// MaxLeaseLife, without a store request, never over the bucket's
	// bounds (docs/leases.md). A cold key is decided as without them.
	// Only a bucket that is not Strict leases, and only on a store that
	// keeps [storage.BucketState.Leased] ([storage.LeaseKeeper]); on another store the
	// bucket decides every call at the store.
	Leases bool
}

// TokenBucket is Smyte's token bucket. A bucket holds up to MaxAmount tokens
// and starts full; every RefillTime since the last refill adds RefillAmount
// tokens (refills arrive in steps, and the time left over is kept); AllowN
// takes n tokens if the bucket holds at least n. In strict mode a denial sets
// the refill timer to now, so a client that keeps retrying stays blocked.
//
// The bucket parameters are part of the stored key. A TokenBucket is safe for
// concurrent use and is exact (never admits more than the tokens available)
// on any [storage.BucketStore] that honours its atomicity contract. Time going
// backwards never refills a bucket.
type TokenBucket struct {
	cfg   TokenBucketConfig
	store storage.BucketStore
	batch storage.Batcher // store's
	space string
	ttl   time.Duration
	cache *denyCache
	lz    *leaser // nil: no leases
}

// NewTokenBucket returns a token bucket on store, or an error wrapping
// [ErrInvalidConfig] naming the bad field.
func NewTokenBucket(store storage.BucketStore, cfg TokenBucketConfig) (*TokenBucket, error) {
	if cfg.RefillAmount == 0 {
		cfg.RefillAmount = 1
	}
	switch {
	case store == nil:
		return nil, configError("token bucket", cfg.Name, "store", "must not be nil")
	case cfg.MaxAmount <= 0:
		return nil, configError("token bucket", cfg.Name, "max amount", "must be positive, got %d", cfg.MaxAmount)
	case cfg.RefillTime <= 0:
		return nil, configError("token bucket", cfg.Name, "refill time", "must be positive, got %v", cfg.RefillTime)
	case cfg.RefillAmount < 0:
		return nil, configError("token bucket", cfg.Name, "refill amount", "must be positive, got %d", cfg.RefillAmount)
	case cfg.Leases && cfg.Strict:
		return nil, configError("token bucket", cfg.Name, "leases", "a strict bucket does not lease (its denials move its refill time)")
	}

	// Time to refill from empty, plus one refill period of slack: after that
	// an absent bucket (full) and a stored one are the same.
	steps := (cfg.MaxAmount + cfg.RefillAmount - 1) / cfg.RefillAmount
	ttl := satMul(time.Duration(steps+1), cfg.RefillTime)
	var lz *leaser
	if k, ok := store.(storage.LeaseKeeper); cfg.Leases && ok && k.KeepsLeased() {
		lz = newLeaser(cfg.MaxAmount, store)
		lz.holds = true
		// Kept until leased units have expired from it: a bucket the
		// store dropped would start full while leases hold its units.
		ttl = max(ttl, 3*storage.LeaseEpoch)
	}
	return &TokenBucket{
		cfg:   cfg,
		store: store,
		batch: batcher(storage.Steps{Bucket: store}),
		space: "tb:" + strconv.FormatInt(cfg.MaxAmount, 10) + ":" + cfg.RefillTime.String() + ":" + strconv.FormatInt(cfg.RefillAmount, 10) + tagSpace(cfg.Tag),
		ttl:   ttl,
		cache: newDenyCache(cfg.NoDenyCache, cfg.Strict),
		lz:    lz,
	}, nil
}

// Config returns the bucket's configuration (with defaults applied).
func (b *TokenBucket) Config() TokenBucketConfig { return b.cfg }

// TTL returns how long the store keeps a key's bucket after its last
// write: the time to refill it from empty plus one refill period (a
// bucket the store dropped reads as full, as it would be by then), and
// at least three lease epochs ([storage.LeaseEpoch]) for a bucket that
// leases on a store that keeps leases ([storage.LeaseKeeper]), until its
// leased units have expired.
func (b *TokenBucket) TTL() time.Duration { return b.ttl }

// Space returns the key space of the bucket's state: its parameters
// (and its Tag).
func (b *TokenBucket) Space() string { return b.space }

// Allow is AllowN(ctx, key, now, 1).
func (b *TokenBucket) Allow(ctx context.Context, key string, now time.Time) (Decision, error) {
	return b.AllowN(ctx, key, now, 1)
}

// AllowN is Smyte's reduce(n): it takes n tokens if the bucket holds them.
func (b *TokenBucket) AllowN(ctx context.Context, key string, now time.Time, n int64) (Decision, error) {
	return decideOne(ctx, b, key, now, n)
}

// Get is Smyte's get(): the bucket's state at now, without taking anything.
// Decision.Remaining is the number of tokens; Allowed reports whether a
// request of cost 1 would pass.
func (b *TokenBucket) Get(ctx context.Context, key string, now time.Time) (Decision, error) {
	t, err := unixNano(b.cfg.Name, now)
	if err != nil {
		return Decision{}, err
	}
	d, err := b.store.UpdateBucket(ctx, storage.Key{Space: b.space, Name: key}, b.op(t, 1, storage.ModePeek), b.ttl)
	if err != nil {
		return Decision{}, b.storeErr(err)
	}
	return fromStore(d, b.cfg.Name), nil
}

// Refund puts n tokens back (capped at MaxAmount).
func (b *TokenBucket) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	return refundOne(ctx, b, key, now, n)
}

// leaseEpochOf is the lease epoch of t (Unix ns).
func leaseEpochOf(t int64) int64 { return floorDiv(t, int64(storage.LeaseEpoch)) }

func satMul(a, b time.Duration) time.Duration {
	if a != 0 && b > (1<<63-1)/a {
		return 1<<63 - 1
	}
	return a * b
}

func configError(kind, name, field, format string, args ...any) error {
	return fmt.Errorf("%w: %s %q: %s %s", ErrInvalidConfig, kind, name, field, fmt.Sprintf(format, args...))
}

func costError(name string, n, limit int64) error {
	if n <= 0 {
		return fmt.Errorf("%w: limit %q: cost must be positive, got %d", ErrInvalidCost, name, n)
	}
	return fmt.Errorf("%w: limit %q: cost %d exceeds the capacity %d, so it could never be allowed", ErrInvalidCost, name, n, limit)
}
