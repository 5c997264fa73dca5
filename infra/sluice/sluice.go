package sluice

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/policy"
)

// Attribute names of the tables, as backends/dynamo and the rules-table
// loader read them (TestTableAttributesMatchAuthorizer compares them with
// the authorizer's source).
const (
	StatePartitionKey = "pk"   // String
	StateTTLAttribute = "ttl"  // Number, epoch seconds
	RulesPartitionKey = "name" // String
)

// The DynamoDB actions the authorizer performs, and nothing more: the
// methods of the client interfaces its code is written against
// (backends/dynamo's Client for the state table, used by the rate-limit
// store and by the load shedders alike; the rules-table loader's ScanAPI).
// TestIAMMatchesClientInterfaces reads those interfaces from the source.
var (
	StateTableActions = []string{"dynamodb:GetItem", "dynamodb:UpdateItem"}
	RulesTableActions = []string{"dynamodb:Scan"}
)

// IdentitySource is the REST authorizer's identity source, and
// HTTPIdentitySource the HTTP API's. With the result cache off, API Gateway
// uses identity sources only to check that they are present (a request
// missing one gets 401 without the authorizer being called), so the source
// must be something every request has: the caller's IP.
const (
	IdentitySource     = "context.identity.sourceIp"
	HTTPIdentitySource = "$context.identity.sourceIp"
)

// ContextKeys are the authorizer context keys (strings or numbers) of a
// decision, readable as $context.authorizer.<key>.
var ContextKeys = []string{"decision", "rule", "limit", "remaining", "reset", "retryAfter"}

// Defaults of the props that the configuration contract does not hold.
const (
	DefaultMemoryMB = 256
	DefaultTimeout  = 3 * time.Second
	DefaultVPCCidr  = "10.40.0.0/16"
	// maxTimeout: API Gateway waits at most this long for an authorizer.
	maxTimeout = 30 * time.Second
)

// RateLimiter is the construct: the authorizer function, its authorizers on
// the APIs, the gateway responses, the grants, and the VPC, cache and table
// it made or was given.
type RateLimiter struct {
	constructs.Construct

	function   awslambda.Function
	role       awsiam.Role
	table      awsdynamodb.ITable
	vpc        awsec2.IVpc
	sg         awsec2.SecurityGroup
	cache      *cacheInfo
	rest       awsapigateway.CfnAuthorizer
	http       awsapigatewayv2.HttpAuthorizer
	metrics    *Metrics
	alarms     map[string]awscloudwatch.Alarm
	publisher  awslambda.Function
	env        map[string]string
	retryAfter time.Duration
	retrySrc   string
	// shedRetryAfter is the 503's Retry-After.
	shedRetryAfter time.Duration
	rules          *rulesSource
	// throttleAlarms by metric name.
	throttleAlarms map[string]awscloudwatch.Alarm
	// sharesAlarms by metric name.
	sharesAlarms map[string]awscloudwatch.Alarm

	errs  []string
	lazy  []func() []string // checks that need the whole tree (synth time)
	props Props
}

// New adds the rate limiter to scope, in front of props.RestAPI and/or
// props.HTTPAPI. Invalid props do not panic: they are validation errors of
// the construct, so `cdk synth` fails naming the construct and the prop.
func New(scope constructs.Construct, id string, props *Props) *RateLimiter {
	r := &RateLimiter{}
	constructs.NewConstruct_Override(r, scope, jsii.String(id))
	r.Node().AddValidation(&validation{check: r.allErrors})
	if props == nil {
		props = &Props{}
	}
	r.props = *props
	p := &r.props
	r.applyDefaults(id)

	if p.RestAPI == nil && p.HTTPAPI == nil {
		r.fail("RestAPI, HTTPAPI: set at least one API to protect")
	}
	if len(p.Methods) > 0 && p.RestAPI == nil {
		r.fail("Methods: set RestAPI")
	}
	if len(p.Routes) > 0 && p.HTTPAPI == nil {
		r.fail("Routes: set HTTPAPI")
	}
	if p.BootstrapDir == "" {
		p.BootstrapDir = DefaultBootstrapDir
		if v, ok := r.Node().TryGetContext(jsii.String(ContextBootstrapDir)).(string); ok && v != "" {
			p.BootstrapDir = v
		}
	}
	if err := checkBootstrap(p.BootstrapDir); err != nil {
		r.fail("BootstrapDir: %v (build it with `make build`, or pass -c %s=<dir holding bootstrap>)", err, ContextBootstrapDir)
	}
	r.checkFunction()
	r.checkTable()
	rules, err := loadRules(p.Rules, p.BootstrapDir)
	if err != nil {
		r.fail("%v", err)
	}
	r.rules = rules
	r.checkScopes()
	r.deriveRetryAfter()
	if len(r.errs) > 0 {
		// Nothing sensible can be built; synthesis reports the errors.
		return r
	}

	r.buildTables()
	r.buildNetwork()
	r.buildCache()
	r.buildEnv()
	r.buildFunction(id)
	r.buildKeeper()
	r.buildPublisher()
	if p.RestAPI != nil {
		r.protectREST()
	}
	if p.HTTPAPI != nil {
		r.protectHTTP()
	}
	r.metrics = newMetrics(p.Function.MetricsNamespace)
	r.buildAlarms()
	return r
}

