package stacks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/infra/sluice"
)

// Consistency modes of the DynamoDB state table.
const (
	// ConsistencyDefault is a global table with multi-Region eventual
	// consistency (MREC): replication is asynchronous, last writer wins.
	ConsistencyDefault = "default"
	// ConsistencyMRSC is a global table with multi-Region strong consistency:
	// exactly three regions of one region set.
	ConsistencyMRSC = "mrsc"
)

// Memcached deployment modes.
const (
	MemcachedServerless = "serverless" // ElastiCache Serverless, TLS only
	MemcachedNodes      = "nodes"      // node-based ElastiCache cluster
	MemcachedNone       = "none"       // no cache: DynamoDB (or embedded memory) only
)

// DummyAccount is the account used when none is configured, so that
// synthesis works offline. Deploying needs the real account (context
// `account`): the CDK CLI refuses to deploy a stack whose account differs from
// the credentials' account.
const DummyAccount = "111111111111"

// mrscRegionSets are the region sets in which a multi-Region strongly
// consistent table may be created; all three replicas must be in one set.
// This mirrors the check in aws-cdk-lib 2.270.0 (TableV2
// validateMrscConfiguration), repeated here to fail early with a message
// that names the config field.
var mrscRegionSets = map[string][]string{
	"US": {"us-east-1", "us-east-2", "us-west-2"},
	"EU": {"eu-west-1", "eu-west-2", "eu-west-3", "eu-central-1"},
	"AP": {"ap-northeast-1", "ap-northeast-2", "ap-northeast-3"},
}

// Config is the deployment configuration, read from a JSON file (see
// LoadConfig). Zero values mean "use the default"; ApplyDefaults fills them
// in and Validate checks the result.
type Config struct {
	// StackPrefix names the stacks (<prefix>-<region>) and, lower-cased,
	// the tables and the cache. Up to 30 characters. Default "Sluice".
	StackPrefix string `json:"stackPrefix,omitempty"`
	// Account is the AWS account of every stack. Default DummyAccount.
	Account string `json:"account,omitempty"`
	// Regions gets one stack each.
	Regions []string `json:"regions"`
	// PrimaryRegion defines the global table(s). Default Regions[0].
	PrimaryRegion string `json:"primaryRegion,omitempty"`
	// Consistency is ConsistencyDefault or ConsistencyMRSC.
	Consistency string `json:"consistency,omitempty"`
	// TableName of the state table. Default "<prefix>-state".
	TableName string `json:"tableName,omitempty"`
	// RetainTables keeps the tables when a stack is deleted. Default true.
	RetainTables *bool `json:"retainTables,omitempty"`
	// TableThroughput pre-warms the state table and caps its throughput
	// (every replica). Unset: AWS's defaults.
	TableThroughput TableThroughputConfig `json:"tableThroughput"`

	Rules      RulesConfig      `json:"rules"`
	Memcached  MemcachedConfig  `json:"memcached"`
	Authorizer AuthorizerConfig `json:"authorizer"`
	Shedding   SheddingConfig   `json:"shedding"`
	API        APIConfig        `json:"api"`
	Alarms     AlarmsConfig     `json:"alarms"`
	VPC        VPCConfig        `json:"vpc"`
	// Edge adds the edge front door (optional).
	Edge *EdgeConfig `json:"edge,omitempty"`
}

// EdgeConfig adds the edge front door: one CloudFront distribution (in a
// stack of its own, <prefix>-edge in us-east-1) for DomainName, whose
// origin OriginName resolves, by Route 53 latency records with health
// checks, to the nearest healthy region's REST API. The shared secret that
// lets the authorizers trust CloudFront-Viewer-Address is not in the file:
// pass it with -c edgeSecret=... (16 to 256 printable characters, e.g.
// `openssl rand -hex 32`), the same on every synth.
type EdgeConfig struct {
	// DomainName is the public name, e.g. "api.example.com".
	DomainName string `json:"domainName"`
	// OriginName defaults to "origin.<domainName>".
	OriginName string `json:"originName,omitempty"`
	// HostedZoneID and ZoneName name the public hosted zone of both
	// names (no lookup at synth).
	HostedZoneID string `json:"hostedZoneId"`
	ZoneName     string `json:"zoneName"`
	// HealthCheckPath is probed in every region (see
	// sluice.EdgeOriginProps). Default "/".
	HealthCheckPath string `json:"healthCheckPath,omitempty"`
	// Secret comes from the context (CtxEdgeSecret), never the file.
	Secret string `json:"-"`
}

