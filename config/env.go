package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// Env is the authorizer's configuration, read from the environment by
// [Parse]. docs/authorizer.md lists the variables.
type Env struct {
	RulesFile  string        // EnvRulesFile: path of a rules document
	RulesYAML  string        // EnvRulesYAML: an inline rules document
	RulesTable string        // EnvRulesTable: DynamoDB table of rules (key "name")
	RulesTTL   time.Duration // EnvRulesTTL: cache time of table rules (DefaultRulesTTL)

	DynamoTable    string   // EnvDynamoTable: state table (key "pk", TTL "ttl")
	MemcachedAddrs []string // EnvMemcachedAddrs: comma-separated host:port
	MemcachedTLS   bool     // EnvMemcachedTLS
	MemcachedProxy bool     // EnvMemcachedProxy
	DefaultBackend string   // EnvDefaultBackend: backend of limits naming none

	Deadline         time.Duration // EnvDeadline: bound of one decision (DefaultDeadline)
	MetricsNamespace string        // EnvMetricsNamespace (the metrics default to DefaultMetricsNamespace)
	HTTPResponses    string        // EnvHTTPResponses: HTTPResponsesSimple (default) or HTTPResponsesIAM
	LogLevel         slog.Level    // EnvLogLevel, else EnvLambdaLogLevel (default INFO)
	LogKey           string        // EnvLogHashKey: HMAC key of hashed keys in logs

	// ClientIP, from EnvClientIP, is ClientIPSourceIP (default) or
	// ClientIPViewerAddress; EdgeSecret, from EnvEdgeSecret, is required
	// with the latter.
	ClientIP   string
	EdgeSecret string

	// Shed configures the load shedders (SLUICE_SHED_*); off unless
	// EnvShedFleetCapacity or EnvShedUtilization is set.
	Shed Shed

	// Breaker configures the circuit breaker of each network backend
	// (memcached, dynamo; never memory): on by default.
	Breaker Breaker

	// Shadow, from EnvShadow, runs every rule in shadow mode.
	Shadow bool

	// NoDenyCache, from EnvDenyCache=false, turns off the deny cache (on
	// by default): a key a store denied is denied again in this process,
	// without a store request, until the denial's RetryAfter has passed.
	NoDenyCache bool

	// NoLeases, from EnvLeases=false, turns off capacity leases (on by
	// default for the limits that allow them).
	NoLeases bool

	// TableMode, from EnvTableMode, is the state table's mode across
	// regions: TableRegional, TableEventual or TableMRSC. With
	// TableEventual a rule with scope global is kept as regional shares
	// (docs/regions.md); Regions, from EnvRegions (two or more), are the
	// deployment's regions in their fixed order, and Region is this
	// one's index in them (EnvAWSRegion's).
	TableMode string
	Regions   []string
	Region    int

	// TestClock, from EnvTestClock (RFC 3339), freezes the clock. It
	// exists for the golden tests of the built binary; never set it in a
	// deployment.
	TestClock time.Time
}

// Breaker configures the circuit breakers of the network backends
// (package breaker): one per backend.
type Breaker struct {
	// Failures, from EnvBreakerFailures, is how many store failures in a
	// row (unavailable, from 3 distinct keys or a refused connection; a
	// throttle is not a failure) open a breaker (DefaultBreakerFailures, at
	// most MaxBreakerFailures); 0 turns the breakers off.
	Failures int
	// OpenFor, from EnvBreakerOpenFor, is how long an open breaker fails
	// calls at once before it lets one probe through
	// (DefaultBreakerOpenFor, at most MaxBreakerOpenFor).
	OpenFor time.Duration
}

// Enabled reports whether the breakers are on.
func (b Breaker) Enabled() bool { return b.Failures > 0 }

