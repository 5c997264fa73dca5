package memcached

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/limiter/storage"
)

// Value formats. The first byte of a bucket or log value says which it is,
// so a value of another kind (or a foreign one) is reported as corrupt rather
// than misread.
const (
	formatBucket = 'B'
	formatLog    = 'L'
)

// UpdateBucket implements [storage.BucketStore] with gets and cas (add for a
// new bucket), retrying on a lost race. The state's Version is the item's
// CAS id.
func (s *Store) UpdateBucket(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration) (storage.Decision, error) {
	key := bucketKey(s.keys.base(k))
	s.refunds.Wait(ctx, key) //nolint:errcheck // the loop reports ctx's end
	return s.casLoop().update(ctx, "bucket", key, s.bucketApply(op, ttl))
}

// bucketApply is op as an applyFunc on a bucket value.
func (s *Store) bucketApply(op storage.BucketOp, ttl time.Duration) applyFunc {
	return func(val []byte, cas uint64, found bool) (*memcache.Item, storage.Decision, error) {
		var cur storage.BucketState
		if found {
			var err error
			if cur, err = decodeBucket(val); err != nil {
				return nil, storage.Decision{}, err
			}
			cur.Version = cas
		}
		next, d, write := op.Apply(cur, found)
		if !write {
			return nil, d, nil
		}
		return &memcache.Item{Value: encodeBucket(next), Expiration: s.expiry(ttl)}, d, nil
	}
}

// UpdateLog implements [storage.LogStore] with gets and cas of the log
// encoded by [storage.AppendLog].
func (s *Store) UpdateLog(ctx context.Context, k storage.Key, op storage.LogOp, ttl time.Duration) (storage.Decision, error) {
	key := logKey(s.keys.base(k))
	s.refunds.Wait(ctx, key) //nolint:errcheck // the loop reports ctx's end
	return s.casLoop().update(ctx, "log", key, s.logApply(op, ttl))
}

// logApply is op as an applyFunc on a log value.
func (s *Store) logApply(op storage.LogOp, ttl time.Duration) applyFunc {
	return func(val []byte, _ uint64, found bool) (*memcache.Item, storage.Decision, error) {
		var entries []int64
		if found {
			if len(val) == 0 || val[0] != formatLog {
				return nil, storage.Decision{}, fmt.Errorf("%w: not a sliding log value", storage.ErrCorruptState)
			}
			var err error
			if entries, err = storage.ParseLog(val[1:], nil); err != nil {
				return nil, storage.Decision{}, err
			}
		}
		next, d, write := op.Apply(entries)
		if !write {
			return nil, d, nil
		}
		return &memcache.Item{Value: storage.AppendLog([]byte{formatLog}, next), Expiration: s.expiry(ttl)}, d, nil
	}
}

// KeepsLeased implements [storage.LeaseKeeper]: a bucket's value holds
// its leased units (encodeBucket).
func (s *Store) KeepsLeased() bool { return true }

// encodeBucket is the value of a bucket: its format byte, then Tokens and
// Updated as varints, then, when a capacity lease holds units, the two
// lease slots (epoch and units each).
func encodeBucket(b storage.BucketState) []byte {
	out := make([]byte, 0, 1+6*binary.MaxVarintLen64)
	out = append(out, formatBucket)
	out = binary.AppendVarint(out, b.Tokens)
	out = binary.AppendVarint(out, b.Updated)
	if b.Leased == ([2]storage.LeaseSlot{}) {
		return out
	}
	for _, l := range b.Leased {
		out = binary.AppendVarint(out, l.Epoch)
		out = binary.AppendVarint(out, l.Units)
	}
	return out
}

func decodeBucket(v []byte) (storage.BucketState, error) {
	var b storage.BucketState
	if len(v) == 0 || v[0] != formatBucket {
		return b, fmt.Errorf("%w: not a token bucket value", storage.ErrCorruptState)
	}
	v = v[1:]
	t, n := binary.Varint(v)
	if n <= 0 {
		return b, fmt.Errorf("%w: token bucket tokens", storage.ErrCorruptState)
	}
	u, m := binary.Varint(v[n:])
	if m <= 0 {
		return b, fmt.Errorf("%w: token bucket time", storage.ErrCorruptState)
	}
	b.Tokens, b.Updated = t, u
	v = v[n+m:]
	if len(v) == 0 {
		return b, nil
	}
	var f [4]int64
	for i := range f {
		x, k := binary.Varint(v)
		if k <= 0 {
			return b, fmt.Errorf("%w: token bucket leases", storage.ErrCorruptState)
		}
		f[i], v = x, v[k:]
	}
	if len(v) != 0 {
		return b, fmt.Errorf("%w: token bucket value has %d trailing bytes", storage.ErrCorruptState, len(v))
	}
	b.Leased = [2]storage.LeaseSlot{{Epoch: f[0], Units: f[1]}, {Epoch: f[2], Units: f[3]}}
	return b, nil
}

// applyFunc computes what to write from the value a key holds (found is
// false when it holds none; cas is the item's CAS id): the item to write
// (its Value and Expiration; the loop sets Key and CasID), or nil when
// nothing is to be written, and the decision.
type applyFunc func(val []byte, cas uint64, found bool) (write *memcache.Item, d storage.Decision, err error)

// casLoop is the optimistic read-modify-write of the package, shared by
// [Store] (buckets, logs) and [Leases]: its client, the per-call timeout,
// the retry budget (Config.MaxRetries, Config.RetryBackoff) and the item
// cache (nil for none).
type casLoop struct {
	mc         *memcache.Client
	cache      *itemCache
	timeout    time.Duration
	maxRetries int
	backoff    time.Duration
}