// TableThroughputConfig is the construct's sluice.TableThroughput, field
// for field, with its bounds (sluice.TableThroughput.Check): 0 leaves
// AWS's default; a warm value is at least what a new on-demand table
// serves at once (12,000 read, 4,000 write units a second) and not above
// the maximum of its kind.
type TableThroughputConfig struct {
	WarmReadUnitsPerSecond  int `json:"warmReadUnitsPerSecond,omitempty"`
	WarmWriteUnitsPerSecond int `json:"warmWriteUnitsPerSecond,omitempty"`
	MaxReadRequestUnits     int `json:"maxReadRequestUnits,omitempty"`
	MaxWriteRequestUnits    int `json:"maxWriteRequestUnits,omitempty"`
}

// construct is the construct's TableThroughput.
func (t TableThroughputConfig) construct() sluice.TableThroughput {
	return sluice.TableThroughput{
		WarmReadUnitsPerSecond:  t.WarmReadUnitsPerSecond,
		WarmWriteUnitsPerSecond: t.WarmWriteUnitsPerSecond,
		MaxReadRequestUnits:     t.MaxReadRequestUnits,
		MaxWriteRequestUnits:    t.MaxWriteRequestUnits,
	}
}

// RulesConfig says where the authorizer finds its rules: exactly one
// source. A document (inline, file, bundlePath) is parsed at synth, so a
// bad rule fails `cdk synth` naming the rule and the field.
type RulesConfig struct {
	// Inline YAML, passed inline.
	Inline string `json:"inline,omitempty"`
	// File is a YAML file (relative to the config file) read at synthesis
	// and passed inline.
	File string `json:"file,omitempty"`
	// BundlePath is a file inside the deployed bundle (relative to its
	// root, e.g. "rules.yaml"), read from /var/task/<path>.
	BundlePath string `json:"bundlePath,omitempty"`
	// Table creates a rules table (partition key "name"), read by the
	// authorizer at run time (api.retryAfterSeconds is then required).
	Table bool `json:"table,omitempty"`
}

// MemcachedConfig sizes the regional cache.
type MemcachedConfig struct {
	// Mode is MemcachedServerless (default), MemcachedNodes or MemcachedNone.
	Mode string `json:"mode,omitempty"`
	// MaxDataStorageGB caps a serverless cache's storage. Default 1.
	MaxDataStorageGB int `json:"maxDataStorageGB,omitempty"`
	// MaxECPUPerSecond caps a serverless cache's compute. Default 5000.
	MaxECPUPerSecond int `json:"maxECPUPerSecond,omitempty"`
	// NodeType of a node-based cluster. Default "cache.t4g.small".
	NodeType string `json:"nodeType,omitempty"`
	// Nodes in a node-based cluster. Default 2.
	Nodes int `json:"nodes,omitempty"`
	// Port of a node-based cluster. Default 11211.
	Port int `json:"port,omitempty"`
	// TLS enables in-transit encryption on a node-based cluster (memcached
	// 1.6.12 or later). Default true. Serverless caches always use TLS.
	TLS *bool `json:"tls,omitempty"`
	// EngineVersion of a node-based cluster. Default "1.6.22".
	EngineVersion string `json:"engineVersion,omitempty"`
}

// AuthorizerConfig configures the authorizer Lambda.
type AuthorizerConfig struct {
	// MemoryMB default 256.
	MemoryMB int `json:"memoryMB,omitempty"`
	// TimeoutSeconds default 3; must exceed Deadline.
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
	// Deadline of one decision, a Go duration. Default
	// config.DefaultDeadline.
	Deadline string `json:"deadline,omitempty"`
	// MetricsNamespace of the EMF metrics. Default
	// config.DefaultMetricsNamespace.
	MetricsNamespace string `json:"metricsNamespace,omitempty"`
	// LogRetentionDays of the function's log group. Default 30.
	LogRetentionDays int `json:"logRetentionDays,omitempty"`
	// ReservedConcurrency, 0 for none.
	ReservedConcurrency int `json:"reservedConcurrency,omitempty"`
}

// Shed backends (shedding.backend): the store shared by every container of
// a region's authorizer. Never the in-process memory store, which counts
// per Lambda container.
const (
	ShedBackendMemcached = "memcached"
	ShedBackendDynamo    = "dynamo"
)

