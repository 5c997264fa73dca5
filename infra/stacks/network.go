package stacks

import (
	"slices"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/jsii-runtime-go"
)

// network is the region's VPC and the authorizer's security group.
type network struct {
	vpc          awsec2.Vpc
	subnets      *awsec2.SubnetSelection
	authorizerSG awsec2.SecurityGroup
}

// newNetwork builds a VPC of isolated subnets only: no internet gateway, no
// NAT. The authorizer talks to memcached inside the VPC and to DynamoDB
// through a gateway endpoint whose policy allows only the authorizer's
// actions on the region's tables; Lambda ships its logs (and so the EMF
// metrics) outside the function's network, so nothing else is needed.
func newNetwork(s awscdk.Stack, c *Config, region string, t *tables) *network {
	isolated := &awsec2.SubnetSelection{SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED}
	flowLogs := awslogs.NewLogGroup(s, jsii.String("FlowLogs"), &awslogs.LogGroupProps{
		Retention:     retention(c.Authorizer.LogRetentionDays),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	vpc := awsec2.NewVpc(s, jsii.String("Vpc"), &awsec2.VpcProps{
		IpAddresses:       awsec2.IpAddresses_Cidr(jsii.String(c.VPC.CIDR)),
		AvailabilityZones: jsii.Strings(c.VPC.Zones(region)...),
		NatGateways:       jsii.Number(0),
		SubnetConfiguration: &[]*awsec2.SubnetConfiguration{{
			Name:       jsii.String("private"),
			SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED,
			CidrMask:   jsii.Number(22),
		}},
		// Left false so that no custom-resource Lambda is added to each
		// region; nothing in this VPC uses the default security group.
		RestrictDefaultSecurityGroup: jsii.Bool(false),
		FlowLogs: &map[string]*awsec2.FlowLogOptions{
			"Rejected": {
				Destination: awsec2.FlowLogDestination_ToCloudWatchLogs(flowLogs, nil),
				TrafficType: awsec2.FlowLogTrafficType_REJECT,
			},
		},
	})

	endpoint := vpc.AddGatewayEndpoint(jsii.String("DynamoDB"), &awsec2.GatewayVpcEndpointOptions{
		Service: awsec2.GatewayVpcEndpointAwsService_DYNAMODB(),
		Subnets: &[]*awsec2.SubnetSelection{isolated},
	})
	endpoint.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("SluiceStateTable"),
		Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
		Actions:    jsii.Strings(stateTableActions...),
		Resources:  jsii.Strings(t.stateARN),
	}))
	if t.rulesARN != "" {
		endpoint.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String("SluiceRulesTable"),
			Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
			Actions:    jsii.Strings(rulesTableActions...),
			Resources:  jsii.Strings(t.rulesARN),
		}))
	}

	sg := awsec2.NewSecurityGroup(s, jsii.String("AuthorizerSecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              vpc,
		Description:      jsii.String("Sluice authorizer: egress to DynamoDB (gateway endpoint) and memcached only"),
		AllowAllOutbound: jsii.Bool(false),
	})
	// The subnets have no route but the gateway endpoint's: HTTPS can only
	// reach DynamoDB. (The endpoint's prefix list id is not available to a
	// template without a lookup.)
	sg.AddEgressRule(awsec2.Peer_AnyIpv4(), awsec2.Port_Tcp(jsii.Number(443)), jsii.String("HTTPS to DynamoDB through the gateway endpoint"), nil)
	return &network{vpc: vpc, subnets: isolated, authorizerSG: sg}
}

// retention converts a validated number of days to the CDK enum.
func retention(days int) awslogs.RetentionDays {
	return awslogs.RetentionDays(retentionNames[slices.Index(logRetentionDays, days)])
}
