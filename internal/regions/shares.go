package regions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("regions: invalid configuration")

// Config configures a limit of Limit units per Window shared by Regions
// regions.
type Config struct {
	Regions int
	Limit   int64
	Window  time.Duration
	// SubWindows and Leases configure each region's windows (see
	// limiter.SlidingWindowConfig; sub-window counters).
	SubWindows int
	Leases     bool
}

// Allocation tuning.
const (
	// minWeight is the least share of the demand a region is counted
	// with, so that a region with no demand yet keeps a little.
	minWeight = 0.01
	// hysteresis is the least surplus worth a grant, as a share of the
	// region's target, and at least minSurplus of the limit.
	hysteresis = 0.1
	minSurplus = 0.01
	// giveEvery, in windows, is the least time between a region's grants:
	// every share a region held bounds it for a window after, so shares
	// that change often bound it by their least.
	giveEvery = 0.5
	// demandWeight is the weight of a tick's rate in the demand estimate.
	demandWeight = 0.25
)

func (c Config) validate() error {
	if c.Regions < 2 || c.Limit < int64(c.Regions) || c.Window <= 0 || c.SubWindows < 1 {
		return fmt.Errorf("%w: %d regions, limit %d, window %v, %d sub-windows", ErrInvalidConfig, c.Regions, c.Limit, c.Window, c.SubWindows)
	}
	return nil
}

// State is a region's ledger entry, written by that region only.
type State struct {
	// Demand is the units a second its callers asked for, recently.
	Demand float64 `json:"d"`
	// Given is the units it gave each region so far: running totals,
	// never decreasing.
	Given []int64 `json:"g"`
	// Seq numbers its publications.
	Seq int64 `json:"n"`
}

// Ledger publishes a region's state and reads the other regions' as the
// region's own replica holds them (a lag old).
type Ledger interface {
	Publish(ctx context.Context, region int, st State) error
	Read(ctx context.Context, region int) (State, bool, error)
}

// base is region r's share before any grant: the limit split evenly.
func (c Config) base(r int) int64 {
	b := c.Limit / int64(c.Regions)
	if int64(r) < c.Limit%int64(c.Regions) {
		b++
	}
	return b
}

// share is region r's share from states (each region's, as read by the
// one computing): its base, less what it gave, plus what the others gave
// it.
func (c Config) share(r int, states []State) int64 {
	s := c.base(r)
	for o, st := range states {
		if o == r {
			for _, g := range st.Given {
				s -= g
			}
		} else if r < len(st.Given) {
			s += st.Given[r]
		}
	}
	return s
}

// targets are the shares the regions' demands call for.
func (c Config) targets(states []State) []float64 {
	var total float64
	for _, st := range states {
		total += st.Demand
	}
	floor := max(total*minWeight, 1e-9)
	w := make([]float64, len(states))
	var sum float64
	for i, st := range states {
		w[i] = max(st.Demand, floor)
		sum += w[i]
	}
	for i := range w {
		w[i] = float64(c.Limit) * w[i] / sum
	}
	return w
}

// plan is what region r gives each region now (nil: nothing): its
// surplus over its target, to the regions short of theirs as r sees them,
// in proportion to what they lack. It never gives more than r's share.
func (c Config) plan(r int, states []State) []int64 {
	tg := c.targets(states)
	surplus := float64(c.share(r, states)) - tg[r]
	if surplus < max(hysteresis*tg[r], minSurplus*float64(c.Limit)) {
		return nil
	}
	lack := make([]float64, len(states))
	var total float64
	for o := range states {
		if o != r {
			lack[o] = max(tg[o]-float64(c.share(o, states)), 0)
			total += lack[o]
		}
	}
	if total < 1 {
		return nil
	}
	give := min(surplus, total)
	out := make([]int64, len(states))
	any := false
	for o := range out {
		out[o] = int64(give * lack[o] / total)
		any = any || out[o] > 0
	}
	if !any {
		return nil
	}
	return out
}

