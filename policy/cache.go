package policy

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Loader loads a fresh Policy, e.g. by reading a rules table and calling
// [New].
type Loader func(ctx context.Context) (*Policy, error)

// CacheConfig configures a [Cache].
type CacheConfig struct {
	// TTL is how long a loaded Policy is used before a reload is started.
	// Must be positive.
	TTL time.Duration
	// LoadTimeout bounds one background reload. Zero means 10s.
	LoadTimeout time.Duration
	// Clock tells when the TTL has passed. Nil means limiter.SystemClock.
	Clock limiter.Clock
	// OnError, when not nil, is called with every failed background
	// reload (the previous Policy stays in use).
	OnError func(error)
}

// Cache holds a Policy loaded from a slow source and reloads it in the
// background once its TTL has passed (the system-design seed's "rules in a
// database, cached in memory with a TTL"). A request never waits for a
// reload: it uses the last Policy loaded. A failed reload keeps the previous
// Policy and is retried after another TTL. Safe for concurrent use.
type Cache struct {
	load Loader
	cfg  CacheConfig

	cur      atomic.Pointer[Policy]
	expires  atomic.Int64 // Unix ns after which a reload starts
	mu       sync.Mutex
	loading  bool
	loads    atomic.Int64
	failures atomic.Int64
	wg       sync.WaitGroup
}

// NewCache loads the first Policy synchronously (an error is returned, so
// that invalid rules fail at start-up) and returns the cache.
func NewCache(ctx context.Context, load Loader, cfg CacheConfig) (*Cache, error) {
	if load == nil {
		return nil, errors.New("policy: cache: nil loader")
	}
	if cfg.TTL <= 0 {
		return nil, errors.New("policy: cache: TTL must be positive")
	}
	if cfg.LoadTimeout <= 0 {
		cfg.LoadTimeout = 10 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = limiter.SystemClock
	}
	c := &Cache{load: load, cfg: cfg}
	if err := c.Refresh(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Policy returns the current Policy, and starts a background reload when
// its TTL has passed and none is running.
func (c *Cache) Policy() *Policy {
	if c.cfg.Clock.Now().UnixNano() >= c.expires.Load() {
		c.mu.Lock()
		if !c.loading {
			c.loading = true
			c.wg.Add(1)
			go c.reload()
		}
		c.mu.Unlock()
	}
	return c.cur.Load()
}

func (c *Cache) reload() {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LoadTimeout)
	err := c.Refresh(ctx)
	cancel()
	if err != nil {
		c.failures.Add(1)
		// Keep the old policy; try again after another TTL.
		c.expires.Store(c.cfg.Clock.Now().Add(c.cfg.TTL).UnixNano())
		if c.cfg.OnError != nil {
			c.cfg.OnError(err)
		}
	}
	c.mu.Lock()
	c.loading = false
	c.mu.Unlock()
}

// Refresh loads a Policy now and, on success, makes it current.
func (c *Cache) Refresh(ctx context.Context) error {
	p, err := c.load(ctx)
	if err == nil && p == nil {
		err = errors.New("policy: cache: loader returned no policy")
	}
	if err != nil {
		return err
	}
	c.cur.Store(p)
	c.loads.Add(1)
	c.expires.Store(c.cfg.Clock.Now().Add(c.cfg.TTL).UnixNano())
	return nil
}

// Wait waits for a running background reload to finish (for tests and
// shutdown).
func (c *Cache) Wait() { c.wg.Wait() }

// CacheStats counts a cache's loads.
type CacheStats struct {
	Loads    int64 // successful loads, the first included
	Failures int64 // failed background reloads
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	return CacheStats{Loads: c.loads.Load(), Failures: c.failures.Load()}
}