// SheddingConfig turns on the authorizer's load shedders (Stripe's
// fleet-usage and worker-utilization shedders, docs/shedding.md): the
// construct's Shedding props, with durations as Go duration strings. Off
// by default. Bounds and defaults are the configuration contract's
// (package config), checked by the authorizer's own parser.
type SheddingConfig struct {
	// FleetCapacity is the number of requests the fleet behind one
	// region's API serves at once; 0 leaves the fleet-usage shedder off.
	FleetCapacity int `json:"fleetCapacity,omitempty"`
	// FleetReserve is the share of FleetCapacity kept for critical
	// traffic, in [0, 1).
	FleetReserve *float64 `json:"fleetReserve,omitempty"`
	// FleetShares optionally lowers the share a priority ("low", "normal",
	// "high") may fill before it is shed.
	FleetShares map[string]float64 `json:"fleetShares,omitempty"`
	// FleetName names the fleet's lease key; the stack appends the region
	// (SLUICE_SHED_FLEET_NAME=<name>-<region>), so that each region counts
	// its own fleet even on a global table.
	FleetName string `json:"fleetName,omitempty"`
	// LeaseTTL is how long a request let through counts as in flight, a
	// Go duration near the integration's typical latency.
	LeaseTTL string `json:"leaseTtl,omitempty"`
	// Utilization names the utilization the backend fleet publishes;
	// empty leaves the worker-utilization shedder off.
	Utilization string `json:"utilization,omitempty"`
	// UtilizationMaxAge is how old the published value may be, a Go
	// duration.
	UtilizationMaxAge string `json:"utilizationMaxAge,omitempty"`
	// Backend holds the leases and the published utilization:
	// ShedBackendMemcached (the default when the stack has a cache) or
	// ShedBackendDynamo (the state table; the default without a cache).
	Backend string `json:"backend,omitempty"`
}

// Enabled reports whether any shedder is on.
func (s SheddingConfig) Enabled() bool { return s.FleetCapacity > 0 || s.Utilization != "" }

// APIConfig configures the APIs in front of the authorizer.
type APIConfig struct {
	// StageName of the REST API. Default "prod".
	StageName string `json:"stageName,omitempty"`
	// UpstreamURL is proxied to (REST: HTTP_PROXY to <url>/{proxy}; HTTP
	// API: HTTP_PROXY to <url>). Empty: the REST API answers with a mock
	// integration and the HTTP API proxies to DefaultHTTPUpstream.
	UpstreamURL string `json:"upstreamUrl,omitempty"`
	// HTTPAPI adds the HTTP API variant. Default true.
	HTTPAPI *bool `json:"httpApi,omitempty"`
	// RetryAfterSeconds is the static Retry-After of the 429 (unless
	// ContextHeaders). Default: derived from the rules
	// (sluice.DeriveRetryAfter); required with rules.table. (The 503 of a
	// shed request says the lease TTL, rounded up.)
	RetryAfterSeconds int `json:"retryAfterSeconds,omitempty"`
	// ContextHeaders maps context.authorizer.* into the 429's headers
	// (Retry-After, RateLimit-*). API Gateway documents only request
	// parameters and static values as gateway-response header sources, so
	// this is off by default; see docs/infra.md.
	ContextHeaders bool `json:"contextHeaders,omitempty"`
	// LegacyRateLimitHeaders adds the RateLimit-Limit, -Remaining and
	// -Reset trio beside the RateLimit-Policy and RateLimit fields, for
	// clients that read the older draft's headers.
	LegacyRateLimitHeaders bool `json:"legacyRateLimitHeaders,omitempty"`
	// CloudWatchRole creates the account-level API Gateway role that
	// access logging needs (one per account and region). Default true.
	CloudWatchRole *bool `json:"cloudWatchRole,omitempty"`
	// WebACLArns associates a WAFv2 web ACL with the REST API stage, per
	// region (region -> ARN). Optional.
	WebACLArns map[string]string `json:"webAclArns,omitempty"`
}

// DefaultHTTPUpstream is the HTTP API's integration when no upstream is
// configured: an AWS-operated endpoint that answers any GET with the
// caller's IP, harmless to point at.
const DefaultHTTPUpstream = "https://checkip.amazonaws.com"

