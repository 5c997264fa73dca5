package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// Priority ranks traffic for the load shedders: the higher, the more
// important. The zero value is PriorityNormal.
type Priority int8

const (
	// PriorityLow is shed first (Stripe's test-mode and analytics traffic).
	PriorityLow Priority = -1
	// PriorityNormal is the default.
	PriorityNormal Priority = 0
	// PriorityHigh is shed last among non-critical traffic.
	PriorityHigh Priority = 1
	// PriorityCritical is never shed (Stripe's charges: the traffic that
	// moves money).
	PriorityCritical Priority = 2
)

// String returns "low", "normal", "high" or "critical".
func (p Priority) String() string {
	switch p {
	case PriorityLow:
		return "low"
	case PriorityNormal:
		return "normal"
	case PriorityHigh:
		return "high"
	case PriorityCritical:
		return "critical"
	}
	return "priority(" + strconv.Itoa(int(p)) + ")"
}

// UnmarshalText parses the names String returns; "" is PriorityNormal.
func (p *Priority) UnmarshalText(text []byte) error {
	switch s := string(text); s {
	case "low":
		*p = PriorityLow
	case "normal", "":
		*p = PriorityNormal
	case "high":
		*p = PriorityHigh
	case "critical":
		*p = PriorityCritical
	default:
		return fmt.Errorf("%w: unknown priority %q (want low, normal, high or critical)", ErrInvalidConfig, s)
	}
	return nil
}

// valid reports whether p is one of the four priorities.
func (p Priority) valid() bool { return p >= PriorityLow && p <= PriorityCritical }

// defaultShedRetryAfter is the RetryAfter of a shedding decision when the
// shedder's configuration gives none.
const defaultShedRetryAfter = time.Second

// FleetShedderConfig configures a [FleetShedder].
type FleetShedderConfig struct {
	// Name identifies the shedder in decisions and metrics, and names its
	// one global key. Empty means "fleet".
	Name string
	// Capacity is the number of requests the fleet can serve at once (1 to
	// MaxLeases).
	Capacity int64
	// Reserve is the share of Capacity kept for critical traffic, in
	// [0, 1): non-critical requests are shed once non-critical requests
	// hold Capacity*(1-Reserve) slots (rounded down, at least 1).
	Reserve float64
	// Shares optionally lowers the share of Capacity a non-critical
	// priority may fill before it is shed, so lower priorities are shed
	// first: with {Low: 0.5, Normal: 0.7}, low-priority requests are shed
	// once non-critical traffic holds half the capacity, normal ones at
	// 70%, high ones at 1-Reserve. Shares must not exceed 1-Reserve and
	// must not decrease with priority.
	Shares map[Priority]float64
	// LeaseTTL bounds how long a request holds its slot when its release
	// is lost (see [ConcurrencyConfig]).
	LeaseTTL time.Duration
	// RetryAfter is the RetryAfter of a shedding decision. Zero means one
	// second.
	RetryAfter time.Duration
	// NewID makes lease IDs (see [ConcurrencyConfig]).
	NewID func() string
}

// FleetShedder is Stripe's fleet-usage load shedder: a concurrency limit on
// one global key that keeps a share of the fleet for critical traffic.
// Non-critical requests take a lease on the global key and are shed
// (Decision.Allowed false, which callers answer with 503) once the
// non-critical leases reach their priority's share of the capacity.
// Critical requests are never shed and never touch the store, so no amount
// of non-critical traffic, and no store failure, can refuse them.
//
// Leases work as in [Concurrency]: release them when the request is done;
// a lost release frees its slot after LeaseTTL. A FleetShedder is safe for
// concurrent use; its zero value is not usable: use [NewFleetShedder].
type FleetShedder struct {
	cc         *Concurrency
	capacity   int64
	limits     [PriorityCritical - PriorityLow]int64 // by priority - PriorityLow
	retryAfter time.Duration
}

// fleetKey is the caller's key of the one global lease set.
const fleetKey = "fleet"