// Function is the authorizer function.
func (r *RateLimiter) Function() awslambda.Function { return r.function }

// Role is the function's role.
func (r *RateLimiter) Role() awsiam.Role { return r.role }

// Table is the DynamoDB state table (given or created).
func (r *RateLimiter) Table() awsdynamodb.ITable { return r.table }

// VPC is the function's VPC, nil when it runs outside any.
func (r *RateLimiter) VPC() awsec2.IVpc { return r.vpc }

// SecurityGroup is the function's security group, nil outside a VPC.
func (r *RateLimiter) SecurityGroup() awsec2.SecurityGroup { return r.sg }

// RestAuthorizer is the REST API's REQUEST authorizer, nil without RestAPI.
func (r *RateLimiter) RestAuthorizer() awsapigateway.CfnAuthorizer { return r.rest }

// HTTPAuthorizer is the HTTP API's authorizer, nil without HTTPAPI.
func (r *RateLimiter) HTTPAuthorizer() awsapigatewayv2.HttpAuthorizer { return r.http }

// Metrics are the authorizer's CloudWatch metrics.
func (r *RateLimiter) Metrics() *Metrics { return r.metrics }

// RetryAfter is the static Retry-After of the 429 (rate limited), and
// where it comes from (the prop, or the limit it was derived from).
func (r *RateLimiter) RetryAfter() (time.Duration, string) { return r.retryAfter, r.retrySrc }

// ShedRetryAfter is the static Retry-After of the 503 (shed).
func (r *RateLimiter) ShedRetryAfter() time.Duration { return r.shedRetryAfter }

// Environment is the function's environment (values may hold tokens).
func (r *RateLimiter) Environment() map[string]string { return r.env }

// Errors are the validation errors found so far (synthesis adds those
// that need the whole construct tree).
func (r *RateLimiter) Errors() []string { return slices.Clone(r.errs) }

func (r *RateLimiter) allErrors() []string {
	errs := slices.Clone(r.errs)
	for _, f := range r.lazy {
		errs = append(errs, f()...)
	}
	return errs
}

func (r *RateLimiter) fail(format string, args ...any) {
	r.errs = append(r.errs, "sluice: "+fmt.Sprintf(format, args...))
}

// validation reports the construct's errors at synth. (It holds a
// function, not the construct: jsii must not see a Go struct that embeds a
// construct twice.)
type validation struct{ check func() []string }

func (v *validation) Validate() *[]*string {
	errs := v.check()
	out := make([]*string, len(errs))
	for i, e := range errs {
		out[i] = jsii.String(e)
	}
	return &out
}

