package memcached

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/limiter"
)

// Add implements [limiter.Counter]: incr (add on a miss) on sub-window cur,
// in parallel with one get-multi of sub-windows cur-1 ... cur-span+1 and
// cur+1, whose count is reported as Counts.Later. It looks one sub-window
// ahead only.
//
// On error the add may or may not have happened.
func (s *Store) Add(ctx context.Context, k limiter.Key, cur int64, span int, n int64, ttl time.Duration) (limiter.Counts, error) {
	var c limiter.Counts
	if span < 1 || span > limiter.MaxSpan || n < 0 {
		return c, fmt.Errorf("memcached: bad window add (span %d, n %d)", span, n)
	}
	if cur == math.MaxInt64 || cur < math.MinInt64+int64(span) {
		return c, fmt.Errorf("memcached: sub-window index %d out of range", cur)
	}
	if err := ctx.Err(); err != nil {
		return c, errorf("add", err)
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()

	base := s.keys.base(k)
	// Read cur+1 (for Later), cur when only reading, and cur-1 ... cur-span+1.
	keys := make([]string, 0, span+1)
	for j := -1; j < span; j++ {
		if j == 0 && n > 0 {
			continue // incremented, not read
		}
		keys = append(keys, counterKey(base, cur-int64(j)))
	}

	var incrCh chan incrResult
	if n > 0 {
		incrCh = make(chan incrResult, 1)
		key := counterKey(base, cur)
		exp := s.expiry(ttl)
		go func() {
			v, err := s.incr(key, n, exp)
			incrCh <- incrResult{v, err}
		}()
		if !s.oneTrip(cur, span, ttl) {
			// Near a boundary: the reads must see the world after our
			// increment (see the package comment).
			if err := waitIncr(ctx, incrCh, &c); err != nil {
				return c, err
			}
			incrCh = nil
		}
	}
	items, err := call(ctx, func() (map[string]*memcache.Item, error) {
		return retryDead(s.mc, func() (map[string]*memcache.Item, error) { return s.mc.GetMulti(keys) })
	})
	if err != nil {
		return c, errorf("add: get-multi", err)
	}
	if incrCh != nil {
		if err := waitIncr(ctx, incrCh, &c); err != nil {
			return c, err
		}
	}
	for j := -1; j < span; j++ {
		if j == 0 && n > 0 {
			continue
		}
		key := counterKey(base, cur-int64(j))
		it, ok := items[key]
		if !ok {
			continue
		}
		v, err := parseCount(it.Value)
		if err != nil {
			return limiter.Counts{}, errorf("add: "+key, err)
		}
		if j < 0 {
			c.Later = v
		} else {
			c.C[j] = v
		}
	}
	return c, nil
}

type incrResult struct {
	v   int64
	err error
}

// waitIncr waits for the incr's result and stores it as c.C[0].
func waitIncr(ctx context.Context, ch <-chan incrResult, c *limiter.Counts) error {
	select {
	case r := <-ch:
		if r.err != nil {
			return errorf("add: incr", r.err)
		}
		c.C[0] = r.v
		return nil
	case <-ctx.Done():
		return errorf("add: incr", ctx.Err())
	}
}

// oneTrip reports whether a decision on sub-window cur may issue its incr
// and its get-multi at once. The sub-window length is not passed to Add; it
// is ttl/span, as the limiter's windows set ttl to span sub-windows (a
// window plus one sub-window). When it is not a whole number, oneTrip says
// no: a changed convention costs a round trip, never exactness.
func (s *Store) oneTrip(cur int64, span int, ttl time.Duration) bool {
	if s.guard < 0 || span == 1 {
		// A fixed window reads no older sub-window: nothing to race.
		return true
	}
	if ttl <= 0 || ttl%time.Duration(span) != 0 {
		return false
	}
	sub := int64(ttl) / int64(span)
	now := s.now().UnixNano()
	idx := now / sub
	if now%sub < 0 {
		idx--
	}
	if idx != cur {
		return false // a replay, or the caller's clock is off ours
	}
	elapsed := now - idx*sub
	g := int64(s.guard)
	return elapsed >= g && sub-elapsed > g
}

// incr adds n to the counter at key, creating it with expiry exp when
// missing: incr; on a miss, add; if add lost the race to another writer's
// add, incr again. It returns the counter after the add.
func (s *Store) incr(key string, n int64, exp int32) (int64, error) {
	increment := func() (uint64, error) { return s.mc.Increment(key, uint64(n)) }
	// An item can vanish between add and incr (eviction, flush_all); a
	// few rounds cover it.
	for range 3 {
		v, err := retryDead(s.mc, increment)
		if err == nil {
			return clampCount(v), nil
		}
		if !errors.Is(err, memcache.ErrCacheMiss) {
			return 0, err
		}
		it := &memcache.Item{Key: key, Value: strconv.AppendInt(nil, n, 10), Expiration: exp}
		_, err = retryDead(s.mc, func() (struct{}, error) { return struct{}{}, s.mc.Add(it) })
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, memcache.ErrNotStored) {
			return 0, err
		}
		// Another writer's add won: incr theirs.
		v, err = retryDead(s.mc, increment)
		if err == nil {
			return clampCount(v), nil
		}
		if !errors.Is(err, memcache.ErrCacheMiss) {
			return 0, err
		}
	}
	return 0, fmt.Errorf("%w: counter %s kept vanishing between add and incr", limiter.ErrConflict, key)
}

// Sub implements [limiter.Counter] with decr, which memcached stops at zero.
// A missing counter (expired, evicted) has nothing to give back.
func (s *Store) Sub(ctx context.Context, k limiter.Key, idx int64, n int64) error {
	if n < 0 {
		return fmt.Errorf("memcached: bad window sub (n %d)", n)
	}
	if err := ctx.Err(); err != nil {
		return errorf("sub", err)
	}
	if n == 0 {
		return nil
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	key := counterKey(s.keys.base(k), idx)
	_, err := call(ctx, func() (uint64, error) {
		return retryDead(s.mc, func() (uint64, error) { return s.mc.Decrement(key, uint64(n)) })
	})
	if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
		return errorf("sub: decr", err)
	}
	return nil
}

// parseCount parses a counter's value. Memcached may leave trailing spaces
// after a decr that shortened the number.
func parseCount(b []byte) (int64, error) {
	b = bytes.TrimRight(b, " ")
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: counter value %.40q is not a number", limiter.ErrCorruptState, b)
	}
	return clampCount(v), nil
}

func clampCount(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}
