// Package config is the configuration contract between Sluice's authorizer
// and the infrastructure that deploys it: the names of the SLUICE_*
// environment variables, their defaults and their bounds, and [Parse], the
// one function that reads them.
//
// The authorizer (functions/authz) parses its environment with [Parse] at
// init; the CDK construct (infra/sluice) builds the environment it gives the
// function from its typed props and runs the same [Parse] on it at synth, so
// a value the authorizer would refuse at every cold start fails `cdk synth`
// instead, with the same message. No other package spells a SLUICE_* name or
// repeats one of these bounds: TestNamesLiveHere scans the repository's Go
// files for it.
//
// The package imports the standard library and package limiter only (for
// the priorities and the fleet shedder's own validation).
package config
