package sluice

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"

	"github.com/sluicehq/sluice/config"
)

// ContextPublisherBootstrapDir is the CDK context key of the directory
// holding the utilization publisher's bootstrap.
const ContextPublisherBootstrapDir = "sluice:publisherBootstrapDir"

// DefaultPublisherBootstrapDir is where `make build` puts the publisher.
const DefaultPublisherBootstrapDir = "build/publisher"

// PublisherActions are what the publisher's role may do on the state table
// (only on the gauge's item when its name allows a LeadingKeys condition):
// the one UpdateItem of limiter.PublishedUtilization.Publish on
// dynamo.Leases.
var PublisherActions = []string{"dynamodb:UpdateItem"}

// Publisher deploys the utilization publisher (functions/publisher) for
// the worker-utilization shedder: a scheduled function that reads a
// CloudWatch metric of the backend fleet and publishes metric/Divisor as
// the utilization Shedding.Utilization. Set it in Shedding.Publisher.
type Publisher struct {
	// Namespace and Metric name the CloudWatch metric (e.g. "AWS/Lambda",
	// "ConcurrentExecutions"). Required.
	Namespace, Metric string
	// Dimensions of the metric (e.g. {"FunctionName": "orders"}).
	Dimensions map[string]string
	// Statistic is read over each period. Default
	// config.DefaultPublishStatistic (Maximum).
	Statistic string
	// Divisor is the metric's value at full utilization (the backend's
	// reserved concurrency; 100 for a percentage). Default 1.
	Divisor float64
	// Period is the metric's period and the schedule, whole minutes.
	// Default config.DefaultPublishPeriod (1 minute).
	Period time.Duration
	// BootstrapDir holds the publisher's bootstrap (`make build`).
	// Default: the context value ContextPublisherBootstrapDir, else
	// DefaultPublisherBootstrapDir.
	BootstrapDir string
}

// env is the publisher's SLUICE_PUBLISH_* variables, checked with its own
// parser; errors name the prop.
func (p *Publisher) env() (map[string]string, config.Publish, error) {
	raw := map[string]string{
		config.EnvPublishNamespace: p.Namespace,
		config.EnvPublishMetric:    p.Metric,
		config.EnvPublishStatistic: p.Statistic,
	}
	if p.Divisor != 0 {
		raw[config.EnvPublishDivisor] = fmt.Sprint(p.Divisor)
	}
	if p.Period != 0 {
		raw[config.EnvPublishPeriod] = p.Period.String()
	}
	if len(p.Dimensions) > 0 {
		dims := ""
		for _, k := range slices.Sorted(maps.Keys(p.Dimensions)) {
			if dims != "" {
				dims += ","
			}
			dims += k + "=" + p.Dimensions[k]
		}
		raw[config.EnvPublishDimensions] = dims
	}
	c, err := config.ParsePublish(func(k string) string { return raw[k] })
	if err != nil {
		return nil, c, fmt.Errorf("Shedding.Publisher.%s: %w", publisherProp(err), err)
	}
	return c.Env(), c, nil
}

func publisherProp(err error) string {
	e, ok := err.(*config.Error)
	if !ok {
		return "?"
	}
	switch e.Name {
	case config.EnvPublishNamespace:
		return "Namespace"
	case config.EnvPublishMetric:
		return "Metric"
	case config.EnvPublishDimensions:
		return "Dimensions"
	case config.EnvPublishStatistic:
		return "Statistic"
	case config.EnvPublishDivisor:
		return "Divisor"
	case config.EnvPublishPeriod:
		return "Period"
	}
	return e.Name
}

// publisherMaxAge is the utilization's max age when the construct deploys
// the publisher and the props give none: config.PublishMaxAgePeriods
// periods, so one late or failed run does not make the gauge stale.
func (s Shedding) publisherMaxAge() time.Duration {
	period := config.DefaultPublishPeriod
	if s.Publisher != nil && s.Publisher.Period != 0 {
		period = s.Publisher.Period
	}
	return time.Duration(float64(period) * config.PublishMaxAgePeriods)
}

var plainGaugeName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

// buildPublisher deploys the utilization publisher when
// Shedding.Publisher is set: the function (provided.al2023, arm64, in the
// authorizer's VPC and security group when the shed store is memcached),
// its role (own logs, cloudwatch:GetMetricData, UpdateItem on the gauge's
// item), and an EventBridge schedule every Period.
func (r *RateLimiter) buildPublisher() {
	p := &r.props
	pub := p.Shedding.Publisher
	if pub == nil {
		return
	}
	dir, c, env, ok := r.publisherSetup()
	if !ok {
		return
	}
	backend := r.env[config.EnvShedBackend]
	scope := constructs.NewConstruct(r, jsii.String("Publisher"))
	logs := awslogs.NewLogGroup(scope, jsii.String("Logs"), &awslogs.LogGroupProps{
		Retention:     p.Function.LogRetention,
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	role := r.publisherRole(scope, logs, backend)
	fp := &awslambda.FunctionProps{
		Description:  jsii.String("Sluice utilization publisher: " + c.Namespace + " " + c.Metric + " -> " + p.Shedding.Utilization),
		Runtime:      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture: awslambda.Architecture_ARM_64(),
		Handler:      jsii.String("bootstrap"),
		Code:         awslambda.Code_FromAsset(jsii.String(dir), nil),
		MemorySize:   jsii.Number(128),
		Timeout:      awscdk.Duration_Seconds(jsii.Number(30)),
		Environment:  &env,
		Role:         role,
		LogGroup:     logs,
		// One run at a time is plenty; a stuck run must not pile up.
		ReservedConcurrentExecutions: jsii.Number(1),
	}
	if backend == config.BackendMemcached && r.vpc != nil {
		fp.Vpc = r.vpc
		fp.VpcSubnets = r.subnets()
		fp.SecurityGroups = &[]awsec2.ISecurityGroup{r.sg}
	}
	fn := awslambda.NewFunction(scope, jsii.String("Function"), fp)
	awsevents.NewRule(scope, jsii.String("Schedule"), &awsevents.RuleProps{
		Description: jsii.String("Runs the Sluice utilization publisher every period"),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(c.Period.Minutes()))),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(fn, &awseventstargets.LambdaFunctionProps{
			RetryAttempts: jsii.Number(0), // the next period's run is the retry
		})},
	})
	r.publisher = fn
}

