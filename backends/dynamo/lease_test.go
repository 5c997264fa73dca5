package dynamo_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// leaseTable is fresh per test binary.
var leaseTable = fmt.Sprintf("sluice-leases-test-%d-%d", os.Getpid(), time.Now().UnixNano())

var (
	leaseTableOnce sync.Once
	leaseTableErr  error
)

// newLeases returns a lease store on the shared DynamoDB Local, with its
// own client and table.
func newLeases(t testing.TB) *dynamo.Leases {
	t.Helper()
	client := dynamodb.New(dynamodb.Options{
		BaseEndpoint: aws.String(testserver.DynamoDB(t)),
		Region:       "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "test"}, nil
		}),
	})
	leaseTableOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		leaseTableErr = dynamo.CreateTable(ctx, client, leaseTable)
	})
	if leaseTableErr != nil {
		t.Fatalf("create table: %v", leaseTableErr)
	}
	// DynamoDB Local under -race on a shared 2-core machine is slow: a
	// generous deadline and attempt budget for 64-way contention.
	l, err := dynamo.NewLeases(client, dynamo.Config{Table: leaseTable, Timeout: 20 * time.Second, MaxAttempts: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLeases(t *testing.T) {
	limitertest.RunLeases(t, newLeases(t))
}

func TestGauges(t *testing.T) {
	limitertest.RunGauges(t, newLeases(t))
}