// AlarmsConfig sets the alarm thresholds.
type AlarmsConfig struct {
	// DeniedRatio alarms when Denied/(Allowed+Denied) exceeds it for 5
	// minutes. Default 0.5.
	DeniedRatio float64 `json:"deniedRatio,omitempty"`
	// BackendLatencyP99Ms alarms when the p99 of BackendLatency exceeds
	// it in 3 of 5 minutes. Default 100.
	BackendLatencyP99Ms float64 `json:"backendLatencyP99Ms,omitempty"`
	// TopicArns receive the alarms, per region (region -> SNS topic ARN).
	TopicArns map[string]string `json:"topicArns,omitempty"`
}

// VPCConfig shapes the VPC of each region.
type VPCConfig struct {
	// CIDR default "10.40.0.0/16".
	CIDR string `json:"cidr,omitempty"`
	// MaxAZs default 2 (ElastiCache Serverless needs at least 2).
	MaxAZs int `json:"maxAzs,omitempty"`
	// AvailabilityZones per region (region -> zone names). Zones are named
	// explicitly because a stack with an explicit environment would
	// otherwise look them up in the account at synthesis, which needs
	// credentials. Default: the first MaxAZs of DefaultZones(region).
	AvailabilityZones map[string][]string `json:"availabilityZones,omitempty"`
}

// Zones returns the availability zones of the VPC in a region.
func (v VPCConfig) Zones(region string) []string {
	if z, ok := v.AvailabilityZones[region]; ok {
		return z
	}
	z := DefaultZones(region)
	return z[:min(len(z), v.MaxAZs)]
}

// DefaultZones guesses a region's zone names: <region>a, b, c, except in
// regions known to lack a "b" zone for new accounts. Zone letters map to
// physical zones per account and a few regions differ between accounts
// (us-west-1): set vpc.availabilityZones when in doubt
// (`aws ec2 describe-availability-zones --region R`).
func DefaultZones(region string) []string {
	letters := []string{"a", "b", "c"}
	switch region {
	case "ap-northeast-1":
		letters = []string{"a", "c", "d"}
	case "ca-central-1":
		letters = []string{"a", "b", "d"}
	case "us-west-1":
		letters = []string{"b", "c"}
	}
	zs := make([]string, len(letters))
	for i, l := range letters {
		zs[i] = region + l
	}
	return zs
}

// LoadConfig reads a JSON config file. Unknown fields are an error, so that
// a typo does not silently fall back to a default. A relative rules.file is
// resolved against the config file's directory.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if c.Rules.File != "" && !filepath.IsAbs(c.Rules.File) {
		c.Rules.File = filepath.Join(filepath.Dir(path), c.Rules.File)
	}
	return &c, nil
}

// ApplyDefaults fills in every zero field with its default.
func (c *Config) ApplyDefaults() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	defBool := func(b **bool, v bool) {
		if *b == nil {
			*b = &v
		}
	}
	def(&c.StackPrefix, "Sluice")
	def(&c.Account, DummyAccount)
	if c.PrimaryRegion == "" && len(c.Regions) > 0 {
		c.PrimaryRegion = c.Regions[0]
	}
	def(&c.Consistency, ConsistencyDefault)
	def(&c.TableName, strings.ToLower(c.StackPrefix)+"-state")
	defBool(&c.RetainTables, true)

	m := &c.Memcached
	def(&m.Mode, MemcachedServerless)
	defInt(&m.MaxDataStorageGB, 1)
	defInt(&m.MaxECPUPerSecond, 5000)
	def(&m.NodeType, "cache.t4g.small")
	defInt(&m.Nodes, 2)
	defInt(&m.Port, 11211)
	defBool(&m.TLS, true)
	def(&m.EngineVersion, "1.6.22")

	a := &c.Authorizer
	defInt(&a.MemoryMB, 256)
	defInt(&a.TimeoutSeconds, 3)
	def(&a.Deadline, config.DefaultDeadline.String())
	def(&a.MetricsNamespace, config.DefaultMetricsNamespace)
	defInt(&a.LogRetentionDays, 30)

	p := &c.API
	def(&p.StageName, "prod")
	defBool(&p.HTTPAPI, true)
	defBool(&p.CloudWatchRole, true)

	if c.Alarms.DeniedRatio == 0 {
		c.Alarms.DeniedRatio = 0.5
	}
	if c.Alarms.BackendLatencyP99Ms == 0 {
		c.Alarms.BackendLatencyP99Ms = 100
	}

	def(&c.VPC.CIDR, "10.40.0.0/16")
	defInt(&c.VPC.MaxAZs, 2)
}

