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
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
)

// tableName is fresh per test binary, so runs against the shared server
// never see each other's items.
var tableName = fmt.Sprintf("sluice-dynamo-test-%d-%d", os.Getpid(), time.Now().UnixNano())

var (
	tableOnce sync.Once
	tableErr  error
)

// requests counts the HTTP requests (SDK attempts, retries included) a client
// sends, per operation, and the write capacity DynamoDB reports.
type requests struct {
	total, get, update atomic.Int64
	failed             atomic.Int64 // attempts that returned an error (failed conditions included)
	wcuMilli           atomic.Int64 // consumed capacity of successful writes, in thousandths
	rcuMilli           atomic.Int64 // consumed capacity of reads, in thousandths
	consumed           bool         // ask for ReturnConsumedCapacity=TOTAL
}

func (r *requests) load() int64 { return r.total.Load() }

// middleware adds the counter to a client's stack: an Initialize step that
// asks for consumed capacity and reads it from the output, and a Finalize
// step after the retry middleware that counts each attempt.
func (r *requests) middleware(st *middleware.Stack) error {
	if err := st.Initialize.Add(middleware.InitializeMiddlewareFunc("countCapacity",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			if r.consumed {
				switch p := in.Parameters.(type) {
				case *dynamodb.UpdateItemInput:
					p.ReturnConsumedCapacity = types.ReturnConsumedCapacityTotal
				case *dynamodb.GetItemInput:
					p.ReturnConsumedCapacity = types.ReturnConsumedCapacityTotal
				}
			}
			out, md, err := next.HandleInitialize(ctx, in)
			switch o := out.Result.(type) {
			case *dynamodb.UpdateItemOutput:
				if o.ConsumedCapacity != nil && o.ConsumedCapacity.CapacityUnits != nil {
					r.wcuMilli.Add(int64(*o.ConsumedCapacity.CapacityUnits * 1000))
				}
			case *dynamodb.GetItemOutput:
				if o.ConsumedCapacity != nil && o.ConsumedCapacity.CapacityUnits != nil {
					r.rcuMilli.Add(int64(*o.ConsumedCapacity.CapacityUnits * 1000))
				}
			}
			return out, md, err
		}), middleware.After); err != nil {
		return err
	}
	return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("countRequests",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			r.total.Add(1)
			switch awsmiddleware.GetOperationName(ctx) {
			case "GetItem":
				r.get.Add(1)
			case "UpdateItem":
				r.update.Add(1)
			}
			out, md, err := next.HandleFinalize(ctx, in)
			if err != nil {
				r.failed.Add(1)
			}
			return out, md, err
		}), middleware.After)
}

// newClient returns a client for endpoint with dummy credentials and extra
// middleware.
func newClient(endpoint string, apiOptions ...func(*middleware.Stack) error) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "test"}, nil
		}),
		APIOptions: apiOptions,
	})
}

// sharedEndpoint returns the shared DynamoDB Local's endpoint with the test
// table created.
func sharedEndpoint(t testing.TB) string {
	t.Helper()
	endpoint := testserver.DynamoDB(t)
	tableOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		tableErr = dynamo.CreateTable(ctx, newClient(endpoint), tableName)
	})
	if tableErr != nil {
		t.Fatalf("create table: %v", tableErr)
	}
	return endpoint
}

// newStore returns a store on the shared server's test table, with a request
// counter.
func newStore(t testing.TB, cfg dynamo.Config) (*dynamo.Store, *requests, *dynamodb.Client) {
	t.Helper()
	endpoint := sharedEndpoint(t)
	r := &requests{}
	client := newClient(endpoint, r.middleware)
	if cfg.Table == "" {
		cfg.Table = tableName
	}
	s, err := dynamo.New(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, r, client
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
