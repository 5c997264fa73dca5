package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/lru"
	"github.com/sluicehq/sluice/limiter/storage"
)

const numShards = 64

// DefaultMaxKeys is the key cap used when Config.MaxKeys is zero.
const DefaultMaxKeys = 100_000

// Config configures a [Store]. The zero value is usable.
type Config struct {
	// MaxKeys caps the number of keys held (at least numShards). Zero
	// means DefaultMaxKeys.
	MaxKeys int
	// Clock is the time used for expiry (not for the algorithms, which get
	// their time from the caller). Nil means time.Now.
	Clock func() time.Time
}

// Store is an in-process, bounded store for every limiter algorithm. It is
// safe for concurrent use. Create it with [New]; the zero value is not
// usable.
type Store struct {
	shards    [numShards]shard
	seed      maphash.Seed
	clock     func() time.Time // nil: the monotonic clock from start
	start     time.Time
	perShard  int
	evictions atomic.Int64
	expired   atomic.Int64
	// brokenFence makes AddFenced and UpdateBucketFenced ignore the
	// fence (tests show they fail such a store).
	brokenFence bool
}

var (
	_ storage.Counter       = (*Store)(nil)
	_ storage.BucketStore   = (*Store)(nil)
	_ storage.LogStore      = (*Store)(nil)
	_ storage.PackedCounter = (*Store)(nil)
	_ storage.Fencer        = (*Store)(nil)
	_ storage.BucketFencer  = (*Store)(nil)
)

type shard struct {
	mu  sync.Mutex
	m   map[storage.Key]*entry
	lru lru.List[entry, *entry] // most recent at the front
	_   [64]byte
}

type entry struct {
	key     storage.Key
	expires int64 // Unix ns; the entry is absent at or after it
	lru.Links[entry]

	// Window counters: slots[idx mod len(slots)] for idx in
	// (newest-len(slots), newest], newest being the newest sub-window
	// written.
	slots  []int64
	newest int64
	// fence is the key's fence (storage.Fencer), a window's or a
	// bucket's: an add or bucket take fenced below it is refused. It
	// lives and expires with the key's state.
	fence int64

	bucket    storage.BucketState
	hasBucket bool

	log []int64

	// Packed counters: per level, a ring of cells indexed by cell index,
	// holding every counter that covers a slot in
	// [pnewest-pkeep, pnewest] (see storage.PackedCounter).
	packed  [storage.PackedLevels][]cell
	pnewest int64
	pkeep   int64
}

// cell is one packed counter in a level's ring; ok is false for an empty
// place. v is the counter as a 64-bit value that wraps, which is what the
// limiter reads; carries counts the adds that carried out of its top field
// since (v wrapped past 2^64), so that a refund knows the add it takes
// back is in the counter even when v has become smaller than its delta.
// DynamoDB's numbers keep the same information by not wrapping; memcached
// cannot keep it and subtracts modulo 2^64 instead.
type cell struct {
	idx     int64
	v       uint64
	carries uint32
	ok      bool
}

// New returns an empty store.
func New(cfg Config) (*Store, error) {
	if cfg.MaxKeys < 0 {
		return nil, fmt.Errorf("memory: MaxKeys must not be negative, got %d", cfg.MaxKeys)
	}
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.MaxKeys < numShards {
		cfg.MaxKeys = numShards
	}
	s := &Store{seed: maphash.MakeSeed(), clock: cfg.Clock, start: time.Now(), perShard: cfg.MaxKeys / numShards}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.m = make(map[storage.Key]*entry)
		sh.lru.Init()
	}
	return s, nil
}

// Stats are counters of a store's housekeeping.
type Stats struct {
	// Keys is the number of keys held (live or not yet swept).
	Keys int
	// Evictions counts live keys dropped to stay under MaxKeys.
	Evictions int64
	// Expired counts expired keys removed.
	Expired int64
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	st := Stats{Evictions: s.evictions.Load(), Expired: s.expired.Load()}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Keys += len(sh.m)
		sh.mu.Unlock()
	}
	return st
}

func (s *Store) shard(k storage.Key) *shard {
	return &s.shards[maphash.Comparable(s.seed, k)%numShards]
}

// entry returns key's entry, creating it (and making room) when absent. An
// expired entry is returned emptied. Call with sh.mu held.
func (s *Store) entry(sh *shard, k storage.Key, now int64) *entry {
	e, ok := sh.m[k]
	if ok {
		if now >= e.expires {
			e.reset()
			s.expired.Add(1)
		}
		sh.lru.MoveToFront(e)
		return e
	}
	if len(sh.m) >= s.perShard {
		s.makeRoom(sh, now)
	}
	e = &entry{key: k}
	sh.m[k] = e
	sh.lru.PushFront(e)
	return e
}