var (
	regionRE     = regexp.MustCompile(`^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]$`)
	accountRE    = regexp.MustCompile(`^[0-9]{12}$`)
	prefixRE     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9-]{0,29}$`)
	tableNameRE  = regexp.MustCompile(`^[a-zA-Z0-9_.-]{3,200}$`)
	cacheNameRE  = regexp.MustCompile(`^[a-z][a-z0-9]*(-[a-z0-9]+)*$`) // ElastiCache: no "--", no trailing "-"
	stageNameRE  = regexp.MustCompile(`^[A-Za-z0-9_]{1,128}$`)
	hostRE       = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$`)
	zoneIDRE     = regexp.MustCompile(`^Z[A-Z0-9]{1,31}$`)
	errNoRegions = errors.New("config: regions: at least one region is required")
)

// maxTimeoutSec bounds the authorizer's timeout: an authorizer answering
// later than API Gateway waits is useless.
const maxTimeoutSec = 30

// Validate checks a defaulted config. The error names the offending field.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config: %s: "+format, append([]any{field}, args...)...))
	}
	if len(c.Regions) == 0 {
		return errNoRegions
	}
	seen := c.validateRegions(bad)
	c.validateRules(bad)
	c.Memcached.validate(bad)
	c.Authorizer.validate(bad)
	c.validateShedding(bad)
	c.validateAPI(bad, seen)
	c.validateAlarmsVPC(bad, seen)
	if c.Edge != nil {
		c.Edge.validate(bad)
	}
	return errors.Join(errs...)
}

// badFunc records the error of a field.
type badFunc = func(field, format string, args ...any)

// validateRegions checks the names, the account, the regions and the
// table, and returns the regions.
func (c *Config) validateRegions(bad badFunc) map[string]bool {
	if !prefixRE.MatchString(c.StackPrefix) {
		bad("stackPrefix", "%q must start with a letter and hold up to 30 letters, digits or '-'", c.StackPrefix)
	}
	if !cacheNameRE.MatchString(strings.ToLower(c.StackPrefix)) {
		bad("stackPrefix", "%q must not end with '-' or hold \"--\" (it names the cache)", c.StackPrefix)
	}
	if !accountRE.MatchString(c.Account) {
		bad("account", "%q is not a 12-digit AWS account id", c.Account)
	}
	seen := map[string]bool{}
	for _, r := range c.Regions {
		if !regionRE.MatchString(r) {
			bad("regions", "%q is not a region name", r)
		}
		if seen[r] {
			bad("regions", "%q is listed twice", r)
		}
		seen[r] = true
	}
	if !seen[c.PrimaryRegion] {
		bad("primaryRegion", "%q is not one of regions %v", c.PrimaryRegion, c.Regions)
	}
	switch c.Consistency {
	case ConsistencyDefault:
	case ConsistencyMRSC:
		if len(c.Regions) != 3 {
			bad("consistency", "mrsc needs exactly three regions, got %d %v", len(c.Regions), c.Regions)
		} else if set := mrscRegionSet(c.Regions); set == "" {
			bad("consistency", "mrsc needs all three regions in one region set (%s), got %v", describeRegionSets(), c.Regions)
		}
	default:
		bad("consistency", "%q is neither %q nor %q", c.Consistency, ConsistencyDefault, ConsistencyMRSC)
	}
	if !tableNameRE.MatchString(c.TableName) {
		bad("tableName", "%q is not a valid DynamoDB table name", c.TableName)
	}
	if err := c.TableThroughput.construct().Check(); err != nil {
		// The construct's check, one error a field, named as in this file.
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			field, msg, _ := strings.Cut(e.Error(), ": ")
			bad(jsonField(field), "%s", msg)
		}
	}
	return seen
}

// validateRules checks that exactly one rules source is set.
func (c *Config) validateRules(bad badFunc) {
	sources := 0
	for _, set := range []bool{c.Rules.Inline != "", c.Rules.File != "", c.Rules.BundlePath != "", c.Rules.Table} {
		if set {
			sources++
		}
	}
	if sources != 1 {
		bad("rules", "set exactly one of inline, file, bundlePath, table")
	}
	if strings.HasPrefix(c.Rules.BundlePath, "/") || strings.Contains(c.Rules.BundlePath, "..") {
		bad("rules.bundlePath", "%q must be a relative path inside the bundle", c.Rules.BundlePath)
	}
}

