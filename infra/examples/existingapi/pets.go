// Command existingapi is the smallest use of the sluice construct: a
// user's own CDK app with the REST API they already have, and Sluice put
// in front of every method of it. The lines between the README markers are
// the README's "Protect an existing API" section, word for word
// (TestReadmeShowsThisCode).
//
//	make build                                   # build/authorizer/bootstrap
//	cd infra/examples/existingapi
//	npx cdk synth -c sluice:bootstrapDir=../../../build/authorizer
package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/infra/sluice"
)

// NewPetsStack is a user's stack: their API, then Sluice.
func NewPetsStack(scope constructs.Construct, id string, props *awscdk.StackProps) awscdk.Stack {
	stack := awscdk.NewStack(scope, jsii.String(id), props)

	// README:begin
	// The API you already have.
	api := awsapigateway.NewRestApi(stack, jsii.String("PetsApi"), nil)
	pets := api.Root().AddResource(jsii.String("pets"), nil)
	pets.AddMethod(jsii.String("GET"), awsapigateway.NewHttpIntegration(jsii.String("https://pets.example.com/pets"), nil), nil)

	// Sluice in front of every method of it: the authorizer (result cache
	// off), the 429/503 responses, a VPC, memcached and a DynamoDB table.
	sluice.New(stack, "RateLimit", &sluice.Props{
		RestAPI: api,
		Rules:   sluice.Rules{File: "rules.yaml"}, // parsed at synth: a bad rule fails `cdk synth`
	})
	// README:end

	return stack
}