func (r *RateLimiter) applyDefaults(id string) {
	p := &r.props
	f := &p.Function
	if f.MemoryMB == 0 {
		f.MemoryMB = DefaultMemoryMB
	}
	if f.Timeout == 0 {
		f.Timeout = DefaultTimeout
	}
	if f.Deadline == 0 {
		f.Deadline = config.DefaultDeadline
	}
	if f.MetricsNamespace == "" {
		f.MetricsNamespace = config.DefaultMetricsNamespace
	}
	if f.LogRetention == "" {
		f.LogRetention = awslogs.RetentionDays_ONE_MONTH
	}
	if f.AuthorizerName == "" {
		f.AuthorizerName = id
	}
	if p.Cache == nil {
		p.Cache = &Cache{}
	} else {
		c := *p.Cache
		p.Cache = &c
	}
	c := p.Cache
	if c.Mode == "" {
		c.Mode = CacheServerless
	}
	if c.MaxDataStorageGB == 0 {
		c.MaxDataStorageGB = 1
	}
	if c.MaxECPUPerSecond == 0 {
		c.MaxECPUPerSecond = 5000
	}
	if c.NodeType == "" {
		c.NodeType = "cache.t4g.small"
	}
	if c.Nodes == 0 {
		c.Nodes = 2
	}
	if c.EngineVersion == "" {
		c.EngineVersion = "1.6.22"
	}
	if c.Port == 0 {
		c.Port = serverlessPort
	}
	if c.TLS == nil {
		c.TLS = jsii.Bool(true)
	}
	if p.RetainTable == nil {
		p.RetainTable = jsii.Bool(true)
	}
	if p.GatewayResponses == nil {
		p.GatewayResponses = jsii.Bool(true)
	}
	if p.VPCCidr == "" {
		p.VPCCidr = DefaultVPCCidr
	}
}

var cacheNameRE = regexp.MustCompile(`^[a-z][a-z0-9]*(-[a-z0-9]+)*$`) // ElastiCache: no "--", no trailing "-"

// checkFunction checks the props the contract's parser does not see.
func (r *RateLimiter) checkFunction() {
	p := &r.props
	f := p.Function
	if f.MemoryMB < 128 || f.MemoryMB > 10240 {
		r.fail("Function.MemoryMB: %d is outside 128..10240", f.MemoryMB)
	}
	if f.Timeout < time.Second || f.Timeout > maxTimeout || f.Timeout%time.Second != 0 {
		r.fail("Function.Timeout: %v is not a whole number of seconds in 1s..%v", f.Timeout, maxTimeout)
	}
	if f.Deadline >= f.Timeout {
		r.fail("Function.Deadline: %v must be shorter than Function.Timeout (%v)", f.Deadline, f.Timeout)
	}
	if strings.HasPrefix(f.MetricsNamespace, "AWS/") {
		r.fail("Function.MetricsNamespace: %q must not start with AWS/", f.MetricsNamespace)
	}
	if f.ReservedConcurrency < 0 {
		r.fail("Function.ReservedConcurrency: %d is negative", f.ReservedConcurrency)
	}
	if p.RetryAfter < 0 || p.RetryAfter%time.Second != 0 {
		r.fail("RetryAfter: %v is not a whole, positive number of seconds", p.RetryAfter)
	}
	if p.ShedRetryAfter < 0 || p.ShedRetryAfter%time.Second != 0 {
		r.fail("ShedRetryAfter: %v is not a whole, positive number of seconds", p.ShedRetryAfter)
	}
	c := p.Cache
	switch c.Mode {
	case CacheServerless:
		if c.MaxDataStorageGB < 1 || c.MaxDataStorageGB > 5000 {
			r.fail("Cache.MaxDataStorageGB: %d is outside 1..5000", c.MaxDataStorageGB)
		}
		if c.MaxECPUPerSecond < 1000 || c.MaxECPUPerSecond > 15000000 {
			r.fail("Cache.MaxECPUPerSecond: %d is outside 1000..15000000", c.MaxECPUPerSecond)
		}
	case CacheNodes:
		if c.Nodes < 1 || c.Nodes > 40 {
			r.fail("Cache.Nodes: %d is outside 1..40", c.Nodes)
		}
		if !strings.HasPrefix(c.NodeType, "cache.") {
			r.fail("Cache.NodeType: %q is not a cache node type", c.NodeType)
		}
		if c.Port < 1024 || c.Port > 65535 {
			r.fail("Cache.Port: %d is outside 1024..65535", c.Port)
		}
	case CacheExisting:
		if c.Addrs == "" {
			r.fail("Cache.Addrs: required with Cache.Mode %q", CacheExisting)
		}
	case CacheNone:
	default:
		r.fail("Cache.Mode: %q is not %q, %q, %q or %q", c.Mode, CacheServerless, CacheNodes, CacheNone, CacheExisting)
	}
	if c.Name != "" && (!cacheNameRE.MatchString(c.Name) || len(c.Name) > 40) {
		r.fail("Cache.Name: %q must be up to 40 lower-case letters, digits and single '-'", c.Name)
	}
	if p.VPC == nil && len(p.VPCZones) == 1 {
		r.fail("VPCZones: %v: a VPC needs at least 2 zones (ElastiCache Serverless does)", p.VPCZones)
	}
}

