package limiter

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultDenyCacheSize is how many keys a limit's deny cache holds.
const DefaultDenyCacheSize = 4096

const denyShards = 16

var denySeed = maphash.MakeSeed()

// DenyCache remembers, per key, a store's denial until its RetryAfter has
// passed, so that the same process denies the key again without a store
// request (Upstash's ephemeral cache, envoy's local over-limit cache). A
// flood on one key then costs no store request at all.
//
// It never admits anything: it only denies. A denial at stamp t with
// RetryAfter r says that no request stamped in [t, t+r) fits, provided no
// units are given back in between: traffic, including late writers, only
// adds; and no request of n or more units fits, so smaller requests are
// not answered from it. Two things can give units back sooner, and the cache then denies
// what the store would admit (under-admission, never over): refunds of
// requests denied by another limit of the same batch (a stack or a rule
// set) in other processes, and refunds made in other processes. A Refund
// through the limit itself forgets the key. A request
// stamped before the cached denial is not answered from the cache. Limits
// whose denials change the store (a window with CountDenied, a strict
// bucket) have no cache.
//
// It is bounded: when a shard is full, expired entries are dropped, then an
// arbitrary one. A nil *DenyCache remembers nothing. Safe for concurrent
// use.
type DenyCache struct {
	shards [denyShards]denyShard
	max    int // per shard
	// gen counts the units given back through the limit in this process.
	// A denial is remembered only if none was given back while it was
	// being decided: it may have been caused by a take that was then
	// refunded (another limit of a stack denied), and would otherwise stay
	// cached for its whole RetryAfter.
	gen atomic.Uint64
}

type denyShard struct {
	mu sync.Mutex
	m  map[string]denial
}

type denial struct {
	from, until, reset int64 // Unix ns
	limit              int64
	n                  int64 // the denied cost: smaller requests are not answered
	name               string
}

// NewDenyCache returns a cache of about size keys (at least one per shard).
func NewDenyCache(size int) *DenyCache {
	c := &DenyCache{max: max(size/denyShards, 1)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]denial)
	}
	return c
}

func (c *DenyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(denySeed, key)%denyShards]
}

// denied answers from the cache for n units of key at t.
func (c *DenyCache) denied(key string, t, n int64) (Decision, bool) {
	if c == nil {
		return Decision{}, false
	}
	sh := c.shard(key)
	sh.mu.Lock()
	e, ok := sh.m[key]
	if ok && t >= e.until {
		delete(sh.m, key)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || t < e.from || n < e.n {
		return Decision{}, false
	}
	retry := time.Duration(e.until - t)
	return Decision{Limit: e.limit, Name: e.name, RetryAfter: retry, ResetAfter: max(time.Duration(e.reset-t), retry)}, true
}

// generation returns the count of give-backs so far (0 for a nil cache).
func (c *DenyCache) generation() uint64 {
	if c == nil {
		return 0
	}
	return c.gen.Load()
}

// remember records a store's denial d of n units of key at t, unless units
// were given back through the limit since gen (see DenyCache.gen).
func (c *DenyCache) remember(key string, t, n int64, d Decision, gen uint64) {
	if c == nil || d.Allowed || d.RetryAfter <= 0 {
		return
	}
	e := denial{from: t, until: satAddTime(t, d.RetryAfter), reset: satAddTime(t, d.ResetAfter), limit: d.Limit, n: n, name: d.Name}
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if c.gen.Load() != gen {
		return // a give-back raced the decision: it may be stale
	}
	if old, ok := sh.m[key]; ok {
		// Keep the earliest start and the latest end of overlapping denials.
		if old.until >= e.from && old.from <= e.until && old.n == e.n {
			e.from = min(e.from, old.from)
			e.until = max(e.until, old.until)
			e.reset = max(e.reset, old.reset)
		}
	} else if len(sh.m) >= c.max {
		for k, v := range sh.m {
			if v.until <= t {
				delete(sh.m, k)
			}
		}
		for k := range sh.m {
			if len(sh.m) < c.max {
				break
			}
			delete(sh.m, k)
		}
	}
	sh.m[key] = e
}

// forget drops key: units were given back to it through this limit. It
// also makes every denial being decided at this moment unrememberable.
func (c *DenyCache) forget(key string) {
	if c == nil {
		return
	}
	c.gen.Add(1)
	sh := c.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
}

// bump makes every denial being decided at this moment unrememberable
// (units were given back through the limit), without forgetting any.
func (c *DenyCache) bump() {
	if c != nil {
		c.gen.Add(1)
	}
}

// Len returns the number of keys held (expired ones included until they
// are dropped).
func (c *DenyCache) Len() int {
	if c == nil {
		return 0
	}
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

func satAddTime(t int64, d time.Duration) int64 {
	if s := t + int64(d); s >= t {
		return s
	}
	return 1<<63 - 1
}