// NewFleetShedder returns a fleet-usage shedder on store, or an error
// wrapping [ErrInvalidConfig] naming the bad field.
func NewFleetShedder(store storage.LeaseStore, cfg FleetShedderConfig) (*FleetShedder, error) {
	const kind = "fleet shedder"
	if cfg.Name == "" {
		cfg.Name = "fleet"
	}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = defaultShedRetryAfter
	}
	switch {
	case !(cfg.Reserve >= 0 && cfg.Reserve < 1):
		return nil, configError(kind, cfg.Name, "reserve", "must be in [0, 1), got %v", cfg.Reserve)
	case cfg.RetryAfter < 0:
		return nil, configError(kind, cfg.Name, "retry after", "must not be negative, got %v", cfg.RetryAfter)
	}
	cc, err := NewConcurrency(store, ConcurrencyConfig{Name: cfg.Name, Capacity: cfg.Capacity, LeaseTTL: cfg.LeaseTTL, NewID: cfg.NewID})
	if err != nil {
		return nil, err
	}
	f := &FleetShedder{cc: cc, capacity: cfg.Capacity, retryAfter: cfg.RetryAfter}
	top := 1 - cfg.Reserve
	prev := 0.0
	for p := PriorityLow; p < PriorityCritical; p++ {
		share, ok := cfg.Shares[p]
		if !ok {
			share = top
		}
		if !(share > 0 && share <= top+1e-12) || share < prev {
			return nil, configError(kind, cfg.Name, "shares", "share of %v is %v: shares must be in (0, 1-reserve = %v] and must not decrease with priority", p, share, top)
		}
		prev = share
		f.limits[p-PriorityLow] = max(int64(math.Floor(share*float64(cfg.Capacity)+1e-9)), 1)
	}
	for p := range cfg.Shares {
		if !p.valid() || p == PriorityCritical {
			return nil, configError(kind, cfg.Name, "shares", "share for %v: only low, normal and high traffic has a share", p)
		}
	}
	return f, nil
}

// Limit returns the number of slots non-critical traffic may hold before
// requests of priority p are shed (0 for critical traffic, which is not
// counted).
func (f *FleetShedder) Limit(p Priority) int64 {
	if p >= PriorityCritical {
		return 0
	}
	return f.limits[max(p, PriorityLow)-PriorityLow]
}

// Acquire decides whether a request of priority p may proceed at now. A
// critical request is always allowed with a zero Lease and no store call
// (its decision reports Limit and Remaining as the whole Capacity: critical
// traffic is not counted). A non-critical request is allowed with a Lease if
// fewer than Limit(p) non-critical leases are live; otherwise it is shed:
// Allowed is false and RetryAfter the configured hint. Priorities below
// PriorityLow count as low.
//
// On a store error the decision is zero and the error is returned: the
// caller's fail mode decides (Stripe fails open).
func (f *FleetShedder) Acquire(ctx context.Context, p Priority, now time.Time) (Lease, Decision, error) {
	if p >= PriorityCritical {
		return Lease{}, Decision{Allowed: true, Limit: f.capacity, Remaining: f.capacity, Name: f.cc.cfg.Name}, nil
	}
	l, d, err := f.cc.acquire(ctx, fleetKey, now, f.Limit(p))
	if err != nil {
		return Lease{}, Decision{}, fmt.Errorf("limiter: fleet shedder: %w", err)
	}
	if !d.Allowed {
		d.RetryAfter = f.retryAfter
	}
	return l, d, nil
}

// Release gives back the slot l holds (see [Concurrency.Release]).
func (f *FleetShedder) Release(ctx context.Context, l Lease) error {
	return f.cc.Release(ctx, l)
}

// Check is Acquire without a release: a non-critical request that is let
// through holds its slot until the lease expires, LeaseTTL later. It is the
// shedder's form for callers that cannot run anything after the request,
// such as an API Gateway authorizer. With LeaseTTL set near the requests'
// typical duration, the live leases count the non-critical requests started
// within that time, which approximates the requests in flight (Little's
// law: in flight = arrival rate x duration). Where the request's end can
// be seen, use Acquire and Release: they count requests in flight exactly.
func (f *FleetShedder) Check(ctx context.Context, p Priority, now time.Time) (Decision, error) {
	_, d, err := f.Acquire(ctx, p, now)
	return d, err
}

