package regions

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/lru"
	"github.com/sluicehq/sluice/limiter"
)

// KeysConfig configures [Keys]: one limit's regional shares for every key
// a process decides.
type KeysConfig struct {
	// Config is the limit (its Key is unused: each key is its own).
	Config Config
	// Table places the keys' items (its Name is unused: key k's items
	// are named ItemPrefix() + k).
	Table Table
	// Prefix names the limit's keys in the table and the store (the
	// limit's name and a separator), so that two limits never share a
	// key; ItemPrefix adds the limit's parameters.
	Prefix string
	// Names, if set, are the regions in their order (SLUICE_REGIONS):
	// Config.Regions of them, region r the r-th. The order names whose
	// share each item holds, so it is in ItemPrefix's tag: regions that
	// list the regions in other orders (a reordered list deployed one
	// region at a time) share no item, where they would read one
	// another's shares as their own.
	Names []string
	// Store is the region's store (a storage.Counter for a window, a
	// storage.BucketStore for a bucket), for the processes and the agents.
	Store any
	// Holder names this process in the agent role it takes.
	Holder string
	// MaxKeys bounds the keys held (least recently decided dropped
	// first; default DefaultMaxKeys).
	MaxKeys int
	// Tick is how often the holder of a key's agent role ticks it
	// (default 250 ms).
	Tick time.Duration
	// SweepEvery is how often a process sweeps in line with its
	// decisions (Sweep: the other regions' wants indexes read, the keys
	// they list ticked here; default Tick).
	SweepEvery time.Duration
	// SweepDeadline bounds each index read, prune and tick of a sweep
	// run in line with a decision (default half the table's Deadline;
	// the keeper's have the Deadline), so that a key whose
	// requests do not answer, ticked by the sweep, holds the decision of
	// another key that ran it for about SweepDeadline, not its whole
	// deadline.
	SweepDeadline time.Duration
	// SweepKeys bounds the keys a sweep ticks (those ticked longest ago
	// first; default 64).
	SweepKeys int
	// WantsLife is how long a key's listing in its region's wants index
	// stays in force after it was last written (default 15 s): a short
	// region lists its key again every third of it, and the other
	// regions stop ticking a key whose listing is older (its region no
	// longer decides it), which this region's sweeps then remove.
	WantsLife time.Duration
	// Report, when not nil, is given the limit's counts in this process
	// every ReportEvery (default a minute), in line with a decision or a
	// sweep (no goroutine), and at Flush.
	Report      func(now time.Time, c Counts)
	ReportEvery time.Duration
}

// Keys defaults.
const (
	DefaultMaxKeys = 10000
	defaultTick    = 250 * time.Millisecond
)

// Keys is a process's limiter of one limit kept as regional shares, for
// any key: per key, a [Process] and a table agent ([NewTableAgent]) that
// the process runs in line with its decisions, with no goroutine of its
// own (a Lambda container is frozen between invocations): a decision of
// key k, when a tick of k's agent is due, ticks it alongside the decision
// and returns only once both have ended. The process that holds k's
// agent role ticks every Tick; another tries to take the role only when
// the entry its process read says the holder stopped publishing (its
// publication plus the table's LockLife has passed), so a region's active
// keys cost no reads beyond their processes' and one holder's. A
// decision in a process that finds no entry valid runs that tick beside
// it and reads again while it runs (a take publishes the predecessor's
// entry again; a new key's first tick, the region's base share).
//
// A region short of k lists k in its wants index (wants.go); the other
// regions tick their agents of the keys listed there (Sweep), in line
// with decisions of any key (every SweepEvery) or from a keeper
// ([Keeper]), so that a region where nobody decides k still gives its
// share of k away (docs/regions.md, "A rule's scope"). Safe for
// concurrent use.
type Keys struct {
	cfg KeysConfig

	mu   sync.Mutex
	keys map[string]*keyShare
	lru  lru.List[keyShare, *keyShare]

	sweep  sweeper // sweep.go
	counts counter // counts.go

	// brokenExpiry (tests): listings never go out of force, and none is
	// pruned.
	brokenExpiry bool
}

// keyShare is one key's process and agent.
type keyShare struct {
	lru.Links[keyShare]
	key   string
	proc  *Process
	agent *Agent

	ticking sync.Mutex // one tick at a time
	mu      sync.Mutex
	tried   int64 // stamp of the last tick tried (0: none)
}

