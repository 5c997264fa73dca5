package dynamo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/sluicehq/sluice/limiter/storage"
)

// conditionFailed returns the item DynamoDB returned with a failed
// condition (ReturnValuesOnConditionCheckFailure=ALL_OLD; nil when the item
// does not exist) and true, or false when err is another error.
func conditionFailed(err error) (map[string]types.AttributeValue, bool) {
	var cf *types.ConditionalCheckFailedException
	if errors.As(err, &cf) {
		return cf.Item, true
	}
	return nil, false
}

// throttleCodes are the error codes of a request DynamoDB refused for
// capacity: its own (ProvisionedThroughputExceededException,
// ThrottlingException, RequestLimitExceeded) and the generic AWS ones the
// SDK's retryer also treats as throttling.
var throttleCodes = map[string]bool{
	"ProvisionedThroughputExceededException": true,
	"ThrottlingException":                    true,
	"RequestLimitExceeded":                   true,
	"Throttling":                             true,
	"ThrottledException":                     true,
	"RequestThrottledException":              true,
	"TooManyRequestsException":               true,
}

// mapError is the package's one error mapping: every DynamoDB request's
// error goes through it (the conditional writes through
// [writer.conditional]), so that the policy layer can tell the cases apart
// with errors.Is. The original error stays in the chain.
//
//   - Throttling (throttleCodes, or a transaction cancelled for throttling)
//     wraps ErrThrottled, and so storage.ErrThrottled.
//   - A failed condition, a transaction conflict or a multi-Region write
//     conflict that reaches it (a lost race its caller does not retry)
//     wraps storage.ErrConflict.
//   - Anything else wraps ErrUnavailable, and so storage.ErrUnavailable:
//     network errors, timeouts and cancelled contexts, 5xx, a missing table
//     (ResourceNotFoundException), refused credentials or permissions, and
//     any other request the service did not carry out. The store could not
//     decide, so the rule's fail mode applies.
//
// Errors the store finds in what DynamoDB returned (an item it cannot
// decode) are not DynamoDB errors: they wrap storage.ErrCorruptState where
// they are found and never pass through here.
func mapError(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case throttled(err):
		return fmt.Errorf("dynamo: %s: %w: %w", op, ErrThrottled, err)
	case lostRace(err):
		return fmt.Errorf("dynamo: %s: %w: %w", op, storage.ErrConflict, err)
	}
	return fmt.Errorf("dynamo: %s: %w: %w", op, ErrUnavailable, err)
}

// throttled reports whether err is DynamoDB refusing a request for
// capacity.
func throttled(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) && throttleCodes[ae.ErrorCode()] {
		return true
	}
	var tc *types.TransactionCanceledException
	if errors.As(err, &tc) {
		for _, r := range tc.CancellationReasons {
			if code := aws.ToString(r.Code); code == "ThrottlingError" || code == "ProvisionedThroughputExceeded" {
				return true
			}
		}
	}
	return false
}

// lostRace reports whether err is a write that lost to another writer.
func lostRace(err error) bool {
	var (
		cf *types.ConditionalCheckFailedException
		tc *types.TransactionConflictException
		rw *types.ReplicatedWriteConflictException
		tx *types.TransactionCanceledException
	)
	if errors.As(err, &cf) || errors.As(err, &tc) || errors.As(err, &rw) {
		return true
	}
	if errors.As(err, &tx) {
		for _, r := range tx.CancellationReasons {
			if code := aws.ToString(r.Code); code == "ConditionalCheckFailed" || code == "TransactionConflict" {
				return true
			}
		}
	}
	return false
}

// RetryerConfig configures [NewRetryer].
type RetryerConfig struct {
	// MaxAttempts is the number of attempts per request (the first one
	// included). Zero means 3.
	MaxAttempts int
	// ConflictAttempts is the number of attempts per request while its
	// failed attempts meet ReplicatedWriteConflictException (on a
	// multi-Region strongly consistent table, another region was writing
	// the item). Zero means DefaultConflictAttempts; never fewer than
	// MaxAttempts.
	ConflictAttempts int
	// BackoffBase and BackoffMax shape the full-jitter exponential pause
	// before retry i: uniform in [0, min(BackoffMax, BackoffBase*2^i)).
	// Zero means 5ms and 50ms.
	BackoffBase, BackoffMax time.Duration
}

// DefaultConflictAttempts is [RetryerConfig.ConflictAttempts]' default. A
// conflict costs a cross-region round trip and tells only that another
// region wrote the item meanwhile, so a retry usually gets through; but a
// hot item written from three regions meets one in most attempts (on the
// local harness, docs/regions.md), and three attempts lost up to a
// quarter of such decisions.
const DefaultConflictAttempts = 10

