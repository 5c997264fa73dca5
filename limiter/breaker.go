package limiter

import "errors"

// ErrBreakerOpen is wrapped, together with [ErrUnavailable], by the error
// of a store call that a circuit breaker refused without reaching the
// store (package breaker): the backend failed repeatedly and the
// breaker answers at once, so the rule's fail mode applies without
// waiting for the deadline.
var ErrBreakerOpen = errors.New("limiter: circuit breaker open")
