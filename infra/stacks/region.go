package stacks

import (
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
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
	RulesYAML    string // inline rules, "" for none
}

// NewRegionStack adds the stack of one region to scope.
func NewRegionStack(scope awscdk.App, p RegionStackProps) awscdk.Stack {
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

	tables := newTables(s, c, primary)
	net := newNetwork(s, c, p.Region, tables)
	cache := newCache(s, c, net)
	fn := newAuthorizer(s, authorizerProps{
		config:       c,
		bootstrapDir: p.BootstrapDir,
		rulesYAML:    p.RulesYAML,
		net:          net,
		cache:        cache,
		tables:       tables,
	})
	rest := newRestAPI(s, c, p.Region, fn)
	output(s, "RestApiUrl", rest.Url(), "REST API (429/503 gateway responses)")
	if *c.API.HTTPAPI {
		httpAPI := newHTTPAPI(s, c, fn)
		output(s, "HttpApiUrl", httpAPI.Url(), "HTTP API (refusals are 403)")
	}
	output(s, "StateTableName", jsii.String(tables.stateName), "DynamoDB state table (this region's replica)")
	newMonitoring(s, c, p.Region, fn)
	return s
}

func output(s awscdk.Stack, id string, value *string, desc string) {
	awscdk.NewCfnOutput(s, jsii.String(id), &awscdk.CfnOutputProps{Value: value, Description: jsii.String(desc)})
}
