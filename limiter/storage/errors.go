package storage

import (
	"errors"
)

// ErrBreakerOpen is wrapped, together with [ErrUnavailable], by the error
// of a store call that a circuit breaker refused without reaching the
// store (package breaker): the backend failed repeatedly and the
// breaker answers at once, so the rule's fail mode applies without
// waiting for the deadline.
var ErrBreakerOpen = errors.New("storage: circuit breaker open")
var (
	// ErrConflict is what backends wrap when an optimistic update lost a
	// race (a CAS mismatch, a failed condition) and retries ran out.
	ErrConflict = errors.New("storage: conflicting concurrent update")
	// ErrCorruptState is what backends wrap when stored state cannot be
	// decoded. The limiter never treats it as an empty (full) bucket.
	ErrCorruptState = errors.New("storage: corrupt stored state")
	// ErrUnavailable is what backends wrap when the store could not be
	// reached or did not answer within the deadline (network errors,
	// timeouts, server errors, a missing table): the cases where a rule's
	// fail mode applies.
	ErrUnavailable = errors.New("storage: store unavailable")
	// ErrThrottled is what backends wrap when the store refused the request
	// for capacity (DynamoDB throttling) and retries within the deadline did
	// not get through. Like every store error, it follows the rule's fail
	// mode.
	ErrThrottled = errors.New("storage: store throttled")
	// ErrFenced is what a store answers a fenced take ([Step].Fence)
	// whose fence is below its key's ([Fencer]): nothing was taken. It is
	// not an outage: the caller decided on a state older than the key's
	// fence and must read that state again before deciding.
	ErrFenced = errors.New("storage: fenced: the key's fence is above the take's")
)
