package limiter

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// denyCacheSize is how many keys a limit's deny cache holds.
const denyCacheSize = 4096

const denyShards = 16

var denySeed = maphash.MakeSeed()

// denyCache remembers, per key, a store's denial until its RetryAfter has
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
// through the limit itself, or a batch's give-back of a take, forgets the
// key, and no denial of it is remembered for givebackLands (1 s) after
// that: a give-back sent without waiting may not have reached the store
// yet, and a denial read meanwhile may have counted the take it gives
// back. A request
// stamped before the cached denial is not answered from the cache. Limits
// whose denials change the store (a window with CountDenied, a strict
// bucket) have no cache.
//
// It is bounded: when a shard is full, expired entries are dropped, then an
// arbitrary one. A nil *denyCache remembers nothing. Safe for concurrent
// use.
type denyCache struct {
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
	// dirty (wall-clock Unix ns) marks a key given back to until then:
	// no denial of it is remembered meanwhile. An entry with until == 0
	// is only that mark.
	dirty int64
}

// givebackLands is how long after a give-back is sent a denial of the same
// key is not remembered. forget runs once the store call of the give-back
// has returned, but a store may send it without waiting (memcached's
// window refund is a noreply decr, bucket and log refunds run on their own
// goroutine): a decision that starts after forget can still read the
// counter before the give-back lands, on another connection, and be denied
// by the take being given back. The generation cannot see that; this mark
// covers it, for about the time a refund sent without waiting takes to
// land (a network round trip, or a few under a lost race).
const givebackLands = time.Second

// makeDenyCache returns a cache of about size keys (at least one per shard).
func makeDenyCache(size int) *denyCache {
	c := &denyCache{max: max(size/denyShards, 1)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]denial)
	}
	return c
}

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(denySeed, key)%denyShards]
}

// denied answers from the cache for n units of key at t.
func (c *denyCache) denied(key string, t, n int64) (Decision, bool) {
	if c == nil {
		return Decision{}, false
	}
	sh := c.shard(key)
	sh.mu.Lock()
	e, ok := sh.m[key]
	if ok && t >= e.until {
		if e.dirty == 0 || e.dirty <= time.Now().UnixNano() {
			delete(sh.m, key)
		}
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
func (c *denyCache) generation() uint64 {
	if c == nil {
		return 0
	}
	return c.gen.Load()
}

// remember records a store's denial d of n units of key at t, unless units
// were given back through the limit since gen (see denyCache.gen).
func (c *denyCache) remember(key string, t, n int64, d Decision, gen uint64) {
	if c == nil || d.Allowed || d.RetryAfter <= 0 {
		return
	}
	e := denial{from: t, until: satAddTime(t, d.RetryAfter*brokenDenyLonger), reset: satAddTime(t, d.ResetAfter), limit: d.Limit, n: n, name: d.Name}
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if c.gen.Load() != gen {
		return // a give-back raced the decision: it may be stale
	}
	if old, ok := sh.m[key]; ok && old.dirty > time.Now().UnixNano() {
		return // a give-back of this key may not have landed yet
	} else if ok && old.until > 0 {
		// Keep the earliest start and the latest end of overlapping denials.
		if old.until >= e.from && old.from <= e.until && old.n == e.n {
			e.from = min(e.from, old.from)
			e.until = max(e.until, old.until)
			e.reset = max(e.reset, old.reset)
		}
	} else if !ok && len(sh.m) >= c.max {
		c.evict(sh, t)
	}
	sh.m[key] = e
}

// forget drops key: units were given back to it through this limit. It
// also makes every denial being decided at this moment unrememberable.
func (c *denyCache) forget(key string) {
	if c == nil {
		return
	}
	c.gen.Add(1)
	sh := c.shard(key)
	sh.mu.Lock()
	if _, ok := sh.m[key]; !ok && len(sh.m) >= c.max {
		c.evict(sh, time.Now().UnixNano())
	}
	sh.m[key] = denial{dirty: time.Now().Add(givebackLands).UnixNano()}
	sh.mu.Unlock()
}

// evict makes room in a full shard: expired denials and marks first, then
// arbitrary entries. The caller holds sh.mu.
func (c *denyCache) evict(sh *denyShard, t int64) {
	wall := time.Now().UnixNano()
	for k, v := range sh.m {
		if v.until <= t && v.dirty <= wall {
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

// bump makes every denial being decided at this moment unrememberable
// (units were given back through the limit), without forgetting any.
func (c *denyCache) bump() {
	if c != nil {
		c.gen.Add(1)
	}
}

// Len returns the number of keys held (expired ones included until they
// are dropped).
func (c *denyCache) Len() int {
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

// brokenDenyLonger multiplies what a denial is remembered for: a deny
// cache that caches too long, which TestLeasesHotKeyCappedSim must fail.
// Tests only.
var brokenDenyLonger time.Duration = 1

func satAddTime(t int64, d time.Duration) int64 {
	if s := t + int64(d); s >= t {
		return s
	}
	return 1<<63 - 1
}
