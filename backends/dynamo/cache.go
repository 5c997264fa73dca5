package dynamo

import (
	"hash/maphash"
	"sync"

	"github.com/sluicehq/sluice/internal/lru"
)

const cacheShards = 16

// cache is a bounded, sharded LRU map from partition key to the last state
// the store saw for it. A nil *cache (CacheSize < 0) holds nothing.
type cache struct {
	seed     maphash.Seed
	perShard int
	shards   [cacheShards]cacheShard
}

type cacheShard struct {
	mu  sync.Mutex
	m   map[string]*cacheNode
	lru lru.List[cacheNode, *cacheNode] // most recently used at the front
}

type cacheNode struct {
	key string
	val any
	lru.Links[cacheNode]
}

func newCache(size int) *cache {
	if size < 0 {
		return nil
	}
	c := &cache{seed: maphash.MakeSeed(), perShard: max(size/cacheShards, 1)}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.m = make(map[string]*cacheNode)
		sh.lru.Init()
	}
	return c
}

func (c *cache) shard(key string) *cacheShard {
	return &c.shards[maphash.String(c.seed, key)%cacheShards]
}

// get returns the value stored for key.
func (c *cache) get(key string) (any, bool) {
	if c == nil {
		return nil, false
	}
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n, ok := sh.m[key]
	if !ok {
		return nil, false
	}
	sh.lru.MoveToFront(n)
	return n.val, true
}

// put stores val for key, evicting the least recently used key of its shard
// when full. Values are treated as immutable once stored.
func (c *cache) put(key string, val any) {
	c.update(key, func(any) any { return val })
}

// update stores f(the value stored for key, or nil) for key, under the
// shard's lock, as put does.
func (c *cache) update(key string, f func(old any) any) {
	if c == nil {
		return
	}
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if n, ok := sh.m[key]; ok {
		n.val = f(n.val)
		sh.lru.MoveToFront(n)
		return
	}
	if len(sh.m) >= c.perShard {
		old := sh.lru.Back()
		sh.lru.Remove(old)
		delete(sh.m, old.key)
	}
	n := &cacheNode{key: key, val: f(nil)}
	sh.m[key] = n
	sh.lru.PushFront(n)
}

// remove forgets key.
func (c *cache) remove(key string) {
	if c == nil {
		return
	}
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if n, ok := sh.m[key]; ok {
		sh.lru.Remove(n)
		delete(sh.m, key)
	}
}

func (c *cache) len() int {
	if c == nil {
		return 0
	}
	total := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		total += len(sh.m)
		sh.mu.Unlock()
	}
	return total
}

func (c *cache) clear() {
	if c == nil {
		return
	}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.lru.Init()
		sh.mu.Unlock()
	}
}
