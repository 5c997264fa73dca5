package policy

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Loader loads a fresh Policy, e.g. by reading a rules table and calling
// [New].
type Loader func(ctx context.Context) (*Policy, error)

// Read is what a [Reader] read from a rules source, not yet built.
type Read struct {
	// Doc is what was read (the rules, lists and tiers), compared with
	// reflect.DeepEqual: a reload whose Doc equals the current Policy's
	// keeps that Policy, with its limiters' leases and deny caches, and
	// does not call Build. Nil: every reload builds.
	Doc any
	// Build builds the Policy of Doc.
	Build func() (*Policy, error)
}

// Reader reads a rules source (a rules table) without building it.
type Reader func(ctx context.Context) (Read, error)

// DefaultRetireAfter is CacheConfig.RetireAfter's default.
const DefaultRetireAfter = time.Second

// CacheConfig configures a [Cache].
type CacheConfig struct {
	// TTL is how long a loaded Policy is used before a reload is started.
	// Must be positive.
	TTL time.Duration
	// LoadTimeout bounds one background reload, and the return of a
	// replaced Policy's leases. Zero means 10s.
	LoadTimeout time.Duration
	// Clock tells when the TTL has passed. Nil means limiter.SystemClock.
	Clock limiter.Clock
	// OnError, when not nil, is called with every failed background
	// reload (the previous Policy stays in use).
	OnError func(error)
	// RetireAfter is how long (wall time) after a reload replaced a Policy
	// the replaced one's capacity leases are given back
	// ([Policy.ReturnLeases]): a request that took the replaced Policy
	// before the swap must have finished its decision by then (the
	// caller's deadline bounds it). Zero means DefaultRetireAfter;
	// negative never gives them back (their units stay counted in the
	// store until they expire).
	RetireAfter time.Duration
	// LeaseClock stamps those returns (the decisions' clock). Nil means
	// Clock.
	LeaseClock limiter.Clock
	// Log, when not nil, gets a debug line for each reload that kept the
	// current Policy, an info line for each replacement, and a line for
	// each replaced Policy's return (warn when a write failed).
	Log *slog.Logger
}

// Cache holds a Policy loaded from a slow source and reloads it in the
// background once its TTL has passed (the system-design seed's "rules in a
// database, cached in memory with a TTL"). A request never waits for a
// reload: it uses the last Policy loaded. A reload that reads what the
// current Policy was built from keeps it (see [Read]); one that reads new
// rules replaces it and, RetireAfter later, gives back the replaced
// Policy's capacity leases. A failed reload keeps the previous Policy and
// is retried after another TTL. Safe for concurrent use.
type Cache struct {
	read Reader
	cfg  CacheConfig

	cur     atomic.Pointer[Policy]
	expires atomic.Int64 // Unix ns after which a reload starts
	mu      sync.Mutex
	loading bool
	// retiring holds the replaced Policies whose leases are still to be
	// given back, with their timers (under mu).
	retiring map[*Policy]*time.Timer
	// refresh serializes Refresh; doc is the current Policy's Read.Doc.
	refresh sync.Mutex
	doc     any
	stats   struct {
		loads, unchanged, failures, retired, retireErrors, returned, lost atomic.Int64
	}
	wg sync.WaitGroup
}

// NewCache loads the first Policy synchronously (an error is returned, so
// that invalid rules fail at start-up) and returns the cache. Every reload
// of load builds a new Policy; [NewReaderCache] keeps the current one when
// the rules did not change.
func NewCache(ctx context.Context, load Loader, cfg CacheConfig) (*Cache, error) {
	if load == nil {
		return nil, errors.New("policy: cache: nil loader")
	}
	return NewReaderCache(ctx, func(ctx context.Context) (Read, error) {
		p, err := load(ctx)
		return Read{Build: func() (*Policy, error) { return p, err }}, nil
	}, cfg)
}

