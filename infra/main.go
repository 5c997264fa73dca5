// Command infra is Sluice's multi-region example app, built on the sluice
// construct (package sluice): `cdk synth` (run from this directory,
// see cdk.json) writes one CloudFormation template per configured region to
// cdk.out/. See docs/infra.md.
package main

import (
	"fmt"
	"os"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/infra/stacks"
)

func main() {
	// Stops the jsii node process and removes its temporary directory. (It
	// may print a harmless "Runtime process exited abnormally: waitid: no
	// child processes": two goroutines of jsii-runtime-go wait for the same
	// child.)
	defer jsii.Close()
	app := awscdk.NewApp(nil)
	if _, err := stacks.Build(app); err != nil {
		fmt.Fprintln(os.Stderr, "sluice infra:", err)
		jsii.Close()
		os.Exit(1)
	}
	app.Synth(nil)
}