// makeRoom removes expired entries from the cold end of the LRU list, or
// failing that the least recently used entry.
func (s *Store) makeRoom(sh *shard, now int64) {
	removed := 0
	for e := sh.lru.Back(); e != nil && removed < 16; {
		prev := sh.lru.Prev(e)
		if now >= e.expires {
			sh.remove(e)
			s.expired.Add(1)
			removed++
		}
		e = prev
	}
	if removed == 0 {
		sh.remove(sh.lru.Back())
		s.evictions.Add(1)
	}
}

func (e *entry) reset() {
	e.slots = e.slots[:0]
	e.newest, e.fence = 0, 0
	e.bucket, e.hasBucket = storage.BucketState{}, false
	e.log = e.log[:0]
	for l := range e.packed {
		e.packed[l] = e.packed[l][:0]
	}
	e.pnewest, e.pkeep = 0, 0
}

func (sh *shard) remove(e *entry) {
	sh.lru.Remove(e)
	delete(sh.m, e.key)
}

// now is the expiry clock in nanoseconds. Without a Config.Clock it reads
// only the monotonic clock (time.Since), which costs half of time.Now.
func (s *Store) now() int64 {
	if s.clock != nil {
		return s.clock().UnixNano()
	}
	return s.start.UnixNano() + int64(time.Since(s.start))
}

func (s *Store) lock(ctx context.Context, k storage.Key) (*shard, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, fmt.Errorf("memory: %w", err)
	}
	sh := s.shard(k)
	sh.mu.Lock()
	return sh, s.now(), nil
}

// Add implements [storage.Counter]. A key's ring holds the newest
// span+Horizon(span) sub-windows written to it, so a writer up to the
// horizon behind the newest finds its whole view. A writer further behind
// is counted in the oldest sub-window of the newest writer's view
// (Counts.Moved), and judged against everything newer.
// Reads (n == 0) never move the ring.
func (s *Store) Add(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration) (storage.Counts, error) {
	return s.add(ctx, k, cur, span, n, ttl, 0)
}

// AddFenced implements [storage.Fencer]: Add under the shard's lock, on
// condition that the key's fence is at most fence.
func (s *Store) AddFenced(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration, fence int64) (storage.Counts, error) {
	return s.add(ctx, k, cur, span, n, ttl, fence)
}

// RaiseFence implements [storage.Fencer]: under the shard's lock, the
// key's fence becomes f if it was lower, and the key lives at least ttl
// more (the fence goes with the key's counters: it expires, and is
// evicted, with them).
func (s *Store) RaiseFence(ctx context.Context, k storage.Key, f int64, ttl time.Duration) error {
	if f <= 0 {
		return fmt.Errorf("memory: bad fence %d", f)
	}
	sh, now, err := s.lock(ctx, k)
	if err != nil {
		return err
	}
	defer sh.mu.Unlock()
	e := s.entry(sh, k, now)
	e.fence = max(e.fence, f)
	e.expires = max(e.expires, expiry(now, ttl))
	return nil
}

// add is Add, fenced when fence > 0 and n > 0.
func (s *Store) add(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration, fence int64) (storage.Counts, error) {
	if span < 1 || span > storage.MaxSpan || n < 0 {
		return storage.Counts{}, fmt.Errorf("memory: bad window add (span %d, n %d)", span, n)
	}
	sh, now, err := s.lock(ctx, k)
	if err != nil {
		return storage.Counts{}, err
	}
	defer sh.mu.Unlock()
	e := s.entry(sh, k, now)
	if n > 0 && fence > 0 && e.fence > fence && !s.brokenFence {
		return storage.Counts{}, fmt.Errorf("memory: window add fenced at %d, key's fence %d: %w", fence, e.fence, storage.ErrFenced)
	}
	horizon := storage.Horizon(span)
	size := int64(span) + horizon
	if int64(len(e.slots)) != size {
		if n == 0 {
			return storage.Counts{}, nil
		}
		e.slots = append(e.slots[:0], make([]int64, size)...)
		e.newest = cur
	}
	at := cur
	if n > 0 {
		if cur > e.newest {
			for i := e.newest + 1; i <= cur && i <= e.newest+size; i++ {
				e.slots[mod(i, size)] = 0
			}
			e.newest = cur
		}
		// Past the horizon: counted in the oldest sub-window of the
		// newest writer's view, never dropped, so never free.
		if at < e.newest-horizon {
			at = e.newest - int64(span) + 1
		}
		i := mod(at, size)
		if e.slots[i] += n; e.slots[i] < 0 { // overflow
			e.slots[i] = 1<<63 - 1
		}
		e.expires = max(e.expires, expiry(now, ttl))
	}
	var c storage.Counts
	if at != cur {
		c.Moved, c.At = true, at
	}
	oldest := e.newest - size + 1
	// Walk the ring from at's slot: back over the view, forward over the
	// newer sub-windows (one division, not one per slot).
	base := mod(at, size)
	for j, i := int64(0), base; j < int64(span); j++ {
		if idx := at - j; idx >= oldest && idx <= e.newest {
			c.C[j] = e.slots[i]
		}
		if i--; i < 0 {
			i = size - 1
		}
	}
	last := min(e.newest, at+storage.Ahead(span))
	if c.Moved {
		last = e.newest // a writer from past the horizon is judged against all of it
	}
	for idx, i := at+1, base; idx <= last; idx++ {
		if i++; i == size {
			i = 0
		}
		if idx < oldest {
			continue
		}
		if c.Later += e.slots[i]; c.Later < 0 { // overflow
			c.Later = 1<<63 - 1
		}
	}
	return c, nil
}

