package dynamo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
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

var throttleCodes = map[string]bool{
	"ProvisionedThroughputExceededException": true,
	"ThrottlingException":                    true,
	"RequestLimitExceeded":                   true,
	"Throttling":                             true,
	"ThrottledException":                     true,
	"RequestThrottledException":              true,
	"TooManyRequestsException":               true,
}

var unavailableCodes = map[string]bool{
	"InternalServerError":     true,
	"InternalFailure":         true,
	"ServiceUnavailable":      true,
	"RequestTimeout":          true,
	"RequestTimeoutException": true,
}

// mapError types an SDK error for the policy layer: throttling wraps
// ErrThrottled, network errors, 5xx and timeouts wrap ErrUnavailable. The
// original error stays in the chain.
func mapError(op string, err error) error {
	if throttled(err) {
		return fmt.Errorf("dynamo: %s: %w: %w", op, ErrThrottled, err)
	}
	var ae smithy.APIError
	if errors.As(err, &ae) && unavailableCodes[ae.ErrorCode()] {
		return fmt.Errorf("dynamo: %s: %w: %w", op, ErrUnavailable, err)
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() >= 500 {
		return fmt.Errorf("dynamo: %s: %w: %w", op, ErrUnavailable, err)
	}
	var (
		send     *smithyhttp.RequestSendError
		canceled *aws.RequestCanceledError
		netErr   net.Error
	)
	if errors.As(err, &send) || errors.As(err, &canceled) || errors.As(err, &netErr) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("dynamo: %s: %w: %w", op, ErrUnavailable, err)
	}
	return fmt.Errorf("dynamo: %s: %w", op, err)
}

func throttled(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && throttleCodes[ae.ErrorCode()]
}

// RetryerConfig configures [NewRetryer].
type RetryerConfig struct {
	// MaxAttempts is the number of attempts per request (the first one
	// included). Zero means 3.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the full-jitter exponential pause
	// before retry i: uniform in [0, min(BackoffMax, BackoffBase*2^i)).
	// Zero means 5ms and 50ms.
	BackoffBase, BackoffMax time.Duration
}

// NewRetryer returns the SDK retryer the store uses by default, sized for
// calls that must finish within a few hundred milliseconds: the SDK's
// standard retryer (which retries throttling, 5xx and network errors, and
// keeps its client-side retry quota so a fleet does not storm a throttled
// table) with at most 3 attempts per request, a full-jitter backoff of 5 to
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
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = 5 * time.Millisecond
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 50 * time.Millisecond
	}
	std := retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = cfg.MaxAttempts
		o.MaxBackoff = cfg.BackoffMax
		o.Backoff = jitter{base: cfg.BackoffBase, max: cfg.BackoffMax}
		// A multi-Region strongly consistent (MRSC) table rejects a write
		// that conflicts with one in another region; AWS documents it as
		// safe to retry.
		o.Retryables = append(o.Retryables, retry.IsErrorRetryableFunc(func(err error) aws.Ternary {
			var rc *types.ReplicatedWriteConflictException
			if errors.As(err, &rc) {
				return aws.TrueTernary
			}
			return aws.UnknownTernary
		}))
	})
	return deadlineRetryer{RetryerV2: std, reserve: cfg.BackoffMax}
}

// jitter is a full-jitter exponential backoff.
type jitter struct{ base, max time.Duration }

func (j jitter) BackoffDelay(attempt int, _ error) (time.Duration, error) {
	ceiling := min(j.base<<min(max(attempt-1, 0), 20), j.max)
	return time.Duration(rand.Int64N(int64(ceiling) + 1)), nil
}

// deadlineRetryer refuses a retry when less than reserve is left before the
// context's deadline.
type deadlineRetryer struct {
	aws.RetryerV2
	reserve time.Duration
}

var errNoTimeToRetry = errors.New("dynamo: no time left before the deadline to retry")

func (r deadlineRetryer) GetRetryToken(ctx context.Context, opErr error) (func(error) error, error) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) < r.reserve {
		return nil, errNoTimeToRetry
	}
	return r.RetryerV2.GetRetryToken(ctx, opErr)
}
