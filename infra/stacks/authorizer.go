package stacks

import (
	"path"
	"strconv"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"

	"github.com/sluicehq/sluice/config"
)

// Environment variables read by the authorizer: the names of the
// configuration contract (package config).
const (
	EnvRulesFile        = config.EnvRulesFile
	EnvRulesYAML        = config.EnvRulesYAML
	EnvRulesTable       = config.EnvRulesTable
	EnvDynamoTable      = config.EnvDynamoTable
	EnvMemcachedAddrs   = config.EnvMemcachedAddrs
	EnvMemcachedTLS     = config.EnvMemcachedTLS
	EnvMemcachedProxy   = config.EnvMemcachedProxy
	EnvDeadline         = config.EnvDeadline
	EnvMetricsNamespace = config.EnvMetricsNamespace

	EnvShedFleetCapacity     = config.EnvShedFleetCapacity
	EnvShedFleetReserve      = config.EnvShedFleetReserve
	EnvShedFleetShares       = config.EnvShedFleetShares
	EnvShedFleetName         = config.EnvShedFleetName
	EnvShedLeaseTTL          = config.EnvShedLeaseTTL
	EnvShedUtilization       = config.EnvShedUtilization
	EnvShedUtilizationMaxAge = config.EnvShedUtilizationMaxAge
	EnvShedBackend           = config.EnvShedBackend
)

// lambdaTaskRoot is where Lambda unpacks the deployment package.
const lambdaTaskRoot = "/var/task"

type authorizerProps struct {
	config       *Config
	bootstrapDir string
	rulesYAML    string
	net          *network
	cache        *cache // nil without memcached
	tables       *tables
}

// newAuthorizer builds the authorizer function: provided.al2023 on arm64,
// in the isolated subnets, with a role that may write its own log group,
// manage its network interfaces, and use the region's tables with the
// actions the authorizer performs.
func newAuthorizer(s awscdk.Stack, p authorizerProps) awslambda.Function {
	c := p.config
	logs := awslogs.NewLogGroup(s, jsii.String("AuthorizerLogs"), &awslogs.LogGroupProps{
		Retention:     retention(c.Authorizer.LogRetentionDays),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})

	role := awsiam.NewRole(s, jsii.String("AuthorizerRole"), &awsiam.RoleProps{
		AssumedBy:   awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil),
		Description: jsii.String("Sluice authorizer: own logs, VPC interfaces, rate-limit tables"),
	})
	statement := func(sid string, actions []string, resources ...string) {
		role.AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String(sid),
			Actions:   jsii.Strings(actions...),
			Resources: jsii.Strings(resources...),
		}))
	}
	statement("Logs", []string{"logs:CreateLogStream", "logs:PutLogEvents"}, *logs.LogGroupArn())
	// What AWSLambdaVPCAccessExecutionRole grants for the function's
	// network interfaces; these actions take no resource-level scoping.
	statement("VpcNetworkInterfaces", []string{
		"ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets",
		"ec2:DeleteNetworkInterface", "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses",
	}, "*")
	statement("StateTable", stateTableActions, p.tables.stateARN)
	if p.tables.rulesARN != "" {
		statement("RulesTable", rulesTableActions, p.tables.rulesARN)
	}
	cdknag.NagSuppressions_AddResourceSuppressions(role, &[]*cdknag.NagPackSuppression{{
		Id:        jsii.String("AwsSolutions-IAM5"),
		Reason:    jsii.String("A function in a VPC must create, describe and delete its network interfaces; these EC2 actions (the ones in AWSLambdaVPCAccessExecutionRole) do not support resource-level permissions. Every other statement names its log group or table."),
		AppliesTo: &[]any{jsii.String("Resource::*")},
	}}, jsii.Bool(true))

	env := map[string]*string{
		EnvDynamoTable:      jsii.String(p.tables.stateName),
		EnvDeadline:         jsii.String(c.Authorizer.Deadline),
		EnvMetricsNamespace: jsii.String(c.Authorizer.MetricsNamespace),
	}
	if p.cache != nil {
		env[EnvMemcachedAddrs] = jsii.String(p.cache.addrs)
		env[EnvMemcachedTLS] = jsii.String(strconv.FormatBool(p.cache.tls))
		env[EnvMemcachedProxy] = jsii.String(strconv.FormatBool(p.cache.proxy))
	}
	switch {
	case p.rulesYAML != "":
		env[EnvRulesYAML] = jsii.String(p.rulesYAML)
	case c.Rules.BundlePath != "":
		env[EnvRulesFile] = jsii.String(path.Join(lambdaTaskRoot, c.Rules.BundlePath))
	case p.tables.rulesName != "":
		env[EnvRulesTable] = jsii.String(p.tables.rulesName)
	}

	for k, v := range shedEnv(c, *s.Region()) {
		env[k] = jsii.String(v)
	}

	var reserved *float64
	if c.Authorizer.ReservedConcurrency > 0 {
		reserved = jsii.Number(float64(c.Authorizer.ReservedConcurrency))
	}
	fn := awslambda.NewFunction(s, jsii.String("Authorizer"), &awslambda.FunctionProps{
		Description:                  jsii.String("Sluice rate-limiting authorizer"),
		Runtime:                      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture:                 awslambda.Architecture_ARM_64(),
		Handler:                      jsii.String("bootstrap"),
		Code:                         awslambda.Code_FromAsset(jsii.String(p.bootstrapDir), nil),
		MemorySize:                   jsii.Number(float64(c.Authorizer.MemoryMB)),
		Timeout:                      awscdk.Duration_Seconds(jsii.Number(float64(c.Authorizer.TimeoutSeconds))),
		Environment:                  &env,
		Role:                         role,
		LogGroup:                     logs,
		Vpc:                          p.net.vpc,
		VpcSubnets:                   p.net.subnets,
		SecurityGroups:               &[]awsec2.ISecurityGroup{p.net.authorizerSG},
		ReservedConcurrentExecutions: reserved,
	})
	fn.Node().DefaultChild().(awslambda.CfnFunction).OverrideLogicalId(jsii.String(AuthorizerLogicalID))
	for _, t := range p.tables.defined {
		// The policy names the table by ARN, not by reference: make the
		// primary region's function wait for its tables anyway.
		fn.Node().AddDependency(t)
	}
	return fn
}