// Agent is a region's share keeper: it estimates the region's demand,
// reads the other regions' ledger entries, gives surplus away and
// publishes its own entry (Tick, every few hundred milliseconds), and
// knows the shares in force for the region's limiters. Safe for
// concurrent use.
type Agent struct {
	cfg     Config
	r       int
	ledger  Ledger
	offered atomic.Int64

	mu     sync.Mutex
	states []State
	last   time.Time
	gave   time.Time // the last grant
	shares []inForce // the current one last
	stats  AgentStats
}

// inForce is a share and when it stopped being current (zero: it is).
type inForce struct {
	share int64
	until time.Time
}

// AgentStats counts an agent's work.
type AgentStats struct {
	Ticks, Grants, Published, ReadErrors, PublishErrors int64
	// Given is the units it gave away; Share the current share.
	Given, Share int64
}

// NewAgent returns region's agent, holding the base share.
func NewAgent(cfg Config, region int, ledger Ledger) (*Agent, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if region < 0 || region >= cfg.Regions || ledger == nil {
		return nil, fmt.Errorf("%w: region %d of %d, ledger %v", ErrInvalidConfig, region, cfg.Regions, ledger)
	}
	a := &Agent{cfg: cfg, r: region, ledger: ledger, states: make([]State, cfg.Regions)}
	for i := range a.states {
		a.states[i].Given = make([]int64, cfg.Regions)
	}
	a.shares = []inForce{{share: cfg.base(region)}}
	return a, nil
}

// Tick runs one round at now: demand, read, give, publish. A grant lowers
// the region's share before it is published; a share raised by a grant
// read takes effect at once, bounded by the older shares for a window.
func (a *Agent) Tick(ctx context.Context, now time.Time) error {
	read := make([]State, a.cfg.Regions)
	ok := make([]bool, a.cfg.Regions)
	var firstErr error
	for o := range read {
		if o == a.r {
			continue
		}
		st, found, err := a.ledger.Read(ctx, o)
		if err != nil {
			a.count(func(s *AgentStats) { s.ReadErrors++ })
			firstErr = cmpErr(firstErr, err)
			continue
		}
		ok[o] = found && len(st.Given) == a.cfg.Regions
		read[o] = st
	}

	a.mu.Lock()
	a.stats.Ticks++
	offered := a.offered.Swap(0)
	if !a.last.IsZero() && now.After(a.last) {
		rate := float64(offered) / now.Sub(a.last).Seconds()
		own := &a.states[a.r]
		own.Demand = (1-demandWeight)*own.Demand + demandWeight*rate
		if a.stats.Ticks == 2 {
			own.Demand = rate
		}
	}
	a.last = now
	for o := range read {
		// A region's entries replicate in order, but never step back.
		if ok[o] && read[o].Seq >= a.states[o].Seq {
			a.states[o] = read[o]
		}
	}
	if now.Sub(a.gave) < time.Duration(giveEvery*float64(a.cfg.Window)) {
		// Not yet: the last grant's new share still settles.
	} else if g := a.cfg.plan(a.r, a.states); g != nil {
		a.gave = now
		a.stats.Grants++
		for o, u := range g {
			a.states[a.r].Given[o] += u
			a.stats.Given += u
		}
	}
	a.setShare(now, a.cfg.share(a.r, a.states))
	a.states[a.r].Seq++
	own := a.states[a.r]
	own.Given = slices.Clone(own.Given)
	a.mu.Unlock()

	if err := a.ledger.Publish(ctx, a.r, own); err != nil {
		// Published at a later tick: the grant is already out of this
		// region's share, so a late publication only delays it.
		a.count(func(s *AgentStats) { s.PublishErrors++ })
		return cmpErr(firstErr, err)
	}
	a.count(func(s *AgentStats) { s.Published++ })
	return firstErr
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func (a *Agent) count(f func(*AgentStats)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(&a.stats)
}

// keep is how long a share that stopped being current still bounds the
// region: a window and a sub-window (what a bounded window counts).
func (a *Agent) keep() time.Duration {
	return a.cfg.Window + a.cfg.Window/time.Duration(a.cfg.SubWindows)
}

// setShare makes s the current share at now. a.mu is held.
func (a *Agent) setShare(now time.Time, s int64) {
	a.stats.Share = s
	cur := &a.shares[len(a.shares)-1]
	if cur.share == s {
		return
	}
	cur.until = now
	a.shares = append(a.shares, inForce{share: s})
	keep := a.shares[:0]
	for _, f := range a.shares {
		if f.until.IsZero() || now.Sub(f.until) < a.keep() {
			keep = append(keep, f)
		}
	}
	a.shares = keep
}

// InForce returns the shares bounding a decision at now: the current
// one and those replaced within a window and a sub-window.
func (a *Agent) InForce(now time.Time) []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []int64
	for _, f := range a.shares {
		if (f.until.IsZero() || now.Sub(f.until) < a.keep()) && !slices.Contains(out, f.share) {
			out = append(out, f.share)
		}
	}
	return out
}

