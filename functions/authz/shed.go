package authz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// Defaults of the load-shedding variables (docs/shedding.md).
const (
	// DefaultShedFleetReserve is the share of the fleet's capacity kept
	// for critical traffic (SLUICE_SHED_FLEET_RESERVE).
	DefaultShedFleetReserve = 0.2
	// DefaultShedLeaseTTL is how long a request let through by the fleet
	// shedder counts as in flight (SLUICE_SHED_LEASE_TTL): the authorizer
	// cannot see a request end, so set it near the integration's typical
	// latency.
	DefaultShedLeaseTTL = time.Second
	// DefaultShedUtilizationMaxAge is how old a published utilization may
	// be before it is ignored (SLUICE_SHED_UTILIZATION_MAX_AGE).
	DefaultShedUtilizationMaxAge = 30 * time.Second
	// ShedUtilizationRefresh is how often a container reads the published
	// utilization; in between it answers from its last reading.
	ShedUtilizationRefresh = time.Second
	// maxShedLeaseTTL bounds SLUICE_SHED_LEASE_TTL (a Lambda's longest
	// run).
	maxShedLeaseTTL = 15 * time.Minute
	// maxStoreName bounds SLUICE_SHED_UTILIZATION and
	// SLUICE_SHED_FLEET_NAME.
	maxStoreName = 128
	// DefaultShedFleetName names the fleet shedder's lease key
	// (SLUICE_SHED_FLEET_NAME).
	DefaultShedFleetName = "fleet"
)

// ShedEnv configures the load shedders (Stripe's fleet-usage and
// worker-utilization shedders, package limiter). Both are off by default.
type ShedEnv struct {
	// FleetCapacity, from SLUICE_SHED_FLEET_CAPACITY, is the number of
	// requests the fleet behind the API serves at once (1 to
	// limiter.MaxLeases); 0 turns the fleet-usage shedder off.
	FleetCapacity int64
	// FleetName, from SLUICE_SHED_FLEET_NAME, names the fleet's one lease
	// key in the store (default "fleet"): deployments that share a store
	// but protect different fleets need different names.
	FleetName string
	// FleetReserve, from SLUICE_SHED_FLEET_RESERVE, is the share of
	// FleetCapacity kept for critical traffic, in [0, 1) (default 0.2).
	FleetReserve float64
	// FleetShares, from SLUICE_SHED_FLEET_SHARES ("low=0.5,normal=0.7"),
	// optionally lowers the share of FleetCapacity a priority may fill, so
	// that lower priorities are shed first.
	FleetShares map[limiter.Priority]float64
	// LeaseTTL, from SLUICE_SHED_LEASE_TTL, is how long a request let
	// through by the fleet shedder holds its slot (default 1s).
	LeaseTTL time.Duration
	// Utilization, from SLUICE_SHED_UTILIZATION, names the utilization
	// (0 to 1) the backend fleet publishes into the shed backend; empty
	// turns the worker-utilization shedder off.
	Utilization string
	// UtilizationMaxAge, from SLUICE_SHED_UTILIZATION_MAX_AGE, is how old
	// the published value may be (default 30s); an older one is ignored
	// and the shedder recedes (fails open, slowly).
	UtilizationMaxAge time.Duration
	// Backend, from SLUICE_SHED_BACKEND, holds the fleet's leases and the
	// published utilization: memcached or dynamo (default: memcached if
	// configured, else dynamo if configured). Never memory: a memory store
	// counts per Lambda container, not across the fleet.
	Backend string
}

// Enabled reports whether any shedder is configured.
func (s ShedEnv) Enabled() bool { return s.FleetCapacity > 0 || s.Utilization != "" }