// Shed configures the load shedders (Stripe's fleet-usage and
// worker-utilization shedders, package limiter). Both are off by default.
type Shed struct {
	// FleetCapacity, from EnvShedFleetCapacity, is the number of requests
	// the fleet behind the API serves at once (1 to MaxShedFleetCapacity);
	// 0 turns the fleet-usage shedder off.
	FleetCapacity int64
	// FleetName, from EnvShedFleetName, names the fleet's one lease key in
	// the store (DefaultShedFleetName): deployments that share a store but
	// protect different fleets need different names.
	FleetName string
	// FleetReserve, from EnvShedFleetReserve, is the share of FleetCapacity
	// kept for critical traffic, in [0, 1) (DefaultShedFleetReserve).
	FleetReserve float64
	// FleetShares, from EnvShedFleetShares ("low=0.5,normal=0.7"),
	// optionally lowers the share of FleetCapacity a priority may fill, so
	// that lower priorities are shed first.
	FleetShares map[limiter.Priority]float64
	// LeaseTTL, from EnvShedLeaseTTL, is how long a request let through by
	// the fleet shedder holds its slot (DefaultShedLeaseTTL, at most
	// MaxShedLeaseTTL).
	LeaseTTL time.Duration
	// Utilization, from EnvShedUtilization, names the utilization (0 to 1)
	// the backend fleet publishes into the shed backend; empty turns the
	// worker-utilization shedder off.
	Utilization string
	// UtilizationMaxAge, from EnvShedUtilizationMaxAge, is how old the
	// published value may be (DefaultShedUtilizationMaxAge); an older one
	// is ignored and the shedder recedes (fails open, slowly).
	UtilizationMaxAge time.Duration
	// Backend, from EnvShedBackend, holds the fleet's leases and the
	// published utilization: BackendMemcached or BackendDynamo (default:
	// memcached if configured, else dynamo if configured). Never memory: a
	// memory store counts per Lambda container, not across the fleet.
	Backend string
}

// Enabled reports whether any shedder is configured.
func (s Shed) Enabled() bool { return s.FleetCapacity > 0 || s.Utilization != "" }

// FleetConfig is the fleet-usage shedder's configuration.
func (s Shed) FleetConfig() limiter.FleetShedderConfig {
	return limiter.FleetShedderConfig{Name: s.FleetName, Capacity: s.FleetCapacity, Reserve: s.FleetReserve, Shares: s.FleetShares, LeaseTTL: s.LeaseTTL}
}

// Configured returns the network backends e configures (memcached with
// addresses, dynamo with a state table).
func (e Env) Configured() map[string]bool {
	m := map[string]bool{}
	if len(e.MemcachedAddrs) > 0 {
		m[BackendMemcached] = true
	}
	if e.DynamoTable != "" {
		m[BackendDynamo] = true
	}
	return m
}

// BackendVar names the variable that configures a network backend: the
// one to set when an error says the backend is missing.
func BackendVar(backend string) string {
	switch backend {
	case BackendMemcached:
		return EnvMemcachedAddrs
	case BackendDynamo:
		return EnvDynamoTable
	}
	return EnvDefaultBackend
}

// Error is a variable that [Parse] refuses.
type Error struct {
	Name string // the variable, e.g. EnvDeadline
	Msg  string // what is wrong with its value
}

func (e *Error) Error() string { return "config: " + e.Name + ": " + e.Msg }

// Parse reads the configuration through getenv (os.Getenv in the
// authorizer; the environment it is about to deploy in the construct).
// Errors are an [*Error] naming the variable.
func Parse(getenv func(string) string) (Env, error) {
	e := Env{
		RulesFile:        strings.TrimSpace(getenv(EnvRulesFile)),
		RulesYAML:        getenv(EnvRulesYAML),
		RulesTable:       strings.TrimSpace(getenv(EnvRulesTable)),
		DynamoTable:      strings.TrimSpace(getenv(EnvDynamoTable)),
		DefaultBackend:   strings.TrimSpace(getenv(EnvDefaultBackend)),
		MetricsNamespace: strings.TrimSpace(getenv(EnvMetricsNamespace)),
		HTTPResponses:    strings.TrimSpace(getenv(EnvHTTPResponses)),
		LogKey:           getenv(EnvLogHashKey),
		RulesTTL:         DefaultRulesTTL,
		Deadline:         DefaultDeadline,
		LogLevel:         slog.LevelInfo,
	}
	for _, parse := range []func(func(string) string) error{e.parseRules, e.parseBackends, e.parseLogs, e.parseClientIP, e.parseBreaker, e.parseTable} {
		if err := parse(getenv); err != nil {
			return Env{}, err
		}
	}
	shed, err := parseShed(getenv, e)
	if err != nil {
		return Env{}, err
	}
	e.Shed = shed
	if v := strings.TrimSpace(getenv(EnvTestClock)); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return Env{}, bad(EnvTestClock, "%q is not an RFC 3339 time", v)
		}
		e.TestClock = t
	}
	return e, nil
}

// bad is the error of the variable name.
func bad(name, format string, args ...any) error {
	return &Error{Name: name, Msg: fmt.Sprintf(format, args...)}
}