// checkTable checks the sizing of a table New creates.
func (r *RateLimiter) checkTable() {
	p := &r.props
	if p.Table != nil && !p.TableThroughput.IsZero() {
		r.fail("TableThroughput: sizes a table New creates; size your own table (Props.Table) where you define it")
		return
	}
	for _, err := range p.TableThroughput.problems() {
		r.fail("%v", err)
	}
}

// deriveRetryAfter sets the static Retry-After values.
func (r *RateLimiter) deriveRetryAfter() {
	p := &r.props
	r.shedRetryAfter = p.ShedRetryAfter
	if r.shedRetryAfter == 0 {
		lease := durationOr(p.Shedding.LeaseTTL, config.DefaultShedLeaseTTL)
		r.shedRetryAfter = max((lease+time.Second-1)/time.Second, 1) * time.Second
	}
	switch {
	case p.RetryAfter > 0:
		r.retryAfter, r.retrySrc = p.RetryAfter, "Props.RetryAfter"
	case r.rules == nil:
	case r.rules.table:
		if p.RestAPI != nil && *p.GatewayResponses {
			r.fail("RetryAfter: required with rules from a table (the rules are not known at synth)")
		}
		r.retryAfter, r.retrySrc = time.Second, "none (rules from a table)"
	default:
		r.retryAfter, r.retrySrc = DeriveRetryAfter(r.rules.rules)
	}
}

func checkBootstrap(dir string) error {
	fi, err := osStat(dir + "/bootstrap")
	switch {
	case err != nil:
		return fmt.Errorf("no authorizer binary at %s/bootstrap: %v", dir, err)
	case fi.IsDir():
		return fmt.Errorf("%s/bootstrap is a directory, not the authorizer binary", dir)
	}
	return nil
}

// buildTables uses or creates the state table.
func (r *RateLimiter) buildTables() {
	p := &r.props
	if p.Table != nil {
		r.table = p.Table
		return
	}
	removal := awscdk.RemovalPolicy_DESTROY
	if *p.RetainTable {
		removal = awscdk.RemovalPolicy_RETAIN
	}
	r.table = awsdynamodb.NewTableV2(r, jsii.String("StateTable"), &awsdynamodb.TablePropsV2{
		PartitionKey:        &awsdynamodb.Attribute{Name: jsii.String(StatePartitionKey), Type: awsdynamodb.AttributeType_STRING},
		Billing:             p.TableThroughput.Billing(),
		WarmThroughput:      p.TableThroughput.Warm(),
		TimeToLiveAttribute: jsii.String(StateTTLAttribute),
		PointInTimeRecoverySpecification: &awsdynamodb.PointInTimeRecoverySpecification{
			PointInTimeRecoveryEnabled: jsii.Bool(true),
		},
		RemovalPolicy: removal,
	})
}

// tableARNs are the tables the function reads and writes, with the
// actions it performs on each.
func (r *RateLimiter) tableGrants() []grant {
	g := []grant{{"StateTable", StateTableActions, r.table.TableArn()}}
	if t := r.props.Rules.Table; t != nil {
		g = append(g, grant{"RulesTable", RulesTableActions, t.TableArn()})
	}
	return g
}

type grant struct {
	sid      string
	actions  []string
	resource *string
}

