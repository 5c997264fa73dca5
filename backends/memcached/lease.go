package memcached

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// Leases keeps the leases of the concurrent-requests limiter and the
// fleet-usage shedder ([storage.LeaseStore]) and published values such as
// the fleet's utilization ([storage.GaugeStore]) in memcached.
//
// Storage protocol: a key's live leases are one item, 'S' followed by
// [storage.AppendLeases]. An acquire or a release is an optimistic
// read-modify-write of that item:
//
//  1. gets the item (value and CAS id); a miss is an empty set.
//  2. Apply the op ([storage.LeaseOp] or [storage.ReleaseOp], pure). If it
//     writes nothing, its decision stands: it was made on what the server
//     held at the gets.
//  3. cas the new value on the CAS id (add when there was no item). EXISTS
//     or NOT_FOUND on cas, or NOT_STORED on add, means another writer got
//     there first: wait a random, growing pause and go to 1.
//
// This is the package's one read-modify-write loop, the one [Store] runs
// for buckets and logs (without the item cache: every decision is made on a
// fresh gets). Every write is conditional on the value it was computed
// from, so no update is lost and a key never holds more than its capacity
// of live leases. Attempts stop after MaxRetries lost races or at the
// call's deadline, with an error wrapping [storage.ErrConflict]; errors are
// typed as the Store's are (see "Connections and errors" in the package
// documentation). A set that
// becomes empty is written empty (with a short expiry) rather than deleted,
// as a delete is not conditional. An item is kept until its last lease
// expires, measured from the write (so the offset between the callers' and
// the server's clocks does not matter), plus 2 s and up to Jitter.
//
// Gauges are items 'G', float64 bits and a varint time, written with set
// (last writer wins) and read with get.
//
// Keys: prefix "l:" Space "/" Name for a lease set and prefix "g:" Space
// "/" Name for a gauge when printable and short enough, otherwise "L:" or
// "G:" and the base64url SHA-256 of the key; they never collide with the
// keys of [Store] ("k:" and "h:"), so one cluster and one KeyPrefix can
// serve both.
//
// Leases works on any gomemcache client; to share the one a [Store] built
// (its ring, TLS and auto discovery), pass [Store.Client] to [NewLeases]. It
// is safe for concurrent use.
type Leases struct {
	mc         *memcache.Client
	prefix     string
	timeout    time.Duration
	jitter     time.Duration
	maxRetries int
	backoff    time.Duration
}

var (
	_ storage.LeaseStore = (*Leases)(nil)
	_ storage.GaugeStore = (*Leases)(nil)
)

const (
	leaseFormat = 'S'
	gaugeFormat = 'G'
	// leaseMargin is added to every lease item's expiry, beyond its last
	// lease.
	leaseMargin = 2 * time.Second
	// leaseMaxKeyLen is memcached's key limit.
	leaseMaxKeyLen = 250
)

// NewLeases returns a lease and gauge store on mc. Only KeyPrefix, Timeout,
// Jitter, MaxRetries and RetryBackoff of cfg are used; Addrs,
// AutoDiscovery, TLS and ServerName must be empty (the client has its own).
func NewLeases(mc *memcache.Client, cfg Config) (*Leases, error) {
	switch {
	case mc == nil:
		return nil, fmt.Errorf("%w: memcached: nil client", limiter.ErrInvalidConfig)
	case len(cfg.Addrs) > 0 || cfg.AutoDiscovery != "" || cfg.TLS != nil || cfg.ServerName != "":
		return nil, fmt.Errorf("%w: memcached: NewLeases takes its nodes and TLS from the client; leave Addrs, AutoDiscovery, TLS and ServerName empty", limiter.ErrInvalidConfig)
	case len(cfg.KeyPrefix) > MaxKeyPrefix || !leasePrintable(cfg.KeyPrefix):
		return nil, fmt.Errorf("%w: memcached: key prefix %q must be printable ASCII without spaces, at most %d bytes", limiter.ErrInvalidConfig, cfg.KeyPrefix, MaxKeyPrefix)
	case cfg.MaxRetries < 0 || cfg.RetryBackoff < 0 || cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: memcached: MaxRetries, RetryBackoff and Timeout must not be negative", limiter.ErrInvalidConfig)
	}
	l := &Leases{mc: mc, prefix: cfg.KeyPrefix, timeout: cfg.Timeout, jitter: cfg.Jitter, maxRetries: cfg.MaxRetries, backoff: cfg.RetryBackoff}
	if l.timeout == 0 {
		l.timeout = DefaultTimeout
	}
	if l.jitter == 0 {
		l.jitter = DefaultJitter
	}
	l.jitter = max(l.jitter, 0)
	if l.maxRetries == 0 {
		l.maxRetries = DefaultMaxRetries
	}
	if l.backoff == 0 {
		l.backoff = DefaultRetryBackoff
	}
	return l, nil
}