// parseRules checks that at most one rules source is set, and reads the
// rules' TTL and the deadline.
func (e *Env) parseRules(getenv func(string) string) error {
	sources := 0
	for _, s := range []string{e.RulesFile, strings.TrimSpace(e.RulesYAML), e.RulesTable} {
		if s != "" {
			sources++
		}
	}
	if sources > 1 {
		return bad(EnvRulesFile+", "+EnvRulesYAML+", "+EnvRulesTable, "set at most one rules source")
	}
	if v := strings.TrimSpace(getenv(EnvRulesTTL)); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return bad(EnvRulesTTL, "%q is not a positive Go duration such as 60s", v)
		}
		e.RulesTTL = d
	}
	if v := strings.TrimSpace(getenv(EnvDeadline)); v != "" {
		d, err := ParseDeadline(v)
		if err != nil {
			return bad(EnvDeadline, "%v", err)
		}
		e.Deadline = d
	}
	return nil
}

// parseBackends reads the memcached nodes, the switches and the default
// backend.
func (e *Env) parseBackends(getenv func(string) string) error {
	if v := strings.TrimSpace(getenv(EnvMemcachedAddrs)); v != "" {
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				e.MemcachedAddrs = append(e.MemcachedAddrs, a)
			}
		}
	}
	for _, b := range []struct {
		name string
		dst  *bool
	}{{EnvMemcachedTLS, &e.MemcachedTLS}, {EnvMemcachedProxy, &e.MemcachedProxy}, {EnvShadow, &e.Shadow}} {
		switch v := strings.ToLower(strings.TrimSpace(getenv(b.name))); v {
		case "", "false", "0", "no":
		case "true", "1", "yes":
			*b.dst = true
		default:
			return bad(b.name, "%q is not true or false", v)
		}
	}
	for _, b := range []struct {
		name string
		off  *bool
	}{{EnvDenyCache, &e.NoDenyCache}, {EnvLeases, &e.NoLeases}} {
		switch v := strings.ToLower(strings.TrimSpace(getenv(b.name))); v {
		case "", "true", "1", "yes":
		case "false", "0", "no":
			*b.off = true
		default:
			return bad(b.name, "%q is not true or false", v)
		}
	}
	switch e.DefaultBackend {
	case "":
		switch {
		case len(e.MemcachedAddrs) > 0:
			e.DefaultBackend = BackendMemcached
		case e.DynamoTable != "":
			e.DefaultBackend = BackendDynamo
		default:
			e.DefaultBackend = BackendMemory
		}
	case BackendMemory, BackendMemcached, BackendDynamo:
	default:
		return bad(EnvDefaultBackend, "%q is not memory, memcached or dynamo", e.DefaultBackend)
	}
	return nil
}

// parseLogs reads the HTTP API's response format and the log level.
func (e *Env) parseLogs(getenv func(string) string) error {
	switch e.HTTPResponses {
	case "":
		e.HTTPResponses = DefaultHTTPResponses
	case HTTPResponsesSimple, HTTPResponsesIAM:
	default:
		return bad(EnvHTTPResponses, "%q is not %s or %s", e.HTTPResponses, HTTPResponsesSimple, HTTPResponsesIAM)
	}
	level, name := strings.TrimSpace(getenv(EnvLogLevel)), EnvLogLevel
	if level == "" {
		level, name = strings.TrimSpace(getenv(EnvLambdaLogLevel)), EnvLambdaLogLevel
	}
	if level == "" {
		return nil
	}
	switch strings.ToUpper(level) {
	case "TRACE", "DEBUG":
		e.LogLevel = slog.LevelDebug
	case "INFO":
		e.LogLevel = slog.LevelInfo
	case "WARN":
		e.LogLevel = slog.LevelWarn
	case "ERROR", "FATAL":
		e.LogLevel = slog.LevelError
	default:
		return bad(name, "%q is not DEBUG, INFO, WARN or ERROR", level)
	}
	return nil
}

// parseClientIP reads where the client's address comes from, and the edge
// secret that makes the viewer address trustworthy.
func (e *Env) parseClientIP(getenv func(string) string) error {
	e.ClientIP = strings.TrimSpace(getenv(EnvClientIP))
	e.EdgeSecret = strings.TrimSpace(getenv(EnvEdgeSecret))
	switch e.ClientIP {
	case "":
		e.ClientIP = ClientIPSourceIP
	case ClientIPSourceIP:
	case ClientIPViewerAddress:
		if e.EdgeSecret == "" {
			return bad(EnvEdgeSecret, "required with %s=%s: without it, any caller that reaches the API directly picks its own address", EnvClientIP, ClientIPViewerAddress)
		}
	default:
		return bad(EnvClientIP, "%q is not %s or %s", e.ClientIP, ClientIPSourceIP, ClientIPViewerAddress)
	}
	if v := e.EdgeSecret; v != "" && (len(v) < MinEdgeSecret || len(v) > MaxEdgeSecret || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r >= 0x7f })) {
		return bad(EnvEdgeSecret, "is not %d to %d printable ASCII characters without spaces", MinEdgeSecret, MaxEdgeSecret)
	}
	return nil
}

