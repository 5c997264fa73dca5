package dynamo_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// leaseTable is fresh per test binary.
var leaseTable = fmt.Sprintf("sluice-leases-test-%d-%d", os.Getpid(), time.Now().UnixNano())

var (
	leaseTableOnce sync.Once
	leaseTableErr  error
)

// newLeases returns a lease store on the shared DynamoDB Local, with its
// own client and table, and a count of the requests it sends.
func newLeases(t testing.TB) (*dynamo.Leases, *atomic.Int64) {
	t.Helper()
	var sent atomic.Int64
	count := func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("countLeaseRequests",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				sent.Add(1)
				return next.HandleFinalize(ctx, in)
			}), middleware.After)
	}
	client := dynamodb.New(dynamodb.Options{
		BaseEndpoint: aws.String(testserver.DynamoDB(t)),
		Region:       "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "test"}, nil
		}),
		APIOptions: []func(*middleware.Stack) error{count},
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
	return l, &sent
}

func TestLeases(t *testing.T) {
	l, _ := newLeases(t)
	limitertest.RunLeases(t, l)
}

func TestGauges(t *testing.T) {
	l, _ := newLeases(t)
	limitertest.RunGauges(t, l)
}

// TestLeaseRoundTrips: an acquire with room is one request, a release is
// one, a denial on a full set without expired leases is one; only a new key
// and a full set holding expired leases take a second (the write of the
// whole set).
func TestLeaseRoundTrips(t *testing.T) {
	l, sent := newLeases(t)
	c, err := limiter.NewConcurrency(l, limiter.ConcurrencyConfig{Name: limitertest.Key(t), Capacity: 3, LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := limitertest.Key(t)
	step := func(what string, want int64, f func()) {
		t.Helper()
		before := sent.Load()
		f()
		if got := sent.Load() - before; got != want {
			t.Fatalf("%s: %d requests, want %d", what, got, want)
		}
	}
	acquire := func(at time.Duration, allowed bool) limiter.Lease {
		t.Helper()
		lease, d, err := c.Acquire(ctx, key, limitertest.Base.Add(at))
		if err != nil || d.Allowed != allowed {
			t.Fatalf("acquire at %v: %+v, %v; want allowed=%v", at, d, err, allowed)
		}
		return lease
	}
	var first limiter.Lease
	step("first acquire on a new key", 2, func() { first = acquire(0, true) })
	step("acquire with room", 1, func() { acquire(0, true) })
	step("acquire with room", 1, func() { acquire(0, true) })
	step("denial", 1, func() { acquire(0, false) })
	step("release", 1, func() {
		if err := c.Release(ctx, first); err != nil {
			t.Fatal(err)
		}
	})
	step("acquire after a release", 1, func() { acquire(0, true) })
	step("acquire on a set full of expired leases", 2, func() { acquire(time.Hour, true) })
	step("release of an unknown key", 1, func() {
		if err := c.Release(ctx, limiter.Lease{Key: limitertest.Key(t), ID: "nope"}); err != nil {
			t.Fatal(err)
		}
	})
}