// AcquireLease implements [storage.LeaseStore] (see the protocol above).
func (l *Leases) AcquireLease(ctx context.Context, k storage.Key, op storage.LeaseOp) (storage.Decision, error) {
	if op.Capacity <= 0 || op.Capacity > storage.MaxLeases {
		return storage.Decision{}, fmt.Errorf("memcached: bad lease capacity %d", op.Capacity)
	}
	var d storage.Decision
	err := l.update(ctx, "acquire lease", l.key("l:", "L:", k), op.Now, func(cur []storage.LeaseEntry) ([]storage.LeaseEntry, bool) {
		var next []storage.LeaseEntry
		var write bool
		next, d, write = op.Apply(cur)
		return next, write
	})
	if err != nil {
		return storage.Decision{}, err
	}
	return d, nil
}

// ReleaseLease implements [storage.LeaseStore].
func (l *Leases) ReleaseLease(ctx context.Context, k storage.Key, op storage.ReleaseOp) error {
	return l.update(ctx, "release lease", l.key("l:", "L:", k), op.Now, op.Apply)
}

// update applies a lease op to key's set with the package's read-modify-write
// loop ([casLoop.update], the one buckets and logs use; no item cache, so
// every decision is made on a fresh gets). now is the caller's time, for the
// item's expiry.
func (l *Leases) update(ctx context.Context, what, key string, now int64, apply func([]storage.LeaseEntry) ([]storage.LeaseEntry, bool)) error {
	c := casLoop{mc: l.mc, timeout: l.timeout, maxRetries: l.maxRetries, backoff: l.backoff}
	var buf []storage.LeaseEntry
	_, err := c.update(ctx, what, key, func(val []byte, _ uint64, found bool) (*memcache.Item, storage.Decision, error) {
		cur := buf[:0]
		if found {
			if len(val) == 0 || val[0] != leaseFormat {
				return nil, storage.Decision{}, fmt.Errorf("%w: not a lease set value", storage.ErrCorruptState)
			}
			var err error
			if cur, err = storage.ParseLeases(val[1:], cur); err != nil {
				return nil, storage.Decision{}, err
			}
		}
		next, write := apply(cur)
		buf = next
		if !write {
			return nil, storage.Decision{}, nil
		}
		exp := time.Second // an empty set: gone soon
		if len(next) > 0 {
			exp = storage.LeaseExpiry(next, now) + leaseMargin
		}
		return &memcache.Item{Value: storage.AppendLeases([]byte{leaseFormat}, next), Expiration: l.expiry(exp)}, storage.Decision{}, nil
	})
	return err
}

// PutGauge implements [storage.GaugeStore] with set.
func (l *Leases) PutGauge(ctx context.Context, k storage.Key, g storage.Gauge, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return errorf("put gauge", err)
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	v := binary.AppendVarint(binary.LittleEndian.AppendUint64([]byte{gaugeFormat}, math.Float64bits(g.Value)), g.At)
	it := &memcache.Item{Key: l.key("g:", "G:", k), Value: v, Expiration: l.expiry(ttl)}
	if _, err := call(ctx, func() (struct{}, error) { return struct{}{}, l.mc.Set(it) }); err != nil {
		return errorf("put gauge", err)
	}
	return nil
}

// GetGauge implements [storage.GaugeStore] with get.
func (l *Leases) GetGauge(ctx context.Context, k storage.Key) (storage.Gauge, bool, error) {
	if err := ctx.Err(); err != nil {
		return storage.Gauge{}, false, errorf("get gauge", err)
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	it, err := call(ctx, func() (*memcache.Item, error) { return l.mc.Get(l.key("g:", "G:", k)) })
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return storage.Gauge{}, false, nil
	case err != nil:
		return storage.Gauge{}, false, errorf("get gauge", err)
	}
	v := it.Value
	if len(v) < 10 || v[0] != gaugeFormat {
		return storage.Gauge{}, false, errorf("get gauge", fmt.Errorf("%w: not a gauge value", storage.ErrCorruptState))
	}
	at, n := binary.Varint(v[9:])
	if n <= 0 || 9+n != len(v) {
		return storage.Gauge{}, false, errorf("get gauge", fmt.Errorf("%w: gauge time", storage.ErrCorruptState))
	}
	return storage.Gauge{Value: math.Float64frombits(binary.LittleEndian.Uint64(v[1:9])), At: at}, true, nil
}

// key returns the memcached key of k: readable (prefix, tag, Space "/" Name)
// when that is printable and fits, else hashed (prefix, hashTag, base64url
// SHA-256 of uvarint(len(Space)) Space Name).
func (l *Leases) key(tag, hashTag string, k storage.Key) string {
	if len(l.prefix)+len(tag)+len(k.Space)+1+len(k.Name) <= leaseMaxKeyLen && leasePrintable(k.Space) && leasePrintable(k.Name) && !strings.Contains(k.Space, "/") {
		return l.prefix + tag + k.Space + "/" + k.Name
	}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(k.Space)))])
	h.Write([]byte(k.Space))
	h.Write([]byte(k.Name))
	return l.prefix + hashTag + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// leasePrintable reports whether s is only bytes 0x21-0x7e.
func leasePrintable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// expiry is the memcached expiration of an item kept for keep from now
// (expiration: an absolute time, plus up to Jitter).
func (l *Leases) expiry(keep time.Duration) int32 { return expiration(time.Now(), keep, l.jitter) }