// NewKeys returns the limiter of cfg.
func NewKeys(cfg KeysConfig) (*Keys, error) {
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.Tick <= 0 {
		cfg.Tick = defaultTick
	}
	cfg.SweepEvery = orDefault(cfg.SweepEvery, cfg.Tick)
	if cfg.SweepKeys <= 0 {
		cfg.SweepKeys = defaultSweepKeys
	}
	cfg.WantsLife = orDefault(cfg.WantsLife, DefaultWantsLife)
	cfg.ReportEvery = orDefault(cfg.ReportEvery, DefaultReportEvery)
	cfg.Table = cfg.Table.withDefaults()
	cfg.SweepDeadline = orDefault(cfg.SweepDeadline, cfg.Table.Deadline/2)
	if cfg.Prefix == "" || cfg.Holder == "" {
		return nil, fmt.Errorf("%w: keys need a prefix and a holder", ErrInvalidConfig)
	}
	if len(cfg.Names) > 0 && len(cfg.Names) != cfg.Config.Regions {
		return nil, fmt.Errorf("%w: %d regions named (%v) for %d regions", ErrInvalidConfig, len(cfg.Names), cfg.Names, cfg.Config.Regions)
	}
	// Check the limit and the table once, on a key of the limit's own.
	if _, err := cfg.newKey(cfg.Prefix); err != nil {
		return nil, err
	}
	k := &Keys{cfg: cfg, keys: map[string]*keyShare{}}
	k.lru.Init()
	return k, nil
}

// newKey makes key k's process and agent.
func (c *KeysConfig) newKey(k string) (*keyShare, error) {
	lc, t := c.Config, c.Table
	prefix := c.ItemPrefix()
	lc.Key, t.Name = prefix+k, prefix+k
	p, err := NewProcess(lc, t, c.Store)
	if err != nil {
		return nil, err
	}
	a, err := NewTableAgent(lc, t, c.Holder, c.Store)
	if err != nil {
		return nil, err
	}
	a.tbl.wants = &wantsRef{client: t.Client, table: t.Table, prefix: prefix, key: k, region: t.Region, life: c.WantsLife}
	return &keyShare{key: k, proc: p, agent: a}, nil
}

// ItemPrefix begins the names of the limit's items in the table and the
// store (key k's are regions/<ItemPrefix><k>/<r>, and its processes'
// counters ItemPrefix + k) and names its wants index
// (regions/<ItemPrefix>/wants/<r>/index): Prefix, then a tag of the
// limit's parameters and the regions' names in their order (paramsTag)
// and ':'. Two Keys of one Prefix whose
// limits differ (a rules reload that changed a global limit keeps the
// replaced policy's Keys beside the new one for seconds, and regions
// reload at different times) then share no item: each ticks only the
// keys listed by regions on its own parameters, with the shares those
// divide (docs/regions.md, "Rules reloads").
func (c KeysConfig) ItemPrefix() string {
	if brokenParamsTag {
		return c.Prefix
	}
	names := c.Names
	if brokenNamesTag {
		names = nil
	}
	return c.Prefix + c.Config.paramsTag(names) + ":"
}

// paramsTag names what c's shares divide and how (the regions, their
// names in order if given, and the window's or the bucket's numbers; not
// Leases, Skew or Offers, which regions may set apart) in 8 hex digits
// of FNV-1a: a change of any of them names other items, the same numbers
// the same ones in every region.
func (c Config) paramsTag(names []string) string {
	h := fnv.New32a()
	if b := c.Bucket; b != nil {
		fmt.Fprintf(h, "bucket:%d:%d:%d:%d", c.Regions, b.MaxAmount, int64(b.RefillTime), b.RefillAmount)
	} else {
		fmt.Fprintf(h, "window:%d:%d:%d:%d", c.Regions, c.Limit, int64(c.Window), c.SubWindows)
	}
	if len(names) > 0 {
		fmt.Fprintf(h, ":%s", strings.Join(names, ","))
	}
	return fmt.Sprintf("%08x", h.Sum32())
}

// brokenParamsTag (tests): the items are named by Prefix alone, as
// before, so Keys of other parameters share them. brokenNamesTag
// (tests): the regions' names are left out of the tag, so regions that
// order them differently share items.
var (
	brokenParamsTag = false
	brokenNamesTag  = false
)

// Len returns the number of keys held.
func (k *Keys) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.keys)
}

// get returns key's share, made on first use, dropping the least recent
// key beyond MaxKeys (its agent role, if held, lapses and another process
// of the region takes it).
func (k *Keys) get(key string) (*keyShare, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ks := k.keys[key]; ks != nil {
		k.lru.MoveToFront(ks)
		return ks, nil
	}
	ks, err := k.cfg.newKey(key)
	if err != nil {
		return nil, err
	}
	k.keys[key] = ks
	k.lru.PushFront(ks)
	for len(k.keys) > k.cfg.MaxKeys {
		old := k.lru.Back()
		k.lru.Remove(old)
		delete(k.keys, old.key)
	}
	return ks, nil
}

