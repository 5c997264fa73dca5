package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// limiters returns one limiter of each kind on s.
func limiters(t *testing.T, s *dynamo.Store) map[string]limiter.Limiter {
	t.Helper()
	b, err1 := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 1000, RefillTime: time.Hour})
	w, err2 := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1000, Window: time.Minute})
	l, err3 := limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Limit: 50, Window: time.Second})
	if err := errors.Join(err1, err2, err3); err != nil {
		t.Fatal(err)
	}
	return map[string]limiter.Limiter{"bucket": b, "window": w, "log": l}
}

// A private DynamoDB Local stopped in the middle of a run: every call fails
// with ErrUnavailable within the deadline (plus scheduling slack), none
// panics or hangs; after a restart the store works again.
func TestServerStoppedMidRun(t *testing.T) {
	srv := testserver.StartDynamoDBLocal(t)
	client := newClient(srv.Endpoint())
	ctx := testCtx(t)
	if err := dynamo.CreateTable(ctx, client, "faults"); err != nil {
		t.Fatal(err)
	}
	const timeout = 300 * time.Millisecond
	s, err := dynamo.New(client, dynamo.Config{Table: "faults", Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	ls := limiters(t, s)

	var (
		stopped         atomic.Bool
		ok, unavailable atomic.Int64
		slowest         atomic.Int64
		wg              sync.WaitGroup
		mu              sync.Mutex
		unexpected      []error
	)
	for name, l := range ls {
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := name + string(rune('a'+w))
				// Until 5 calls have been made after the stop.
				for i, after := 0, 0; after < 5; i++ {
					if stopped.Load() {
						after++
					}
					start := time.Now()
					_, err := l.AllowN(context.Background(), key, base.Add(time.Duration(i)*time.Millisecond), 1)
					el := time.Since(start)
					for old := slowest.Load(); int64(el) > old && !slowest.CompareAndSwap(old, int64(el)); old = slowest.Load() {
					}
					switch {
					case err == nil:
						ok.Add(1)
					case errors.Is(err, dynamo.ErrUnavailable):
						unavailable.Add(1)
					default:
						mu.Lock()
						unexpected = append(unexpected, err)
						mu.Unlock()
					}
				}
			}()
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ok.Load() < 30; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no successful decisions before the stop")
		}
	}
	srv.Stop()
	stopped.Store(true)
	wg.Wait()
	for _, err := range unexpected {
		t.Errorf("untyped error: %v", err)
	}
	if unavailable.Load() < 12*4 {
		t.Errorf("%d ErrUnavailable after the server stopped, want at least 48", unavailable.Load())
	}
	// Within the deadline: the store's timeout plus generous scheduling
	// slack for a loaded 2-core machine running -race.
	if el := time.Duration(slowest.Load()); el > timeout+2*time.Second {
		t.Errorf("slowest call took %v with a %v timeout", el, timeout)
	}
	t.Logf("%d ok, %d ErrUnavailable; slowest call %v (timeout %v)", ok.Load(), unavailable.Load(), time.Duration(slowest.Load()), timeout)

	srv.Restart()
	ctx = testCtx(t)
	if err := dynamo.CreateTable(ctx, client, "faults"); err != nil {
		t.Fatal(err)
	}
	for name, l := range ls {
		if d, err := l.AllowN(ctx, "after-restart", base, 1); err != nil || !d.Allowed {
			t.Errorf("%s after restart: %+v, %v", name, d, err)
		}
	}
}