// NewReaderCache is NewCache for a Reader: a reload whose Read.Doc is the
// current Policy's keeps that Policy.
func NewReaderCache(ctx context.Context, read Reader, cfg CacheConfig) (*Cache, error) {
	if read == nil {
		return nil, errors.New("policy: cache: nil reader")
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
	if cfg.LeaseClock == nil {
		cfg.LeaseClock = cfg.Clock
	}
	if cfg.RetireAfter == 0 {
		cfg.RetireAfter = DefaultRetireAfter
	}
	c := &Cache{read: read, cfg: cfg, retiring: map[*Policy]*time.Timer{}}
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
		c.stats.failures.Add(1)
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

// Refresh reads the rules now. When they are what the current Policy was
// built from, it keeps that Policy; otherwise it builds them and, on
// success, makes the new Policy current and schedules the return of the
// replaced one's leases.
func (c *Cache) Refresh(ctx context.Context) error {
	c.refresh.Lock()
	defer c.refresh.Unlock()
	r, err := c.read(ctx)
	if err != nil {
		return err
	}
	if r.Doc != nil && c.cur.Load() != nil && reflect.DeepEqual(r.Doc, c.doc) {
		c.stats.unchanged.Add(1)
		c.expires.Store(c.cfg.Clock.Now().Add(c.cfg.TTL).UnixNano())
		if c.cfg.Log != nil {
			c.cfg.Log.Debug("rules unchanged; the policy is kept")
		}
		return nil
	}
	if r.Build == nil {
		return errors.New("policy: cache: reader returned no build")
	}
	p, err := r.Build()
	if err == nil && p == nil {
		err = errors.New("policy: cache: loader returned no policy")
	}
	if err != nil {
		return err
	}
	old := c.cur.Swap(p)
	c.doc = r.Doc
	c.stats.loads.Add(1)
	c.expires.Store(c.cfg.Clock.Now().Add(c.cfg.TTL).UnixNano())
	if old != nil && old != p {
		if c.cfg.Log != nil {
			c.cfg.Log.Info("rules changed; the policy is replaced", "retire_after", c.cfg.RetireAfter.String())
		}
		c.retire(old)
	}
	return nil
}

// retire schedules the return of old's leases, RetireAfter from now.
func (c *Cache) retire(old *Policy) {
	if c.cfg.RetireAfter < 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wg.Add(1)
	c.retiring[old] = time.AfterFunc(c.cfg.RetireAfter, func() {
		c.mu.Lock()
		_, ok := c.retiring[old]
		delete(c.retiring, old)
		c.mu.Unlock()
		if !ok {
			return // ReturnLeases took it
		}
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LoadTimeout)
		defer cancel()
		c.giveBack(ctx, old, c.cfg.LeaseClock.Now()) //nolint:errcheck // counted and logged
	})
}

// giveBack returns p's leases at now and counts the outcome.
func (c *Cache) giveBack(ctx context.Context, p *Policy, now time.Time) error {
	before := p.leaseTotals()
	err := p.ReturnLeases(ctx, now)
	after := p.leaseTotals()
	returned, lost := after.Returned-before.Returned, after.Lost-before.Lost
	c.stats.returned.Add(returned)
	c.stats.lost.Add(lost)
	if err != nil {
		c.stats.retireErrors.Add(1)
	} else {
		c.stats.retired.Add(1)
	}
	if c.cfg.Log != nil {
		if err != nil {
			c.cfg.Log.Warn("returning the replaced policy's leases failed; their units stay counted until they expire",
				"returned_units", returned, "lost_units", lost, "error", err.Error())
		} else {
			c.cfg.Log.Info("the replaced policy's leases were given back", "returned_units", returned)
		}
	}
	return err
}

// leaseTotals sums the lease counters of every rule of p.
func (p *Policy) leaseTotals() limiter.LeaseStats {
	var s limiter.LeaseStats
	for _, r := range p.rules {
		r.eachLimit(func(l limiter.Limiter) {
			if ls, ok := l.(interface{ LeaseStats() limiter.LeaseStats }); ok {
				s = s.Add(ls.LeaseStats())
			}
		})
	}
	return s
}

// ReturnLeases gives back, at now, the leases of the replaced Policies
// still waiting for their return, then the current Policy's: for a process
// about to stop (as [Policy.ReturnLeases]).
func (c *Cache) ReturnLeases(ctx context.Context, now time.Time) error {
	c.mu.Lock()
	var pending []*Policy
	for p, t := range c.retiring {
		t.Stop()
		pending = append(pending, p)
	}
	clear(c.retiring)
	c.mu.Unlock()
	var errs []error
	for _, p := range pending {
		errs = append(errs, c.giveBack(ctx, p, now))
		c.wg.Done()
	}
	errs = append(errs, c.cur.Load().ReturnLeases(ctx, now))
	return errors.Join(errs...)
}

// Wait waits for a running background reload and the pending returns of
// replaced Policies' leases (RetireAfter each) to finish (for tests and
// shutdown).
func (c *Cache) Wait() { c.wg.Wait() }

// CacheStats counts a cache's loads.
type CacheStats struct {
	Loads     int64 // Policies built and made current, the first included
	Unchanged int64 // reloads that read the current rules and kept the Policy
	Failures  int64 // failed background reloads
	// Retired counts the replaced Policies whose leases were given back,
	// RetireErrors those where a return failed; ReturnedUnits and
	// LostUnits are the unspent units their returns gave back and did
	// not (limiter.LeaseStats).
	Retired, RetireErrors    int64
	ReturnedUnits, LostUnits int64
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	return CacheStats{
		Loads: c.stats.loads.Load(), Unchanged: c.stats.unchanged.Load(), Failures: c.stats.failures.Load(),
		Retired: c.stats.retired.Load(), RetireErrors: c.stats.retireErrors.Load(),
		ReturnedUnits: c.stats.returned.Load(), LostUnits: c.stats.lost.Load(),
	}
}