// validate checks the memcached section.
func (m MemcachedConfig) validate(bad badFunc) {
	switch m.Mode {
	case MemcachedServerless:
		if m.MaxDataStorageGB < 1 || m.MaxDataStorageGB > 5000 {
			bad("memcached.maxDataStorageGB", "%d is outside 1..5000", m.MaxDataStorageGB)
		}
		if m.MaxECPUPerSecond < 1000 || m.MaxECPUPerSecond > 15000000 {
			bad("memcached.maxECPUPerSecond", "%d is outside 1000..15000000", m.MaxECPUPerSecond)
		}
	case MemcachedNodes:
		if m.Nodes < 1 || m.Nodes > 40 {
			bad("memcached.nodes", "%d is outside 1..40", m.Nodes)
		}
		if !strings.HasPrefix(m.NodeType, "cache.") {
			bad("memcached.nodeType", "%q is not a cache node type", m.NodeType)
		}
		if m.Port < 1024 || m.Port > 65535 {
			bad("memcached.port", "%d is outside 1024..65535", m.Port)
		}
	case MemcachedNone:
	default:
		bad("memcached.mode", "%q is not one of %q, %q, %q", m.Mode, MemcachedServerless, MemcachedNodes, MemcachedNone)
	}
}

// validate checks the authorizer section.
func (a AuthorizerConfig) validate(bad badFunc) {
	if a.MemoryMB < 128 || a.MemoryMB > 10240 {
		bad("authorizer.memoryMB", "%d is outside 128..10240", a.MemoryMB)
	}
	if a.TimeoutSeconds < 1 || a.TimeoutSeconds > maxTimeoutSec {
		bad("authorizer.timeoutSeconds", "%d is outside 1..%d", a.TimeoutSeconds, maxTimeoutSec)
	}
	if d, err := config.ParseDeadline(a.Deadline); err != nil {
		bad("authorizer.deadline", "%v", err)
	} else if d >= time.Duration(a.TimeoutSeconds)*time.Second {
		bad("authorizer.deadline", "%s must be shorter than the function timeout (%ds)", d, a.TimeoutSeconds)
	}
	if a.MetricsNamespace == "" || strings.HasPrefix(a.MetricsNamespace, "AWS/") {
		bad("authorizer.metricsNamespace", "%q must be non-empty and not start with AWS/", a.MetricsNamespace)
	}
	if !slices.Contains(logRetentionDays, a.LogRetentionDays) {
		bad("authorizer.logRetentionDays", "%d is not a CloudWatch Logs retention (%v)", a.LogRetentionDays, logRetentionDays)
	}
	if a.ReservedConcurrency < 0 {
		bad("authorizer.reservedConcurrency", "%d is negative", a.ReservedConcurrency)
	}
}

// validateAPI checks the API section; seen holds the regions.
func (c *Config) validateAPI(bad badFunc, seen map[string]bool) {
	p := c.API
	if !stageNameRE.MatchString(p.StageName) {
		bad("api.stageName", "%q may hold only letters, digits and '_'", p.StageName)
	}
	if p.UpstreamURL != "" && !strings.HasPrefix(p.UpstreamURL, "https://") && !strings.HasPrefix(p.UpstreamURL, "http://") {
		bad("api.upstreamUrl", "%q is not an http(s) URL", p.UpstreamURL)
	}
	if p.RetryAfterSeconds < 0 {
		bad("api.retryAfterSeconds", "%d is negative", p.RetryAfterSeconds)
	}
	if p.RetryAfterSeconds == 0 && c.Rules.Table {
		bad("api.retryAfterSeconds", "required with rules.table (the rules are not known at synth)")
	}
	for r := range p.WebACLArns {
		if !seen[r] {
			bad("api.webAclArns", "region %q is not one of regions", r)
		}
	}
}