// Shedder is the form both load shedders offer to a policy:
// [UtilizationShedder.Check] and [FleetShedder.Check]. A decision with
// Allowed false (and a positive RetryAfter) sheds the request.
type Shedder interface {
	Check(ctx context.Context, p Priority, now time.Time) (Decision, error)
}

// Shedders asks several shedders in turn, cheapest first (a
// UtilizationShedder reads a cached signal; a FleetShedder writes to its
// store): the first that sheds decides, and the later ones are not asked. A
// shedder's error without a shedding decision lets the request past that
// shedder (load shedding fails open); errors are joined and returned with
// the decision. Critical requests are allowed without asking anyone.
type Shedders []Shedder

// Check implements [Shedder].
func (s Shedders) Check(ctx context.Context, p Priority, now time.Time) (Decision, error) {
	if p >= PriorityCritical {
		return Decision{Allowed: true}, nil
	}
	var errs []error
	for _, sh := range s {
		d, err := sh.Check(ctx, p, now)
		if err != nil {
			errs = append(errs, err)
		}
		if !d.Allowed && (err == nil || d.RetryAfter > 0) {
			return d, errors.Join(errs...)
		}
	}
	return Decision{Allowed: true}, errors.Join(errs...)
}

// Utilization is the signal of the worker-utilization load shedder: how
// busy the workers are, from 0 (idle) to 1 (every worker busy).
type Utilization interface {
	Utilization(ctx context.Context) (float64, error)
}

// UtilizationFunc adapts a function to [Utilization].
type UtilizationFunc func(ctx context.Context) (float64, error)

// Utilization returns f(ctx).
func (f UtilizationFunc) Utilization(ctx context.Context) (float64, error) { return f(ctx) }

// Defaults of a [UtilizationShedder], Stripe's numbers.
const (
	// defaultGoodMark is END_OF_GOOD_UTILIZATION: below it, shedding
	// recedes.
	defaultGoodMark = 0.7
	// defaultBadMark is START_OF_BAD_UTILIZATION: above it, shedding
	// grows.
	defaultBadMark = 0.8
	// defaultShedWait is NUMBER_OF_SECONDS_BEFORE_SHEDDING_STARTS (with an
	// 8 s sample rate, 28 s guarantees 3 samples).
	defaultShedWait = 28 * time.Second
	// defaultShedRamp is NUMBER_OF_SECONDS_TO_SHED_ALL_TRAFFIC.
	defaultShedRamp = 120 * time.Second
)

// UtilizationShedderConfig configures a [UtilizationShedder]. Zero fields
// take Stripe's values.
type UtilizationShedderConfig struct {
	// Name identifies the shedder in decisions and metrics. Empty means
	// "utilization".
	Name string
	// Utilization is the signal (required).
	Utilization Utilization
	// GoodMark and BadMark bound the dead zone: 0 < GoodMark <= BadMark
	// < 1. Zero means Stripe's 0.7 and 0.8.
	GoodMark, BadMark float64
	// Wait is how long utilization must stay bad before shedding starts,
	// from rest. It also caps the time one check may advance the
	// controller (Stripe's clamp: a reading says little about a long gap
	// before it), so it must be at least a second. Zero means 28 s
	// (Stripe's: three samples 8 s apart).
	Wait time.Duration
	// Ramp is how long fully bad utilization takes to go from shedding
	// nothing to shedding all non-critical traffic, and fully good
	// utilization to come back. Zero means 120 s (Stripe's).
	Ramp time.Duration
	// Uniform gives every non-critical request the same drop chance, the
	// shed amount (Stripe's sketch, which has one class of non-critical
	// traffic). By default priorities are shed in turn (see
	// [UtilizationShedder.DropChance]).
	Uniform bool
	// Rand is the source of the drop decisions. Nil means a generator
	// seeded from the operating system. It is used under the shedder's
	// lock, so it need not be safe for concurrent use.
	Rand rand.Source
	// RetryAfter is the RetryAfter of a shedding decision. Zero means one
	// second.
	RetryAfter time.Duration
}