func (s *Store) casLoop() casLoop {
	return casLoop{mc: s.mc, cache: s.cache, timeout: s.timeout, maxRetries: s.maxRetries, backoff: s.backoff}
}

// update runs the loop on key:
//
//  1. Start from the item cached for key (value and CAS id from our last
//     read), or read it with gets.
//  2. Apply. A decision that writes nothing is returned only if it was made
//     on a fresh read (a cached item may be stale); otherwise read and
//     apply again.
//  3. Write with cas on the item's CAS id, or add when there was none. A
//     cas that finds the item changed (EXISTS) or gone (NOT_FOUND), or an
//     add that finds it present (NOT_STORED), lost a race: wait a random,
//     growing time (see wait), read again, and go to 2.
//
// No update is lost: every write is conditional on the state it was
// computed from. Attempts stop after maxRetries lost races (a stale cached
// item is not counted), or at the call's deadline, with an error wrapping
// storage.ErrConflict (and the context's error). Every other failure goes
// through errorf, the package's one error mapping. Reads and writes run
// through call (so the call returns at its deadline) and retryDead (a
// pooled connection the server closed is replaced once).
func (c casLoop) update(ctx context.Context, kind, key string, apply applyFunc) (storage.Decision, error) {
	if err := ctx.Err(); err != nil {
		return storage.Decision{}, errorf(kind, err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	it, fresh := c.cache.get(key), false
	if it == nil {
		var err error
		if it, err = c.read(ctx, key); err != nil {
			return storage.Decision{}, errorf(kind+": gets", err)
		}
		fresh = true
	}
	lost := 0
	for {
		found := it.Key != ""
		w, d, err := apply(it.Value, it.CasID, found)
		if err != nil || w == nil {
			if fresh {
				if err != nil {
					c.cache.drop(key)
					return storage.Decision{}, errorf(kind, err)
				}
				return d, nil
			}
			// Made on a cached item: confirm on a fresh read.
			if it, err = c.read(ctx, key); err != nil {
				return storage.Decision{}, errorf(kind+": gets", err)
			}
			fresh = true
			continue
		}
		w.Key, w.CasID = key, it.CasID
		_, err = call(ctx, func() (struct{}, error) {
			return retryDead(c.mc, func() (struct{}, error) {
				if found {
					return struct{}{}, c.mc.CompareAndSwap(w)
				}
				return struct{}{}, c.mc.Add(w)
			})
		})
		// The text protocol does not return the new CAS id, so after a
		// write (or a failed one) the cached item is of no use.
		c.cache.drop(key)
		switch {
		case err == nil:
			return d, nil
		case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCacheMiss):
		default:
			if lost > 0 && ctx.Err() != nil {
				// The deadline struck during the write after lost races:
				// the races are why, as when it strikes in a read or a
				// wait.
				err = fmt.Errorf("%w: %d lost races, then: %w", storage.ErrConflict, lost, err)
			}
			return storage.Decision{}, errorf(kind+": write", err)
		}
		// Lost a race. A stale cached item does not count as a loss.
		if fresh {
			lost++
			if lost > c.maxRetries {
				return storage.Decision{}, errorf(kind, fmt.Errorf("%w: gave up after %d lost races", storage.ErrConflict, lost))
			}
			if err := wait(ctx, c.backoff, lost); err != nil {
				return storage.Decision{}, errorf(kind, fmt.Errorf("%w: %d lost races, then: %w", storage.ErrConflict, lost, err))
			}
		}
		if it, err = c.read(ctx, key); err != nil {
			if lost > 0 && ctx.Err() != nil {
				err = fmt.Errorf("%w: %d lost races, then: %w", storage.ErrConflict, lost, err)
			}
			return storage.Decision{}, errorf(kind+": gets", err)
		}
		fresh = true
	}
}

// read gets key with its CAS id and caches it. A miss gives an empty item.
func (c casLoop) read(ctx context.Context, key string) (*memcache.Item, error) {
	it, err := call(ctx, func() (*memcache.Item, error) {
		return retryDead(c.mc, func() (*memcache.Item, error) { return c.mc.Get(key) })
	})
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		c.cache.drop(key)
		return &memcache.Item{}, nil
	case err != nil:
		return nil, err
	}
	c.cache.put(it)
	return it, nil
}

// wait sleeps before the retry after lost race number attempt (1-based): a
// random time in (0, backoff*2^(attempt-1)], capped at maxRetryBackoff, or
// until ctx is done.
func wait(ctx context.Context, backoff time.Duration, attempt int) error {
	ceiling := backoff << min(attempt-1, 16)
	if ceiling <= 0 || ceiling > maxRetryBackoff {
		ceiling = maxRetryBackoff
	}
	t := time.NewTimer(rand.N(ceiling) + 1)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// itemCache remembers the last item read per key, up to a bound. When full
// it forgets an arbitrary entry. A nil *itemCache caches nothing.
type itemCache struct {
	mu  sync.Mutex
	m   map[string]*memcache.Item
	max int
}

func newItemCache(size int) *itemCache {
	return &itemCache{m: make(map[string]*memcache.Item), max: size}
}

func (c *itemCache) get(key string) *memcache.Item {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[key]
}

func (c *itemCache) put(it *memcache.Item) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[it.Key]; !ok && len(c.m) >= c.max {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[it.Key] = it
}

func (c *itemCache) drop(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	delete(c.m, key)
	c.mu.Unlock()
}