// Sub implements [storage.Counter]: it takes from the counter of idx if the
// ring still holds it, and from no other.
func (s *Store) Sub(ctx context.Context, k storage.Key, idx int64, n int64) error {
	if n < 0 {
		return fmt.Errorf("memory: bad window sub (n %d)", n)
	}
	sh, now, err := s.lock(ctx, k)
	if err != nil {
		return err
	}
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || now >= e.expires || len(e.slots) == 0 {
		return nil
	}
	size := int64(len(e.slots))
	if idx <= e.newest && idx > e.newest-size {
		i := mod(idx, size)
		e.slots[i] = max(e.slots[i]-n, 0)
	}
	return nil
}

// ringSize is the places of level l's ring (l from 1) for keep: the most
// counters of 4^l slots that cover a slot in [newest-keep, newest], plus
// one.
func ringSize(l int, keep int64) int64 {
	w := int64(1) << (2 * l)
	return (keep+w)/w + 2
}

// held reports whether the entry may hold c: c covers a slot at or after
// newest-keep (a counter entirely older may have been dropped).
func (e *entry) held(c storage.PackedCell) bool {
	return c.Last() >= e.pnewest-e.pkeep
}

// find returns c's place in its ring, and whether it holds c.
func (e *entry) find(c storage.PackedCell) (*cell, bool) {
	ring := e.packed[c.Level-1]
	p := &ring[mod(c.Index, int64(len(ring)))]
	return p, p.ok && p.idx == c.Index
}

// validPacked checks the shape of a packed op (storage.PackedOp.Check).
func validPacked(op *storage.PackedOp) error {
	if err := op.Check(); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	return nil
}

// AddPacked implements [storage.PackedCounter] under the shard's lock. Each
// level is a ring of counters; a key holds every counter covering a slot
// within op.Keep of the newest slot added to it. An op naming a counter
// older than that is answered Stale, and nothing changes.
func (s *Store) AddPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) (storage.PackedCounts, error) {
	var c storage.PackedCounts
	if err := validPacked(op); err != nil {
		return c, err
	}
	sh, now, err := s.lock(ctx, k)
	if err != nil {
		return c, err
	}
	defer sh.mu.Unlock()
	e := s.entry(sh, k, now)
	adds := false
	for _, a := range op.Adds {
		adds = adds || a.Delta != 0
	}
	if len(e.packed[0]) == 0 || e.pkeep != op.Keep {
		if !adds {
			return c, nil // nothing held: reads 0
		}
		for l := range e.packed {
			e.packed[l] = append(e.packed[l][:0], make([]cell, ringSize(l+1, op.Keep))...)
		}
		e.pnewest, e.pkeep = op.Slot, op.Keep
	}
	newest := e.pnewest
	if adds {
		newest = max(newest, op.Slot)
	}
	// Past the horizon: refuse rather than create again what may have been
	// dropped.
	for _, a := range op.Adds {
		if a.Delta != 0 && a.Cell.Last() < newest-e.pkeep {
			c.Stale = true
			return c, nil
		}
	}
	for _, r := range op.Reads[:op.NReads] {
		if r.Last() < newest-e.pkeep {
			c.Stale = true
			return c, nil
		}
	}
	e.pnewest = newest
	var ttl time.Duration
	for i, a := range op.Adds {
		if a.Delta == 0 {
			continue
		}
		p, ok := e.find(a.Cell)
		if !ok {
			*p = cell{idx: a.Cell.Index, ok: true}
		}
		var carry uint64
		p.v, carry = bits.Add64(p.v, a.Delta, 0) // modulo 2^64, as memcached's incr: a carry is the limiter's to detect
		p.carries += uint32(carry)
		c.Added[i] = p.v
		ttl = max(ttl, a.TTL)
	}
	if adds {
		e.expires = max(e.expires, expiry(now, ttl))
	}
	for i, r := range op.Reads[:op.NReads] {
		if p, ok := e.find(r); ok && e.held(r) {
			c.Read[i] = p.v
		}
	}
	return c, nil
}