// UtilizationShedder is Stripe's worker-utilization load shedder, the last
// resort: a slow controller of the share of non-critical traffic to shed.
//
// Every check reads the utilization u and moves the shed amount s by the
// time elapsed since the previous check (at most Wait) times a derivative:
// (u/GoodMark - 1)/Ramp below the good mark (shedding recedes, fastest when
// idle), zero in the dead zone between the marks, and
// (u-BadMark)/(1-BadMark)/Ramp above the bad mark (shedding grows, fastest
// when every worker is busy). s is kept in [-Wait/Ramp, 1]. The negative
// part is the wait: from rest, fully bad utilization takes Wait before s
// turns positive, then Ramp more to reach 1, and fully good utilization
// brings s from 1 back to 0 in Ramp. A new shedder starts at rest.
//
// A positive s drops non-critical requests at random: with Uniform, each
// with chance s; otherwise the low, normal and high priorities each own a
// third of s's range, so low traffic is shed first, then normal, then high
// (see [UtilizationShedder.DropChance]). Critical requests are never shed
// and do not read the signal.
//
// The controller state is per shedder (per Lambda container): share the
// signal, not the shedder. A UtilizationShedder is safe for concurrent use;
// its zero value is not usable: use [NewUtilizationShedder].
type UtilizationShedder struct {
	cfg     UtilizationShedderConfig
	resting float64

	mu      sync.Mutex
	rand    *rand.Rand
	amount  float64
	last    time.Time // of the last change; zero before the first check
	lastU   float64
	lastErr error
}

// NewUtilizationShedder returns a worker-utilization shedder, or an error
// wrapping [ErrInvalidConfig] naming the bad field.
func NewUtilizationShedder(cfg UtilizationShedderConfig) (*UtilizationShedder, error) {
	const kind = "utilization shedder"
	if cfg.Name == "" {
		cfg.Name = "utilization"
	}
	if cfg.GoodMark == 0 {
		cfg.GoodMark = defaultGoodMark
	}
	if cfg.BadMark == 0 {
		cfg.BadMark = defaultBadMark
	}
	if cfg.Wait == 0 {
		cfg.Wait = defaultShedWait
	}
	if cfg.Ramp == 0 {
		cfg.Ramp = defaultShedRamp
	}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = defaultShedRetryAfter
	}
	switch {
	case cfg.Utilization == nil:
		return nil, configError(kind, cfg.Name, "utilization", "must not be nil")
	case !(cfg.GoodMark > 0 && cfg.GoodMark <= cfg.BadMark && cfg.BadMark < 1):
		return nil, configError(kind, cfg.Name, "marks", "want 0 < good mark <= bad mark < 1, got %v and %v", cfg.GoodMark, cfg.BadMark)
	case cfg.Wait < time.Second:
		return nil, configError(kind, cfg.Name, "wait", "must be at least 1s, got %v", cfg.Wait)
	case cfg.Ramp < 0:
		return nil, configError(kind, cfg.Name, "ramp", "must be positive, got %v", cfg.Ramp)
	case cfg.RetryAfter < 0:
		return nil, configError(kind, cfg.Name, "retry after", "must not be negative, got %v", cfg.RetryAfter)
	}
	src := cfg.Rand
	if src == nil {
		src = rand.NewPCG(rand.Uint64(), rand.Uint64())
	}
	resting := -cfg.Wait.Seconds() / cfg.Ramp.Seconds()
	return &UtilizationShedder{cfg: cfg, resting: resting, rand: rand.New(src), amount: resting}, nil
}

// Config returns the shedder's configuration (with defaults applied).
func (s *UtilizationShedder) Config() UtilizationShedderConfig { return s.cfg }

