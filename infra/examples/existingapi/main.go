package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
)

func main() {
	defer jsii.Close()
	app := awscdk.NewApp(nil)
	// No environment: the stack synthesizes offline, with no lookups.
	NewPetsStack(app, "Pets", nil)
	app.Synth(nil)
}
