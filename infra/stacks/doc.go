// Package stacks builds Sluice's CloudFormation stacks: one stack per AWS
// region, each holding the authorizer Lambda, its VPC, the memcached cache, a
// REST API (and optionally an HTTP API) protected by the authorizer, and the
// dashboard and alarms; the primary region's stack also defines the DynamoDB
// global table(s) and their replicas.
//
// The app is configured by a JSON file (Config) and a few context keys that
// override it (see Build). Every stack has an explicit account and region so
// that synthesis works offline, without AWS credentials.
//
// Cross-region wiring: the state table has a fixed name, so a non-primary
// stack refers to its local replica by name (an ARN built from the stack's own
// region and account) rather than through CDK's crossRegionReferences, which
// would add SSM parameters and a custom-resource Lambda in every region. The
// price is deployment order: the primary stack (which creates the replicas)
// is deployed first; the other stacks declare a dependency on it so that
// `cdk deploy --all` respects the order.
package stacks