// validateAlarmsVPC checks the alarms and VPC sections; seen holds the
// regions.
func (c *Config) validateAlarmsVPC(bad badFunc, seen map[string]bool) {
	if c.Alarms.DeniedRatio <= 0 || c.Alarms.DeniedRatio >= 1 {
		bad("alarms.deniedRatio", "%g is outside (0, 1)", c.Alarms.DeniedRatio)
	}
	if c.Alarms.BackendLatencyP99Ms <= 0 {
		bad("alarms.backendLatencyP99Ms", "%g is not positive", c.Alarms.BackendLatencyP99Ms)
	}
	for r := range c.Alarms.TopicArns {
		if !seen[r] {
			bad("alarms.topicArns", "region %q is not one of regions", r)
		}
	}
	if c.VPC.MaxAZs < 2 || c.VPC.MaxAZs > 6 {
		bad("vpc.maxAzs", "%d is outside 2..6", c.VPC.MaxAZs)
	}
	for _, r := range c.Regions {
		zs := c.VPC.Zones(r)
		if len(zs) < 2 {
			bad("vpc.availabilityZones", "%s needs at least 2 zones, got %v", r, zs)
		}
		for _, z := range zs {
			if !strings.HasPrefix(z, r) || len(z) != len(r)+1 {
				bad("vpc.availabilityZones", "%q is not a zone of %s", z, r)
			}
		}
	}
	for r := range c.VPC.AvailabilityZones {
		if !seen[r] {
			bad("vpc.availabilityZones", "region %q is not one of regions", r)
		}
	}
}

// validate checks the edge section.
func (e *EdgeConfig) validate(bad badFunc) {
	if !hostRE.MatchString(e.DomainName) || !strings.HasSuffix(e.DomainName, "."+strings.TrimSuffix(e.ZoneName, ".")) {
		bad("edge.domainName", "%q is not a host name in the zone %q", e.DomainName, e.ZoneName)
	}
	if e.OriginName != "" && (!hostRE.MatchString(e.OriginName) || !strings.HasSuffix(e.OriginName, "."+strings.TrimSuffix(e.ZoneName, "."))) {
		bad("edge.originName", "%q is not a host name in the zone %q", e.OriginName, e.ZoneName)
	}
	if !zoneIDRE.MatchString(e.HostedZoneID) {
		bad("edge.hostedZoneId", "%q is not a Route 53 hosted zone id", e.HostedZoneID)
	}
	if e.Secret == "" {
		bad("edge", "the secret shared by CloudFront and the authorizers is missing: pass -c %s=<16 to 256 printable characters>", CtxEdgeSecret)
	}
}

// validateShedding checks the shedding section with the construct's own
// check, the authorizer's parser, for every region's fleet name.
func (c *Config) validateShedding(bad func(field, format string, args ...any)) {
	for _, r := range c.Regions {
		sh, err := c.Shedding.build(r)
		if err == nil {
			_, err = sh.Env(c.Memcached.Mode != MemcachedNone)
		}
		if err != nil {
			field, msg, _ := strings.Cut(err.Error(), ": ")
			bad(jsonField(field), "%s", msg)
			return
		}
	}
}

// jsonField turns a construct prop path ("Shedding.FleetReserve") into
// this file's field name ("shedding.fleetReserve").
func jsonField(prop string) string {
	parts := strings.Split(prop, ".")
	for i, p := range parts {
		if p != "" {
			parts[i] = strings.ToLower(p[:1]) + p[1:]
		}
	}
	return strings.NewReplacer("leaseTTL", "leaseTtl").Replace(strings.Join(parts, "."))
}

// build is the construct's Shedding of one region: the fleet name gets
// the region, so that each region counts its own fleet.
func (s SheddingConfig) build(region string) (sluice.Shedding, error) {
	out := sluice.Shedding{
		FleetCapacity: s.FleetCapacity,
		FleetReserve:  s.FleetReserve,
		FleetShares:   s.FleetShares,
		FleetName:     s.FleetName,
		Utilization:   s.Utilization,
		Backend:       s.Backend,
	}
	if s.FleetCapacity > 0 {
		out.FleetName = cmpOr(s.FleetName, config.DefaultShedFleetName) + "-" + region
	}
	for _, d := range []struct {
		field string
		v     string
		dst   *time.Duration
	}{{"shedding.leaseTtl", s.LeaseTTL, &out.LeaseTTL}, {"shedding.utilizationMaxAge", s.UtilizationMaxAge, &out.UtilizationMaxAge}} {
		if d.v == "" {
			continue
		}
		v, err := time.ParseDuration(d.v)
		if err != nil {
			return out, fmt.Errorf("%s: %q is not a Go duration", d.field, d.v)
		}
		*d.dst = v
	}
	return out, nil
}

