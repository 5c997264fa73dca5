package dynamo_test

import (
	"errors"
	"testing"

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