// parseShedEnv reads the SLUICE_SHED_* variables; e holds the rest of the
// configuration (the backends).
func parseShedEnv(getenv func(string) string, e Env) (ShedEnv, error) {
	s := ShedEnv{
		FleetReserve:      DefaultShedFleetReserve,
		LeaseTTL:          DefaultShedLeaseTTL,
		UtilizationMaxAge: DefaultShedUtilizationMaxAge,
		FleetName:         strings.TrimSpace(getenv("SLUICE_SHED_FLEET_NAME")),
		Utilization:       strings.TrimSpace(getenv("SLUICE_SHED_UTILIZATION")),
		Backend:           strings.TrimSpace(getenv("SLUICE_SHED_BACKEND")),
	}
	bad := func(name, format string, args ...any) (ShedEnv, error) {
		return ShedEnv{}, fmt.Errorf("authz: %s: %s", name, fmt.Sprintf(format, args...))
	}
	if v := strings.TrimSpace(getenv("SLUICE_SHED_FLEET_CAPACITY")); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > limiter.MaxLeases {
			return bad("SLUICE_SHED_FLEET_CAPACITY", "%q is not a number of requests from 0 (off) to %d", v, limiter.MaxLeases)
		}
		s.FleetCapacity = n
	}
	if v := strings.TrimSpace(getenv("SLUICE_SHED_FLEET_RESERVE")); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f >= 0 && f < 1) {
			return bad("SLUICE_SHED_FLEET_RESERVE", "%q is not a share in [0, 1) such as 0.2", v)
		}
		s.FleetReserve = f
	}
	if v := strings.TrimSpace(getenv("SLUICE_SHED_FLEET_SHARES")); v != "" {
		shares, err := parseShares(v)
		if err != nil {
			return bad("SLUICE_SHED_FLEET_SHARES", "%q: %v", v, err)
		}
		s.FleetShares = shares
	}
	if v := strings.TrimSpace(getenv("SLUICE_SHED_LEASE_TTL")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > maxShedLeaseTTL {
			return bad("SLUICE_SHED_LEASE_TTL", "%q is not a Go duration between 0 and %v such as 1s", v, maxShedLeaseTTL)
		}
		s.LeaseTTL = d
	}
	if v := strings.TrimSpace(getenv("SLUICE_SHED_UTILIZATION_MAX_AGE")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return bad("SLUICE_SHED_UTILIZATION_MAX_AGE", "%q is not a positive Go duration such as 30s", v)
		}
		s.UtilizationMaxAge = d
	}
	for name, v := range map[string]string{"SLUICE_SHED_UTILIZATION": s.Utilization, "SLUICE_SHED_FLEET_NAME": s.FleetName} {
		if len(v) > maxStoreName || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			return bad(name, "%.80q is not a name of printable ASCII without spaces, at most %d bytes", v, maxStoreName)
		}
	}
	if s.FleetName == "" {
		s.FleetName = DefaultShedFleetName
	}
	if s.FleetCapacity > 0 {
		// The limiter validates the reserve against the shares; a store
		// that is never called is enough for that.
		if _, err := limiter.NewFleetShedder(noLeases{}, s.fleetConfig()); err != nil {
			name := "SLUICE_SHED_FLEET_SHARES"
			if s.FleetShares == nil {
				name = "SLUICE_SHED_FLEET_RESERVE"
			}
			return bad(name, "%v", err)
		}
	}
	switch s.Backend {
	case "":
		switch {
		case len(e.MemcachedAddrs) > 0:
			s.Backend = BackendMemcached
		case e.DynamoTable != "":
			s.Backend = BackendDynamo
		}
		// Neither: Build refuses to start a shedder without a store.
	case BackendMemory:
		return bad("SLUICE_SHED_BACKEND", "memory counts per Lambda container, not across the fleet: use memcached or dynamo")
	case BackendMemcached, BackendDynamo:
		if s.Enabled() {
			if _, ok := configured(e)[s.Backend]; !ok {
				return bad("SLUICE_SHED_BACKEND", "%s is not configured (set %s)", s.Backend, backendVar(s.Backend))
			}
		}
	default:
		return bad("SLUICE_SHED_BACKEND", "%q is not memcached or dynamo", s.Backend)
	}
	return s, nil
}

// configured returns the network backends e configures.
func configured(e Env) map[string]bool {
	m := map[string]bool{}
	if len(e.MemcachedAddrs) > 0 {
		m[BackendMemcached] = true
	}
	if e.DynamoTable != "" {
		m[BackendDynamo] = true
	}
	return m
}

// parseShares parses "low=0.5,normal=0.7".
func parseShares(v string) (map[limiter.Priority]float64, error) {
	out := map[limiter.Priority]float64{}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, val, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not priority=share", part)
		}
		p, err := limiter.ParsePriority(strings.TrimSpace(name))
		if err != nil || p == limiter.PriorityCritical {
			return nil, fmt.Errorf("%q is not low, normal or high (critical traffic is never shed)", strings.TrimSpace(name))
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || math.IsNaN(f) {
			return nil, fmt.Errorf("%q is not a share such as 0.5", strings.TrimSpace(val))
		}
		if _, dup := out[p]; dup {
			return nil, fmt.Errorf("%s is given twice", p)
		}
		out[p] = f
	}
	if len(out) == 0 {
		return nil, errors.New("no priority=share pair")
	}
	return out, nil
}

func (s ShedEnv) fleetConfig() limiter.FleetShedderConfig {
	return limiter.FleetShedderConfig{Name: s.FleetName, Capacity: s.FleetCapacity, Reserve: s.FleetReserve, Shares: s.FleetShares, LeaseTTL: s.LeaseTTL}
}

// noLeases is a lease store that is never called (validation only).
type noLeases struct{}