// Check decides whether a request of priority p may proceed at now: it reads
// the utilization, advances the controller to now and drops the request
// with the chance DropChance gives. A shed request gets Allowed false and
// RetryAfter the configured hint (callers answer 503); Limit and Remaining
// are zero.
//
// When the utilization cannot be read (an error, or a value that is not a
// number), the controller recedes as if utilization were zero: Stripe's
// fail-open, at the controller's slow pace, so a lost signal neither keeps
// shedding forever nor lets everything back at once. The decision is then
// still valid and is returned with an error wrapping [ErrNoUtilization], for
// the caller to count.
func (s *UtilizationShedder) Check(ctx context.Context, p Priority, now time.Time) (Decision, error) {
	d := Decision{Allowed: true, Name: s.cfg.Name}
	if p >= PriorityCritical {
		return d, nil
	}
	u, err := s.cfg.Utilization.Utilization(ctx)
	if err == nil && math.IsNaN(u) {
		err = errors.New("utilization is NaN")
	}
	if err != nil {
		err = fmt.Errorf("%w: utilization shedder %q: %w", ErrNoUtilization, s.cfg.Name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastErr = err
	if err != nil {
		s.advance(0, now)
	} else {
		s.lastU = u
		s.advance(u, now)
	}
	if c := dropChance(s.amount, p, s.cfg.Uniform); c > 0 && s.rand.Float64() < c {
		d.Allowed = false
		d.RetryAfter = s.cfg.RetryAfter
	}
	return d, err
}

// advance moves the shed amount to now under utilization u, as Stripe's
// update_shedding_amount_derivative and how_much_traffic_to_shed. Call with
// s.mu held.
func (s *UtilizationShedder) advance(u float64, now time.Time) {
	if s.last.IsZero() {
		s.last = now
		return
	}
	var x float64
	switch {
	case u < s.cfg.GoodMark:
		x = u/s.cfg.GoodMark - 1
	case u < s.cfg.BadMark:
		x = 0
	default:
		x = (u - s.cfg.BadMark) / (1 - s.cfg.BadMark)
	}
	derivative := clamp(x, -1, 1) / s.cfg.Ramp.Seconds()
	// Time going backwards changes nothing, and last never moves back (so
	// the same stretch of time is never counted twice).
	elapsed := clamp(now.Sub(s.last).Seconds(), 0, s.cfg.Wait.Seconds())
	if now.After(s.last) {
		s.last = now
	}
	s.amount = clamp(s.amount+elapsed*derivative, s.resting, 1)
}

// dropChance maps shed amount a to the drop chance of priority p.
func dropChance(a float64, p Priority, uniform bool) float64 {
	if a <= 0 || p >= PriorityCritical {
		return 0
	}
	if uniform {
		return min(a, 1)
	}
	const tiers = float64(PriorityCritical - PriorityLow)
	k := float64(max(p, PriorityLow) - PriorityLow)
	return clamp(tiers*a-k, 0, 1)
}

// DropChance returns the chance that a request of priority p is shed at the
// current shed amount s: 0 when s <= 0 and for critical traffic; s for every
// non-critical priority when Uniform; otherwise clamp(3s-k, 0, 1) where k is
// 0 for low, 1 for normal and 2 for high traffic. So low traffic is shed
// entirely at s = 1/3, normal at 2/3 and high at 1.
func (s *UtilizationShedder) DropChance(p Priority) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return dropChance(s.amount, p, s.cfg.Uniform)
}

// ShedderState is a snapshot of a [UtilizationShedder], for metrics.
type ShedderState struct {
	// Amount is the shed amount, in [-Wait/Ramp, 1]: negative is the wait
	// before shedding starts, 1 sheds all non-critical traffic.
	Amount float64
	// Utilization is the last utilization read successfully.
	Utilization float64
	// Updated is the time of the last check (zero before the first).
	Updated time.Time
	// Err is the error of the last read of the utilization, if it failed.
	Err error
}

// State returns the shedder's current state.
func (s *UtilizationShedder) State() ShedderState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ShedderState{Amount: s.amount, Utilization: s.lastU, Updated: s.last, Err: s.lastErr}
}

