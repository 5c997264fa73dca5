package config

import (
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// Prefix begins the name of every variable of the contract.
const Prefix = "SLUICE_"

// Names of the environment variables the authorizer reads.
const (
	// EnvRulesFile is the path of a rules document.
	EnvRulesFile = "SLUICE_RULES_FILE"
	// EnvRulesYAML is an inline rules document.
	EnvRulesYAML = "SLUICE_RULES_YAML"
	// EnvRulesTable names a DynamoDB table of rules (partition key
	// "name").
	EnvRulesTable = "SLUICE_RULES_TABLE"
	// EnvRulesTTL is how long rules read from the table are cached.
	EnvRulesTTL = "SLUICE_RULES_TTL"

	// EnvDynamoTable names the DynamoDB state table (partition key "pk",
	// TTL attribute "ttl").
	EnvDynamoTable = "SLUICE_DYNAMO_TABLE"
	// EnvMemcachedAddrs lists memcached host:port addresses, comma-separated.
	EnvMemcachedAddrs = "SLUICE_MEMCACHED_ADDRS"
	// EnvMemcachedTLS is "true" for TLS, verifying each host.
	EnvMemcachedTLS = "SLUICE_MEMCACHED_TLS"
	// EnvMemcachedProxy is "true" behind a proxy that may reorder a
	// pipeline (ElastiCache Serverless).
	EnvMemcachedProxy = "SLUICE_MEMCACHED_PROXY"
	// EnvDefaultBackend is the backend of limits that name none.
	EnvDefaultBackend = "SLUICE_DEFAULT_BACKEND"

	// EnvDeadline bounds one decision.
	EnvDeadline = "SLUICE_DEADLINE"
	// EnvMetricsNamespace is the CloudWatch namespace of the EMF metrics.
	EnvMetricsNamespace = "SLUICE_METRICS_NAMESPACE"
	// EnvHTTPResponses is HTTPResponsesSimple or HTTPResponsesIAM.
	EnvHTTPResponses = "SLUICE_HTTP_RESPONSES"
	// EnvLogLevel is DEBUG, INFO, WARN or ERROR; else EnvLambdaLogLevel.
	EnvLogLevel = "SLUICE_LOG_LEVEL"
	// EnvLogHashKey is the HMAC key of hashed keys in logs.
	EnvLogHashKey = "SLUICE_LOG_HASH_KEY"
	// EnvTestClock freezes the clock (RFC 3339): for the golden tests of
	// the built binary only, never in a deployment.
	EnvTestClock = "SLUICE_TEST_CLOCK"

	// EnvClientIP says where the rules' {ip} comes from: ClientIPSourceIP
	// (the default) or ClientIPViewerAddress (behind the edge front door).
	EnvClientIP = "SLUICE_CLIENT_IP"
	// EnvEdgeSecret is the value the edge's CloudFront distribution sends
	// in EdgeSecretHeader: a request that carries it came through
	// CloudFront, and only then is its CloudFront-Viewer-Address trusted.
	EnvEdgeSecret = "SLUICE_EDGE_SECRET"

	// EnvShadow is "true" to run every rule in shadow mode (evaluated and
	// counted, never denying): the global switch of the rules' shadow.
	EnvShadow = "SLUICE_SHADOW"

	// EnvPublishNamespace is the CloudWatch namespace of the metric the
	// utilization publisher reads (functions/publisher).
	EnvPublishNamespace = "SLUICE_PUBLISH_NAMESPACE"
	// EnvPublishMetric is the name of that metric.
	EnvPublishMetric = "SLUICE_PUBLISH_METRIC"
	// EnvPublishDimensions are its dimensions, "Name=Value,Name=Value".
	EnvPublishDimensions = "SLUICE_PUBLISH_DIMENSIONS"
	// EnvPublishStatistic is the statistic read (Maximum, Average, ...).
	EnvPublishStatistic = "SLUICE_PUBLISH_STATISTIC"
	// EnvPublishDivisor divides the metric into a utilization in [0, 1]
	// (a reserved concurrency, 100 for a percentage).
	EnvPublishDivisor = "SLUICE_PUBLISH_DIVISOR"
	// EnvPublishPeriod is the metric's period, and the publisher's
	// schedule.
	EnvPublishPeriod = "SLUICE_PUBLISH_PERIOD"

	// EnvShedFleetCapacity turns the fleet-usage shedder on.
	EnvShedFleetCapacity = "SLUICE_SHED_FLEET_CAPACITY"
	// EnvShedFleetReserve is the share of the capacity kept for critical
	// traffic.
	EnvShedFleetReserve = "SLUICE_SHED_FLEET_RESERVE"
	// EnvShedFleetShares lowers the share a priority may fill
	// ("low=0.5,normal=0.7").
	EnvShedFleetShares = "SLUICE_SHED_FLEET_SHARES"
	// EnvShedFleetName names the fleet's lease key.
	EnvShedFleetName = "SLUICE_SHED_FLEET_NAME"
	// EnvShedLeaseTTL is how long a request let through holds its slot.
	EnvShedLeaseTTL = "SLUICE_SHED_LEASE_TTL"
	// EnvShedUtilization turns the worker-utilization shedder on: the name
	// of the utilization the backend fleet publishes.
	EnvShedUtilization = "SLUICE_SHED_UTILIZATION"
	// EnvShedUtilizationMaxAge is how old the published value may be.
	EnvShedUtilizationMaxAge = "SLUICE_SHED_UTILIZATION_MAX_AGE"
	// EnvShedBackend holds the leases and the utilization.
	EnvShedBackend = "SLUICE_SHED_BACKEND"

	// EnvDenyCache is "false" to turn off the deny cache (on by default).
	EnvDenyCache = "SLUICE_DENY_CACHE"
	// EnvLeases is "false" to turn off capacity leases (on by default for
	// the limits that allow them; docs/leases.md).
	EnvLeases = "SLUICE_LEASES"

	// EnvBreakerFailures is how many store failures in a row open a
	// network backend's circuit breaker; 0 turns the breakers off.
	EnvBreakerFailures = "SLUICE_BREAKER_FAILURES"
	// EnvBreakerOpenFor is how long an open breaker fails calls at once
	// before it lets one probe through.
	EnvBreakerOpenFor = "SLUICE_BREAKER_OPEN_FOR"

	// EnvTableMode is the state table's mode across regions:
	// TableRegional (unset), TableEventual or TableMRSC. The construct
	// sets it from Props.TableMode.
	EnvTableMode = "SLUICE_TABLE_MODE"
	// EnvRegions lists the deployment's regions, comma-separated, in one
	// order that every region is given: required with TableEventual.
	EnvRegions = "SLUICE_REGIONS"
)

// EnvAWSRegion is Lambda's own variable naming the function's region:
// with TableEventual, it must be one of EnvRegions.
const EnvAWSRegion = "AWS_REGION"

// The state table's modes across regions (EnvTableMode).
const (
	TableRegional = ""
	TableEventual = "eventual"
	TableMRSC     = "mrsc"
)

// EnvLambdaLogLevel is Lambda's own log-level variable (advanced logging
// controls), read when EnvLogLevel is unset.
const EnvLambdaLogLevel = "AWS_LAMBDA_LOG_LEVEL"

// Names lists every variable of the contract, in the order above.
func Names() []string {
	return []string{
		EnvRulesFile, EnvRulesYAML, EnvRulesTable, EnvRulesTTL,
		EnvDynamoTable, EnvMemcachedAddrs, EnvMemcachedTLS, EnvMemcachedProxy, EnvDefaultBackend,
		EnvDeadline, EnvMetricsNamespace, EnvHTTPResponses, EnvLogLevel, EnvLogHashKey, EnvTestClock,
		EnvClientIP, EnvEdgeSecret, EnvShadow,
		EnvPublishNamespace, EnvPublishMetric, EnvPublishDimensions, EnvPublishStatistic, EnvPublishDivisor, EnvPublishPeriod,
		EnvShedFleetCapacity, EnvShedFleetReserve, EnvShedFleetShares, EnvShedFleetName,
		EnvShedLeaseTTL, EnvShedUtilization, EnvShedUtilizationMaxAge, EnvShedBackend,
		EnvBreakerFailures, EnvBreakerOpenFor, EnvDenyCache, EnvLeases,
		EnvTableMode, EnvRegions,
	}
}

// The regional shares' metrics (a global rule's limits on an eventual
// table): one EMF line per limit and report period of a process, with
// the dimension sets [DimensionLimit] and [] (docs/authorizer.md,
// "Metrics").
const (
	DimensionLimit = "Limit"
	// Units the process's agents gave to other regions, and took in.
	MetricSharesGiven    = "SharesGiven"
	MetricSharesReceived = "SharesReceived"
	// Agent ticks run, and those that failed.
	MetricSharesTicks      = "SharesTicks"
	MetricSharesTickErrors = "SharesTickErrors"
	// Agent roles taken, and found taken by another.
	MetricSharesTakeovers = "SharesTakeovers"
	MetricSharesRoleLost  = "SharesRoleLost"
	// Decisions with no share entry valid at their stamp (the fail
	// mode's), and other regions' entries read stale at ticks.
	MetricSharesStale        = "SharesStale"
	MetricSharesStaleEntries = "SharesStaleEntries"
	// Sweeps of the other regions' wants indexes; their listings read
	// out of force; the most keys listed in force in one sweep (a gauge).
	MetricSharesSweeps  = "SharesSweeps"
	MetricSharesExpired = "SharesExpired"
	MetricSharesWanted  = "SharesWanted"
	// Listing writes to this region's wants index, and keys it could not
	// take (full).
	MetricSharesListed  = "SharesListed"
	MetricSharesDropped = "SharesDropped"
)

// Backend names, as rules, EnvDefaultBackend and EnvShedBackend spell them.
const (
	BackendMemory    = "memory"
	BackendMemcached = "memcached"
	BackendDynamo    = "dynamo"
)

// Values of EnvHTTPResponses: how the authorizer answers an HTTP API.
const (
	HTTPResponsesSimple = "simple" // {isAuthorized, context}: enableSimpleResponses
	HTTPResponsesIAM    = "iam"    // an IAM policy, as for REST APIs
)

// Values of EnvClientIP.
const (
	// ClientIPSourceIP is the request context's source IP: the address
	// that connected to API Gateway.
	ClientIPSourceIP = "source-ip"
	// ClientIPViewerAddress is the address in the CloudFront-Viewer-Address
	// header of a request that carries the edge secret (EdgeSecretHeader).
	ClientIPViewerAddress = "cloudfront-viewer-address"
)

// Headers of the edge front door: CloudFront sets the first to the
// viewer's address and port when the origin request policy includes it,
// and adds the second, with the secret, as an origin custom header.
const (
	ViewerAddressHeader = "CloudFront-Viewer-Address"
	EdgeSecretHeader    = "X-Sluice-Edge-Secret"
)

// Defaults and bounds.
const (
	// DefaultRulesTTL is how long rules read from a table are cached.
	DefaultRulesTTL = 60 * time.Second
	// DefaultDeadline bounds one decision.
	DefaultDeadline = 250 * time.Millisecond
	// MaxDeadline is the longest EnvDeadline: API Gateway waits at most
	// 30 s for a Lambda authorizer (and for the integration after it).
	MaxDeadline = 30 * time.Second
	// DefaultMetricsNamespace is the namespace of the EMF metrics.
	DefaultMetricsNamespace = "Sluice"
	// DefaultHTTPResponses is how the authorizer answers an HTTP API.
	DefaultHTTPResponses = HTTPResponsesSimple

	// DefaultShedFleetReserve is the share of the fleet's capacity kept
	// for critical traffic.
	DefaultShedFleetReserve = 0.2
	// MaxShedFleetCapacity is the largest EnvShedFleetCapacity: one stored
	// value holds the fleet's leases (storage.MaxLeases).
	MaxShedFleetCapacity = storage.MaxLeases
	// DefaultShedFleetName names the fleet shedder's lease key.
	DefaultShedFleetName = "fleet"
	// DefaultShedLeaseTTL is how long a request let through by the fleet
	// shedder counts as in flight: the authorizer cannot see a request
	// end, so set it near the integration's typical latency.
	DefaultShedLeaseTTL = time.Second
	// MaxShedLeaseTTL bounds EnvShedLeaseTTL (a Lambda's longest run).
	MaxShedLeaseTTL = 15 * time.Minute
	// DefaultShedUtilizationMaxAge is how old a published utilization may
	// be before it is ignored.
	DefaultShedUtilizationMaxAge = 30 * time.Second
	// MaxStoreName bounds EnvShedUtilization and EnvShedFleetName, names
	// of keys in the shed store: printable ASCII without spaces.
	MaxStoreName = 128

	// DefaultBreakerFailures is how many store failures in a row
	// (unavailable or throttled) open a network backend's breaker.
	DefaultBreakerFailures = 5
	// MaxBreakerFailures bounds EnvBreakerFailures.
	MaxBreakerFailures = 1000
	// DefaultBreakerOpenFor is how long an open breaker fails calls at
	// once before one probe: a backend's return is noticed within it.
	DefaultBreakerOpenFor = time.Second
	// MaxBreakerOpenFor bounds EnvBreakerOpenFor.
	MaxBreakerOpenFor = 5 * time.Minute

	// MinEdgeSecret and MaxEdgeSecret bound EnvEdgeSecret: printable
	// ASCII without spaces, long enough not to be guessed, short enough
	// for a CloudFront origin custom header.
	MinEdgeSecret = 16
	MaxEdgeSecret = 256
)
