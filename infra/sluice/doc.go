// Package sluice is the CDK construct that puts Sluice's rate-limiting
// authorizer in front of an API Gateway API you already have: add it to your
// own stack, give it your RestApi or HttpApi, and it
//
//   - builds the authorizer function (provided.al2023, arm64, the bootstrap
//     of `make build`) with a role that may do exactly what the authorizer
//     does and nothing more;
//   - attaches it to the methods (REST) or routes (HTTP API) you choose, every
//     one by default, with the authorizer result cache off (TTL 0: a cached
//     Allow would skip the limiter);
//   - adds the REST gateway responses that turn a Deny into 429 and a shed
//     request into 503 (HTTP APIs have none: a refusal is 403 there);
//   - uses your VPC, memcached and DynamoDB table, or makes them (a VPC of
//     isolated subnets with a DynamoDB gateway endpoint, an ElastiCache
//     Serverless cache reachable from the authorizer only, an on-demand
//     table);
//   - exposes the authorizer, the function, the table and the metrics, for
//     your own dashboards and alarms.
//
// The construct and the authorizer read one configuration contract
// (package github.com/sluicehq/sluice/config): the construct builds the
// function's SLUICE_* environment from typed props and parses it with the
// authorizer's own parser at synth, and it parses the rules with package
// policy, so a value or a rule the authorizer would refuse at every cold start
// fails `cdk synth` instead, with the message the authorizer would print
// (naming the rule and the field), prefixed by the prop.
//
// Errors are reported as CDK validation errors of the construct: `cdk synth`
// fails and names the construct's path and the prop.
//
// [NewEdge] and [NewEdgeOrigin] add the optional edge front door: one
// CloudFront distribution whose origin name resolves, by Route 53
// latency-based records with health checks, to the nearest healthy region.
//
// docs/infra.md describes the resources, the grants and the HTTP responses.
package sluice