// AllowN decides n units of key at now (the wall clock) against the
// region's share of it, ticking key's agent alongside when a tick is due.
func (k *Keys) AllowN(ctx context.Context, key string, now time.Time, n int64) (limiter.Decision, error) {
	ks, err := k.get(key)
	if err != nil {
		return limiter.Decision{}, err
	}
	t := now.UnixNano()
	if k.sweepDue(t) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			k.sweepBy(ctx, now, k.cfg.SweepDeadline) //nolint:errcheck // counted in its stats; the next sweep reads again
		}()
		defer func() { <-done }()
	}
	due, valid := k.due(ks, t)
	if due && ks.ticking.TryLock() {
		ks.mu.Lock()
		ks.tried = t
		ks.mu.Unlock()
		if !valid && ks.proc.t.brokenLapse {
			// The decision needs the entry the tick may publish.
			k.tick(ctx, ks, now) //nolint:errcheck // counted; the decision reads what is there
			ks.ticking.Unlock()
		} else {
			// A decision without an entry valid at its stamp reads
			// again while the tick runs (Process.current) rather than
			// after it: a take publishes the entry again at its first
			// write (Table.extend), long before the tick's save.
			done := make(chan struct{})
			go func() {
				defer close(done)
				defer ks.ticking.Unlock()
				k.tick(ctx, ks, now) //nolint:errcheck // counted; the next tick resumes
			}()
			defer func() { <-done }()
		}
	}
	d, err := ks.proc.AllowN(ctx, ks.proc.cfg.Key, now, n)
	if err == nil && !d.Allowed {
		ks.agent.tbl.denied.Add(n) // the share bound: see Agent.short
	}
	if errors.Is(err, ErrStale) {
		k.count(Counts{Stale: 1})
	}
	k.reportDue(now)
	return d, err
}

// due reports whether a tick of ks's agent is due at t (the holder's
// every Tick; another process's when its entry shows no publication for
// LockLife, at most every Tick), and whether the process holds an entry
// valid at t.
func (k *Keys) due(ks *keyShare, t int64) (due, valid bool) {
	p := ks.proc
	p.mu.Lock()
	e, has := p.entry, p.has
	p.mu.Unlock()
	valid = has && t < e.Until
	ks.mu.Lock()
	tried := ks.tried
	ks.mu.Unlock()
	if tried != 0 && t-tried < int64(k.cfg.Tick) {
		return false, valid
	}
	if ks.agent.Holds() || !has {
		return true, valid
	}
	published := e.Until - int64(k.cfg.Table.Validity)
	return t >= published+int64(k.cfg.Table.LockLife), valid
}

// Refund gives nothing back (see Limiter.Refund).
func (k *Keys) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	return nil
}

var _ limiter.Limiter = (*Keys)(nil)

// KeyStats are a key's counts in this process: its process's, and its
// agent's (whether it held the role at its last tick).
type KeyStats struct {
	Process ProcessStats
	Agent   AgentStats
	Table   TableStats
	Wants   WantsStats
	Holds   bool
}

// Stats returns the counts of key in this process (false: not held).
func (k *Keys) Stats(key string) (KeyStats, bool) {
	k.mu.Lock()
	ks := k.keys[key]
	k.mu.Unlock()
	if ks == nil {
		return KeyStats{}, false
	}
	return KeyStats{Process: ks.proc.Stats(), Agent: ks.agent.Stats(), Table: ks.agent.TableStats(), Wants: ks.agent.WantsStats(), Holds: ks.agent.Holds()}, true
}

// leasers returns the limiters of the keys held whose capacity leases
// the processes may hold: each process's window, or its buckets.
func (k *Keys) leasers() []interface {
	ReturnLeases(context.Context, time.Time) error
	LeaseStats() limiter.LeaseStats
} {
	k.mu.Lock()
	shares := make([]*keyShare, 0, len(k.keys))
	for _, ks := range k.keys {
		shares = append(shares, ks)
	}
	k.mu.Unlock()
	var ls []interface {
		ReturnLeases(context.Context, time.Time) error
		LeaseStats() limiter.LeaseStats
	}
	for _, ks := range shares {
		p := ks.proc
		if p.w != nil {
			ls = append(ls, p.w)
			continue
		}
		p.mu.Lock()
		for _, tb := range p.buckets {
			ls = append(ls, tb)
		}
		p.mu.Unlock()
	}
	return ls
}

// ReturnLeases gives back, at now, the unspent units of the capacity
// leases the processes of the keys held took on the region's share
// (waiting for the writes): for a process about to stop, or a limit no
// policy decides any more. The keys stay usable.
func (k *Keys) ReturnLeases(ctx context.Context, now time.Time) error {
	var errs []error
	for _, l := range k.leasers() {
		errs = append(errs, l.ReturnLeases(ctx, now))
	}
	return errors.Join(errs...)
}

// LeaseStats sums the lease counters of the keys held (those of keys
// dropped, MaxKeys, and of buckets' replaced items are not counted).
func (k *Keys) LeaseStats() limiter.LeaseStats {
	var s limiter.LeaseStats
	for _, l := range k.leasers() {
		s = s.Add(l.LeaseStats())
	}
	return s
}