// A server that accepts connections and never answers: calls end at the
// deadline with ErrUnavailable wrapping context.DeadlineExceeded.
func TestServerHangs(t *testing.T) {
	addr := testserver.Hung(t)
	const timeout = 200 * time.Millisecond
	s, err := dynamo.New(newClient("http://"+addr), dynamo.Config{Table: "hang", Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range limiters(t, s) {
		start := time.Now()
		_, err := l.AllowN(context.Background(), "k", base, 1)
		el := time.Since(start)
		if !errors.Is(err, dynamo.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %v, want ErrUnavailable and DeadlineExceeded", name, err)
		}
		if el > timeout+time.Second {
			t.Errorf("%s: returned after %v with a %v timeout", name, el, timeout)
		}
	}
}

// throttler fails the first n attempts (all when n < 0) with a throttling
// error, as DynamoDB does, after the SDK's retry middleware.
type throttler struct {
	n        atomic.Int64
	attempts atomic.Int64
	code     string
}

func (th *throttler) middleware(st *middleware.Stack) error {
	return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("throttle",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			th.attempts.Add(1)
			if th.n.Load() != 0 {
				th.n.Add(-1)
				if th.code == "ProvisionedThroughputExceededException" {
					return middleware.FinalizeOutput{}, middleware.Metadata{}, &types.ProvisionedThroughputExceededException{Message: aws.String("injected")}
				}
				return middleware.FinalizeOutput{}, middleware.Metadata{}, &smithy.GenericAPIError{Code: th.code, Message: "injected"}
			}
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
}

// Throttling is not retried (each retry would land on the partition that
// just refused): a throttled attempt surfaces as ErrThrottled at once,
// after one attempt, and the next call goes through.
func TestThrottling(t *testing.T) {
	endpoint := sharedEndpoint(t)
	for _, code := range []string{"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"} {
		t.Run(code, func(t *testing.T) {
			th := &throttler{code: code}
			const timeout = 5 * time.Second // generous: the machine may be loaded
			s, err := dynamo.New(newClient(endpoint, th.middleware), dynamo.Config{Table: tableName, Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			for name, l := range limiters(t, s) {
				key := limitertest.Key(t)
				// Warm up (DynamoDB Local's first requests of a kind are slow).
				if _, err := l.AllowN(context.Background(), key, base, 1); err != nil {
					t.Fatal(err)
				}
				// One throttled attempt: ErrThrottled, not retried, and a
				// denial for limiter.ThrottledRetryAfter.
				th.n.Store(1)
				th.attempts.Store(0)
				t1 := base.Add(time.Second)
				if d, err := l.AllowN(context.Background(), key, t1, 1); !errors.Is(err, dynamo.ErrThrottled) || d.Allowed || d.RetryAfter != limiter.ThrottledRetryAfter {
					t.Fatalf("%s after a throttle: %+v, %v; want a denial for ThrottledRetryAfter and ErrThrottled", name, d, err)
				}
				if a := th.attempts.Load(); a != 1 {
					t.Fatalf("%s: %d attempts, want 1 (a throttle is not retried)", name, a)
				}
				// The partition has capacity again, RetryAfter later: through.
				t2 := t1.Add(limiter.ThrottledRetryAfter)
				if d, err := l.AllowN(context.Background(), key, t2, 1); err != nil || !d.Allowed {
					t.Fatalf("%s after the throttle: %+v, %v", name, d, err)
				}
				// Throttled for good: ErrThrottled, within the deadline.
				th.n.Store(-1)
				th.attempts.Store(0)
				start := time.Now()
				_, err := l.AllowN(context.Background(), key, t2.Add(time.Second), 1)
				el := time.Since(start)
				th.n.Store(0)
				if !errors.Is(err, dynamo.ErrThrottled) {
					t.Fatalf("%s: %v, want ErrThrottled", name, err)
				}
				if el > timeout+time.Second {
					t.Errorf("%s: throttled call took %v with a %v timeout", name, el, timeout)
				}
				t.Logf("%s: surfaced after %d attempts in %v: %v", name, th.attempts.Load(), el.Round(time.Millisecond), err)
			}
		})
	}
	// A deadline shorter than the backoff reserve: no retry, the throttling
	// error at once.
	th := &throttler{code: "ThrottlingException"}
	th.n.Store(-1)
	s, _ := dynamo.New(newClient(endpoint, th.middleware), dynamo.Config{Table: tableName, Timeout: 30 * time.Millisecond})
	b, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 1, RefillTime: time.Hour})
	if _, err := b.Allow(context.Background(), "k", base); !errors.Is(err, dynamo.ErrThrottled) || th.attempts.Load() != 1 {
		t.Fatalf("short deadline: %v after %d attempts, want ErrThrottled after 1", err, th.attempts.Load())
	}
}

// A table that does not exist (ResourceNotFoundException from DynamoDB
// Local): every kind of call, windows, buckets, logs, leases and gauges,
// fails with an error wrapping ErrUnavailable (and so
// storage.ErrUnavailable), and nothing else.
func TestMissingTable(t *testing.T) {
	endpoint := sharedEndpoint(t)
	table := fmt.Sprintf("sluice-no-such-table-%d-%d", os.Getpid(), time.Now().UnixNano())
	cfg := dynamo.Config{Table: table, Timeout: 20 * time.Second}
	s, err := dynamo.New(newClient(endpoint), cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := dynamo.NewLeases(newClient(endpoint), cfg)
	if err != nil {
		t.Fatal(err)
	}
	fw, err1 := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 10, Window: time.Minute})
	sw, err2 := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 10, Window: time.Minute})
	tb, err3 := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 10, RefillTime: time.Minute})
	sl, err4 := limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Limit: 10, Window: time.Minute})
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	k := storage.Key{Space: "missing", Name: "k"}
	now := base.UnixNano()
	calls := map[string]func() error{
		"fixed window":     func() error { _, err := fw.Allow(ctx, "k", base); return err },
		"sliding window":   func() error { _, err := sw.Allow(ctx, "k", base); return err },
		"window read":      func() error { _, err := s.Add(ctx, k, 1, 4, 0, time.Minute); return err },
		"window refund":    func() error { return s.Sub(ctx, k, 1, 1) },
		"token bucket":     func() error { _, err := tb.Allow(ctx, "k", base); return err },
		"token bucket get": func() error { _, err := tb.Get(ctx, "k", base); return err },
		"sliding log":      func() error { _, err := sl.Allow(ctx, "k", base); return err },
		"acquire lease": func() error {
			_, err := l.AcquireLease(ctx, k, storage.LeaseOp{Capacity: 2, Now: now, TTL: time.Minute, ID: "a"})
			return err
		},
		"release lease": func() error { return l.ReleaseLease(ctx, k, storage.ReleaseOp{ID: "a", Now: now}) },
		"put gauge":     func() error { return l.PutGauge(ctx, k, storage.Gauge{Value: 1, At: now}, time.Minute) },
		"get gauge":     func() error { _, _, err := l.GetGauge(ctx, k); return err },
	}
	for name, call := range calls {
		err := call()
		var rnf *types.ResourceNotFoundException
		if !errors.Is(err, storage.ErrUnavailable) || !errors.Is(err, dynamo.ErrUnavailable) || !errors.As(err, &rnf) {
			t.Errorf("%s: %v, want ErrUnavailable wrapping ResourceNotFoundException", name, err)
		}
		for _, other := range []error{storage.ErrThrottled, storage.ErrConflict, storage.ErrCorruptState} {
			if errors.Is(err, other) {
				t.Errorf("%s: %v also wraps %v", name, err, other)
			}
		}
	}
}
