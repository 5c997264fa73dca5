package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
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

// TestLeases runs the lease suite with 16 goroutines, not 64, on the
// Contention scenario's one concurrency item: behind DynamoDB's partition
// cap (the cap proxy every DynamoDB test runs behind, which also
// serializes the item's writes as DynamoDB does) 64 goroutines retrying a
// full item keep it over 1,000 write units a second, failed conditions
// included, and fresh-clone make test runs had 31 and 48 of 512 acquires
// time out at 10 s. One hot DynamoDB item does not serve 64 contending
// containers (docs/stores.md, "One hot item"); 16 still contend for a
// capacity of 10.
func TestLeases(t *testing.T) {
	l, _ := newLeases(t)
	limitertest.RunLeasesWith(t, l, limitertest.LeaseOptions{ContentionWorkers: 16})
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

// throttlingHTTP is the SDK client's HTTP client: it passes the first pass
// requests to the server, then answers every request as DynamoDB answers a
// throttled one (HTTP 400, the error code in the JSON body), so the SDK's
// own deserializer and retryer see exactly what they would in AWS.
type throttlingHTTP struct {
	code      string
	pass      atomic.Int64
	throttled atomic.Int64
}

func (h *throttlingHTTP) Do(r *http.Request) (*http.Response, error) {
	if h.pass.Add(-1) >= 0 {
		return http.DefaultClient.Do(r)
	}
	h.throttled.Add(1)
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	body := `{"__type":"com.amazonaws.dynamodb.v20120810#` + h.code + `","message":"Throughput exceeds the current capacity (injected)."}`
	return &http.Response{
		Status:        "400 Bad Request",
		StatusCode:    http.StatusBadRequest,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": {"application/x-amz-json-1.0"}, "X-Amzn-Requestid": {"injected"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       r,
	}, nil
}

// The acceptance: a throttled lease call returns an error for which
// errors.Is(err, storage.ErrThrottled) and errors.Is(err,
// dynamo.ErrThrottled) hold, for every throttling code the mapping knows,
// on every lease and gauge request: an acquire's first write, the second
// write of an acquire on a new key, a release, a gauge's put and get.
func TestLeasesThrottled(t *testing.T) {
	endpoint := testserver.DynamoDB(t)
	newLeases(t) // creates the lease table
	for _, code := range dynamo.ThrottleCodes() {
		t.Run(code, func(t *testing.T) {
			h := &throttlingHTTP{code: code}
			h.pass.Store(1 << 30)
			client := dynamodb.New(dynamodb.Options{
				BaseEndpoint: aws.String(endpoint),
				Region:       "us-east-1",
				Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
					return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "test"}, nil
				}),
				HTTPClient: h,
			})
			l, err := dynamo.NewLeases(client, dynamo.Config{Table: leaseTable, Timeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ctx := testCtx(t)
			now := limitertest.Base.UnixNano()
			held := storage.Key{Space: "throttled", Name: limitertest.Key(t)}
			op := storage.LeaseOp{Capacity: 3, Now: now, TTL: time.Minute, ID: "first"}
			if d, err := l.AcquireLease(ctx, held, op); err != nil || !d.Allowed {
				t.Fatalf("setup: %+v, %v", d, err)
			}
			calls := []struct {
				name string
				pass int64 // requests that get through before the throttling
				call func() error
			}{
				{"acquire", 0, func() error {
					op.ID = "second"
					_, err := l.AcquireLease(ctx, held, op)
					return err
				}},
				{"acquire on a new key (second write)", 1, func() error {
					op.ID = "new"
					_, err := l.AcquireLease(ctx, storage.Key{Space: "throttled", Name: limitertest.Key(t) + "-new"}, op)
					return err
				}},
				{"release", 0, func() error {
					return l.ReleaseLease(ctx, held, storage.ReleaseOp{ID: "first", Now: now})
				}},
				{"put gauge", 0, func() error {
					return l.PutGauge(ctx, held, storage.Gauge{Value: 0.5, At: now}, time.Minute)
				}},
				{"get gauge", 0, func() error {
					_, _, err := l.GetGauge(ctx, held)
					return err
				}},
			}
			for _, c := range calls {
				h.pass.Store(c.pass)
				h.throttled.Store(0)
				err := c.call()
				if !errors.Is(err, storage.ErrThrottled) || !errors.Is(err, dynamo.ErrThrottled) || errors.Is(err, storage.ErrUnavailable) {
					t.Errorf("%s: %v, want ErrThrottled (limiter and dynamo) only", c.name, err)
				}
				if h.throttled.Load() == 0 {
					t.Errorf("%s: no request was throttled", c.name)
				}
			}
		})
	}
}

// A lease item whose leases or lv attribute has the wrong type is reported
// as ErrCorruptState by an acquire and by a release (the types fail the
// requests' conditions, so the item is read back and checked), never as a
// failed request, and is left as it was. (A single lease entry of the wrong
// type inside the map passes the conditions: an acquire reports it from the
// item its write returns.)
func TestCorruptLeaseItems(t *testing.T) {
	newLeases(t) // creates the lease table
	l, _ := newLeases(t)
	raw := newClient(testserver.DynamoDB(t))
	now := limitertest.Base.UnixNano()
	cases := []struct {
		name string
		item map[string]types.AttributeValue
	}{
		{"leases not a map", map[string]types.AttributeValue{
			"leases": &types.AttributeValueMemberS{Value: "x"}, "lv": &types.AttributeValueMemberN{Value: "1"}}},
		{"lv not a number", map[string]types.AttributeValue{
			"leases": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{}}, "lv": &types.AttributeValueMemberS{Value: "1"}}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := storage.Key{Space: "corrupt", Name: fmt.Sprintf("%s-%d", limitertest.Key(t), i)}
			it := maps.Clone(c.item)
			it["pk"] = &types.AttributeValueMemberS{Value: "#L/" + k.Space + "/" + k.Name}
			if _, err := raw.PutItem(testCtx(t), &dynamodb.PutItemInput{TableName: aws.String(leaseTable), Item: it}); err != nil {
				t.Fatal(err)
			}
			_, err := l.AcquireLease(testCtx(t), k, storage.LeaseOp{Capacity: 5, Now: now, TTL: time.Minute, ID: "b"})
			if !errors.Is(err, storage.ErrCorruptState) || errors.Is(err, storage.ErrUnavailable) {
				t.Errorf("acquire: %v, want ErrCorruptState", err)
			}
			err = l.ReleaseLease(testCtx(t), k, storage.ReleaseOp{ID: "a", Now: now})
			if !errors.Is(err, storage.ErrCorruptState) || errors.Is(err, storage.ErrUnavailable) {
				t.Errorf("release: %v, want ErrCorruptState", err)
			}
			out, err := raw.GetItem(testCtx(t), &dynamodb.GetItemInput{TableName: aws.String(leaseTable), Key: map[string]types.AttributeValue{"pk": it["pk"]}, ConsistentRead: aws.Bool(true)})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(out.Item, it) {
				t.Errorf("item changed: %v, was %v", out.Item, it)
			}
		})
	}
}
