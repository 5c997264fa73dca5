package authz

import (
	_ "embed"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// DefaultRules is the embedded default rules document (rules.yaml).
//
//go:embed rules.yaml
var DefaultRules []byte

// DefaultRulesTTL is how long rules read from a table are cached.
const DefaultRulesTTL = 60 * time.Second

// Env is the authorizer's configuration, read from environment variables
// by [ParseEnv]. docs/authorizer.md lists them.
type Env struct {
	RulesFile  string        // SLUICE_RULES_FILE: path of a rules document
	RulesYAML  string        // SLUICE_RULES_YAML: an inline rules document
	RulesTable string        // SLUICE_RULES_TABLE: DynamoDB table of rules (key "name")
	RulesTTL   time.Duration // SLUICE_RULES_TTL: cache time of table rules (default 60s)

	DynamoTable    string   // SLUICE_DYNAMO_TABLE: state table (key "pk", TTL "ttl")
	MemcachedAddrs []string // SLUICE_MEMCACHED_ADDRS: comma-separated host:port
	MemcachedTLS   bool     // SLUICE_MEMCACHED_TLS: "true" for TLS, verifying each host
	MemcachedProxy bool     // SLUICE_MEMCACHED_PROXY: "true" behind a proxy that may reorder a pipeline (ElastiCache Serverless)
	DefaultBackend string   // SLUICE_DEFAULT_BACKEND: backend of limits naming none

	Deadline         time.Duration // SLUICE_DEADLINE: bound of one decision (default 250ms)
	MetricsNamespace string        // SLUICE_METRICS_NAMESPACE (default Sluice)
	HTTPResponses    string        // SLUICE_HTTP_RESPONSES: simple (default) or iam
	LogLevel         slog.Level    // SLUICE_LOG_LEVEL, else AWS_LAMBDA_LOG_LEVEL (default INFO)
	LogKey           string        // SLUICE_LOG_HASH_KEY: HMAC key of hashed keys in logs

	// Shed configures the load shedders (SLUICE_SHED_*); off unless
	// SLUICE_SHED_FLEET_CAPACITY or SLUICE_SHED_UTILIZATION is set.
	Shed ShedEnv

	// TestClock, from SLUICE_TEST_CLOCK (RFC 3339), freezes the clock. It
	// exists for the golden tests of the built binary; never set it in a
	// deployment.
	TestClock time.Time
}

// ParseEnv reads the configuration through getenv (os.Getenv). Errors name
// the variable.
func ParseEnv(getenv func(string) string) (Env, error) {
	e := Env{
		RulesFile:        strings.TrimSpace(getenv("SLUICE_RULES_FILE")),
		RulesYAML:        getenv("SLUICE_RULES_YAML"),
		RulesTable:       strings.TrimSpace(getenv("SLUICE_RULES_TABLE")),
		DynamoTable:      strings.TrimSpace(getenv("SLUICE_DYNAMO_TABLE")),
		DefaultBackend:   strings.TrimSpace(getenv("SLUICE_DEFAULT_BACKEND")),
		MetricsNamespace: strings.TrimSpace(getenv("SLUICE_METRICS_NAMESPACE")),
		HTTPResponses:    strings.TrimSpace(getenv("SLUICE_HTTP_RESPONSES")),
		LogKey:           getenv("SLUICE_LOG_HASH_KEY"),
		RulesTTL:         DefaultRulesTTL,
		Deadline:         DefaultDeadline,
		LogLevel:         slog.LevelInfo,
	}
	bad := func(name, format string, args ...any) (Env, error) {
		return Env{}, fmt.Errorf("authz: %s: %s", name, fmt.Sprintf(format, args...))
	}
	sources := 0
	for _, s := range []string{e.RulesFile, strings.TrimSpace(e.RulesYAML), e.RulesTable} {
		if s != "" {
			sources++
		}
	}
	if sources > 1 {
		return bad("SLUICE_RULES_FILE, SLUICE_RULES_YAML, SLUICE_RULES_TABLE", "set at most one rules source")
	}
	if v := strings.TrimSpace(getenv("SLUICE_RULES_TTL")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return bad("SLUICE_RULES_TTL", "%q is not a positive Go duration such as 60s", v)
		}
		e.RulesTTL = d
	}
	if v := strings.TrimSpace(getenv("SLUICE_DEADLINE")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > 30*time.Second {
			return bad("SLUICE_DEADLINE", "%q is not a Go duration between 0 and 30s such as 250ms", v)
		}
		e.Deadline = d
	}
	if v := strings.TrimSpace(getenv("SLUICE_MEMCACHED_ADDRS")); v != "" {
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				e.MemcachedAddrs = append(e.MemcachedAddrs, a)
			}
		}
	}
	switch v := strings.ToLower(strings.TrimSpace(getenv("SLUICE_MEMCACHED_TLS"))); v {
	case "", "false", "0", "no":
	case "true", "1", "yes":
		e.MemcachedTLS = true
	default:
		return bad("SLUICE_MEMCACHED_TLS", "%q is not true or false", v)
	}
	switch v := strings.ToLower(strings.TrimSpace(getenv("SLUICE_MEMCACHED_PROXY"))); v {
	case "", "false", "0", "no":
	case "true", "1", "yes":
		e.MemcachedProxy = true
	default:
		return bad("SLUICE_MEMCACHED_PROXY", "%q is not true or false", v)
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
		return bad("SLUICE_DEFAULT_BACKEND", "%q is not memory, memcached or dynamo", e.DefaultBackend)
	}
	switch e.HTTPResponses {
	case "":
		e.HTTPResponses = HTTPSimple
	case HTTPSimple, HTTPIAM:
	default:
		return bad("SLUICE_HTTP_RESPONSES", "%q is not simple or iam", e.HTTPResponses)
	}
	level := strings.TrimSpace(getenv("SLUICE_LOG_LEVEL"))
	name := "SLUICE_LOG_LEVEL"
	if level == "" {
		level, name = strings.TrimSpace(getenv("AWS_LAMBDA_LOG_LEVEL")), "AWS_LAMBDA_LOG_LEVEL"
	}
	if level != "" {
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
	}
	shed, err := parseShedEnv(getenv, e)
	if err != nil {
		return Env{}, err
	}
	e.Shed = shed
	if v := strings.TrimSpace(getenv("SLUICE_TEST_CLOCK")); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return bad("SLUICE_TEST_CLOCK", "%q is not an RFC 3339 time", v)
		}
		e.TestClock = t
	}
	return e, nil
}

// Backend names, as rules and SLUICE_DEFAULT_BACKEND spell them.
const (
	BackendMemory    = "memory"
	BackendMemcached = "memcached"
	BackendDynamo    = "dynamo"
)