// parseBreaker reads the circuit breakers' settings.
func (e *Env) parseBreaker(getenv func(string) string) error {
	e.Breaker = Breaker{Failures: DefaultBreakerFailures, OpenFor: DefaultBreakerOpenFor}
	if v := strings.TrimSpace(getenv(EnvBreakerFailures)); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > MaxBreakerFailures {
			return bad(EnvBreakerFailures, "%q is not a number of failures from 0 (off) to %d", v, MaxBreakerFailures)
		}
		e.Breaker.Failures = n
	}
	if v := strings.TrimSpace(getenv(EnvBreakerOpenFor)); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > MaxBreakerOpenFor {
			return bad(EnvBreakerOpenFor, "%q is not a Go duration between 0 and %v such as %v", v, MaxBreakerOpenFor, DefaultBreakerOpenFor)
		}
		e.Breaker.OpenFor = d
	}
	return nil
}

// parseTable reads the table's mode and, for an eventual table, the
// regions and this region's place in them.
func (e *Env) parseTable(getenv func(string) string) error {
	e.TableMode = strings.TrimSpace(getenv(EnvTableMode))
	switch e.TableMode {
	case TableRegional, TableMRSC:
		return nil
	case TableEventual:
	default:
		return bad(EnvTableMode, "%q is not %s or %s (unset: a regional table)", e.TableMode, TableEventual, TableMRSC)
	}
	v := strings.TrimSpace(getenv(EnvRegions))
	for _, r := range strings.Split(v, ",") {
		if r = strings.TrimSpace(r); r == "" {
			continue
		}
		if slices.Contains(e.Regions, r) {
			return bad(EnvRegions, "%q is listed twice", r)
		}
		e.Regions = append(e.Regions, r)
	}
	if len(e.Regions) < 2 {
		return bad(EnvRegions, "%q: %s=%s needs the deployment's regions, two or more, in one order (a global limit is kept as a share per region)", v, EnvTableMode, TableEventual)
	}
	region := strings.TrimSpace(getenv(EnvAWSRegion))
	e.Region = slices.Index(e.Regions, region)
	if e.Region < 0 {
		return bad(EnvAWSRegion, "%q is not one of %s %v: each region must know its place among the regions that share a global limit", region, EnvRegions, e.Regions)
	}
	return nil
}

// ParseDeadline parses a value of EnvDeadline: a Go duration in
// (0, MaxDeadline].
func ParseDeadline(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > MaxDeadline {
		return 0, fmt.Errorf("%q is not a Go duration between 0 and %v such as %v", v, MaxDeadline, DefaultDeadline)
	}
	return d, nil
}

// parseShed reads the SLUICE_SHED_* variables; e holds the rest of the
// configuration (the backends).
func parseShed(getenv func(string) string, e Env) (Shed, error) {
	s := Shed{
		FleetReserve:      DefaultShedFleetReserve,
		LeaseTTL:          DefaultShedLeaseTTL,
		UtilizationMaxAge: DefaultShedUtilizationMaxAge,
		FleetName:         strings.TrimSpace(getenv(EnvShedFleetName)),
		Utilization:       strings.TrimSpace(getenv(EnvShedUtilization)),
		Backend:           strings.TrimSpace(getenv(EnvShedBackend)),
	}
	if err := s.parseFleet(getenv); err != nil {
		return Shed{}, err
	}
	if v := strings.TrimSpace(getenv(EnvShedUtilizationMaxAge)); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return Shed{}, bad(EnvShedUtilizationMaxAge, "%q is not a positive Go duration such as %v", v, DefaultShedUtilizationMaxAge)
		}
		s.UtilizationMaxAge = d
	}
	for _, n := range []struct{ name, v string }{{EnvShedUtilization, s.Utilization}, {EnvShedFleetName, s.FleetName}} {
		if err := CheckStoreName(n.v); err != nil {
			return Shed{}, bad(n.name, "%v", err)
		}
	}
	if s.FleetName == "" {
		s.FleetName = DefaultShedFleetName
	}
	if s.FleetCapacity > 0 {
		// The limiter validates the reserve against the shares; a store
		// that is never called is enough for that.
		if _, err := limiter.NewFleetShedder(noLeases{}, s.FleetConfig()); err != nil {
			name := EnvShedFleetShares
			if s.FleetShares == nil {
				name = EnvShedFleetReserve
			}
			return Shed{}, bad(name, "%v", err)
		}
	}
	if err := s.parseBackend(e); err != nil {
		return Shed{}, err
	}
	return s, nil
}