// construct is build for a validated config.
func (s SheddingConfig) construct(region string) sluice.Shedding {
	out, _ := s.build(region)
	return out
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// rules is the construct's Rules; a rules table is the region's replica,
// by name.
func (c *Config) rules(s awscdk.Stack) sluice.Rules {
	r := c.Rules
	switch {
	case r.Inline != "":
		return sluice.Rules{YAML: r.Inline}
	case r.File != "":
		return sluice.Rules{File: r.File}
	case r.BundlePath != "":
		return sluice.Rules{BundlePath: r.BundlePath}
	case r.Table:
		return sluice.Rules{Table: awsdynamodb.Table_FromTableName(s, jsii.String("RulesTableReplica"), jsii.String(c.RulesTableName()))}
	}
	return sluice.Rules{}
}

// construct is the construct's Cache.
func (m MemcachedConfig) construct(prefix string) *sluice.Cache {
	mode := m.Mode
	if mode == MemcachedNone {
		mode = sluice.CacheNone
	}
	return &sluice.Cache{
		Mode:             mode,
		Name:             strings.ToLower(prefix) + "-memcached",
		MaxDataStorageGB: m.MaxDataStorageGB,
		MaxECPUPerSecond: m.MaxECPUPerSecond,
		NodeType:         m.NodeType,
		Nodes:            m.Nodes,
		EngineVersion:    m.EngineVersion,
		Port:             m.Port,
		TLS:              m.TLS,
	}
}

// construct is the construct's Function.
func (a AuthorizerConfig) construct(prefix string) sluice.Function {
	d, _ := time.ParseDuration(a.Deadline)
	return sluice.Function{
		MemoryMB:            a.MemoryMB,
		Timeout:             time.Duration(a.TimeoutSeconds) * time.Second,
		Deadline:            d,
		MetricsNamespace:    a.MetricsNamespace,
		LogRetention:        retention(a.LogRetentionDays),
		ReservedConcurrency: a.ReservedConcurrency,
		AuthorizerName:      prefix + "RateLimiter",
	}
}

// RulesTableName is the rules table's name ("<prefix>-rules").
func (c *Config) RulesTableName() string {
	return strings.ToLower(c.StackPrefix) + "-rules"
}

// StackName is the stack (and template file) name for a region.
func (c *Config) StackName(region string) string {
	return c.StackPrefix + "-" + region
}

// ReplicaRegions are the regions other than the primary, in config order.
func (c *Config) ReplicaRegions() []string {
	var rs []string
	for _, r := range c.Regions {
		if r != c.PrimaryRegion {
			rs = append(rs, r)
		}
	}
	return rs
}

func mrscRegionSet(regions []string) string {
	for name, set := range mrscRegionSets {
		all := true
		for _, r := range regions {
			all = all && slices.Contains(set, r)
		}
		if all {
			return name
		}
	}
	return ""
}

func describeRegionSets() string {
	var parts []string
	for _, name := range []string{"US", "EU", "AP"} {
		parts = append(parts, name+": "+strings.Join(mrscRegionSets[name], ", "))
	}
	return strings.Join(parts, "; ")
}

// logRetentionDays are the values CloudWatch Logs accepts.
var logRetentionDays = []int{1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653}

// retentionNames are the jsii enum names of logRetentionDays, in order.
var retentionNames = []string{"ONE_DAY", "THREE_DAYS", "FIVE_DAYS", "ONE_WEEK", "TWO_WEEKS", "ONE_MONTH", "TWO_MONTHS", "THREE_MONTHS", "FOUR_MONTHS", "FIVE_MONTHS", "SIX_MONTHS", "ONE_YEAR", "THIRTEEN_MONTHS", "EIGHTEEN_MONTHS", "TWO_YEARS", "THREE_YEARS", "FIVE_YEARS", "SIX_YEARS", "SEVEN_YEARS", "EIGHT_YEARS", "NINE_YEARS", "TEN_YEARS"}

// retention converts a validated number of days to the CDK enum.
func retention(days int) awslogs.RetentionDays {
	return awslogs.RetentionDays(retentionNames[slices.Index(logRetentionDays, days)])
}

// tableMode is the state table's mode across regions, for the rules'
// scope (sluice.Props.TableMode; TableEventual with the regions in
// sluice.json's order, sluice.Props.TableRegions).
func (c *Config) tableMode() string {
	switch {
	case c.Consistency == ConsistencyMRSC:
		return sluice.TableMRSC
	case len(c.Regions) > 1:
		return sluice.TableEventual
	}
	return sluice.TableRegional
}