func clamp(v, lo, hi float64) float64 {
	switch {
	case v < lo:
		return lo
	case v > hi:
		return hi
	}
	return v
}

// defaultMaxAge is the MaxAge of a [PublishedUtilization] when it gives none.
const defaultMaxAge = time.Minute

// PublishedUtilization is a [Utilization] that the backend fleet (or a job
// watching it) publishes into a [storage.GaugeStore] with Publish, and shedders read
// with Utilization. A value older than MaxAge, or none, is an error wrapping
// [ErrStaleUtilization]: a publisher that stopped is noticed, not trusted.
// Wrap it in a [CachedUtilization] so that a shedder reads the store once
// in a while rather than on every request. Safe for concurrent use.
type PublishedUtilization struct {
	// Store holds the value (required).
	Store storage.GaugeStore
	// Name is the value's key (one per fleet).
	Name string
	// MaxAge is how old a value may be. Zero means a minute.
	MaxAge time.Duration
	// Clock judges the age. Nil means SystemClock.
	Clock Clock
}

const gaugeSpace = "gauge"

func (p *PublishedUtilization) clock() Clock {
	if p.Clock == nil {
		return SystemClock
	}
	return p.Clock
}

func (p *PublishedUtilization) maxAge() time.Duration {
	if p.MaxAge <= 0 {
		return defaultMaxAge
	}
	return p.MaxAge
}

// Publish stores u (clamped to [0, 1]) as the utilization at now, kept for
// MaxAge.
func (p *PublishedUtilization) Publish(ctx context.Context, u float64, now time.Time) error {
	if math.IsNaN(u) {
		return fmt.Errorf("limiter: publish utilization %q: NaN", p.Name)
	}
	g := storage.Gauge{Value: clamp(u, 0, 1), At: now.UnixNano()}
	if err := p.Store.PutGauge(ctx, storage.Key{Space: gaugeSpace, Name: p.Name}, g, p.maxAge()); err != nil {
		return fmt.Errorf("limiter: publish utilization %q: %w", p.Name, err)
	}
	return nil
}

// Utilization implements [Utilization]: the published value if it is at
// most MaxAge old.
func (p *PublishedUtilization) Utilization(ctx context.Context) (float64, error) {
	g, found, err := p.Store.GetGauge(ctx, storage.Key{Space: gaugeSpace, Name: p.Name})
	switch {
	case err != nil:
		return 0, fmt.Errorf("limiter: published utilization %q: %w", p.Name, err)
	case !found:
		return 0, fmt.Errorf("%w: %q: none published", ErrStaleUtilization, p.Name)
	}
	if age := p.clock().Now().Sub(time.Unix(0, g.At)); age > p.maxAge() {
		return 0, fmt.Errorf("%w: %q: published %v ago", ErrStaleUtilization, p.Name, age.Round(time.Millisecond))
	}
	return clamp(g.Value, 0, 1), nil
}

// CachedUtilization reads another [Utilization] at most once per Every and
// answers from its last reading in between (an error too is kept for
// Every, so a failing store is not asked on every request; a failure caused
// by the caller's own context is not kept). Concurrent callers wait for one
// reading. Use it by pointer, once its fields are set.
type CachedUtilization struct {
	// Signal is the Utilization read (required).
	Signal Utilization
	// Every is how often Signal is read at most.
	Every time.Duration
	// Clock tells the time. Nil means SystemClock.
	Clock Clock

	mu    sync.Mutex
	at    time.Time
	value float64
	err   error
	valid bool
}

// Utilization implements [Utilization].
func (c *CachedUtilization) Utilization(ctx context.Context) (float64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	clock := c.Clock
	if clock == nil {
		clock = SystemClock
	}
	now := clock.Now()
	if c.valid && now.Sub(c.at) < c.Every && !now.Before(c.at) {
		return c.value, c.err
	}
	v, err := c.Signal.Utilization(ctx)
	if err != nil && ctx.Err() != nil {
		return v, err // this caller's deadline, not the signal's fault: not kept
	}
	c.value, c.err = v, err
	c.at, c.valid = now, true
	return v, err
}
