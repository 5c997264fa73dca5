package wiring

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// Outputs are where a built handler writes: metrics (EMF) to Stdout, logs
// to Stderr (nil means os.Stdout and os.Stderr), and hooks for embedders
// and tests.
type Outputs struct {
	Stdout, Stderr io.Writer
	// Shedder, when not nil, builds the load shedder the policy asks
	// before any limit, once, from the configured stores ("memory",
	// "memcached", "dynamo"), instead of the shedders of the SLUICE_SHED_*
	// variables. A nil shedder sheds nothing.
	Shedder func(ctx context.Context, env Env, stores map[string]storage.Store) (limiter.Shedder, error)
	// ShedStore, when not nil, holds the leases and the published
	// utilization of the SLUICE_SHED_* shedders instead of the store of
	// SLUICE_SHED_BACKEND. For tests: a memory.Leases, which the
	// environment refuses because it counts per Lambda container.
	ShedStore breaker.ShedStore
	// Clock, when not nil, is the handler's and the shedders' time (tests:
	// a fake clock). It takes precedence over SLUICE_TEST_CLOCK.
	Clock limiter.Clock
	// CreateTable, when true, creates the DynamoDB state table if it is
	// missing (the local API on DynamoDB Local); a deployed authorizer's
	// table belongs to the infrastructure.
	CreateTable bool
}

// Built is a handler with what was built for it.
type Built struct {
	Handler *authz.Handler
	Env     Env
	// Stores are the configured backends by name.
	Stores map[string]storage.Store
	// Rules describes the rules' source, e.g. "embedded" or "table t".
	Rules string
	// Shedding holds the load shedders of the SLUICE_SHED_* variables; nil
	// when none is configured (or Outputs.Shedder replaced them).
	Shedding *Shedding
	// Breakers are the whole-backend circuit breakers by backend name
	// (DynamoDB's; memcached has one per node inside its store, see
	// BreakerStates); nil when SLUICE_BREAKER_FAILURES is 0.
	Breakers map[string]*breaker.Breaker
	// Leases holds the rules' concurrency leases: the shed store when the
	// shedders are on, else a lease store on the default backend (memory:
	// per process, for the local API). An integration releases them there
	// (lambdawrap.NewStoreReleaser).
	Leases storage.LeaseStore
	// Logger is the handler's logger.
	Logger  *slog.Logger
	closers []func()
	// returnLeases gives back the policy's capacity leases (Close).
	returnLeases func()
	// sharesSet holds the regional shares of the global limits
	// (shares.go).
	sharesSet *sharesSet
}

// Close gives back the capacity leases the process holds, then releases
// the backends' connections.
func (b *Built) Close() {
	if b.returnLeases != nil {
		b.returnLeases()
	}
	for _, c := range b.closers {
		c()
	}
}

// waitRefunds lets the refunds a store sent without waiting land before the
// process goes (the local API's exit, a test's end), for at most twice the
// deadline. A Lambda environment is frozen, not closed, after a response:
// there they land at the next invocation.
func waitRefunds(s interface{ WaitRefunds(context.Context) error }, deadline time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*deadline)
	defer cancel()
	s.WaitRefunds(ctx) //nolint:errcheck // best effort: a lost refund stays counted
}

// FromEnv reads the environment and builds the handler: it is all a Lambda
// main needs. Clients are built here, once.
func FromEnv(ctx context.Context, getenv func(string) string, out Outputs) (*Built, error) {
	env, err := ParseEnv(getenv)
	if err != nil {
		return nil, err
	}
	return Build(ctx, env, out)
}

// Build builds the stores, the rules and the handler of env.
func Build(ctx context.Context, env Env, out Outputs) (*Built, error) {
	if out.Stdout == nil {
		out.Stdout = os.Stdout
	}
	if out.Stderr == nil {
		out.Stderr = os.Stderr
	}
	logger := slog.New(slog.NewJSONHandler(out.Stderr, &slog.HandlerOptions{Level: env.LogLevel}))
	b := &Built{Env: env, Logger: logger, Stores: map[string]storage.Store{}}
	metrics := authz.NewMetrics(out.Stdout, env.MetricsNamespace)
	h, err := b.build(ctx, out, metrics)
	if err != nil {
		b.Close()
		return nil, err
	}
	b.Handler = h
	return b, nil
}

