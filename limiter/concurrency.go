package limiter

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

func leaseExpiry(now int64, ttl time.Duration) int64 {
	if now > 1<<63-1-int64(ttl) {
		return 1<<63 - 1
	}
	return now + int64(ttl)
}

// ConcurrencyConfig configures a [Concurrency] limit.
type ConcurrencyConfig struct {
	// Name identifies the limit in decisions and metrics, and is part of
	// the stored key: limits with different names never share leases.
	Name string
	// Capacity is the number of requests a key may have in flight (1 to
	// MaxLeases).
	Capacity int64
	// LeaseTTL bounds how long a request may hold its slot: a lease whose
	// release was lost (the holder crashed or timed out) stops counting
	// after LeaseTTL. Set it above the longest request (a Lambda's
	// timeout) plus the clock skew between callers.
	LeaseTTL time.Duration
	// NewID makes lease IDs. Nil means 64 random bits, base64url-encoded
	// (11 bytes). IDs must be unique among a key's live leases and valid
	// (see [storage.MaxLeaseIDLen]).
	NewID func() string
}

// Concurrency is Stripe's concurrent-requests limiter: a key may have at
// most Capacity requests in flight. Acquire adds a lease (a random ID with
// an expiry) to the key's set of live leases if fewer than Capacity are
// live, atomically; Release removes it when the request is done. A lease
// that is never released (a crashed Lambda) expires after LeaseTTL, so lost
// releases leak capacity for at most that long.
//
// Expiry is judged by the callers' clocks (now). A caller whose clock is
// behind sees leases live for longer, so time going backwards never frees a
// slot early; a caller whose clock is ahead by d sees leases lapse d early.
// The capacity and lease TTL are not part of the stored key: changing them
// keeps the leases in flight. Concurrency is safe for concurrent use and
// exact (never more than Capacity live leases) on any [storage.LeaseStore] that
// honours its contract. Its zero value is not usable: use [NewConcurrency].
type Concurrency struct {
	cfg   ConcurrencyConfig
	store storage.LeaseStore
	space string
	// cleanups holds a token per running clean-up (see cleanUp).
	cleanups chan struct{}
	stats    struct{ unknown, releases, failed, skipped atomic.Int64 }
}

// NewConcurrency returns a concurrent-requests limit on store, or an error
// wrapping [ErrInvalidConfig] naming the bad field.
func NewConcurrency(store storage.LeaseStore, cfg ConcurrencyConfig) (*Concurrency, error) {
	const kind = "concurrency limit"
	switch {
	case store == nil:
		return nil, configError(kind, cfg.Name, "store", "must not be nil")
	case cfg.Capacity <= 0 || cfg.Capacity > storage.MaxLeases:
		return nil, configError(kind, cfg.Name, "capacity", "must be between 1 and %d, got %d", storage.MaxLeases, cfg.Capacity)
	case cfg.LeaseTTL <= 0:
		return nil, configError(kind, cfg.Name, "lease TTL", "must be positive, got %v", cfg.LeaseTTL)
	}
	if cfg.NewID == nil {
		cfg.NewID = newLeaseID
	}
	return &Concurrency{cfg: cfg, store: store, space: "cc:" + cfg.Name, cleanups: make(chan struct{}, maxCleanups)}, nil
}

// Config returns the limit's configuration (with defaults applied).
func (c *Concurrency) Config() ConcurrencyConfig { return c.cfg }

// Lease is a slot held by one request. The zero Lease holds nothing.
type Lease struct {
	// Key is the caller's key the lease was taken on.
	Key string
	// ID identifies the lease among the key's leases.
	ID string
	// Expires is when the lease lapses if it is not released.
	Expires time.Time
}

// Held reports whether l holds a slot (it is not the zero Lease).
func (l Lease) Held() bool { return l.ID != "" }

// String encodes l's ID and key as text (ID "." base64url(key)), to pass a
// lease from the process that acquired it to the one that releases it: for
// example from an API Gateway authorizer, through its context, to the
// integration. [ParseLease] decodes it. The zero Lease encodes as "".
func (l Lease) String() string {
	if !l.Held() {
		return ""
	}
	return l.ID + "." + base64.RawURLEncoding.EncodeToString([]byte(l.Key))
}

