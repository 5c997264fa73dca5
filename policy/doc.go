// Package policy holds Sluice's rules: the rule model, parsing and validation
// of rules documents (YAML or JSON), matching requests to rules, rendering
// rate-limit keys from request attributes, and evaluating every matching
// rule's stacked limits into one decision.
//
// A rules document is parsed by [Parse] into [Rule] values, by one schema:
// the `rule` tags of [Rule] and [Limit] name the fields; invalid rules fail
// with an error naming the rule, the field and its line. [New] compiles
// rules into a [Policy] against injected stores (a map from backend name
// to a [storage.Store]), so this package never imports a backend, the AWS
// SDK or aws-lambda-go. A [Request] is a plain struct of attributes (source IP,
// method, path, route key, stage, headers, query, API key, token) that the
// caller fills from its event.
//
// [Policy.Evaluate] picks the matching rules, renders each rule's key, and
// checks each rule's limits as a [limiter.Stack]; the rules are checked in
// order and a request passes only if all pass. When a rule denies, what the
// earlier rules took is refunded. When a backend errs (or the deadline in
// ctx expires) the rule's fail mode decides: open allows, closed denies.
//
// A rules document may carry allow and deny lists ([Lists]: CIDRs and exact
// attribute values), decided in memory before anything else. A rule may be
// in shadow mode (checked and counted, never denying), pick its limits per
// request from a tier attribute ([Tier]), and hold a concurrent-requests
// limit whose leases an allowed request carries in Result.Leases for the
// code that sees the request end ([Policy.Release], lambdawrap). Every
// [Result] says why with a [Reason].
//
// Keys are hostile-input safe: every attribute value is bounded and
// percent-escaped, values longer than [MaxValueLen] are replaced by a hash,
// tokens and API keys are always hashed, and the whole key is bounded by
// [MaxKeyLen].
//
// [Cache] keeps a Policy loaded from a slow source (a DynamoDB table) and
// reloads it in the background when its TTL has passed.
//
// The rule format is documented with examples in docs/rules.md.
package policy