// build builds b's parts in turn: the stores, the shedders and leases, the
// rules and the handler.
func (b *Built) build(ctx context.Context, out Outputs, metrics *authz.Metrics) (*authz.Handler, error) {
	env, logger := b.Env, b.Logger
	clock, frozen := out.Clock, (func() time.Time)(nil)
	if clock == nil && !env.TestClock.IsZero() {
		t := env.TestClock
		frozen = func() time.Time { return t }
		clock = limiter.ClockFunc(frozen)
		logger.Warn(config.EnvTestClock+" is set: the clock is frozen; this is for tests only", "time", t.Format(time.RFC3339Nano))
	}
	if clock == nil {
		clock = limiter.SystemClock
	}
	ddb, err := b.buildStores(ctx, out.CreateTable, metrics, frozen)
	if err != nil {
		return nil, err
	}
	opts := policy.Options{Stores: b.Stores, DefaultBackend: env.DefaultBackend, NoDenyCache: env.NoDenyCache, NoLeases: env.NoLeases, Shadow: env.Shadow}
	if env.Shadow {
		logger.Warn(config.EnvShadow + " is set: every rule runs in shadow mode and nothing is rate limited (the deny list still denies)")
	}
	if opts.Shedder, err = b.buildShedder(ctx, out, ddb, clock); err != nil {
		return nil, err
	}
	if b.Leases == nil {
		if b.Leases, err = leaseStore(env, b.Stores, ddb, out.ShedStore); err != nil {
			return nil, fmt.Errorf("wiring: concurrency leases: %w", err)
		}
		if _, mem := b.Leases.(*memory.Leases); mem && frozen != nil {
			// The memory lease store on the frozen clock too (buildStores).
			if b.Leases, err = memory.NewLeases(memory.Config{Clock: frozen}); err != nil {
				return nil, fmt.Errorf("wiring: concurrency leases: %w", err)
			}
		}
	}
	opts.Leases = b.Leases
	if opts.Shares, err = b.buildShares(ddb, metrics); err != nil {
		return nil, err
	}
	source, err := b.buildRules(ctx, ddb, opts, clock)
	if err != nil {
		return nil, err
	}
	b.returnLeases = func() {
		// Before the stores close: the leases' unspent units go back (a
		// rules cache's replaced policies' too).
		ctx, cancel := context.WithTimeout(context.Background(), 2*env.Deadline)
		defer cancel()
		source.(leaseReturner).ReturnLeases(ctx, clock.Now()) //nolint:errcheck // best effort: what is not returned expires
	}
	var logKey []byte
	if env.LogKey != "" {
		logKey = []byte(env.LogKey)
	}
	return authz.New(authz.Config{
		Policy:        source,
		Deadline:      env.Deadline,
		Clock:         clock,
		Metrics:       metrics,
		Logger:        logger,
		HTTPResponses: env.HTTPResponses,
		LogKey:        logKey,
		ClientIP:      env.ClientIP,
		EdgeSecret:    env.EdgeSecret,
		Scheduled:     b.keeper(opts.Shares, clock),
	})
}