// ParseLease decodes what [Lease.String] wrote (Expires is not carried and
// is zero). Malformed input gives an error wrapping [ErrUnknownLease].
func ParseLease(s string) (Lease, error) {
	id, key, ok := strings.Cut(s, ".")
	if !ok || !storage.ValidLeaseID(id) {
		return Lease{}, fmt.Errorf("%w: %.80q", ErrUnknownLease, s)
	}
	k, err := base64.RawURLEncoding.DecodeString(key)
	if err != nil {
		return Lease{}, fmt.Errorf("%w: %.80q: key: %w", ErrUnknownLease, s, err)
	}
	return Lease{Key: string(k), ID: id}, nil
}

// Acquire takes a slot for key at now. When allowed, the Lease holds it until
// Release or until Lease.Expires; when denied, the Lease is the zero Lease.
//
// If Acquire errs the slot may or may not have been taken: the store call
// may have been cut short by ctx (its deadline, a cancellation) or the
// store's own timeout while its write was on its way, and the write may
// land anyway. On such an error (one wrapping context.DeadlineExceeded,
// context.Canceled, a timeout or [storage.ErrUnavailable], but not
// [storage.ErrBreakerOpen]: that call never reached the store) Acquire
// releases the lease ID it sent, in the background, on a context of its
// own: at once, and again a second later for a write that was still on
// its way. A write that lands after both, releases skipped (at most 64
// run at once per limit: the store is slow or down) or lost with their
// process hold the slot until LeaseTTL, as a lost release does.
// [Concurrency.Stats] counts the clean-ups.
func (c *Concurrency) Acquire(ctx context.Context, key string, now time.Time) (Lease, Decision, error) {
	return c.take(ctx, key, now, c.cfg.Capacity, true)
}

// acquire is Acquire with capacity and no clean-up, for the fleet
// shedder: its Check holds a slot until LeaseTTL by design, and a request
// it let through on an error (fail open) stays counted if the write landed.
func (c *Concurrency) acquire(ctx context.Context, key string, now time.Time, capacity int64) (Lease, Decision, error) {
	return c.take(ctx, key, now, capacity, false)
}

func (c *Concurrency) take(ctx context.Context, key string, now time.Time, capacity int64, cleanup bool) (Lease, Decision, error) {
	t, err := leaseNow(c.cfg.Name, now)
	if err != nil {
		return Lease{}, Decision{}, err
	}
	id := c.cfg.NewID()
	if !storage.ValidLeaseID(id) {
		return Lease{}, Decision{}, configError("concurrency limit", c.cfg.Name, "new ID", "made an invalid lease ID %.80q", id)
	}
	op := storage.LeaseOp{Capacity: capacity, Now: t, TTL: c.cfg.LeaseTTL, ID: id}
	d, err := c.store.AcquireLease(ctx, storage.Key{Space: c.space, Name: key}, op)
	if err != nil {
		if cleanup && unknownOutcome(ctx, err) {
			c.cleanUp(ctx, Lease{Key: key, ID: id})
		}
		return Lease{}, Decision{}, fmt.Errorf("limiter: concurrency limit %q: %w", c.cfg.Name, err)
	}
	if !d.Allowed {
		return Lease{}, fromStore(d, c.cfg.Name), nil
	}
	return Lease{Key: key, ID: id, Expires: time.Unix(0, leaseExpiry(t, c.cfg.LeaseTTL))}, fromStore(d, c.cfg.Name), nil
}

// Release gives back the slot l holds. Releasing the zero Lease, a lease
// released before or an expired one does nothing.
func (c *Concurrency) Release(ctx context.Context, l Lease) error {
	if !l.Held() {
		return nil
	}
	if !storage.ValidLeaseID(l.ID) {
		return fmt.Errorf("limiter: concurrency limit %q: %w: bad ID %.80q", c.cfg.Name, ErrUnknownLease, l.ID)
	}
	// Now is the earliest time: a release removes l and nothing else
	// (acquires drop the expired leases).
	op := storage.ReleaseOp{ID: l.ID, Now: -1 << 63}
	if err := c.store.ReleaseLease(ctx, storage.Key{Space: c.space, Name: l.Key}, op); err != nil {
		return fmt.Errorf("limiter: concurrency limit %q: release: %w", c.cfg.Name, err)
	}
	return nil
}