// SubPacked implements [storage.PackedCounter]: it subtracts each delta
// from its counter if the key still holds it, exactly when the counter
// holds the delta (its 64-bit value with the carries out of its top field
// counted: a refund after adds in flight wrapped it), else taking each
// field down to 0 (a counter dropped and created again).
func (s *Store) SubPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) error {
	if err := validPacked(op); err != nil {
		return err
	}
	sh, now, err := s.lock(ctx, k)
	if err != nil {
		return err
	}
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || now >= e.expires || len(e.packed[0]) == 0 || e.pkeep != op.Keep {
		return nil
	}
	for _, a := range op.Adds {
		p, ok := e.find(a.Cell)
		if !ok || !e.held(a.Cell) || a.Delta == 0 {
			continue
		}
		if p.v >= a.Delta || p.carries > 0 {
			// Exact: the add being refunded is in the counter, so the
			// subtraction borrows back any carry it made between fields,
			// and out of the top field (a per-field clamp would lose the
			// carried units, or, once v has wrapped below the delta,
			// everything the counter holds).
			var borrow uint64
			p.v, borrow = bits.Sub64(p.v, a.Delta, 0)
			p.carries -= uint32(borrow)
			continue
		}
		var v uint64
		for j := range 4 {
			f, d := storage.FieldOf(p.v, j), storage.FieldOf(a.Delta, j)
			v |= (f - min(f, d)) << (storage.PackedFieldBits * j)
		}
		p.v = v
	}
	return nil
}

// KeepsLeased implements [storage.LeaseKeeper]: the whole bucket state is
// kept, leased units included.
func (s *Store) KeepsLeased() bool { return true }

// UpdateBucket implements [storage.BucketStore] under the shard's lock.
func (s *Store) UpdateBucket(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration) (storage.Decision, error) {
	return s.updateBucket(ctx, k, op, ttl, 0)
}

// UpdateBucketFenced implements [storage.BucketFencer]: UpdateBucket
// under the shard's lock, a take on condition that the key's fence is at
// most fence.
func (s *Store) UpdateBucketFenced(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration, fence int64) (storage.Decision, error) {
	return s.updateBucket(ctx, k, op, ttl, fence)
}

// updateBucket is UpdateBucket, a take fenced when fence > 0.
func (s *Store) updateBucket(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration, fence int64) (storage.Decision, error) {
	sh, now, err := s.lock(ctx, k)
	if err != nil {
		return storage.Decision{}, err
	}
	defer sh.mu.Unlock()
	e := s.entry(sh, k, now)
	if fence > 0 && op.Take() && e.fence > fence && !s.brokenFence {
		return storage.Decision{}, fmt.Errorf("memory: bucket take fenced at %d, key's fence %d: %w", fence, e.fence, storage.ErrFenced)
	}
	next, d, write := op.Apply(e.bucket, e.hasBucket)
	if write {
		next.Version = e.bucket.Version + 1
		e.bucket, e.hasBucket = next, true
		e.expires = max(e.expires, expiry(now, ttl)) // a raised fence's life is kept
	}
	return d, nil
}

// UpdateLog implements [storage.LogStore] under the shard's lock.
func (s *Store) UpdateLog(ctx context.Context, k storage.Key, op storage.LogOp, ttl time.Duration) (storage.Decision, error) {
	sh, now, err := s.lock(ctx, k)
	if err != nil {
		return storage.Decision{}, err
	}
	defer sh.mu.Unlock()
	e := s.entry(sh, k, now)
	next, d, write := op.Apply(e.log)
	if write {
		e.log = next
		e.expires = expiry(now, ttl)
	}
	return d, nil
}

// expiry is now+ttl, saturated: a bucket's TTL may be near the largest
// Duration (a large bucket refilled slowly), and a sum that wrapped would
// make the entry expired at once.
func expiry(now int64, ttl time.Duration) int64 {
	if int64(ttl) > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + int64(ttl)
}

func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}
