package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// leaseShards is the number of shards of a Leases.
const leaseShards = 64

// Leases is the in-process store of the concurrent-requests limiter and the
// fleet-usage shedder ([storage.LeaseStore]) and of published values such as
// the fleet's utilization ([storage.GaugeStore]).
//
// Storage protocol: keys are spread over 64 shards by a seeded hash; each
// shard is a map guarded by one mutex, so an acquire (drop the expired
// leases, add one if there is room) or a release happens under that lock
// and is exact. A key's leases are kept until the last one expires (by the
// callers' clocks, as the limiter judges them; the store measures the same
// span on its own clock).
//
// Memory is bounded: each shard holds at most MaxKeys/64 keys. When a new key
// arrives at a full shard, the keys whose leases all expired go first, then
// an arbitrary one; evicting a key with live leases forgets them (the key
// admits up to its capacity again), and is counted in Stats. Leases is safe
// for concurrent use; create it with [NewLeases].
type Leases struct {
	shards    [leaseShards]leaseShard
	seed      maphash.Seed
	clock     func() time.Time
	perShard  int
	evictions atomic.Int64
}

var (
	_ storage.LeaseStore = (*Leases)(nil)
	_ storage.GaugeStore = (*Leases)(nil)
)

type leaseShard struct {
	mu     sync.Mutex
	sets   map[storage.Key]*leaseSet
	gauges map[storage.Key]gaugeEntry
	_      [64]byte
}

type leaseSet struct {
	entries []storage.LeaseEntry
	expires int64 // store clock, Unix ns: the set is empty from then on
}

type gaugeEntry struct {
	g       storage.Gauge
	expires int64 // store clock, Unix ns
}

// NewLeases returns an empty lease store. Only MaxKeys and Clock of cfg are
// used (Clock for the store's own expiry, never for the limiter's).
func NewLeases(cfg Config) (*Leases, error) {
	if cfg.MaxKeys < 0 {
		return nil, fmt.Errorf("memory: MaxKeys must not be negative, got %d", cfg.MaxKeys)
	}
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	cfg.MaxKeys = max(cfg.MaxKeys, leaseShards)
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	l := &Leases{seed: maphash.MakeSeed(), clock: cfg.Clock, perShard: cfg.MaxKeys / leaseShards}
	for i := range l.shards {
		l.shards[i].sets = make(map[storage.Key]*leaseSet)
		l.shards[i].gauges = make(map[storage.Key]gaugeEntry)
	}
	return l, nil
}

// LeaseStats are counters of a lease store's housekeeping.
type LeaseStats struct {
	// Keys is the number of lease sets and gauges held.
	Keys int
	// Evictions counts keys with live leases dropped to stay under MaxKeys.
	Evictions int64
}

// Stats returns the store's counters.
func (l *Leases) Stats() LeaseStats {
	st := LeaseStats{Evictions: l.evictions.Load()}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		st.Keys += len(sh.sets) + len(sh.gauges)
		sh.mu.Unlock()
	}
	return st
}

func (l *Leases) lock(ctx context.Context, k storage.Key) (*leaseShard, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, fmt.Errorf("memory: %w", err)
	}
	sh := &l.shards[maphash.Comparable(l.seed, k)%leaseShards]
	sh.mu.Lock()
	return sh, l.clock().UnixNano(), nil
}

// AcquireLease implements [storage.LeaseStore] under the shard's lock.
func (l *Leases) AcquireLease(ctx context.Context, k storage.Key, op storage.LeaseOp) (storage.Decision, error) {
	if op.Capacity <= 0 || op.Capacity > storage.MaxLeases {
		return storage.Decision{}, fmt.Errorf("memory: bad lease capacity %d", op.Capacity)
	}
	sh, now, err := l.lock(ctx, k)
	if err != nil {
		return storage.Decision{}, err
	}
	defer sh.mu.Unlock()
	set := sh.sets[k]
	if set != nil && now >= set.expires {
		set.entries = set.entries[:0]
	}
	var cur []storage.LeaseEntry
	if set != nil {
		cur = set.entries
	}
	next, d, write := op.Apply(cur)
	if !write {
		return d, nil
	}
	if set == nil {
		if len(sh.sets)+len(sh.gauges) >= l.perShard {
			l.makeRoom(sh, now)
		}
		set = &leaseSet{}
		sh.sets[k] = set
	}
	set.entries = next
	set.expires = now + int64(storage.LeaseExpiry(next, op.Now))
	return d, nil
}

// ReleaseLease implements [storage.LeaseStore] under the shard's lock.
func (l *Leases) ReleaseLease(ctx context.Context, k storage.Key, op storage.ReleaseOp) error {
	sh, now, err := l.lock(ctx, k)
	if err != nil {
		return err
	}
	defer sh.mu.Unlock()
	set := sh.sets[k]
	if set == nil {
		return nil
	}
	if now >= set.expires {
		delete(sh.sets, k)
		return nil
	}
	next, write := op.Apply(set.entries)
	switch {
	case len(next) == 0:
		delete(sh.sets, k)
	case write:
		set.entries = next
	}
	return nil
}

// PutGauge implements [storage.GaugeStore].
func (l *Leases) PutGauge(ctx context.Context, k storage.Key, g storage.Gauge, ttl time.Duration) error {
	sh, now, err := l.lock(ctx, k)
	if err != nil {
		return err
	}
	defer sh.mu.Unlock()
	if _, ok := sh.gauges[k]; !ok && len(sh.sets)+len(sh.gauges) >= l.perShard {
		l.makeRoom(sh, now)
	}
	sh.gauges[k] = gaugeEntry{g: g, expires: now + int64(ttl)}
	return nil
}

// GetGauge implements [storage.GaugeStore].
func (l *Leases) GetGauge(ctx context.Context, k storage.Key) (storage.Gauge, bool, error) {
	sh, now, err := l.lock(ctx, k)
	if err != nil {
		return storage.Gauge{}, false, err
	}
	defer sh.mu.Unlock()
	e, ok := sh.gauges[k]
	if !ok || now >= e.expires {
		return storage.Gauge{}, false, nil
	}
	return e.g, true, nil
}

// makeRoom removes expired keys from sh, or failing that an arbitrary lease
// set (or gauge). Call with sh.mu held.
func (l *Leases) makeRoom(sh *leaseShard, now int64) {
	removed := 0
	for k, s := range sh.sets {
		if now >= s.expires {
			delete(sh.sets, k)
			removed++
		}
	}
	for k, g := range sh.gauges {
		if now >= g.expires {
			delete(sh.gauges, k)
			removed++
		}
	}
	if removed > 0 {
		return
	}
	for k := range sh.sets {
		delete(sh.sets, k)
		l.evictions.Add(1)
		return
	}
	for k := range sh.gauges {
		delete(sh.gauges, k)
		l.evictions.Add(1)
		return
	}
}
