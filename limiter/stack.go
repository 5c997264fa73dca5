package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Stack applies several limits to one key (ClassDojo's "100 per minute and 2
// per second"): a request passes only if every limit allows it. The limits
// are checked in order; when one denies, the units the earlier ones took are
// given back, so a denial never eats another limit's quota. Safe for
// concurrent use.
type Stack struct {
	limits []Limiter
}

// NewStack returns a stack of limits (at least one, none nil).
func NewStack(limits ...Limiter) (*Stack, error) {
	if len(limits) == 0 {
		return nil, fmt.Errorf("%w: stack: needs at least one limit", ErrInvalidConfig)
	}
	for i, l := range limits {
		if l == nil {
			return nil, fmt.Errorf("%w: stack: limit %d is nil", ErrInvalidConfig, i)
		}
	}
	return &Stack{limits: limits}, nil
}

// Allow is AllowN(ctx, key, now, 1).
func (s *Stack) Allow(ctx context.Context, key string, now time.Time) (Decision, error) {
	return s.AllowN(ctx, key, now, 1)
}

// AllowN asks every limit, as one batch ([Decide]): the limits on the same
// store go to it in one round trip where the store batches. The decision is
// the first denial in the stack's order, or when all allow, the allowing
// decision with the least remaining. On a denial what the other limits took
// is given back. When a limit errs, what the others took is given back and
// the error returned. If giving back fails, the decision is still returned,
// with an error wrapping [ErrRefund].
func (s *Stack) AllowN(ctx context.Context, key string, now time.Time, n int64) (Decision, error) {
	var ibuf [8]Item
	var obuf [8]Outcome
	items, out := s.items(ibuf[:0], key, n), obuf[:0]
	if len(items) > len(obuf) {
		out = make([]Outcome, len(items))
	}
	out = out[:len(items)]
	i, err := Decide(ctx, now, items, out)
	if err != nil {
		return Decision{}, err
	}
	var errs []error
	for j := range out {
		if out[j].Err != nil {
			errs = append(errs, out[j].Err)
		}
	}
	return out[i].Decision, errors.Join(errs...)
}

// Refund gives back n units to every limit, as one batch: the limits on
// the same store in one round trip where the store batches.
func (s *Stack) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	var ibuf [8]Item
	var ebuf [8]error
	items, errs := s.items(ibuf[:0], key, n), ebuf[:0]
	if len(items) > len(ebuf) {
		errs = make([]error, len(items))
	}
	errs = errs[:len(items)]
	giveBack(ctx, now, items, errs)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrRefund, err)
	}
	return nil
}

// items appends the stack's limits to dst as the items of a call of n
// units for key.
func (s *Stack) items(dst []Item, key string, n int64) []Item {
	for _, l := range s.limits {
		dst = append(dst, Item{Limit: l, Key: key, N: n})
	}
	return dst
}
