// Package stacks is Sluice's multi-region example app, built on the
// construct of package sluice the way a platform team would use it: one
// stack per AWS region, each holding the APIs to protect (a REST API and
// optionally an HTTP API), the sluice construct in front of them on the
// region's replica of the global tables, and alarms and a dashboard on the
// construct's metrics; the primary region's stack also defines the DynamoDB
// global table(s) and their replicas; an optional edge stack (us-east-1)
// holds the CloudFront front door.
//
// The app is configured by a JSON file (Config) and a few context keys that
// override it (see Build). Every stack has an explicit account and region so
// that synthesis works offline, without AWS credentials.
//
// Cross-region wiring: the state table has a fixed name, so every stack
// refers to its local replica by name (an ARN built from the stack's own
// region and account) rather than through CDK's crossRegionReferences, which
// would add SSM parameters and a custom-resource Lambda in every region. The
// price is deployment order: the primary stack (which creates the replicas)
// is deployed first; the other stacks declare a dependency on it so that
// `cdk deploy --all` respects the order.
package stacks
