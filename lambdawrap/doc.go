// Package lambdawrap wraps aws-lambda-go handlers with Sluice's
// concurrent-requests limiter.
//
// [Concurrency] takes any handler of the form aws-lambda-go accepts,
// func(context.Context, In) (Out, error), and returns one of the same type
// that acquires a lease before calling it and releases the lease after it
// returns, errs or panics (the panic goes on after the release, to the
// Lambda runtime). A request over the limit never reaches the handler. The
// result goes to lambda.Start as the handler would:
//
//	h := lambdawrap.Concurrency(handle, limit, func(_ context.Context, req events.APIGatewayProxyRequest) (string, error) {
//		return req.RequestContext.Identity.SourceIP, nil
//	})
//	lambda.Start(h)
//
// [Release] is the other half of a lease taken upstream: an API Gateway
// authorizer acquires a slot of the fleet-usage shedder and passes the lease
// to the integration in its context ([LeaseContextKey]); the integration's
// handler, wrapped with Release, gives the slot back when it is done, so the
// shedder counts requests in flight exactly instead of letting each slot
// lapse after the lease TTL.
//
// Sluice's authorizer passes every lease it took (a rule's concurrency
// limit, the fleet shedder's slot) as [FormatLeases] under
// [LeaseContextKey]; [ReleaseLeases] wraps the integration's handler and
// releases them all, by limit name, on one lease store
// ([NewStoreReleaser]).
//
// The package imports only the limiter and the standard library; it works
// with any event types, aws-lambda-go's or your own.
package lambdawrap
