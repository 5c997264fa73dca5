package dynamo_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/backends/dynamo"
)

// A write that conflicts with another region's on an MRSC table is retried.
func TestRetryerRetriesReplicatedWriteConflicts(t *testing.T) {
	r := dynamo.NewRetryer(dynamo.RetryerConfig{})
	msg := "conflict"
	if !r.IsErrorRetryable(&types.ReplicatedWriteConflictException{Message: &msg}) {
		t.Fatal("ReplicatedWriteConflictException is not retried")
	}
	if r.IsErrorRetryable(errors.New("validation")) {
		t.Fatal("a plain error is retried")
	}
	var _ aws.RetryerV2 = r
}

// A throttled request is not retried: the partition that refused it has no
// capacity left, and a retry within the decision only piles onto it.
func TestRetryerDoesNotRetryThrottles(t *testing.T) {
	r := dynamo.NewRetryer(dynamo.RetryerConfig{})
	msg := "throughput exceeded"
	for _, err := range []error{
		&types.ProvisionedThroughputExceededException{Message: &msg},
		&types.RequestLimitExceeded{Message: &msg},
		&types.ThrottlingException{Message: &msg},
	} {
		if r.IsErrorRetryable(err) {
			t.Errorf("%T is retried", err)
		}
	}
}

// A replicated write conflict is retried up to ConflictAttempts attempts
// and without the retry quota; other errors stop at MaxAttempts.
func TestRetryerConflictAttempts(t *testing.T) {
	r := dynamo.NewRetryer(dynamo.RetryerConfig{})
	msg := "conflict"
	conflict := &types.ReplicatedWriteConflictException{Message: &msg}
	if got := r.MaxAttempts(); got != dynamo.DefaultConflictAttempts {
		t.Errorf("MaxAttempts = %d, want %d", got, dynamo.DefaultConflictAttempts)
	}
	if _, err := r.RetryDelay(3, conflict); err != nil {
		t.Errorf("a conflict's fourth attempt refused: %v", err)
	}
	other := &types.InternalServerError{Message: &msg}
	if _, err := r.RetryDelay(3, other); err == nil || !errors.As(err, new(*types.InternalServerError)) {
		t.Errorf("a 500's fourth attempt: %v, want refused with the 500 in the chain", err)
	}
	if _, err := r.RetryDelay(2, other); err != nil {
		t.Errorf("a 500's third attempt refused: %v", err)
	}
	for i := range 1000 { // the SDK's quota is 500, 5 a retry
		if _, err := r.GetRetryToken(t.Context(), conflict); err != nil {
			t.Fatalf("conflict retry %d: %v", i, err)
		}
	}
	if _, err := r.GetRetryToken(t.Context(), other); err != nil {
		t.Errorf("the quota after 1,000 conflict retries: %v", err)
	}
}

// A conflict's retries pause a full-jitter exponential backoff: spread
// over [0, ceiling] (writers from several regions that met do not retry
// in step), the ceiling doubling from BackoffBase up to BackoffMax. The
// SDK's own retry.NewExponentialJitterBackoff(50ms) gives 50 ms every
// time, which fails it.
func TestRetryerConflictBackoffJittered(t *testing.T) {
	const base, maxBackoff = 5 * time.Millisecond, 50 * time.Millisecond
	r := dynamo.NewRetryer(dynamo.RetryerConfig{BackoffBase: base, BackoffMax: maxBackoff})
	msg := "conflict"
	conflict := &types.ReplicatedWriteConflictException{Message: &msg}
	for attempt := 1; attempt <= 8; attempt++ {
		ceiling := min(base<<(attempt-1), maxBackoff)
		seen := map[time.Duration]bool{}
		lo, hi := time.Duration(1<<62), time.Duration(0)
		for range 200 {
			d, err := r.RetryDelay(attempt, conflict)
			if err != nil {
				t.Fatalf("attempt %d: %v", attempt, err)
			}
			seen[d] = true
			lo, hi = min(lo, d), max(hi, d)
		}
		if hi > ceiling || lo > ceiling/4 || hi < ceiling*3/4 || len(seen) < 100 {
			t.Errorf("attempt %d: pauses in [%v, %v], %d distinct of 200; want spread over [0, %v]", attempt, lo, hi, len(seen), ceiling)
		}
	}
}