// shedEnv returns the SLUICE_SHED_* variables of a region's authorizer:
// none unless the shedding section turns a shedder on. The fleet's lease
// key is per region (each region's API protects the fleet behind it, and a
// global table's replicas would otherwise overwrite each other's leases).
// The leases and the utilization live in the store the authorizer already
// reaches: memcached through its security group, the state table through
// the role's statement and the gateway endpoint (GetItem, UpdateItem).
func shedEnv(c *Config, region string) map[string]string {
	sh := c.Shedding
	if !sh.Enabled() {
		return nil
	}
	env := map[string]string{EnvShedBackend: sh.Backend}
	if sh.FleetCapacity > 0 {
		env[EnvShedFleetCapacity] = strconv.Itoa(sh.FleetCapacity)
		reserve := 0.2
		if sh.FleetReserve != nil {
			reserve = *sh.FleetReserve
		}
		env[EnvShedFleetReserve] = strconv.FormatFloat(reserve, 'g', -1, 64)
		env[EnvShedFleetName] = sh.FleetName + "-" + region
		env[EnvShedLeaseTTL] = sh.LeaseTTL
		if len(sh.FleetShares) > 0 {
			var parts []string
			for _, p := range []string{"low", "normal", "high"} {
				if v, ok := sh.FleetShares[p]; ok {
					parts = append(parts, p+"="+strconv.FormatFloat(v, 'g', -1, 64))
				}
			}
			env[EnvShedFleetShares] = strings.Join(parts, ",")
		}
	}
	if sh.Utilization != "" {
		env[EnvShedUtilization] = sh.Utilization
		env[EnvShedUtilizationMaxAge] = sh.UtilizationMaxAge
	}
	return env
}
