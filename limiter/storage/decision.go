package storage

import "time"

// Decision is a store's answer to a step that decides: what
// [BucketOp.Apply], [LogOp.Apply] and [LeaseOp.Apply] compute. It is
// limiter.Decision without the limit's name, which the limiter adds.
type Decision struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Limit is the capacity of the limit (a bucket's maxAmount, a log's
	// limit, a concurrency limit's capacity); Remaining is how much of it
	// is left after this request (never negative).
	Limit, Remaining int64
	// ResetAfter is how long until the limit is back to full capacity if
	// no more requests arrive; RetryAfter how long until a request of the
	// same cost could be allowed (zero when Allowed).
	ResetAfter, RetryAfter time.Duration
	// Granted is what a bucket's lease take gave a capacity lease (the
	// decision at hand's cost included); zero for any other op. LeaseRef
	// is where it counted them: the lease epoch of its slot, which the
	// lease's return names.
	Granted, LeaseRef int64
	// Leased is a bucket op's units of live capacity leases held in the
	// bucket after it (counted in its tokens, out of Remaining); zero for
	// any other step.
	Leased int64
}
