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

// AllowN asks every limit in turn. The decision is the first denial, or when
// all allow, the allowing decision with the least remaining. When a limit
// errs, what the earlier ones took is given back and the error returned. If
// giving back fails, the decision is still returned, with an error wrapping
// [ErrRefund].
func (s *Stack) AllowN(ctx context.Context, key string, now time.Time, n int64) (Decision, error) {
	var best Decision
	for i, l := range s.limits {
		d, err := l.AllowN(ctx, key, now, n)
		if err != nil && !errors.Is(err, ErrRefund) {
			if rerr := s.refund(ctx, key, now, n, i); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return Decision{}, err
		}
		if !d.Allowed {
			rerr := s.refund(ctx, key, now, n, i)
			return d, errors.Join(err, rerr)
		}
		if i == 0 || d.Remaining < best.Remaining || d.Remaining == best.Remaining && d.ResetAfter > best.ResetAfter {
			best = d
		}
	}
	return best, nil
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
