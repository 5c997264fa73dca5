package limiter

import (
	"fmt"
	"math"

	"github.com/sluicehq/sluice/limiter/storage"
)

// A per-decision cap (Item.Cap): a sliding window with sub-window
// counters judges one decision against a lower limit on the same counters
// (its key space, which encodes Limit, is unchanged). Used to keep one
// limit as shares that move between places (internal/regions,
// docs/regions.md): a share is a cap on a window of the whole limit.
//
// The cap counts as traffic ahead of the decision's clock (Counts.Later,
// Limit-Cap more units): the Bounded estimate, Remaining, RetryAfter and a
// lease take's grant (leaseGot) are then exactly those of a window of
// limit Cap on the same counts. A lease taken under a cap holds units the
// store counted, so lowering the cap later never lets its spending exceed
// what the counters show. A denial is cached with the cap as its Limit,
// and a decision whose cap is higher is not answered from it (the cap
// rose: the store decides).
//
// A token bucket refuses a cap: its capacity could be lowered per
// decision, but raising it again on the same state would hand back at
// once the refills the lower capacity dropped, and a rate cannot change
// per decision on a store that keeps the bucket as a refill grid
// (DynamoDB). A packed window refuses it too (its retry-after works on
// its fields, not on Counts).

// capCheck refuses a cap c that limit s cannot take.
func capCheck(s stepper, c int64) error {
	w, ok := s.(*SlidingWindow)
	switch {
	case c < 0:
		return fmt.Errorf("%w: a cap must be positive, got %d", ErrInvalidConfig, c)
	case !ok:
		return fmt.Errorf("%w: a cap (Item.Cap) needs a sliding window with sub-window counters, not %T", ErrInvalidConfig, s)
	case w.packed != nil:
		return fmt.Errorf("%w: limit %q: a cap (Item.Cap) needs sub-window counters, not a packed window", ErrInvalidConfig, w.cfg.Name)
	}
	return nil
}

// capCounts applies cap c to r, the answer to limit s's step, before it
// is judged, and returns the decision's limit (math.MaxInt64: no cap).
func capCounts(s stepper, c int64, r *storage.StepResult) int64 {
	w, ok := s.(*SlidingWindow)
	if !ok || c <= 0 || c >= w.cfg.Limit || r.Err != nil {
		return math.MaxInt64
	}
	r.Counts.Later = satAdd(r.Counts.Later, w.cfg.Limit-c)
	return c
}

// capRaised reports that d, a denial cached for it's limit s, was made
// under a lower limit than it's: it does not answer it.
func capRaised(s stepper, it *Item, d Decision) bool {
	w, ok := s.(*SlidingWindow)
	if !ok {
		return false
	}
	limit := w.cfg.Limit
	if it.Cap > 0 {
		limit = min(limit, it.Cap)
	}
	return d.Limit < limit
}