// NewRetryer returns the SDK retryer the store uses by default, sized for
// calls that must finish within a few hundred milliseconds: the SDK's
// standard retryer (which retries throttling, 5xx and network errors, and
// keeps its client-side retry quota so a fleet does not storm a failing
// table) with at most 3 attempts per request, no retry of a throttled
// request (it fails at once with ErrThrottled), up to ConflictAttempts
// attempts while they meet ReplicatedWriteConflictException (AWS documents
// it as safe to retry; such a retry takes nothing from the retry quota: a
// lost race is not a failing service, and a hot item's conflicts would
// otherwise empty the quota and fail the client's other retries), a
// full-jitter backoff of 5 to
// 50 ms instead of the SDK's default of up to 20 s, and no retry that would
// start its pause with less than BackoffMax left before the context's
// deadline: the request then fails with the error of its last attempt (so a
// throttled request surfaces as ErrThrottled, not as a bare timeout).
//
// Use it for a client of your own too:
//
//	dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.Retryer = dynamo.NewRetryer(dynamo.RetryerConfig{}) })
func NewRetryer(cfg RetryerConfig) aws.RetryerV2 {
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	if cfg.ConflictAttempts <= 0 {
		cfg.ConflictAttempts = DefaultConflictAttempts
	}
	cfg.ConflictAttempts = max(cfg.ConflictAttempts, cfg.MaxAttempts)
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = 5 * time.Millisecond
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 50 * time.Millisecond
	}
	std := retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = cfg.ConflictAttempts // other errors: attemptsRetryer.RetryDelay
		o.MaxBackoff = cfg.BackoffMax
		o.Backoff = jitter{base: cfg.BackoffBase, max: cfg.BackoffMax}
		// A multi-Region strongly consistent (MRSC) table rejects a write
		// that conflicts with one in another region; AWS documents it as
		// safe to retry.
		o.Retryables = append(o.Retryables, retry.IsErrorRetryableFunc(func(err error) aws.Ternary {
			if replicatedConflict(err) {
				return aws.TrueTernary
			}
			return aws.UnknownTernary
		}))
		// A throttle is not retried: the partition that refused the
		// write has no capacity left for about a second, so a retry
		// within a decision's deadline only adds to the refused writes
		// on it (each one costs the partition's request handling). The
		// store answers ErrThrottled at once and the limiter denies
		// the key (limiter.ThrottledRetryAfter). Checked first, so that
		// the SDK's own throttle codes never reach its retryables.
		o.Retryables = append([]retry.IsErrorRetryable{retry.IsErrorRetryableFunc(func(err error) aws.Ternary {
			if throttled(err) {
				return aws.FalseTernary
			}
			return aws.UnknownTernary
		})}, o.Retryables...)
	})
	return deadlineRetryer{RetryerV2: std, reserve: cfg.BackoffMax, attempts: cfg.MaxAttempts}
}

// replicatedConflict reports whether err is a ReplicatedWriteConflictException.
func replicatedConflict(err error) bool {
	var rc *types.ReplicatedWriteConflictException
	return errors.As(err, &rc)
}

// jitter is a full-jitter exponential backoff: a pause uniform in
// [0, min(max, base*2^(attempt-1))]. Hand-written because the SDK's
// retry.NewExponentialJitterBackoff counts from a base of one second: with
// a cap under a second every pause it gives is exactly the cap, the same
// for every writer (synchronized retries, which is what jitter is for);
// the SDK's millisecond base is not exported.
type jitter struct{ base, max time.Duration }

func (j jitter) BackoffDelay(attempt int, _ error) (time.Duration, error) {
	ceiling := min(j.base<<min(max(attempt-1, 0), 20), j.max)
	return time.Duration(rand.Int64N(int64(ceiling) + 1)), nil
}

// deadlineRetryer refuses a retry when less than reserve is left before the
// context's deadline, ends a request after attempts attempts unless its last
// one met a replicated write conflict (the SDK's own bound is the
// conflicts'), and retries conflicts without the retry quota.
type deadlineRetryer struct {
	aws.RetryerV2
	reserve  time.Duration
	attempts int
}

var errNoTimeToRetry = errors.New("dynamo: no time left before the deadline to retry")

func (r deadlineRetryer) GetRetryToken(ctx context.Context, opErr error) (func(error) error, error) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) < r.reserve {
		return nil, errNoTimeToRetry
	}
	if replicatedConflict(opErr) {
		return func(error) error { return nil }, nil
	}
	return r.RetryerV2.GetRetryToken(ctx, opErr)
}

// RetryDelay ends a request that failed its attempts-th attempt with an
// error other than a replicated write conflict, as the SDK's MaxAttempts
// would (attempt counts the attempts made, as the SDK's retry middleware
// passes it; the retry token it took first is not returned). The error
// wraps the attempt's.
func (r deadlineRetryer) RetryDelay(attempt int, err error) (time.Duration, error) {
	if attempt >= r.attempts && !replicatedConflict(err) {
		return 0, &retry.MaxAttemptsError{Attempt: attempt, Err: err}
	}
	return r.RetryerV2.RetryDelay(attempt, err)
}