// ConcurrencyStats counts a [Concurrency] limit's clean-ups in this
// process: the releases of the lease IDs of acquires whose outcome is
// unknown (see [Concurrency.Acquire]).
type ConcurrencyStats struct {
	// Unknown is the acquires that failed with an unknown outcome.
	Unknown int64
	// Releases is the clean-up releases sent (two per acquire in
	// Unknown); Failed those that erred.
	Releases, Failed int64
	// Skipped is the clean-up releases not sent: 64 were running
	// already (the store is slow or down). A slot whose write landed
	// and whose releases were both skipped lapses after LeaseTTL.
	Skipped int64
}

// Stats returns the limit's counters.
func (c *Concurrency) Stats() ConcurrencyStats {
	return ConcurrencyStats{
		Unknown: c.stats.unknown.Load(), Releases: c.stats.releases.Load(),
		Failed: c.stats.failed.Load(), Skipped: c.stats.skipped.Load(),
	}
}

// Clean-ups of acquires with an unknown outcome (docs/shedding.md).
const (
	// maxCleanups bounds the clean-up releases running at once per
	// limit: when the store is down every acquire times out, and each
	// release runs for up to cleanupTimeout.
	maxCleanups = 64
	// cleanupTimeout bounds each clean-up release.
	cleanupTimeout = 500 * time.Millisecond
	// cleanupAgain is the wait before the second release, for a write
	// still on its way when the first one ran.
	cleanupAgain = time.Second
)

// brokenCleanup: an acquire with an unknown outcome releases nothing, as
// before. Tests only.
var brokenCleanup = false

// unknownOutcome reports whether an acquire whose store call failed with
// err may have taken its slot all the same: the call ran out of time or
// was cancelled (ctx done, a deadline, a timeout), or the store did not
// answer (storage.ErrUnavailable: a 5xx, a connection lost mid-request).
// A breaker that refused the call never reached the store.
func unknownOutcome(ctx context.Context, err error) bool {
	if errors.Is(err, storage.ErrBreakerOpen) {
		return false
	}
	var timeout interface{ Timeout() bool }
	return ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, storage.ErrUnavailable) || (errors.As(err, &timeout) && timeout.Timeout())
}

// cleanUp releases l, the lease an acquire with an unknown outcome may
// have taken, in the background on a context of its own (ctx's values
// without its deadline): at once, then once more after cleanupAgain,
// since the acquire's write may still be on its way (the store serving it
// after the caller gave up). Releasing an ID the store never saw changes
// no lease. It returns at once. A release that would pass maxCleanups
// running is skipped: only the releases hold a goroutine (the wait is a
// timer).
func (c *Concurrency) cleanUp(ctx context.Context, l Lease) {
	c.stats.unknown.Add(1)
	if brokenCleanup {
		return
	}
	ctx = context.WithoutCancel(ctx)
	if c.startCleanup() {
		go c.releaseFor(ctx, l)
	}
	time.AfterFunc(cleanupAgain, func() {
		if c.startCleanup() {
			c.releaseFor(ctx, l)
		}
	})
}

// startCleanup takes one of maxCleanups tokens for a clean-up release,
// or counts the release skipped.
func (c *Concurrency) startCleanup() bool {
	select {
	case c.cleanups <- struct{}{}:
		return true
	default:
		c.stats.skipped.Add(1)
		return false
	}
}

// releaseFor releases l within cleanupTimeout, counting the attempt, and
// gives back its clean-up token.
func (c *Concurrency) releaseFor(ctx context.Context, l Lease) {
	defer func() { <-c.cleanups }()
	ctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	c.stats.releases.Add(1)
	if c.Release(ctx, l) != nil {
		c.stats.failed.Add(1)
	}
}

// newLeaseID returns 64 random bits, base64url-encoded: 11 bytes.
func newLeaseID() string {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// leaseNow converts now to Unix nanoseconds, rejecting times they cannot
// represent.
func leaseNow(name string, now time.Time) (int64, error) {
	const limit = (1<<63 - 1) / int64(time.Second)
	if sec := now.Unix(); sec <= -limit || sec >= limit {
		return 0, fmt.Errorf("limiter: concurrency limit %q: time %v is out of range", name, now)
	}
	return now.UnixNano(), nil
}
