// Package authz is Sluice's API Gateway Lambda authorizer: it decodes the
// authorizer events (REST TOKEN, REST REQUEST, HTTP API payload 1.0 and
// 2.0, told apart by their "version" and "type" fields and decoded with
// aws-lambda-go's events types, one file per source), turns them into a
// [policy.Request], asks the rules, and answers in the event's response
// shape with the decision in the context (limit, remaining, reset,
// retryAfter, rule, decision).
//
// A Deny means rate limited (the infra maps REST's ACCESS_DENIED to 429).
// Authentication failures return the error "Unauthorized" (401), never
// Deny. Load shedding fails the invocation with a [*ShedError] (the infra
// maps the authorizer failure to 503). Malformed and unknown events fail
// with an [*EventError]; nothing panics.
//
// Every decision prints CloudWatch Embedded Metric Format lines to stdout
// (see [Metrics]) and logs with log/slog, keys hashed.
//
// The package imports no backend and no AWS SDK: package wiring
// (functions/wiring) builds the stores, the rules and the [Handler] from the
// environment; functions/authorizer hands the handler to lambda.Start, and
// the local API (functions/dev/localapi) serves it over HTTP.
// docs/authorizer.md describes events, responses, environment variables and
// metrics.
package authz