// parseFleet reads the fleet shedder's capacity, reserve, shares and
// lease TTL.
func (s *Shed) parseFleet(getenv func(string) string) error {
	if v := strings.TrimSpace(getenv(EnvShedFleetCapacity)); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > MaxShedFleetCapacity {
			return bad(EnvShedFleetCapacity, "%q is not a number of requests from 0 (off) to %d", v, MaxShedFleetCapacity)
		}
		s.FleetCapacity = n
	}
	if v := strings.TrimSpace(getenv(EnvShedFleetReserve)); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f >= 0 && f < 1) {
			return bad(EnvShedFleetReserve, "%q is not a share in [0, 1) such as %g", v, DefaultShedFleetReserve)
		}
		s.FleetReserve = f
	}
	if v := strings.TrimSpace(getenv(EnvShedFleetShares)); v != "" {
		shares, err := parseShares(v)
		if err != nil {
			return bad(EnvShedFleetShares, "%q: %v", v, err)
		}
		s.FleetShares = shares
	}
	if v := strings.TrimSpace(getenv(EnvShedLeaseTTL)); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > MaxShedLeaseTTL {
			return bad(EnvShedLeaseTTL, "%q is not a Go duration between 0 and %v such as %v", v, MaxShedLeaseTTL, DefaultShedLeaseTTL)
		}
		s.LeaseTTL = d
	}
	return nil
}

// parseBackend checks the shedders' backend, defaulting to the network
// backend e configures.
func (s *Shed) parseBackend(e Env) error {
	switch s.Backend {
	case "":
		switch {
		case len(e.MemcachedAddrs) > 0:
			s.Backend = BackendMemcached
		case e.DynamoTable != "":
			s.Backend = BackendDynamo
		}
		// Neither: the authorizer refuses to start a shedder without a
		// store.
	case BackendMemory:
		return bad(EnvShedBackend, "memory counts per Lambda container, not across the fleet: use memcached or dynamo")
	case BackendMemcached, BackendDynamo:
		if s.Enabled() && !e.Configured()[s.Backend] {
			return bad(EnvShedBackend, "%s is not configured (set %s)", s.Backend, BackendVar(s.Backend))
		}
	default:
		return bad(EnvShedBackend, "%q is not memcached or dynamo", s.Backend)
	}
	return nil
}

// CheckStoreName checks a name of a key in the shed store
// (EnvShedUtilization, EnvShedFleetName): printable ASCII without spaces,
// at most MaxStoreName bytes. The empty name passes (it means the default
// or off).
func CheckStoreName(v string) error {
	if len(v) > MaxStoreName || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return fmt.Errorf("%.80q is not a name of printable ASCII without spaces, at most %d bytes", v, MaxStoreName)
	}
	return nil
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
		var p limiter.Priority
		if err := p.UnmarshalText([]byte(strings.TrimSpace(name))); err != nil || p == limiter.PriorityCritical {
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

// FormatShares writes shares by priority name ("low", "normal", "high") in
// the EnvShedFleetShares syntax, in that order; any other name follows, in
// sorted order, for [Parse] to refuse with its own message.
func FormatShares(shares map[string]float64) string {
	var parts []string
	add := func(name string) {
		parts = append(parts, name+"="+strconv.FormatFloat(shares[name], 'g', -1, 64))
	}
	known := []string{limiter.PriorityLow.String(), limiter.PriorityNormal.String(), limiter.PriorityHigh.String()}
	for _, name := range known {
		if _, ok := shares[name]; ok {
			add(name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(shares)) {
		if !slices.Contains(known, name) {
			add(name)
		}
	}
	return strings.Join(parts, ",")
}

// noLeases is a lease store that is never called (validation only).
type noLeases struct{}

func (noLeases) AcquireLease(context.Context, storage.Key, storage.LeaseOp) (storage.Decision, error) {
	return storage.Decision{}, errors.New("not a store")
}
func (noLeases) ReleaseLease(context.Context, storage.Key, storage.ReleaseOp) error {
	return errors.New("not a store")
}