func (noLeases) AcquireLease(context.Context, limiter.Key, limiter.LeaseOp) (limiter.Decision, error) {
	return limiter.Decision{}, errors.New("not a store")
}
func (noLeases) ReleaseLease(context.Context, limiter.Key, limiter.ReleaseOp) error {
	return errors.New("not a store")
}

// ShedStore holds the fleet shedder's leases and the published
// utilization: memcached.Leases, dynamo.Leases, or memory.Leases (tests
// only, through [Outputs.ShedStore]: it counts per process).
type ShedStore interface {
	limiter.LeaseStore
	limiter.GaugeStore
}

// Shedding is what [Build] made of the SLUICE_SHED_* variables.
type Shedding struct {
	// Fleet is the fleet-usage shedder, nil when off.
	Fleet *limiter.FleetShedder
	// Utilization is the worker-utilization shedder, nil when off.
	Utilization *limiter.UtilizationShedder
	// Backend names the store holding both ("memcached", "dynamo", or
	// "injected" for Outputs.ShedStore).
	Backend string
}

// Shedder returns the shedders in the order the policy asks them: the
// utilization shedder first (it reads a cached value), then the fleet
// shedder (a write to the store). Nil when none is configured.
func (s *Shedding) Shedder() policy.Shedder {
	var sh limiter.Shedders
	if s.Utilization != nil {
		sh = append(sh, s.Utilization)
	}
	if s.Fleet != nil {
		sh = append(sh, s.Fleet)
	}
	if len(sh) == 0 {
		return nil
	}
	return sh
}

// buildShedding builds the shedders of env on store, at clock's time.
func buildShedding(env ShedEnv, store ShedStore, backend string, clock limiter.Clock) (*Shedding, error) {
	s := &Shedding{Backend: backend}
	if env.Utilization != "" {
		signal := limiter.NewCachedUtilization(&limiter.PublishedUtilization{
			Store: store, Name: env.Utilization, MaxAge: env.UtilizationMaxAge, Clock: clock,
		}, ShedUtilizationRefresh, clock)
		u, err := limiter.NewUtilizationShedder(limiter.UtilizationShedderConfig{Utilization: signal})
		if err != nil {
			return nil, fmt.Errorf("SLUICE_SHED_UTILIZATION: %w", err)
		}
		s.Utilization = u
	}
	if env.FleetCapacity > 0 {
		f, err := limiter.NewFleetShedder(store, env.fleetConfig())
		if err != nil {
			return nil, fmt.Errorf("SLUICE_SHED_FLEET_CAPACITY: %w", err)
		}
		s.Fleet = f
	}
	return s, nil
}

// newShedStore builds the lease and gauge store of the network backend
// env.Shed.Backend, on the clients the counter stores already hold: the
// memcached Store's gomemcache client (its nodes, TLS dialer, timeout and
// pool), or the DynamoDB client and state table.
func newShedStore(env Env, stores map[string]any, ddb *dynamodb.Client) (ShedStore, error) {
	switch env.Shed.Backend {
	case BackendMemcached:
		mc, ok := stores[BackendMemcached].(*memcached.Store)
		if !ok {
			return nil, errors.New("SLUICE_SHED_BACKEND: memcached is not configured (set SLUICE_MEMCACHED_ADDRS)")
		}
		l, err := memcached.NewLeases(mc.Client(), memcached.Config{Timeout: env.Deadline})
		if err != nil {
			return nil, fmt.Errorf("SLUICE_MEMCACHED_ADDRS: %w", err)
		}
		return l, nil
	case BackendDynamo:
		l, err := dynamo.NewLeases(ddb, dynamo.Config{Table: env.DynamoTable, Timeout: env.Deadline})
		if err != nil {
			return nil, fmt.Errorf("SLUICE_DYNAMO_TABLE: %w", err)
		}
		return l, nil
	case "":
		return nil, errors.New("SLUICE_SHED_BACKEND: the load shedders need a store shared by the fleet: set SLUICE_MEMCACHED_ADDRS or SLUICE_DYNAMO_TABLE")
	}
	return nil, fmt.Errorf("SLUICE_SHED_BACKEND: %q is not memcached or dynamo", env.Shed.Backend)
}

// warmShed reads a gauge nobody publishes, to open the shed store's
// connection at init rather than in the first decision (the counter
// store's warm-up opens its own pool, not the gomemcache client's). Best
// effort.
func warmShed(ctx context.Context, log *slog.Logger, store ShedStore, deadline time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	if _, _, err := store.GetGauge(ctx, limiter.Key{Space: "sluice-warmup", Name: "init"}); err != nil {
		log.Warn("shed store warm-up failed; the first decisions will open the connection", "error", err.Error())
		return
	}
	log.Debug("shed store warm", "latency", time.Since(start).String())
}
