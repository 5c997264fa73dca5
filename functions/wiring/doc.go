// Package wiring builds Sluice's authorizer from its configuration: it is
// the one package under functions/ that imports the backends
// (backends/memory, memcached, dynamo) and the AWS SDK. [FromEnv] reads the
// SLUICE_* variables (package config holds the contract), builds the
// stores, the rules source (embedded, a file, inline YAML or a DynamoDB
// rules table, [LoadRulesTable]), the load shedders of SLUICE_SHED_* and
// the handler of package authz, once, at init; functions/authorizer hands
// that handler to lambda.Start, and the local API (functions/dev/localapi)
// serves it over HTTP.
//
// TestImports keeps the rule: no other package under functions/ imports a
// backend or the AWS SDK.
package wiring