// buildStores builds the memory store and the network backends env
// configures, behind their breakers, and warms their connections. It
// returns the DynamoDB client (nil without DynamoDB). frozen, when not
// nil, is SLUICE_TEST_CLOCK's clock, on which the memory store expires
// its keys: with the decisions' time frozen, a store expiring on the wall
// clock would make the answers hang on how long a run takes.
func (b *Built) buildStores(ctx context.Context, createTable bool, metrics *authz.Metrics, frozen func() time.Time) (*dynamodb.Client, error) {
	env, logger := b.Env, b.Logger
	mem, err := memory.New(memory.Config{Clock: frozen})
	if err != nil {
		return nil, fmt.Errorf("wiring: memory store: %w", err)
	}
	b.Stores[BackendMemory] = mem
	if len(env.MemcachedAddrs) > 0 {
		cfg := memcached.Config{Addrs: env.MemcachedAddrs, Timeout: env.Deadline, Proxy: env.MemcachedProxy,
			Breaker: memcachedBreaker(env, logger, metrics)}
		if env.MemcachedTLS {
			cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		mc, err := memcached.New(cfg)
		if err != nil {
			return nil, fmt.Errorf("wiring: %s: %w", config.EnvMemcachedAddrs, err)
		}
		b.Stores[BackendMemcached] = mc
		b.closers = append(b.closers, func() {
			waitRefunds(mc, env.Deadline)
			mc.Close()
		})
	}
	ddb, err := b.buildDynamo(ctx, createTable)
	if err != nil {
		return nil, err
	}
	if b.Breakers, err = wrapBreakers(env, b.Stores, logger, metrics); err != nil {
		return nil, err
	}
	// Open the network backends' connections now, at init, rather than in
	// the first decision, whose deadline a TLS handshake to DynamoDB or a
	// cold connection can exceed. Best effort, bounded by the deadline.
	for _, name := range []string{BackendMemcached, BackendDynamo} {
		if c, ok := b.Stores[name]; ok {
			warm(ctx, logger, name, c, env.Deadline)
		}
	}
	if _, ok := b.Stores[env.DefaultBackend]; !ok {
		return nil, fmt.Errorf("wiring: %s: %s is not configured (set %s)", config.EnvDefaultBackend, env.DefaultBackend, config.BackendVar(env.DefaultBackend))
	}
	return ddb, nil
}

// buildDynamo makes the DynamoDB client when env names a state or rules
// table (nil otherwise), creates the state table when asked, and adds the
// DynamoDB store.
func (b *Built) buildDynamo(ctx context.Context, createTable bool) (*dynamodb.Client, error) {
	env := b.Env
	if env.DynamoTable == "" && env.RulesTable == "" {
		return nil, nil
	}
	awsCfg, err := loadAWSConfig(ctx, env, b.Logger)
	if err != nil {
		return nil, fmt.Errorf("wiring: AWS configuration: %w", err)
	}
	ddb := dynamodb.NewFromConfig(awsCfg)
	if env.DynamoTable == "" {
		return ddb, nil
	}
	if createTable {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := dynamo.CreateTable(cctx, ddb, env.DynamoTable)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("wiring: %s: %w", config.EnvDynamoTable, err)
		}
	}
	// An MRSC table's every write crosses regions: leases sized by the
	// round trip (docs/leases.md).
	st, err := dynamo.New(ddb, dynamo.Config{Table: env.DynamoTable, Timeout: env.Deadline, CrossRegion: env.TableMode == config.TableMRSC})
	if err != nil {
		return nil, fmt.Errorf("wiring: %s: %w", config.EnvDynamoTable, err)
	}
	b.Stores[BackendDynamo] = st
	b.closers = append(b.closers, func() { waitRefunds(st, env.Deadline) })
	return ddb, nil
}

// buildShedder returns the load shedder the policy asks before any limit:
// Outputs.Shedder's, or the SLUICE_SHED_* shedders (whose store then holds
// b.Leases too), or none.
func (b *Built) buildShedder(ctx context.Context, out Outputs, ddb *dynamodb.Client, clock limiter.Clock) (limiter.Shedder, error) {
	env := b.Env
	switch {
	case out.Shedder != nil:
		shedder, err := out.Shedder(ctx, env, b.Stores)
		if err != nil {
			return nil, fmt.Errorf("wiring: load shedder: %w", err)
		}
		return shedder, nil
	case !env.Shed.Enabled():
		return nil, nil
	}
	store, backend := out.ShedStore, "injected"
	if store == nil {
		st, err := newShedStore(env, b.Stores, ddb)
		if err != nil {
			return nil, fmt.Errorf("wiring: load shedder: %w", err)
		}
		if br := b.Breakers[env.Shed.Backend]; br != nil {
			if st, err = breaker.WrapLeases(st, br); err != nil {
				return nil, fmt.Errorf("wiring: load shedder: %w", err)
			}
		}
		store, backend = st, env.Shed.Backend
		if backend == BackendMemcached {
			warmShed(ctx, b.Logger, store, env.Deadline)
		}
	}
	sh, err := buildShedding(env.Shed, store, backend, clock)
	if err != nil {
		return nil, fmt.Errorf("wiring: load shedder: %w", err)
	}
	b.Shedding = sh
	b.Leases = store
	b.Logger.Info("load shedding on", "backend", backend,
		"fleet_capacity", env.Shed.FleetCapacity, "fleet_reserve", env.Shed.FleetReserve, "lease_ttl", env.Shed.LeaseTTL.String(),
		"utilization", env.Shed.Utilization)
	return sh.Shedder(), nil
}

// leaseReturner gives back the capacity leases of a policy source (a
// *policy.Policy or a *policy.Cache).
type leaseReturner interface {
	ReturnLeases(ctx context.Context, now time.Time) error
}

var (
	_ leaseReturner = (*policy.Policy)(nil)
	_ leaseReturner = (*policy.Cache)(nil)
)