// buildEnv builds the function's environment and parses it with the
// authorizer's own parser.
func (r *RateLimiter) buildEnv() {
	p := &r.props
	env := map[string]string{
		config.EnvDynamoTable:      *r.table.TableName(),
		config.EnvDeadline:         p.Function.Deadline.String(),
		config.EnvMetricsNamespace: p.Function.MetricsNamespace,
	}
	if n := p.Function.BreakerFailures; n != 0 {
		env[config.EnvBreakerFailures] = strconv.Itoa(max(n, 0))
	}
	if d := p.Function.BreakerOpenFor; d != 0 {
		env[config.EnvBreakerOpenFor] = d.String()
	}
	if p.Function.Shadow {
		env[config.EnvShadow] = "true"
	}
	if c := r.cache; c != nil {
		env[config.EnvMemcachedAddrs] = c.addrs
		env[config.EnvMemcachedTLS] = strconv.FormatBool(c.tls)
		env[config.EnvMemcachedProxy] = strconv.FormatBool(c.proxy)
	}
	switch src := r.rules; {
	case src.inline != "":
		env[config.EnvRulesYAML] = src.inline
	case src.file != "":
		env[config.EnvRulesFile] = src.file
	case src.table:
		env[config.EnvRulesTable] = *p.Rules.Table.TableName()
		if p.Rules.TableTTL != 0 {
			env[config.EnvRulesTTL] = p.Rules.TableTTL.String()
		}
	}
	if p.EdgeSecret != "" {
		env[config.EnvClientIP] = config.ClientIPViewerAddress
		env[config.EnvEdgeSecret] = p.EdgeSecret
	}
	if p.TableMode != TableRegional {
		env[config.EnvTableMode] = p.TableMode
	}
	if p.TableMode == TableEventual {
		env[config.EnvRegions] = strings.Join(p.TableRegions, ",")
	}
	shed, err := p.Shedding.Env(r.cache != nil)
	if err != nil {
		r.fail("%v", err)
	}
	maps.Copy(env, shed)
	// Lambda sets AWS_REGION: the parser sees the stack's.
	probe := maps.Clone(env)
	if reg := awscdk.Stack_Of(r).Region(); !*awscdk.Token_IsUnresolved(reg) {
		probe[config.EnvAWSRegion] = *reg
	} else if len(p.TableRegions) > 0 {
		probe[config.EnvAWSRegion] = p.TableRegions[0]
	}
	if _, err := config.Parse(func(k string) string { return probe[k] }); err != nil {
		r.fail("%s: %v", propOf(err), err)
	}
	r.env = env
}

// propOf names the prop that set the variable an error of config.Parse
// names.
func propOf(err error) string {
	ce, ok := err.(*config.Error)
	if !ok {
		return "Props"
	}
	switch ce.Name {
	case config.EnvDeadline:
		return "Function.Deadline"
	case config.EnvMetricsNamespace:
		return "Function.MetricsNamespace"
	case config.EnvTableMode:
		return "TableMode"
	case config.EnvRegions, config.EnvAWSRegion:
		return "TableRegions"
	case config.EnvBreakerFailures:
		return "Function.BreakerFailures"
	case config.EnvBreakerOpenFor:
		return "Function.BreakerOpenFor"
	case config.EnvRulesTTL:
		return "Rules.TableTTL"
	case config.EnvEdgeSecret, config.EnvClientIP:
		return "EdgeSecret"
	case config.EnvMemcachedAddrs, config.EnvMemcachedTLS, config.EnvMemcachedProxy:
		return "Cache"
	case config.EnvShedFleetCapacity:
		return "Shedding.FleetCapacity"
	case config.EnvShedFleetReserve:
		return "Shedding.FleetReserve"
	case config.EnvShedFleetShares:
		return "Shedding.FleetShares"
	case config.EnvShedFleetName:
		return "Shedding.FleetName"
	case config.EnvShedLeaseTTL:
		return "Shedding.LeaseTTL"
	case config.EnvShedUtilization:
		return "Shedding.Utilization"
	case config.EnvShedUtilizationMaxAge:
		return "Shedding.UtilizationMaxAge"
	case config.EnvShedBackend:
		return "Shedding.Backend"
	}
	return "Props"
}

func durationOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// buildFunction builds the authorizer function: provided.al2023 on arm64,
// with a role that may write its own log group, manage its network
// interfaces (in a VPC), and call the actions the authorizer performs on
// its tables.
func (r *RateLimiter) buildFunction(id string) {
	p := &r.props
	logs := awslogs.NewLogGroup(r, jsii.String("Logs"), &awslogs.LogGroupProps{
		Retention:     p.Function.LogRetention,
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	role := awsiam.NewRole(r, jsii.String("Role"), &awsiam.RoleProps{
		AssumedBy:   awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil),
		Description: jsii.String("Sluice authorizer: own logs, VPC interfaces, rate-limit tables"),
	})
	statement := func(sid string, actions []string, resources ...*string) {
		role.AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String(sid),
			Actions:   jsii.Strings(actions...),
			Resources: &resources,
		}))
	}
	statement("Logs", []string{"logs:CreateLogStream", "logs:PutLogEvents"}, logs.LogGroupArn())
	if r.vpc != nil {
		// What AWSLambdaVPCAccessExecutionRole grants for the function's
		// network interfaces; these actions take no resource-level scoping.
		statement("VpcNetworkInterfaces", []string{
			"ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets",
			"ec2:DeleteNetworkInterface", "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses",
		}, jsii.String("*"))
		cdknag.NagSuppressions_AddResourceSuppressions(role, &[]*cdknag.NagPackSuppression{{
			Id:        jsii.String("AwsSolutions-IAM5"),
			Reason:    jsii.String("A function in a VPC must create, describe and delete its network interfaces; these EC2 actions (the ones in AWSLambdaVPCAccessExecutionRole) do not support resource-level permissions. Every other statement names its log group or table."),
			AppliesTo: &[]any{jsii.String("Resource::*")},
		}}, jsii.Bool(true))
	}
	for _, g := range r.tableGrants() {
		statement(g.sid, g.actions, g.resource)
	}
	r.role = role

	env := map[string]*string{}
	for k, v := range r.env {
		env[k] = jsii.String(v)
	}
	var reserved *float64
	if p.Function.ReservedConcurrency > 0 {
		reserved = jsii.Number(float64(p.Function.ReservedConcurrency))
	}
	fp := &awslambda.FunctionProps{
		Description:                  jsii.String("Sluice rate-limiting authorizer"),
		Runtime:                      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture:                 awslambda.Architecture_ARM_64(),
		Handler:                      jsii.String("bootstrap"),
		Code:                         awslambda.Code_FromAsset(jsii.String(p.BootstrapDir), nil),
		MemorySize:                   jsii.Number(float64(p.Function.MemoryMB)),
		Timeout:                      awscdk.Duration_Seconds(jsii.Number(r.functionTimeout().Seconds())),
		Environment:                  &env,
		Role:                         role,
		LogGroup:                     logs,
		ReservedConcurrentExecutions: reserved,
	}
	if r.vpc != nil {
		fp.Vpc = r.vpc
		fp.VpcSubnets = r.subnets()
		fp.SecurityGroups = &[]awsec2.ISecurityGroup{r.sg}
	}
	r.function = awslambda.NewFunction(r, jsii.String("Function"), fp)
	if p.Function.LogicalID != "" {
		r.function.Node().DefaultChild().(awslambda.CfnFunction).OverrideLogicalId(jsii.String(p.Function.LogicalID))
	}
	if t, ok := r.table.(awsdynamodb.TableV2); ok && p.Table == nil {
		r.function.Node().AddDependency(t)
	}
}