// Stats returns the agent's counts.
func (a *Agent) Stats() AgentStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// Limiter is one process's limiter of its region's share: a decision is
// allowed when every share in force allows it, each a sliding window of
// its own (the share is its limit) on the region's store, decided in one
// [limiter.Decide]. Safe for concurrent use.
type Limiter struct {
	a     *Agent
	store storage.Counter
	name  string

	mu      sync.Mutex
	windows map[int64]*limiter.SlidingWindow
}

// NewLimiter returns a limiter of the agent's region on store (a
// process's own), its windows named name.
func (a *Agent) NewLimiter(store storage.Counter, name string) *Limiter {
	return &Limiter{a: a, store: store, name: name, windows: map[int64]*limiter.SlidingWindow{}}
}

func (l *Limiter) window(share int64) (*limiter.SlidingWindow, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.windows[share]; w != nil {
		return w, nil
	}
	c := l.a.cfg
	w, err := limiter.NewSlidingWindow(l.store, limiter.SlidingWindowConfig{Name: l.name, Limit: share, Window: c.Window,
		SubWindows: c.SubWindows, Representation: limiter.SubWindowCounters, Leases: c.Leases})
	if err != nil {
		return nil, err
	}
	l.windows[share] = w
	return w, nil
}

// AllowN decides n units of key at now against the shares in force, on
// the region's own item of the key (key@region: no other region writes
// it, so last-writer-wins never replaces its counts).
func (l *Limiter) AllowN(ctx context.Context, key string, now time.Time, n int64) (limiter.Decision, error) {
	l.a.offered.Add(n)
	key += "@" + strconv.Itoa(l.a.r)
	shares := l.a.InForce(now)
	items := make([]limiter.Item, 0, len(shares))
	for _, s := range shares {
		if s < n {
			return limiter.Decision{Limit: max(s, 0)}, nil // a share too small for the call: denied
		}
		w, err := l.window(s)
		if err != nil {
			return limiter.Decision{}, err
		}
		items = append(items, limiter.Item{Limit: w, Key: key, N: n})
	}
	out := make([]limiter.Outcome, len(items))
	i, err := limiter.Decide(ctx, now, items, out)
	if err != nil {
		return limiter.Decision{}, err
	}
	if i < 0 {
		return limiter.Decision{}, fmt.Errorf("regions: no item decided %q", key)
	}
	return out[i].Decision, nil
}

// Refund gives nothing back: the shares in force, and so the windows
// that counted the units, may have changed since they were taken. A lost
// refund under-admits until the units leave the window; it never
// over-admits.
func (l *Limiter) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	return nil
}

var _ limiter.Limiter = (*Limiter)(nil)
