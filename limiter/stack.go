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
	items, out := ibuf[:0], obuf[:0]
	if len(s.limits) > len(ibuf) {
		items, out = make([]Item, 0, len(s.limits)), make([]Outcome, 0, len(s.limits))
	}
	for _, l := range s.limits {
		items = append(items, Item{Limit: l, Key: key, N: n})
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

// Refund gives back n units to every limit.
func (s *Stack) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	return s.refund(ctx, key, now, n, len(s.limits))
}

// refund gives back n units to limits[:upto].
func (s *Stack) refund(ctx context.Context, key string, now time.Time, n int64, upto int) error {
	var errs []error
	for _, l := range s.limits[:upto] {
		if err := l.Refund(ctx, key, now, n); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrRefund, errors.Join(errs...))
}