// Env returns the SLUICE_SHED_* variables of s (none when no shedder is
// on), checked with the authorizer's parser; cache says whether the
// authorizer has memcached (the default shed backend) or only DynamoDB.
// Errors name the prop.
func (s Shedding) Env(cache bool) (map[string]string, error) {
	env := map[string]string{}
	if !s.Enabled() {
		if s.FleetCapacity < 0 {
			return nil, fmt.Errorf("Shedding.FleetCapacity: %d is negative", s.FleetCapacity)
		}
		if s.FleetReserve != nil || s.FleetShares != nil || s.FleetName != "" || s.LeaseTTL != 0 || s.UtilizationMaxAge != 0 || s.Backend != "" || s.Publisher != nil {
			return nil, errors.New("Shedding: settings without FleetCapacity or Utilization turn nothing on")
		}
		return env, nil
	}
	backend := s.Backend
	if backend == "" {
		backend = config.BackendDynamo
		if cache {
			backend = config.BackendMemcached
		}
	}
	env[config.EnvShedBackend] = backend
	if s.FleetCapacity != 0 {
		env[config.EnvShedFleetCapacity] = strconv.Itoa(s.FleetCapacity)
		reserve := config.DefaultShedFleetReserve
		if s.FleetReserve != nil {
			reserve = *s.FleetReserve
		}
		env[config.EnvShedFleetReserve] = strconv.FormatFloat(reserve, 'g', -1, 64)
		env[config.EnvShedFleetName] = cmp.Or(s.FleetName, config.DefaultShedFleetName)
		env[config.EnvShedLeaseTTL] = durationOr(s.LeaseTTL, config.DefaultShedLeaseTTL).String()
		if len(s.FleetShares) > 0 {
			env[config.EnvShedFleetShares] = config.FormatShares(s.FleetShares)
		}
	}
	if s.Utilization != "" {
		env[config.EnvShedUtilization] = s.Utilization
		maxAge := config.DefaultShedUtilizationMaxAge
		if s.Publisher != nil {
			maxAge = s.publisherMaxAge()
		}
		env[config.EnvShedUtilizationMaxAge] = durationOr(s.UtilizationMaxAge, maxAge).String()
	}
	// The backend's own variable, so that the parser sees it configured.
	probe := maps.Clone(env)
	if cache {
		probe[config.EnvMemcachedAddrs] = "memcached:11211"
	}
	probe[config.EnvDynamoTable] = "table"
	if _, err := config.Parse(func(k string) string { return probe[k] }); err != nil {
		return nil, fmt.Errorf("%s: %w", propOf(err), err)
	}
	return env, nil
}

// checkScopes checks the table's mode and regions, and the rules with
// scope global against them: refused on a regional table (a limit per
// region); on an eventual global table, kept as regional shares, whose
// limits policy.CheckShares accepts; on MRSC, one limit.
func (r *RateLimiter) checkScopes() {
	p := &r.props
	switch p.TableMode {
	case TableRegional, TableEventual, TableMRSC:
	default:
		r.fail("TableMode: %q is not %q, %q or %q", p.TableMode, TableRegional, TableEventual, TableMRSC)
		return
	}
	if p.TableMode == TableEventual {
		r.checkTableRegions()
	} else if len(p.TableRegions) > 0 {
		r.fail("TableRegions: only with TableMode %q (the regions that share a global limit)", TableEventual)
	}
	if r.rules == nil || p.TableMode == TableMRSC {
		return
	}
	for _, rule := range r.rules.rules {
		if rule.Scope != policy.ScopeGlobal {
			continue
		}
		if p.TableMode == TableRegional {
			r.fail("rule %q: scope global needs TableMode %q (regional shares) or %q (one limit); a regional table keeps a limit per region", rule.Name, TableEventual, TableMRSC)
			continue
		}
		limits := slices.Clone(rule.Limits)
		for j := range limits {
			if limits[j].Name == "" {
				limits[j].Name = fmt.Sprintf("%s/%d", rule.Name, j) // the policy's default
			}
		}
		for _, t := range rule.Tiers {
			limits = append(limits, t.Limits...)
		}
		for _, l := range limits {
			if err := policy.CheckShares(&l, max(len(p.TableRegions), 2)); err != nil {
				r.fail("rule %q: scope global on TableMode %q: %v", rule.Name, TableEventual, err)
			}
		}
	}
}

// checkTableRegions checks TableRegions for an eventual table: two or
// more, none twice, the stack's region (when known at synth) among them.
func (r *RateLimiter) checkTableRegions() {
	regions := r.props.TableRegions
	if len(regions) < 2 {
		r.fail("TableRegions: %v: TableMode %q needs the deployment's regions, two or more, in one order (a global limit is kept as a share per region)", regions, TableEventual)
		return
	}
	for i, reg := range regions {
		if reg == "" || slices.Contains(regions[:i], reg) {
			r.fail("TableRegions: %q is empty or listed twice", reg)
		}
	}
	if reg := awscdk.Stack_Of(r).Region(); !*awscdk.Token_IsUnresolved(reg) && !slices.Contains(regions, *reg) {
		r.fail("TableRegions: %v does not hold the stack's region %s", regions, *reg)
	}
}
