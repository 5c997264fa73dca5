package dynamo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter/storage"
)

// writer sends the conditional writes of a [Store] or a [Leases]: its
// client and request options, the retry budget of Config (MaxAttempts,
// BackoffBase, BackoffMax) and where lost races are counted.
type writer struct {
	client      Client
	optFns      []func(*dynamodb.Options)
	maxAttempts int
	base, max   time.Duration
	// lost counts the failed conditions that were retried (Stats.Conflicts);
	// nil counts nothing.
	lost *atomic.Int64
}

func (s *Store) writer() writer {
	return writer{
		client: s.client, optFns: s.optFns,
		maxAttempts: s.cfg.MaxAttempts, base: s.cfg.BackoffBase, max: s.cfg.BackoffMax,
		lost: &s.counter.conflicts,
	}
}

func (l *Leases) writer() writer {
	return writer{
		client: l.client, optFns: l.optFns,
		maxAttempts: l.cfg.MaxAttempts, base: l.cfg.BackoffBase, max: l.cfg.BackoffMax,
	}
}

// condWrite is one read-modify-write for [writer.conditional]: how to build
// each attempt's request and what to do with its outcome. The functions
// share the caller's state (the state last seen, the decision) through
// their closures.
type condWrite struct {
	// next returns the UpdateItem of this attempt, computed from the state
	// last seen, or nil when there is nothing to write (the call is done).
	// It may read first (a GetItem whose error it maps with mapError).
	// Its errors end the call as they are.
	next func(ctx context.Context) (*dynamodb.UpdateItemInput, error)
	// written, when not nil, gets the output of the successful write; its
	// error ends the call.
	written func(out *dynamodb.UpdateItemOutput) error
	// lost gets the item DynamoDB returned with a failed condition
	// (ALL_OLD; nil when there is no item). It takes it as the state last
	// seen and returns true to write again (a lost race), or false to end
	// the call with err (nil: done, e.g. nothing left to do).
	lost func(item map[string]types.AttributeValue) (retry bool, err error)
}

// conditional runs c: next, one UpdateItem, then written or lost, until a
// write succeeds, there is nothing to write, or lost ends the call. The
// first retry after a lost race is at once (it starts from the item the
// failed write returned, without a read); later ones wait a full-jitter
// pause in [0, min(BackoffMax, BackoffBase*2^(i-2))]. After MaxAttempts
// lost races, or when the next pause would outlast ctx's deadline, the call
// fails with an error wrapping storage.ErrConflict; when ctx is done, with
// one wrapping ErrUnavailable and ctx's error (the store did not answer in
// time: a lost race can also be this call's own write, applied by an
// attempt whose reply was lost and then retried by the SDK, as when the
// server goes away). Every request asks for
// ReturnValuesOnConditionCheckFailure=ALL_OLD, so lost always sees the item
// that beat it; every other error of the request goes through mapError.
// Each retried lost race is counted in w.lost.
//
// what names the call in errors ("token bucket <pk>").
func (w writer) conditional(ctx context.Context, what string, c condWrite) error {
	for lost := 0; ; {
		in, err := c.next(ctx)
		if err != nil || in == nil {
			return err
		}
		in.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
		out, err := w.client.UpdateItem(ctx, in, w.optFns...)
		if err == nil {
			if c.written != nil {
				return c.written(out)
			}
			return nil
		}
		item, failed := conditionFailed(err)
		if !failed {
			return mapError(what, err)
		}
		retry, err := c.lost(item)
		if !retry {
			return err
		}
		if w.lost != nil {
			w.lost.Add(1)
		}
		lost++
		if err := w.backoff(ctx, what, lost); err != nil {
			return err
		}
	}
}

// backoff waits before the retry that follows lost race number lost
// (1-based), as [writer.conditional] describes, or returns the error that
// ends the call.
func (w writer) backoff(ctx context.Context, what string, lost int) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dynamo: %s: %w after %d lost races: %w", what, ErrUnavailable, lost, err)
	}
	if lost >= w.maxAttempts {
		return fmt.Errorf("dynamo: %s: %w after %d attempts", what, storage.ErrConflict, lost)
	}
	if lost == 1 {
		return nil
	}
	ceiling := min(w.base<<min(lost-2, 20), w.max)
	pause := time.Duration(rand.Int64N(int64(ceiling) + 1))
	if d, ok := ctx.Deadline(); ok && time.Until(d) < pause {
		return fmt.Errorf("dynamo: %s: %w after %d attempts (deadline too close to retry)", what, storage.ErrConflict, lost)
	}
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("dynamo: %s: %w after %d lost races: %w", what, ErrUnavailable, lost, ctx.Err())
	}
}
