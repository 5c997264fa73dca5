package sluice

import (
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"

	"github.com/sluicehq/sluice/config"
)

// ContextBootstrapDir is the context key of BootstrapDir's default.
const ContextBootstrapDir = "sluice:bootstrapDir"

// DefaultBootstrapDir is BootstrapDir's default without the context key.
const DefaultBootstrapDir = "build/authorizer"

// Props configures a [RateLimiter]. The zero value of every field but the
// API and Rules means its default.
type Props struct {
	// RestAPI is a REST API to protect with a REQUEST authorizer. At least
	// one of RestAPI and HTTPAPI is required; both may be set (one function,
	// two authorizers).
	RestAPI awsapigateway.RestApi
	// Methods are the methods of RestAPI to protect. Empty: every method of
	// RestAPI, including methods added after New, except the OPTIONS
	// methods of CORS preflight.
	Methods []awsapigateway.Method

	// HTTPAPI is an HTTP API to protect with a Lambda authorizer (payload
	// 2.0, simple responses).
	HTTPAPI awsapigatewayv2.HttpApi
	// Routes are the routes of HTTPAPI to protect. Empty: every route of
	// HTTPAPI, including routes added after New.
	Routes []awsapigatewayv2.HttpRoute

	// BootstrapDir is the directory holding the authorizer's `bootstrap`
	// for provided.al2023 on arm64 (`make build` writes
	// build/authorizer/bootstrap). Default: the context value
	// ContextBootstrapDir (`cdk synth -c sluice:bootstrapDir=DIR`), else
	// "build/authorizer", relative to the directory cdk runs in.
	BootstrapDir string

	// Rules says where the authorizer finds its rules. Required.
	Rules Rules

	// VPC runs the function (and a created cache) in your VPC, in
	// VPCSubnets (default: its private subnets). It must reach DynamoDB (a
	// gateway endpoint or NAT). Nil: with a cache, New creates a VPC of
	// isolated subnets with a DynamoDB gateway endpoint whose policy allows
	// only the authorizer's actions on its tables; without a cache, the
	// function runs outside any VPC.
	VPC        awsec2.IVpc
	VPCSubnets *awsec2.SubnetSelection
	// VPCZones are the availability zones of a created VPC (at least 2).
	// Empty: CDK's choice, which for a stack with an explicit environment
	// looks the zones up in the account at synth.
	VPCZones []string
	// VPCCidr of a created VPC. Default "10.40.0.0/16".
	VPCCidr string

	// Cache is the memcached the authorizer uses. Nil: a new ElastiCache
	// Serverless cache.
	Cache *Cache

	// Table is the DynamoDB state table (partition key "pk" String, TTL
	// attribute "ttl"). Nil: New creates an on-demand table.
	Table awsdynamodb.ITable
	// RetainTable keeps a table New creates when the stack is deleted.
	// Default true.
	RetainTable *bool
	// TableThroughput pre-warms a table New creates and caps its
	// throughput (docs/infra.md "Sizing the state table"). Zero: AWS's
	// defaults. With Table set, size your table where you define it.
	TableThroughput TableThroughput
	// TableMode says what the state table is across regions, for the
	// rules' scope: TableRegional (""; a table in one region, or memcached
	// alone), TableEventual (a global table in the default mode: writes
	// replicate asynchronously, last writer wins) or TableMRSC (a global
	// table with multi-Region strong consistency). A rule with scope
	// global is refused at synth on TableRegional. TableMRSC keeps it as
	// one limit; TableEventual as regional shares (a sliding_window,
	// bounded, of sub-window counters, or a token_bucket that is not
	// strict: other limits are refused; docs/regions.md). The function
	// learns the mode from SLUICE_TABLE_MODE.
	TableMode string
	// TableRegions are the deployment's regions, in one order that every
	// region's construct is given (SLUICE_REGIONS; the function finds its
	// own by AWS_REGION): required with TableEventual, two or more, the
	// stack's region among them.
	TableRegions []string

	// Function configures the authorizer function.
	Function Function

	// Shedding turns on the authorizer's load shedders (off by default).
	Shedding Shedding

	// Alarms configures the CloudWatch alarms on the circuit breakers (one
	// per network backend, see [RateLimiter.BreakerAlarms]), on
	// throttling ([RateLimiter.ThrottleAlarms]) and, with the keeper, on
	// the regional shares ([RateLimiter.SharesAlarms]); on by default.
	Alarms Alarms

	// RetryAfter is the Retry-After of the REST API's 429 (rate limited).
	// API Gateway's gateway responses take static header values (see
	// docs/infra.md), so the per-request value is in the 429's JSON body
	// only. Zero: derived from the rules at synth (the longest time any
	// limit can make a client wait for one request, see
	// [DeriveRetryAfter]); required with rules from a table.
	RetryAfter time.Duration
	// ShedRetryAfter is the Retry-After of the REST API's 503 (shed).
	// Zero: the fleet shedder's lease TTL rounded up to a second, at least
	// one second (a shed request waits for a slot to free). API Gateway's
	// own throttling (THROTTLED, a per-second rate) gets 429 with
	// Retry-After 1.
	ShedRetryAfter time.Duration
	// ContextHeaders maps context.authorizer.* into the 429's Retry-After
	// and the RateLimit-Policy and RateLimit fields of
	// draft-ietf-httpapi-ratelimit-headers-11 ([RateLimitHeaders]). API
	// Gateway documents only request parameters and static values for
	// gateway-response headers; this is off by default and untested
	// against AWS (docs/infra.md).
	ContextHeaders bool
	// LegacyRateLimitHeaders adds the older RateLimit-Limit,
	// -Remaining and -Reset trio wherever the RateLimit fields are mapped,
	// for clients that read it.
	LegacyRateLimitHeaders bool
	// EdgeSecret puts the API behind the edge front door ([NewEdge]):
	// the rules' {ip} is the CloudFront-Viewer-Address of a request that
	// carries this secret in config.EdgeSecretHeader (the distribution's
	// EdgeProps.Secret), the source IP otherwise
	// (SLUICE_CLIENT_IP=cloudfront-viewer-address, SLUICE_EDGE_SECRET).
	EdgeSecret string
	// GatewayResponses, false, leaves the REST API's gateway responses
	// alone (a Deny is then API Gateway's default 403). Default true.
	GatewayResponses *bool
}