// buildRules loads the rules from their source (the rules table, a file,
// inline YAML or the embedded rules) on the stores of opts. A rules table
// is cached for env.RulesTTL: a reload that reads the same rules, lists
// and tiers keeps the policy (its limiters' leases and deny caches); one
// that reads new ones replaces it, and the replaced policy's capacity
// leases go back once the requests that still hold it are done
// (rulesRetireAfter; stamped by clock).
func (b *Built) buildRules(ctx context.Context, ddb *dynamodb.Client, opts policy.Options, clock limiter.Clock) (policy.Source, error) {
	env := b.Env
	load := func(what, name string, data []byte) (policy.Source, error) {
		b.Rules = what
		p, err := policy.Load(data, opts)
		if err != nil {
			return nil, fmt.Errorf("wiring: %s: %w", name, hint(err))
		}
		return p, nil
	}
	switch {
	case env.RulesTable != "":
		b.Rules = "table " + env.RulesTable
		readTable := func(ctx context.Context) (policy.Read, error) {
			doc, tiers, err := LoadRulesDocument(ctx, ddb, env.RulesTable)
			if err != nil {
				return policy.Read{}, err
			}
			build := func() (*policy.Policy, error) {
				o := opts
				o.Lists, o.TierOf = doc.Lists, tiers.Lookup
				return b.sharesSet.build(func() (*policy.Policy, error) { return policy.New(doc.Rules, o) })
			}
			if brokenRulesKeep {
				return policy.Read{Build: build}, nil
			}
			return policy.Read{Doc: rulesRead{doc, tiers}, Build: build}, nil
		}
		log := b.Logger.With("table", env.RulesTable)
		cache, err := policy.NewReaderCache(ctx, readTable, policy.CacheConfig{
			TTL:         env.RulesTTL,
			RetireAfter: rulesRetireAfter(env.Deadline),
			LeaseClock:  clock,
			Log:         log,
			OnError: func(err error) {
				log.Error("reloading rules failed; keeping the previous rules", "error", err.Error())
			},
		})
		if err != nil {
			return nil, fmt.Errorf("wiring: %s: %w", config.EnvRulesTable, hint(err))
		}
		return cache, nil
	case env.RulesFile != "":
		data, err := os.ReadFile(env.RulesFile)
		if err != nil {
			return nil, fmt.Errorf("wiring: %s: %w", config.EnvRulesFile, err)
		}
		return load("file "+env.RulesFile, config.EnvRulesFile+" "+env.RulesFile, data)
	case env.RulesYAML != "":
		return load(config.EnvRulesYAML, config.EnvRulesYAML, []byte(env.RulesYAML))
	}
	return load("embedded", "embedded rules", authz.DefaultRules)
}

// rulesRead is what a rules table reload read: a reload that reads the
// same keeps the policy.
type rulesRead struct {
	doc   policy.Document
	tiers policy.Tiers
}

// rulesRetireAfter is how long after a rules reload replaced the policy
// its capacity leases go back: twice the decision deadline (a request
// that took the replaced policy just before the swap has finished its
// decision by then), at least a second, at most 30 s (API Gateway has
// given up on the request by then).
func rulesRetireAfter(deadline time.Duration) time.Duration {
	if brokenRulesRetire {
		return -1
	}
	return min(max(2*deadline, time.Second), 30*time.Second)
}

// brokenRulesKeep: every rules table reload builds a new policy, changed
// or not; brokenRulesRetire: a replaced policy's leases are never given
// back. Both as before. Tests only.
var brokenRulesKeep, brokenRulesRetire = false, false

// warm makes one read-only counter call (n = 0) on a key of its own.
func warm(ctx context.Context, log *slog.Logger, name string, c storage.Counter, deadline time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	_, err := c.Add(ctx, storage.Key{Space: "sluice-warmup", Name: "init"}, 0, 1, 0, time.Second)
	if err != nil {
		log.Warn("backend warm-up failed; the first decisions will open the connection", "backend", name, "error", err.Error())
		return
	}
	log.Debug("backend warm", "backend", name, "latency", time.Since(start).String())
}

// hint adds to a rules error about a missing backend how to configure one.
func hint(err error) error {
	if !strings.Contains(err.Error(), "is not configured") {
		return err
	}
	return fmt.Errorf("%w (memory is built in; %s adds memcached, %s adds dynamo)", err, config.EnvMemcachedAddrs, config.EnvDynamoTable)
}
