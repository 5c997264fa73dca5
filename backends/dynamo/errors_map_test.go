package dynamo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/sluicehq/sluice/limiter/storage"
)

// kinds are the four classes every error of a store call falls in.
var kinds = []struct {
	name string
	err  error
}{
	{"ErrThrottled", storage.ErrThrottled},
	{"ErrUnavailable", storage.ErrUnavailable},
	{"ErrConflict", storage.ErrConflict},
	{"ErrCorruptState", storage.ErrCorruptState},
}

// opError wraps err as the SDK returns it from an operation.
func opError(err error) error {
	return &smithy.OperationError{ServiceID: "DynamoDB", OperationName: "UpdateItem", Err: err}
}

// httpError is an error response with the given status, as the SDK's
// deserializer wraps it.
func httpError(status int, err error) error {
	return &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}}, Err: err}
}

func apiError(code string) error {
	return &smithy.GenericAPIError{Code: code, Message: "injected", Fault: smithy.FaultClient}
}

func cancelled(codes ...string) error {
	tc := &types.TransactionCanceledException{Message: aws.String("cancelled")}
	for _, c := range codes {
		tc.CancellationReasons = append(tc.CancellationReasons, types.CancellationReason{Code: aws.String(c)})
	}
	return tc
}

// TestMapError: every error a DynamoDB request can return falls in exactly
// one of the limiter's classes, keeps the original error in its chain, and
// the package's own sentinels wrap the limiter's.
func TestMapError(t *testing.T) {
	type tc struct {
		name string
		err  error
		want error // storage.ErrThrottled, ErrUnavailable or ErrConflict
	}
	var cases []tc
	for code := range throttleCodes {
		cases = append(cases,
			tc{"generic " + code, apiError(code), storage.ErrThrottled},
			tc{"400 " + code, opError(httpError(400, apiError(code))), storage.ErrThrottled})
	}
	cases = append(cases, []tc{
		{"typed ProvisionedThroughputExceeded", opError(httpError(400, &types.ProvisionedThroughputExceededException{Message: aws.String("x")})), storage.ErrThrottled},
		{"typed RequestLimitExceeded", opError(httpError(400, &types.RequestLimitExceeded{Message: aws.String("x")})), storage.ErrThrottled},
		{"typed ThrottlingException", opError(httpError(400, &types.ThrottlingException{Message: aws.String("x")})), storage.ErrThrottled},
		{"transaction cancelled for throttling", opError(cancelled("None", "ThrottlingError")), storage.ErrThrottled},
		{"transaction cancelled for provisioned throughput", opError(cancelled("ProvisionedThroughputExceeded", "ConditionalCheckFailed")), storage.ErrThrottled},
		{"throttled, no time left to retry", opError(errors.Join(apiError("ThrottlingException"), errNoTimeToRetry)), storage.ErrThrottled},
		{"throttled, retry quota spent", opError(fmt.Errorf("retry quota exceeded: %w", apiError("ProvisionedThroughputExceededException"))), storage.ErrThrottled},

		{"missing table", opError(httpError(400, &types.ResourceNotFoundException{Message: aws.String("Cannot do operations on a non-existent table")})), storage.ErrUnavailable},
		{"missing table, generic", apiError("ResourceNotFoundException"), storage.ErrUnavailable},
		{"internal server error", opError(httpError(500, &types.InternalServerError{Message: aws.String("x")})), storage.ErrUnavailable},
		{"503 without a code", opError(httpError(503, errors.New("service unavailable"))), storage.ErrUnavailable},
		{"ServiceUnavailable", apiError("ServiceUnavailable"), storage.ErrUnavailable},
		{"RequestTimeout", apiError("RequestTimeout"), storage.ErrUnavailable},
		{"send error", opError(&smithyhttp.RequestSendError{Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}}), storage.ErrUnavailable},
		{"request cancelled", opError(&aws.RequestCanceledError{Err: context.Canceled}), storage.ErrUnavailable},
		{"net error", &net.DNSError{Err: "no such host", Name: "dynamodb.example", IsNotFound: true}, storage.ErrUnavailable},
		{"deadline", opError(context.DeadlineExceeded), storage.ErrUnavailable},
		{"cancelled context", context.Canceled, storage.ErrUnavailable},
		{"access denied", opError(httpError(400, apiError("AccessDeniedException"))), storage.ErrUnavailable},
		{"bad credentials", opError(httpError(400, apiError("UnrecognizedClientException"))), storage.ErrUnavailable},
		{"validation", opError(httpError(400, apiError("ValidationException"))), storage.ErrUnavailable},
		{"retryer gave up without an attempt", errNoTimeToRetry, storage.ErrUnavailable},
		{"max attempts", &retry.MaxAttemptsError{Attempt: 3, Err: apiError("InternalFailure")}, storage.ErrUnavailable},
		{"transaction cancelled for validation", opError(cancelled("ValidationError")), storage.ErrUnavailable},
		{"untyped", errors.New("something else"), storage.ErrUnavailable},

		{"failed condition", opError(httpError(400, &types.ConditionalCheckFailedException{Message: aws.String("x")})), storage.ErrConflict},
		{"transaction conflict", opError(httpError(400, &types.TransactionConflictException{Message: aws.String("x")})), storage.ErrConflict},
		{"multi-Region write conflict", opError(httpError(400, &types.ReplicatedWriteConflictException{Message: aws.String("x")})), storage.ErrConflict},
		{"transaction cancelled by a condition", opError(cancelled("None", "ConditionalCheckFailed")), storage.ErrConflict},
		{"transaction cancelled by a conflict", opError(cancelled("TransactionConflict")), storage.ErrConflict},
	}...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := mapError("token bucket write", c.err)
			for _, k := range kinds {
				if is := errors.Is(got, k.err); is != (k.err == c.want) {
					t.Errorf("errors.Is(%v, %s) = %v", got, k.name, is)
				}
			}
			if !errors.Is(got, c.err) {
				t.Errorf("%v: the original error is not in the chain", got)
			}
			switch c.want {
			case storage.ErrThrottled:
				if !errors.Is(got, ErrThrottled) {
					t.Errorf("%v does not wrap dynamo.ErrThrottled", got)
				}
			case storage.ErrUnavailable:
				if !errors.Is(got, ErrUnavailable) {
					t.Errorf("%v does not wrap dynamo.ErrUnavailable", got)
				}
			}
			if errors.Is(c.err, context.DeadlineExceeded) && !errors.Is(got, context.DeadlineExceeded) {
				t.Errorf("%v lost context.DeadlineExceeded", got)
			}
		})
	}
	if mapError("x", nil) != nil {
		t.Error("mapError(nil) is not nil")
	}
}

// The throttling codes are the SDK retryer's too: what mapError reports as
// throttled is what the SDK retried as throttling within the deadline.
func TestThrottleCodesAreRetriedAsThrottling(t *testing.T) {
	for code := range throttleCodes {
		if _, ok := retry.DefaultThrottleErrorCodes[code]; !ok {
			t.Errorf("%s is not a throttling code of the SDK's retryer", code)
		}
	}
}

// The errors the conditional-write loop makes itself: retries spent
// (ErrConflict), the context done between lost races (ErrUnavailable and
// the context's error).
func TestWriterBackoffErrors(t *testing.T) {
	w := writer{maxAttempts: 3, base: 1, max: 1}
	if err := w.backoff(context.Background(), "k", 1); err != nil {
		t.Fatalf("first retry: %v, want none (at once)", err)
	}
	if err := w.backoff(context.Background(), "k", 3); !errors.Is(err, storage.ErrConflict) || errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("retries spent: %v, want ErrConflict only", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.backoff(ctx, "k", 2); !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.Canceled) || errors.Is(err, storage.ErrConflict) {
		t.Fatalf("context done: %v, want ErrUnavailable and context.Canceled", err)
	}
}