// publisherSetup checks the publisher's settings and returns its
// bootstrap's directory, its configuration and its environment (ok false:
// r.fail was called).
func (r *RateLimiter) publisherSetup() (dir string, c config.Publish, env map[string]*string, ok bool) {
	p := &r.props
	pub := p.Shedding.Publisher
	if p.Shedding.Utilization == "" {
		r.fail("Shedding.Publisher: set Shedding.Utilization, the name it publishes under")
		return "", c, nil, false
	}
	pubEnv, c, err := pub.env()
	if err != nil {
		r.fail("%v", err)
		return "", c, nil, false
	}
	if maxAge, _ := time.ParseDuration(r.env[config.EnvShedUtilizationMaxAge]); maxAge < c.Period {
		r.fail("Shedding.UtilizationMaxAge: %v is shorter than Shedding.Publisher.Period (%v): the utilization would be stale between runs (leave it unset for %g periods)", maxAge, c.Period, config.PublishMaxAgePeriods)
		return "", c, nil, false
	}
	dir = pub.BootstrapDir
	if dir == "" {
		dir = DefaultPublisherBootstrapDir
		if v, ok := r.Node().TryGetContext(jsii.String(ContextPublisherBootstrapDir)).(string); ok && v != "" {
			dir = v
		}
	}
	if err := checkBootstrap(dir); err != nil {
		r.fail("Shedding.Publisher.BootstrapDir: %v (build it with `make build`, or pass -c %s=<dir holding bootstrap>)", err, ContextPublisherBootstrapDir)
		return "", c, nil, false
	}
	env = map[string]*string{}
	for k, v := range pubEnv {
		env[k] = jsii.String(v)
	}
	backend := r.env[config.EnvShedBackend]
	for _, k := range []string{config.EnvShedUtilization, config.EnvShedUtilizationMaxAge, config.EnvShedBackend, config.EnvMetricsNamespace, config.EnvDeadline} {
		env[k] = jsii.String(r.env[k])
	}
	if backend == config.BackendMemcached {
		for _, k := range []string{config.EnvMemcachedAddrs, config.EnvMemcachedTLS, config.EnvMemcachedProxy} {
			env[k] = jsii.String(r.env[k])
		}
	} else {
		env[config.EnvDynamoTable] = jsii.String(r.env[config.EnvDynamoTable])
	}
	return dir, c, env, true
}

// publisherRole is the publisher's role: its own logs, GetMetricData, and
// the gauge's write (DynamoDB) or the VPC's network interfaces (memcached).
func (r *RateLimiter) publisherRole(scope constructs.Construct, logs awslogs.LogGroup, backend string) awsiam.Role {
	p := &r.props
	role := awsiam.NewRole(scope, jsii.String("Role"), &awsiam.RoleProps{
		AssumedBy:   awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil),
		Description: jsii.String("Sluice utilization publisher: own logs, one CloudWatch read, one gauge write"),
	})
	statement := func(sid string, actions []string, cond map[string]any, resources ...*string) {
		role.AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid: jsii.String(sid), Actions: jsii.Strings(actions...), Resources: &resources, Conditions: &cond,
		}))
	}
	statement("Logs", []string{"logs:CreateLogStream", "logs:PutLogEvents"}, nil, logs.LogGroupArn())
	// GetMetricData takes no resource-level permission.
	statement("ReadMetric", []string{"cloudwatch:GetMetricData"}, nil, jsii.String("*"))
	suppress := []*cdknag.NagPackSuppression{{
		Id:        jsii.String("AwsSolutions-IAM5"),
		Reason:    jsii.String("cloudwatch:GetMetricData does not support resource-level permissions; the VPC statement (memcached only) holds the AWSLambdaVPCAccessExecutionRole actions, which do not either. The gauge write is scoped to the state table and, for a plain name, to the gauge's item."),
		AppliesTo: &[]any{jsii.String("Resource::*")},
	}}
	if backend == config.BackendMemcached {
		statement("VpcNetworkInterfaces", []string{
			"ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets",
			"ec2:DeleteNetworkInterface", "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses",
		}, nil, jsii.String("*"))
	} else {
		var cond map[string]any
		if name := p.Shedding.Utilization; plainGaugeName.MatchString(name) {
			cond = map[string]any{"ForAllValues:StringEquals": map[string]any{"dynamodb:LeadingKeys": []any{"#G/gauge/" + name}}}
		}
		statement("WriteGauge", PublisherActions, cond, r.table.TableArn())
	}
	cdknag.NagSuppressions_AddResourceSuppressions(role, &suppress, jsii.Bool(true))

	return role
}

// Publisher is the utilization publisher function, nil unless
// Shedding.Publisher is set.
func (r *RateLimiter) Publisher() awslambda.Function { return r.publisher }