// The state table's modes across regions ([Props].TableMode).
const (
	TableRegional = config.TableRegional
	TableEventual = config.TableEventual
	TableMRSC     = config.TableMRSC
)

// Rules says where the authorizer reads its rules: exactly one field. A
// document given here (YAML, File, BundlePath) is parsed with package
// policy at synth; a bad rule fails synthesis, naming the rule and field.
type Rules struct {
	// YAML is a rules document, passed inline (SLUICE_RULES_YAML).
	YAML string
	// File is a rules document read at synth, passed inline.
	File string
	// BundlePath is a file inside BootstrapDir (relative to it, e.g.
	// "rules.yaml"), read by the authorizer from /var/task/<path>
	// (SLUICE_RULES_FILE).
	BundlePath string
	// Table is a DynamoDB table of rules (partition key "name"), read and
	// cached by the authorizer (SLUICE_RULES_TABLE); not known at synth, so
	// RetryAfter is required.
	Table awsdynamodb.ITable
	// TableTTL is how long table rules are cached (SLUICE_RULES_TTL).
	// Default config.DefaultRulesTTL.
	TableTTL time.Duration
}

// Cache modes.
const (
	CacheServerless = "serverless" // ElastiCache Serverless (TLS only), created by New
	CacheNodes      = "nodes"      // a node-based ElastiCache cluster, created by New
	CacheNone       = "none"       // no memcached: DynamoDB (or memory) only
	CacheExisting   = "existing"   // your memcached
)

// Cache configures the authorizer's memcached.
type Cache struct {
	// Mode is CacheServerless (the default), CacheNodes, CacheNone or
	// CacheExisting.
	Mode string
	// Name of a created cache (ElastiCache names are per account and
	// region). Default: derived from the construct's path.
	Name string

	// MaxDataStorageGB and MaxECPUPerSecond cap a serverless cache.
	// Defaults 1 and 5000.
	MaxDataStorageGB int
	MaxECPUPerSecond int

	// NodeType, Nodes, EngineVersion of a node-based cluster. Defaults
	// "cache.t4g.small", 2, "1.6.22".
	NodeType      string
	Nodes         int
	EngineVersion string
	// Port of a node-based or existing cache. Default 11211.
	Port int
	// TLS of a node-based or existing cache. Default true (serverless
	// caches are TLS only).
	TLS *bool

	// Addrs of an existing cache: host:port, comma-separated (tokens
	// allowed).
	Addrs string
	// SecurityGroup of an existing cache: New allows Port from the
	// authorizer's security group into it.
	SecurityGroup awsec2.ISecurityGroup
	// Proxy: an existing cache behind a proxy that may reorder a pipeline
	// (ElastiCache Serverless, mcrouter).
	Proxy bool
}

