// Package publish is the utilization publisher of the worker-utilization
// load shedder (docs/shedding.md): a small scheduled Lambda that reads a
// CloudWatch metric the user names (for example AWS/Lambda
// ConcurrentExecutions of the backend function), divides it into a
// utilization in [0, 1], and publishes it to the gauge store the
// authorizers read (limiter.PublishedUtilization on dynamo.Leases or
// memcached.Leases), once per run.
//
// Failures publish nothing: a CloudWatch error, no data point, a data
// point older than MaxDataAge, a value that is not a number, or a store
// error. The run fails (Lambda counts an error and retries an asynchronous
// invocation) and logs why; the gauge then ages, and once it is older than
// SLUICE_SHED_UTILIZATION_MAX_AGE the shedders treat it as they treat any
// stale signal: they recede as if utilization were 0, at their slow pace,
// and count ShedErrors. A dead publisher can never keep shedding.
//
// functions/publisher is the Lambda (its main); the handler lives
// here with its tests.
package publish
