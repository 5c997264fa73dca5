package stacks

import (
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsroute53"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/infra/sluice"
)

// AuthorizerLogicalID is the CloudFormation logical id of the authorizer
// function in every region's template, fixed so that
// `sam local invoke -t cdk.out/<stack>.template.json SluiceAuthorizer`
// keeps working when the construct tree changes.
const AuthorizerLogicalID = "SluiceAuthorizer"

// RegionStackProps are the inputs of one region's stack.
type RegionStackProps struct {
	Config       *Config
	Region       string
	BootstrapDir string // directory holding the authorizer's bootstrap
}

// RegionStack is one region's stack and what the example built in it.
type RegionStack struct {
	awscdk.Stack
	Limiter *sluice.RateLimiter
	API     *APIs
}

// NewRegionStack adds the stack of one region to scope: the region's APIs
// (what a user of the construct already has) and the sluice construct in
// front of them, on the region's replica of the global tables.
func NewRegionStack(scope awscdk.App, p RegionStackProps) *RegionStack {
	c := p.Config
	primary := p.Region == c.PrimaryRegion
	role := "replica region"
	if primary {
		role = "primary region"
	}
	s := awscdk.NewStack(scope, jsii.String(c.StackName(p.Region)), &awscdk.StackProps{
		Env:         &awscdk.Environment{Account: jsii.String(c.Account), Region: jsii.String(p.Region)},
		Description: jsii.String(fmt.Sprintf("Sluice rate limiter, %s %s (%s tables)", role, p.Region, c.Consistency)),
	})

	globals := newGlobalTables(s, c, primary)
	apis := newAPIs(s, c, p.Region)
	props := &sluice.Props{
		RestAPI:      apis.Rest,
		HTTPAPI:      apis.HTTP,
		BootstrapDir: p.BootstrapDir,
		Rules:        c.rules(s),
		VPCZones:     c.VPC.Zones(p.Region),
		VPCCidr:      c.VPC.CIDR,
		Cache:        c.Memcached.construct(c.StackPrefix),
		// The replica of this region, by name: the same ARN string in
		// every region, with no cross-stack reference.
		Table:                  awsdynamodb.Table_FromTableName(s, jsii.String("StateTableReplica"), jsii.String(c.TableName)),
		Function:               c.Authorizer.construct(c.StackPrefix),
		Shedding:               c.Shedding.construct(p.Region),
		RetryAfter:             time.Duration(c.API.RetryAfterSeconds) * time.Second,
		ContextHeaders:         c.API.ContextHeaders,
		LegacyRateLimitHeaders: c.API.LegacyRateLimitHeaders,
		TableMode:              c.tableMode(),
	}
	if props.TableMode == sluice.TableEventual {
		// Every region's authorizer gets the regions in sluice.json's
		// order: a global rule's shares are numbered by it.
		props.TableRegions = slices.Clone(c.Regions)
	}
	props.Function.LogicalID = AuthorizerLogicalID
	if c.Edge != nil {
		props.EdgeSecret = c.Edge.Secret
	}
	limiter := sluice.New(s, "RateLimiter", props)
	if fn := limiter.Function(); fn != nil {
		for _, t := range globals {
			// The policy names the tables by ARN, not by reference: make
			// the primary region's function wait for them anyway.
			fn.Node().AddDependency(t)
		}
		output(s, "RestApiUrl", apis.Rest.Url(), "REST API (429/503 gateway responses)")
		if apis.HTTP != nil {
			output(s, "HttpApiUrl", apis.HTTP.Url(), "HTTP API (refusals are 403)")
		}
		output(s, "StateTableName", jsii.String(c.TableName), "DynamoDB state table (this region's replica)")
		newMonitoring(s, c, p.Region, limiter)
		if e := c.Edge; e != nil {
			sluice.NewEdgeOrigin(s, "EdgeOrigin", &sluice.EdgeOriginProps{
				RestAPI:         apis.Rest,
				DomainName:      e.DomainName,
				OriginName:      e.OriginName,
				Zone:            e.zone(s),
				HealthCheckPath: e.HealthCheckPath,
			})
		}
	}
	return &RegionStack{Stack: s, Limiter: limiter, API: apis}
}

func output(s awscdk.Stack, id string, value *string, desc string) {
	awscdk.NewCfnOutput(s, jsii.String(id), &awscdk.CfnOutputProps{Value: value, Description: jsii.String(desc)})
}

// EdgeRegion is the region of the edge stack: CloudFront's certificates
// live in us-east-1.
const EdgeRegion = "us-east-1"

// NewEdgeStack adds the edge front door's stack (<prefix>-edge, in
// us-east-1): the CloudFront distribution and its alias records.
func NewEdgeStack(scope awscdk.App, c *Config) awscdk.Stack {
	s := awscdk.NewStack(scope, jsii.String(c.StackPrefix+"-edge"), &awscdk.StackProps{
		Env:         &awscdk.Environment{Account: jsii.String(c.Account), Region: jsii.String(EdgeRegion)},
		Description: jsii.String("Sluice edge front door: CloudFront to the nearest healthy region"),
	})
	e := c.Edge
	sluice.NewEdge(s, "Edge", &sluice.EdgeProps{
		DomainName: e.DomainName,
		OriginName: e.OriginName,
		Zone:       e.zone(s),
		Secret:     e.Secret,
	})
	output(s, "EdgeUrl", jsii.String("https://"+e.DomainName+"/"), "the edge front door (CloudFront)")
	return s
}

func (e *EdgeConfig) zone(s awscdk.Stack) awsroute53.IHostedZone {
	return awsroute53.HostedZone_FromHostedZoneAttributes(s, jsii.String("Zone"), &awsroute53.HostedZoneAttributes{
		HostedZoneId: jsii.String(e.HostedZoneID),
		ZoneName:     jsii.String(e.ZoneName),
	})
}