// Function configures the authorizer function.
type Function struct {
	// MemoryMB default 256.
	MemoryMB int
	// Timeout default 3s; must exceed Deadline.
	Timeout time.Duration
	// Deadline bounds one decision (SLUICE_DEADLINE). Default
	// config.DefaultDeadline.
	Deadline time.Duration
	// MetricsNamespace of the EMF metrics (SLUICE_METRICS_NAMESPACE).
	// Default config.DefaultMetricsNamespace.
	MetricsNamespace string
	// BreakerFailures (SLUICE_BREAKER_FAILURES) is how many store
	// failures in a row open a network backend's circuit breaker. Default
	// config.DefaultBreakerFailures; negative turns the breakers off.
	BreakerFailures int
	// BreakerOpenFor (SLUICE_BREAKER_OPEN_FOR) is how long an open
	// breaker answers at once before one probe. Default
	// config.DefaultBreakerOpenFor.
	BreakerOpenFor time.Duration
	// Shadow (SLUICE_SHADOW) runs every rule in shadow mode: checked and
	// counted (ShadowDenied), never denying; the deny list still denies.
	// For rolling a new rule set out.
	Shadow bool
	// LogRetention of the function's log group. Default one month.
	LogRetention awslogs.RetentionDays
	// ReservedConcurrency, 0 for none.
	ReservedConcurrency int
	// LogicalID fixes the function's CloudFormation logical id (so that
	// `sam local invoke -t <template> <id>` survives refactoring). Default:
	// CDK's.
	LogicalID string
	// AuthorizerName names the API Gateway authorizers. Default: the
	// construct's id.
	AuthorizerName string
}

// Shedding turns on the authorizer's load shedders (docs/shedding.md),
// passed as the SLUICE_SHED_* variables. Off when neither FleetCapacity nor
// Utilization is set.
type Shedding struct {
	// FleetCapacity is the number of requests the fleet behind the API
	// serves at once (SLUICE_SHED_FLEET_CAPACITY); 0 leaves the fleet-usage
	// shedder off.
	FleetCapacity int
	// FleetReserve is the share of FleetCapacity kept for critical traffic
	// (SLUICE_SHED_FLEET_RESERVE). Nil: config.DefaultShedFleetReserve.
	FleetReserve *float64
	// FleetShares lowers the share a priority ("low", "normal", "high")
	// may fill (SLUICE_SHED_FLEET_SHARES).
	FleetShares map[string]float64
	// FleetName names the fleet's lease key (SLUICE_SHED_FLEET_NAME).
	// Default config.DefaultShedFleetName.
	FleetName string
	// LeaseTTL is how long a request let through counts as in flight
	// (SLUICE_SHED_LEASE_TTL). Default config.DefaultShedLeaseTTL.
	LeaseTTL time.Duration
	// Utilization names the utilization the backend fleet publishes
	// (SLUICE_SHED_UTILIZATION); empty leaves the worker-utilization
	// shedder off.
	Utilization string
	// UtilizationMaxAge (SLUICE_SHED_UTILIZATION_MAX_AGE). Default
	// config.DefaultShedUtilizationMaxAge.
	UtilizationMaxAge time.Duration
	// Backend holds the leases and the utilization: "memcached" (the
	// default with a cache) or "dynamo" (the state table; the default
	// without a cache) (SLUICE_SHED_BACKEND).
	Backend string
	// Publisher, with Utilization, deploys the utilization publisher
	// (publisher.go); UtilizationMaxAge then defaults to
	// config.PublishMaxAgePeriods of its period.
	Publisher *Publisher
}

// Enabled reports whether a shedder is on.
func (s Shedding) Enabled() bool { return s.FleetCapacity > 0 || s.Utilization != "" }
