package wiring

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// Defaults of the load-shedding variables (docs/shedding.md), from the
// configuration contract.
const (
	// DefaultShedFleetReserve is the share of the fleet's capacity kept
	// for critical traffic (SLUICE_SHED_FLEET_RESERVE).
	DefaultShedFleetReserve = config.DefaultShedFleetReserve
	// DefaultShedLeaseTTL is how long a request let through by the fleet
	// shedder counts as in flight (SLUICE_SHED_LEASE_TTL).
	DefaultShedLeaseTTL = config.DefaultShedLeaseTTL
	// DefaultShedUtilizationMaxAge is how old a published utilization may
	// be before it is ignored (SLUICE_SHED_UTILIZATION_MAX_AGE).
	DefaultShedUtilizationMaxAge = config.DefaultShedUtilizationMaxAge
	// DefaultShedFleetName names the fleet shedder's lease key
	// (SLUICE_SHED_FLEET_NAME).
	DefaultShedFleetName = config.DefaultShedFleetName
	// ShedUtilizationRefresh is how often a container reads the published
	// utilization; in between it answers from its last reading.
	ShedUtilizationRefresh = time.Second
)

// ShedEnv configures the load shedders (Stripe's fleet-usage and
// worker-utilization shedders, package limiter), from the SLUICE_SHED_*
// variables. Both are off by default.
type ShedEnv = config.Shed

// Shedding is what [Build] made of the SLUICE_SHED_* variables.
type Shedding struct {
	// Fleet is the fleet-usage shedder, nil when off.
	Fleet *limiter.FleetShedder
	// Utilization is the worker-utilization shedder, nil when off.
	Utilization *limiter.UtilizationShedder
	// Backend names the store holding both ("memcached", "dynamo", or
	// "injected" for Outputs.ShedStore).
	Backend string
	// FleetName is the fleet shedder's name: the limit of its leases
	// (lambdawrap.NamedLease.Limit).
	FleetName string
}

// Shedder returns the shedders in the order the policy asks them: the
// utilization shedder first (it reads a cached value), then the fleet
// shedder (a write to the store). Nil when none is configured. With the
// fleet shedder it is a policy.LeasingShedder: the fleet lease of an
// allowed request goes into the authorizer context (sluiceLease) for the
// integration to release (lambdawrap.ReleaseLeases), and a request the
// rules deny gives it back at once; a lease nobody releases lapses after
// SLUICE_SHED_LEASE_TTL, as before.
func (s *Shedding) Shedder() limiter.Shedder {
	if s.Fleet != nil {
		return &fleetShedders{util: s.Utilization, fleet: s.Fleet, name: s.FleetName}
	}
	if s.Utilization != nil {
		return limiter.Shedders{s.Utilization}
	}
	return nil
}

// fleetShedders is limiter.Shedders{utilization, fleet} that keeps the
// fleet shedder's lease.
type fleetShedders struct {
	util  *limiter.UtilizationShedder // nil when off
	fleet *limiter.FleetShedder
	name  string // the fleet shedder's name: its leases' limit
}

var _ policy.LeasingShedder = (*fleetShedders)(nil)

// Check implements limiter.Shedder (the lease, if any, is held until its
// TTL: use CheckLease).
func (f *fleetShedders) Check(ctx context.Context, p limiter.Priority, now time.Time) (limiter.Decision, error) {
	d, _, err := f.CheckLease(ctx, p, now)
	return d, err
}

// CheckLease asks the utilization shedder, then the fleet shedder, as
// limiter.Shedders does: the first that sheds decides; an error without a
// shedding decision lets the request past that shedder.
func (f *fleetShedders) CheckLease(ctx context.Context, p limiter.Priority, now time.Time) (limiter.Decision, policy.Lease, error) {
	if p >= limiter.PriorityCritical {
		return limiter.Decision{Allowed: true}, policy.Lease{}, nil
	}
	var errs []error
	if f.util != nil {
		d, err := f.util.Check(ctx, p, now)
		if err != nil {
			errs = append(errs, err)
		}
		if !d.Allowed && (err == nil || d.RetryAfter > 0) {
			return d, policy.Lease{}, errors.Join(errs...)
		}
	}
	var lease policy.Lease
	l, d, err := f.fleet.Acquire(ctx, p, now)
	switch {
	case err != nil:
		errs = append(errs, err)
	case !d.Allowed:
		return d, policy.Lease{}, errors.Join(errs...)
	case l.Held():
		lease = policy.Lease{Limit: f.name, Lease: l}
	}
	return limiter.Decision{Allowed: true}, lease, errors.Join(errs...)
}

