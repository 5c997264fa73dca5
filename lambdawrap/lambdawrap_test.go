package lambdawrap_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/lambdawrap"
	"github.com/sluicehq/sluice/limiter"
)

var t0 = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

func newLimit(t testing.TB, capacity int64) *limiter.Concurrency {
	t.Helper()
	store, err := memory.NewLeases(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := limiter.NewConcurrency(store, limiter.ConcurrencyConfig{Name: "in-flight", Capacity: capacity, LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// free reports whether key has a free slot now, without keeping it.
func free(t testing.TB, c *limiter.Concurrency, key string) bool {
	t.Helper()
	l, d, err := c.Acquire(context.Background(), key, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	return d.Allowed
}

func sourceIP(_ context.Context, req events.APIGatewayProxyRequest) (string, error) {
	return req.RequestContext.Identity.SourceIP, nil
}

func request(ip string) events.APIGatewayProxyRequest {
	var req events.APIGatewayProxyRequest
	req.RequestContext.Identity.SourceIP = ip
	return req
}

var fixed = limiter.ClockFunc(func() time.Time { return t0 })

// TestHoldsDuringTheHandler: the slot is taken while the handler runs and
// given back after it returns, errs or panics.
func TestHoldsDuringTheHandler(t *testing.T) {
	c := newLimit(t, 1)
	boom := errors.New("boom")
	for _, c2 := range []struct {
		name  string
		run   func() (events.APIGatewayProxyResponse, error)
		err   error
		panic bool
	}{
		{name: "return", run: func() (events.APIGatewayProxyResponse, error) {
			return events.APIGatewayProxyResponse{StatusCode: 200}, nil
		}},
		{name: "error", run: func() (events.APIGatewayProxyResponse, error) { return events.APIGatewayProxyResponse{}, boom }, err: boom},
		{name: "panic", run: func() (events.APIGatewayProxyResponse, error) { panic(boom) }, panic: true},
	} {
		t.Run(c2.name, func(t *testing.T) {
			var heldInside bool
			h := lambdawrap.ConcurrencyWith(func(ctx context.Context, req events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
				heldInside = !free(t, c, "10.0.0.1")
				return c2.run()
			}, c, lambdawrap.Config[events.APIGatewayProxyRequest, events.APIGatewayProxyResponse]{Key: sourceIP, Clock: fixed})
			var recovered any
			func() {
				defer func() { recovered = recover() }()
				resp, err := h(context.Background(), request("10.0.0.1"))
				if !errors.Is(err, c2.err) || (err == nil && resp.StatusCode != 200) {
					t.Fatalf("handler returned %+v, %v; want %v", resp, err, c2.err)
				}
			}()
			if c2.panic != (recovered != nil) || (c2.panic && recovered != boom) {
				t.Fatalf("recovered %v, want the handler's panic: %v", recovered, c2.panic)
			}
			if !heldInside {
				t.Fatal("the slot was free while the handler ran")
			}
			if !free(t, c, "10.0.0.1") {
				t.Fatal("the slot was not given back after the handler")
			}
		})
	}
}

func TestDenied(t *testing.T) {
	c := newLimit(t, 1)
	lease, _, _ := c.Acquire(context.Background(), "10.0.0.2", time.Now()) // another request holds the slot
	called := false
	handle := func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		called = true
		return events.APIGatewayProxyResponse{StatusCode: 200}, nil
	}
	// Concurrency takes its time from the system clock.
	_, err := lambdawrap.Concurrency(handle, c, sourceIP)(context.Background(), request("10.0.0.2"))
	var de *lambdawrap.DeniedError
	if !errors.Is(err, lambdawrap.ErrDenied) || !errors.As(err, &de) || de.Decision.Allowed || de.Decision.Name != "in-flight" || called {
		t.Fatalf("over the limit: %v (called %v), want a DeniedError and no call", err, called)
	}
	// A 429 response instead of an error.
	h := lambdawrap.ConcurrencyWith(handle, c, lambdawrap.Config[events.APIGatewayProxyRequest, events.APIGatewayProxyResponse]{
		Key: sourceIP,
		Denied: func(_ context.Context, _ events.APIGatewayProxyRequest, d limiter.Decision) (events.APIGatewayProxyResponse, error) {
			return events.APIGatewayProxyResponse{StatusCode: 429, Headers: map[string]string{"Retry-After": strconv.Itoa(int(d.RetryAfter.Seconds()))}}, nil
		},
	})
	resp, err := h(context.Background(), request("10.0.0.2"))
	if secs, _ := strconv.Atoi(resp.Headers["Retry-After"]); err != nil || resp.StatusCode != 429 || secs < 1 || secs > 60 || called {
		t.Fatalf("over the limit with Denied: %+v, %v", resp, err)
	}
	// Other keys are not affected.
	if resp, err := h(context.Background(), request("10.0.0.3")); err != nil || resp.StatusCode != 200 || !called {
		t.Fatalf("another key: %+v, %v", resp, err)
	}
	c.Release(context.Background(), lease)
}

func TestKeyError(t *testing.T) {
	c := newLimit(t, 1)
	noKey := errors.New("no API key")
	h := lambdawrap.Concurrency(func(context.Context, string) (string, error) {
		t.Fatal("called")
		return "", nil
	}, c, func(context.Context, string) (string, error) { return "", noKey })
	if _, err := h(context.Background(), "x"); !errors.Is(err, noKey) {
		t.Fatalf("key error: %v", err)
	}
}

// brokenLimit is a Leaser whose store is down.
type brokenLimit struct{ released atomic.Int64 }

var errDown = errors.New("store down")

func (b *brokenLimit) Acquire(context.Context, string, time.Time) (limiter.Lease, limiter.Decision, error) {
	return limiter.Lease{}, limiter.Decision{}, errDown
}

func (b *brokenLimit) Release(context.Context, limiter.Lease) error {
	b.released.Add(1)
	return errDown
}

func TestStoreDown(t *testing.T) {
	b := &brokenLimit{}
	var reported []error
	onError := func(_ context.Context, err error) { reported = append(reported, err) }
	calls := 0
	handle := func(context.Context, string) (string, error) { calls++; return "ok", nil }
	key := func(context.Context, string) (string, error) { return "k", nil }

	open := lambdawrap.ConcurrencyWith(handle, b, lambdawrap.Config[string, string]{Key: key, OnError: onError})
	if out, err := open(context.Background(), "x"); err != nil || out != "ok" || calls != 1 {
		t.Fatalf("fail open: %q, %v, %d calls", out, err, calls)
	}
	closed := lambdawrap.ConcurrencyWith(handle, b, lambdawrap.Config[string, string]{Key: key, OnError: onError, FailClosed: true})
	if _, err := closed(context.Background(), "x"); !errors.Is(err, errDown) || calls != 1 {
		t.Fatalf("fail closed: %v, %d calls", err, calls)
	}
	if len(reported) != 2 || b.released.Load() != 0 {
		t.Fatalf("reported %v, %d releases of nothing", reported, b.released.Load())
	}
}

// TestReleaseAfterDeadline: a handler that ran out of time still gives its
// slot back (the release does not use the handler's cancelled context).
func TestReleaseAfterDeadline(t *testing.T) {
	c := newLimit(t, 1)
	h := lambdawrap.Concurrency(func(ctx context.Context, _ string) (string, error) {
		<-ctx.Done()
		return "", ctx.Err()
	}, c, func(context.Context, string) (string, error) { return "k", nil })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h(ctx, "x"); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if !free(t, c, "k") {
		t.Fatal("the slot of a cancelled handler was not given back")
	}
}

// TestThroughAWSLambda runs the wrapped handler through aws-lambda-go's own
// handler machinery (JSON in, JSON out), as lambda.Start would.
func TestThroughAWSLambda(t *testing.T) {
	c := newLimit(t, 1)
	h := lambda.NewHandler(lambdawrap.Concurrency(func(_ context.Context, req events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		return events.APIGatewayProxyResponse{StatusCode: 200, Body: "hello " + req.RequestContext.Identity.SourceIP}, nil
	}, c, sourceIP))
	payload, err := json.Marshal(request("192.0.2.7"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := h.Invoke(context.Background(), payload)
	if err != nil {
		t.Fatal(err)
	}
	var resp events.APIGatewayProxyResponse
	if err := json.Unmarshal(out, &resp); err != nil || resp.StatusCode != 200 || resp.Body != "hello 192.0.2.7" {
		t.Fatalf("response %s: %v", out, err)
	}
	if !free(t, c, "192.0.2.7") {
		t.Fatal("slot not given back")
	}
}

// TestContention: 64 concurrent invocations of a wrapped handler with a
// capacity of 10 (on the fake clock of testing/synctest): never more than
// 10 inside the handler at once, and every invocation either ran or was
// refused.
func TestContention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newLimit(t, 10)
		var inside, peak, ran, refused atomic.Int64
		h := lambdawrap.Concurrency(func(context.Context, int) (int, error) {
			n := inside.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(50 * time.Millisecond)
			inside.Add(-1)
			ran.Add(1)
			return 0, nil
		}, c, func(context.Context, int) (string, error) { return "global", nil })
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Go(func() {
				for j := range 5 {
					time.Sleep(time.Duration((i*7+j*13)%40) * time.Millisecond)
					if _, err := h(context.Background(), i); errors.Is(err, lambdawrap.ErrDenied) {
						refused.Add(1)
					} else if err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		t.Logf("%d ran, %d refused, at most %d at once", ran.Load(), refused.Load(), peak.Load())
		if peak.Load() > 10 || ran.Load()+refused.Load() != 64*5 || ran.Load() < 10 {
			t.Fatalf("%d ran, %d refused, peak %d: want a peak of at most 10", ran.Load(), refused.Load(), peak.Load())
		}
	})
}

// TestRelease: a lease taken by the authorizer travels in its context and
// is released by the integration after its handler, even on panic.
func TestRelease(t *testing.T) {
	store, err := memory.NewLeases(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := limiter.NewFleetShedder(store, limiter.FleetShedderConfig{Capacity: 2, Reserve: 0.5, LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The authorizer's side.
	lease, d, err := fleet.Acquire(ctx, limiter.PriorityNormal, t0)
	if err != nil || !d.Allowed {
		t.Fatalf("acquire: %+v, %v", d, err)
	}
	var req events.APIGatewayProxyRequest
	req.RequestContext.Authorizer = map[string]any{lambdawrap.LeaseContextKey: lease.String()}
	if _, d, _ := fleet.Acquire(ctx, limiter.PriorityNormal, t0); d.Allowed {
		t.Fatal("the fleet's one non-critical slot is free while the lease is out")
	}
	// The integration's side.
	leaseOf := func(_ context.Context, req events.APIGatewayProxyRequest) (limiter.Lease, bool) {
		return lambdawrap.LeaseFromContext(req.RequestContext.Authorizer)
	}
	h := lambdawrap.Release(func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		panic("integration bug")
	}, fleet, leaseOf, lambdawrap.ReleaseConfig{})
	func() {
		defer func() {
			if r := recover(); r != "integration bug" {
				t.Fatalf("recovered %v", r)
			}
		}()
		h(ctx, req)
	}()
	l2, d, _ := fleet.Acquire(ctx, limiter.PriorityNormal, t0)
	if !d.Allowed {
		t.Fatal("the integration did not release the authorizer's lease")
	}
	fleet.Release(ctx, l2)
	// No lease, or a malformed one: the handler just runs.
	for _, auth := range []map[string]any{nil, {lambdawrap.LeaseContextKey: 42}, {lambdawrap.LeaseContextKey: "garbage"}} {
		req.RequestContext.Authorizer = auth
		ok := lambdawrap.Release(func(context.Context, events.APIGatewayProxyRequest) (string, error) { return "ran", nil }, fleet, leaseOf, lambdawrap.ReleaseConfig{})
		if out, err := ok(ctx, req); err != nil || out != "ran" {
			t.Fatalf("authorizer context %v: %q, %v", auth, out, err)
		}
	}
}