// ReleaseLease implements policy.LeasingShedder.
func (f *fleetShedders) ReleaseLease(ctx context.Context, l policy.Lease) error {
	if l.Limit != f.name {
		return fmt.Errorf("wiring: release: %q is not the fleet shedder %q", l.Limit, f.name)
	}
	return f.fleet.Release(ctx, l.Lease)
}

// buildShedding builds the shedders of env on store, at clock's time.
func buildShedding(env ShedEnv, store breaker.ShedStore, backend string, clock limiter.Clock) (*Shedding, error) {
	s := &Shedding{Backend: backend}
	if env.Utilization != "" {
		signal := &limiter.CachedUtilization{Signal: &limiter.PublishedUtilization{
			Store: store, Name: env.Utilization, MaxAge: env.UtilizationMaxAge, Clock: clock,
		}, Every: ShedUtilizationRefresh, Clock: clock}
		u, err := limiter.NewUtilizationShedder(limiter.UtilizationShedderConfig{Utilization: signal})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvShedUtilization, err)
		}
		s.Utilization = u
	}
	if env.FleetCapacity > 0 {
		f, err := limiter.NewFleetShedder(store, env.FleetConfig())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvShedFleetCapacity, err)
		}
		s.Fleet = f
		s.FleetName = cmp.Or(env.FleetName, "fleet") // limiter.FleetShedderConfig's default
	}
	return s, nil
}

// newShedStore builds the lease and gauge store of the network backend
// env.Shed.Backend, on the clients the counter stores already hold: the
// memcached Store's gomemcache client (its nodes, TLS dialer, timeout and
// pool), or the DynamoDB client and state table.
func newShedStore(env Env, stores map[string]storage.Store, ddb *dynamodb.Client) (breaker.ShedStore, error) {
	switch env.Shed.Backend {
	case BackendMemcached:
		mc, ok := unwrap(stores[BackendMemcached]).(*memcached.Store)
		if !ok {
			return nil, fmt.Errorf("%s: memcached is not configured (set %s)", config.EnvShedBackend, config.EnvMemcachedAddrs)
		}
		l, err := memcached.NewLeases(mc.Client(), memcached.Config{Timeout: env.Deadline})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvMemcachedAddrs, err)
		}
		return l, nil
	case BackendDynamo:
		l, err := dynamo.NewLeases(ddb, dynamo.Config{Table: env.DynamoTable, Timeout: env.Deadline})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvDynamoTable, err)
		}
		return l, nil
	case "":
		return nil, fmt.Errorf("%s: the load shedders need a store shared by the fleet: set %s or %s", config.EnvShedBackend, config.EnvMemcachedAddrs, config.EnvDynamoTable)
	}
	return nil, fmt.Errorf("%s: %q is not memcached or dynamo", config.EnvShedBackend, env.Shed.Backend)
}

// warmShed reads a gauge nobody publishes, to open the shed store's
// connection at init rather than in the first decision (the counter
// store's warm-up opens its own pool, not the gomemcache client's). Best
// effort.
func warmShed(ctx context.Context, log *slog.Logger, store breaker.ShedStore, deadline time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	if _, _, err := store.GetGauge(ctx, storage.Key{Space: "sluice-warmup", Name: "init"}); err != nil {
		log.Warn("shed store warm-up failed; the first decisions will open the connection", "error", err.Error())
		return
	}
	log.Debug("shed store warm", "latency", time.Since(start).String())
}

// leaseStore is the store of the rules' concurrency leases when the
// shedders are off: injected (tests), or a lease store on the default
// backend's clients (memcached, DynamoDB), or memory.Leases, which counts
// per process (the local API, where the integration runs in the same
// process; a deployed authorizer should keep its limits on a network
// backend).
func leaseStore(env Env, stores map[string]storage.Store, ddb *dynamodb.Client, injected breaker.ShedStore) (storage.LeaseStore, error) {
	if injected != nil {
		return injected, nil
	}
	switch env.DefaultBackend {
	case BackendMemcached, BackendDynamo:
		e := env
		e.Shed.Backend = env.DefaultBackend
		return newShedStore(e, stores, ddb)
	}
	return memory.NewLeases(memory.Config{})
}
