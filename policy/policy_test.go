package policy

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func memStores(t testing.TB) map[string]storage.Store {
	t.Helper()
	s, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]storage.Store{"memory": s}
}

// failing is a store whose every call fails (a stopped backend). It counts
// its calls.
type failing struct {
	err   error
	calls atomic.Int64
}

func (f *failing) Add(context.Context, storage.Key, int64, int, int64, time.Duration) (storage.Counts, error) {
	f.calls.Add(1)
	return storage.Counts{}, f.err
}
func (f *failing) Sub(context.Context, storage.Key, int64, int64) error {
	f.calls.Add(1)
	return f.err
}
func (f *failing) UpdateBucket(context.Context, storage.Key, storage.BucketOp, time.Duration) (storage.Decision, error) {
	f.calls.Add(1)
	return storage.Decision{}, f.err
}
func (f *failing) UpdateLog(context.Context, storage.Key, storage.LogOp, time.Duration) (storage.Decision, error) {
	f.calls.Add(1)
	return storage.Decision{}, f.err
}

func mustLoad(t testing.TB, doc string, opts Options) *Policy {
	t.Helper()
	if opts.Stores == nil {
		opts.Stores = memStores(t)
	}
	p, err := Load([]byte(doc), opts)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return p
}

func get(ip, path string) *Request {
	return &Request{SourceIP: ip, Method: "GET", Path: path, Stage: "prod", RouteKey: "GET " + path}
}

// TestEvaluateSteps walks a two-rule policy through a sequence of requests.
func TestEvaluateSteps(t *testing.T) {
	p := mustLoad(t, `
rules:
  - name: per-ip
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 3, window: 1m}]
  - name: api
    match: {paths: ["/api/**"]}
    key: "{ip}"
    limits: [{algorithm: token_bucket, max_amount: 1, refill_time: 10s}]
`, Options{NoDenyCache: true}) // every step reaches the stores: which rule denies first is under test (TestDenyCache in batch_test.go has the cache)
	type step struct {
		name      string
		at        time.Duration
		req       *Request
		outcome   Outcome
		rule      string
		remaining int64
		retry     time.Duration
		evals     int
	}
	steps := []step{
		{name: "first", req: get("192.0.2.1", "/"), outcome: Allow, rule: "per-ip", remaining: 2, evals: 1},
		{name: "api takes the bucket's token", req: get("192.0.2.1", "/api/x"), outcome: Allow, rule: "api", remaining: 0, evals: 2},
		{name: "api bucket empty: denied, per-ip refunded", req: get("192.0.2.1", "/api/x"), outcome: Deny, rule: "api", retry: 10 * time.Second, evals: 2},
		{name: "per-ip still has one left", req: get("192.0.2.1", "/"), outcome: Allow, rule: "per-ip", remaining: 0, evals: 1},
		{name: "per-ip exhausted", req: get("192.0.2.1", "/"), outcome: Deny, rule: "per-ip", retry: 55 * time.Second, evals: 1},
		{name: "another client", req: get("192.0.2.2", "/"), outcome: Allow, rule: "per-ip", remaining: 2, evals: 1},
		{name: "api denied by per-ip first; api skipped", req: get("192.0.2.1", "/api/y"), outcome: Deny, rule: "per-ip", retry: 55 * time.Second, evals: 2},
		{name: "new window", at: time.Minute, req: get("192.0.2.1", "/"), outcome: Allow, rule: "per-ip", remaining: 2, evals: 1},
	}
	for _, s := range steps {
		res := p.Evaluate(t.Context(), s.req, t0.Add(s.at))
		if res.Outcome != s.outcome || res.Rule != s.rule || len(res.Evals) != s.evals {
			t.Fatalf("%s: outcome %v rule %q evals %d; want %v %q %d", s.name, res.Outcome, res.Rule, len(res.Evals), s.outcome, s.rule, s.evals)
		}
		if s.outcome == Allow && res.Decision.Remaining != s.remaining {
			t.Errorf("%s: remaining %d, want %d", s.name, res.Decision.Remaining, s.remaining)
		}
		if s.outcome == Deny && res.Decision.RetryAfter != s.retry {
			t.Errorf("%s: retry after %v, want %v", s.name, res.Decision.RetryAfter, s.retry)
		}
	}
}

func TestEvaluateRefundsEarlierRules(t *testing.T) {
	p := mustLoad(t, `
rules:
  - name: a
    key: "{ip}"
    limits: [{algorithm: sliding_window, limit: 2, window: 1m}]
  - name: b
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]
`, Options{NoDenyCache: true}) // every denial reaches the stores: the refund path is under test
	r := get("192.0.2.9", "/")
	if res := p.Evaluate(t.Context(), r, t0); res.Outcome != Allow {
		t.Fatalf("first: %v", res.Outcome)
	}
	for i := range 5 {
		res := p.Evaluate(t.Context(), r, t0)
		if res.Outcome != Deny || res.Rule != "b" {
			t.Fatalf("denial %d: %v by %q", i, res.Outcome, res.Rule)
		}
		if !res.Evals[0].Refunded {
			t.Fatalf("denial %d: rule a not refunded: %+v", i, res.Evals[0])
		}
	}
	// a took one unit only (the allowed request): one left.
	res := p.Evaluate(t.Context(), r, t0)
	if res.Evals[0].Decision.Remaining != 0 || res.Evals[0].Outcome != Allow {
		t.Fatalf("rule a after denials: %+v", res.Evals[0])
	}
}

func TestEvaluateMatch(t *testing.T) {
	p := mustLoad(t, `
rules:
  - name: writes
    match: {methods: [post, put]}
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 9, window: 1m}]
  - name: prod-orders
    match: {stages: [prod], routes: ["GET /orders/{id}"], paths: ["/orders/*"]}
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 9, window: 1m}]
  - name: any
    match: {methods: [ANY]}
    key: all
    limits: [{algorithm: fixed_window, limit: 9, window: 1m}]
`, Options{})
	tests := []struct {
		req  Request
		want string
	}{
		{Request{SourceIP: "192.0.2.1", Method: "POST", Path: "/x"}, "writes,any"},
		{Request{SourceIP: "192.0.2.1", Method: "GET", Path: "/orders/7", Stage: "prod", RouteKey: "GET /orders/{id}"}, "prod-orders,any"},
		{Request{SourceIP: "192.0.2.1", Method: "GET", Path: "/orders/7", Stage: "dev", RouteKey: "GET /orders/{id}"}, "any"},
		{Request{SourceIP: "192.0.2.1", Method: "GET", Path: "/orders/7/x", Stage: "prod", RouteKey: "GET /orders/{id}"}, "any"},
		{Request{Method: "POST", Path: "/x", Absent: AttrSourceIP}, "any"},
	}
	for _, tt := range tests {
		res := p.Evaluate(t.Context(), &tt.req, t0)
		var names []string
		for _, e := range res.Evals {
			names = append(names, e.Rule)
		}
		if got := strings.Join(names, ","); got != tt.want {
			t.Errorf("%+v: matched %q, want %q", tt.req, got, tt.want)
		}
	}
}

func TestEvaluateSkipIfMissing(t *testing.T) {
	p := mustLoad(t, `
rules:
  - name: per-key
    key: "{header:X-Api-Key}"
    skip_if_missing: true
    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]
  - name: shared
    key: "{header:X-Api-Key}"
    limits: [{algorithm: fixed_window, limit: 9, window: 1m}]
`, Options{})
	for _, h := range []Header{nil, {"X-Api-Key": ""}} {
		res := p.Evaluate(t.Context(), &Request{Headers: h}, t0)
		if len(res.Evals) != 1 || res.Evals[0].Rule != "shared" {
			t.Errorf("headers %v: evals %+v; want only the shared rule", h, res.Evals)
		}
	}
	res := p.Evaluate(t.Context(), &Request{Headers: Header{"x-api-key": "k"}}, t0)
	if len(res.Evals) != 2 {
		t.Errorf("with a key: %d rules matched, want 2", len(res.Evals))
	}
}

func TestEvaluateNoMatch(t *testing.T) {
	p := mustLoad(t, `rules: [{name: a, match: {paths: ["/a"]}, key: k, limits: [{algorithm: fixed_window, limit: 1, window: 1s}]}]`, Options{})
	res := p.Evaluate(t.Context(), get("192.0.2.1", "/b"), t0)
	if res.Outcome != Allow || res.Rule != "" || len(res.Evals) != 0 || res.Priority != limiter.PriorityNormal {
		t.Fatalf("res = %+v", res)
	}
}

func TestEvaluateFailModes(t *testing.T) {
	down := &failing{err: errors.New("connection refused")}
	stores := memStores(t)
	stores["memcached"] = down
	p := mustLoad(t, `
rules:
  - name: open
    match: {paths: ["/open"]}
    key: "{ip}"
    limits: [{algorithm: sliding_window, limit: 5, window: 1m, backend: memcached}]
    fail: open
  - name: closed
    match: {paths: ["/closed"]}
    key: "{ip}"
    limits: [{algorithm: token_bucket, max_amount: 5, refill_time: 1s, backend: memcached}]
    fail: closed
  - name: healthy
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 5, window: 1m}]
`, Options{Stores: stores})

	res := p.Evaluate(t.Context(), get("192.0.2.1", "/open"), t0)
	if res.Outcome != Allow {
		t.Fatalf("fail open: %v", res.Outcome)
	}
	if ev := res.Evals[0]; !ev.Failed || ev.Err == nil || ev.Outcome != Allow || ev.Fail != FailOpen {
		t.Errorf("fail-open eval = %+v", ev)
	}
	if res.Rule != "healthy" {
		t.Errorf("deciding rule %q; a failed-open rule should not hide a healthy one", res.Rule)
	}

	res = p.Evaluate(t.Context(), get("192.0.2.1", "/closed"), t0)
	if res.Outcome != Deny || res.Rule != "closed" {
		t.Fatalf("fail closed: %v by %q", res.Outcome, res.Rule)
	}
	if res.Decision.RetryAfter != FailClosedRetryAfter || res.Decision.Limit != 5 {
		t.Errorf("fail-closed decision = %+v", res.Decision)
	}
	if ev := res.Evals[0]; !ev.Failed || ev.Outcome != Deny {
		t.Errorf("fail-closed eval = %+v", ev)
	}
	// The rules of a request are decided in one batch: the rule after the
	// denying one was checked with it, and what it took was given back.
	if ev := res.Evals[1]; ev.Outcome != Skipped && !ev.Refunded {
		t.Errorf("rule after a denial kept what it took: %+v", ev)
	}
}

// TestEvaluateDeadline checks that a backend that hangs is cut off by the
// deadline in ctx and the fail mode decides.
func TestEvaluateDeadline(t *testing.T) {
	stores := memStores(t)
	stores["slow"] = hanging{}
	p := mustLoad(t, `
rules:
  - name: slow-open
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 5, window: 1m, backend: slow}]
  - name: slow-closed
    match: {paths: ["/closed"]}
    key: "{ip}"
    fail: closed
    limits: [{algorithm: fixed_window, limit: 5, window: 1m, backend: slow}]
`, Options{Stores: stores})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	res := p.Evaluate(ctx, get("192.0.2.1", "/closed"), t0)
	if res.Outcome != Deny || res.Rule != "slow-closed" {
		t.Fatalf("got %v by %q", res.Outcome, res.Rule)
	}
	if !errors.Is(res.Evals[0].Err, context.DeadlineExceeded) || !res.Evals[0].Failed || res.Evals[0].Outcome != Allow {
		t.Errorf("slow-open eval = %+v", res.Evals[0])
	}
}

// hanging is a store that waits for its context.
type hanging struct{}

func (hanging) UpdateBucket(ctx context.Context, _ storage.Key, _ storage.BucketOp, _ time.Duration) (storage.Decision, error) {
	<-ctx.Done()
	return storage.Decision{}, ctx.Err()
}
func (hanging) UpdateLog(ctx context.Context, _ storage.Key, _ storage.LogOp, _ time.Duration) (storage.Decision, error) {
	<-ctx.Done()
	return storage.Decision{}, ctx.Err()
}

func (hanging) Add(ctx context.Context, _ storage.Key, _ int64, _ int, _ int64, _ time.Duration) (storage.Counts, error) {
	<-ctx.Done()
	return storage.Counts{}, ctx.Err()
}
func (hanging) Sub(ctx context.Context, _ storage.Key, _, _ int64) error {
	<-ctx.Done()
	return ctx.Err()
}

func TestEvaluateRequire(t *testing.T) {
	p := mustLoad(t, `
rules:
  - name: ip
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]
  - name: tenants
    key: "{header:X-Tenant}"
    require: ["header:X-Tenant", token]
    limits: [{algorithm: fixed_window, limit: 5, window: 1m}]
`, Options{})
	r := get("192.0.2.1", "/")
	r.Token = "secret"
	for range 3 {
		res := p.Evaluate(t.Context(), r, t0)
		if res.Outcome != Unauthenticated || res.Rule != "tenants" {
			t.Fatalf("missing header: %v by %q", res.Outcome, res.Rule)
		}
	}
	// Nothing was taken from the ip rule by the refused requests.
	r.Headers = Header{"x-tenant": "t1"}
	if res := p.Evaluate(t.Context(), r, t0); res.Outcome != Allow {
		t.Fatalf("with header: %v by %q", res.Outcome, res.Rule)
	}
}

type shedFunc func(context.Context, limiter.Priority, time.Time) (limiter.Decision, error)

func (f shedFunc) Check(ctx context.Context, p limiter.Priority, now time.Time) (limiter.Decision, error) {
	return f(ctx, p, now)
}

var _ limiter.Shedder = (*limiter.UtilizationShedder)(nil)

func TestEvaluateShedder(t *testing.T) {
	var asked []limiter.Priority
	shed := shedFunc(func(_ context.Context, p limiter.Priority, _ time.Time) (limiter.Decision, error) {
		asked = append(asked, p)
		return limiter.Decision{RetryAfter: 2 * time.Second}, nil
	})
	p := mustLoad(t, `
rules:
  - name: low
    priority: low
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]
  - name: crit
    match: {paths: ["/health"]}
    priority: critical
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]
`, Options{Shedder: shed})
	res := p.Evaluate(t.Context(), get("192.0.2.1", "/"), t0)
	if res.Outcome != Shed || res.Priority != limiter.PriorityLow || res.Decision.RetryAfter != 2*time.Second {
		t.Fatalf("low: %v at %v, %+v", res.Outcome, res.Priority, res.Decision)
	}
	res = p.Evaluate(t.Context(), get("192.0.2.1", "/health"), t0)
	if res.Outcome != Allow || res.Priority != limiter.PriorityCritical {
		t.Fatalf("critical: %v at %v", res.Outcome, res.Priority)
	}
	if len(asked) != 1 || asked[0] != limiter.PriorityLow {
		t.Fatalf("shedder asked %v; critical traffic must never be offered", asked)
	}
}

// TestEvaluateShedderUnmatched checks that a request no rule matches is
// offered to the shedder as normal traffic (it loads the fleet all the
// same), and that a shedder's error without a shedding decision lets the
// request through with the error reported.
func TestEvaluateShedderUnmatched(t *testing.T) {
	var asked []limiter.Priority
	shedding := true
	shed := shedFunc(func(_ context.Context, p limiter.Priority, _ time.Time) (limiter.Decision, error) {
		asked = append(asked, p)
		if !shedding {
			return limiter.Decision{}, errors.New("store down")
		}
		return limiter.Decision{RetryAfter: time.Second, Name: "fleet"}, nil
	})
	p := mustLoad(t, `
rules:
  - name: api
    match: {paths: ["/api/*"]}
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]
`, Options{Shedder: shed})
	res := p.Evaluate(t.Context(), get("192.0.2.1", "/other"), t0)
	if res.Outcome != Shed || res.Rule != "" || len(res.Evals) != 0 || res.Decision.Name != "fleet" {
		t.Fatalf("unmatched: %v rule %q evals %v decision %+v, want shed by the fleet", res.Outcome, res.Rule, res.Evals, res.Decision)
	}
	if len(asked) != 1 || asked[0] != limiter.PriorityNormal {
		t.Fatalf("shedder asked %v, want [normal]", asked)
	}
	shedding = false
	for _, path := range []string{"/other", "/api/x"} {
		res = p.Evaluate(t.Context(), get("192.0.2.1", path), t0)
		if res.Outcome != Allow || res.ShedErr == nil {
			t.Errorf("%s with the shedder failing: %v, shed error %v; want allowed (fail open) with the error", path, res.Outcome, res.ShedErr)
		}
	}
}

// TestEvaluateCost checks that the cost is taken from every limit.
func TestEvaluateCost(t *testing.T) {
	p := mustLoad(t, `rules: [{name: c, key: "{ip}", cost: 4, limits: [{algorithm: token_bucket, max_amount: 10, refill_time: 1h}]}]`, Options{})
	r := get("192.0.2.1", "/")
	for _, want := range []int64{6, 2} {
		res := p.Evaluate(t.Context(), r, t0)
		if res.Outcome != Allow || res.Decision.Remaining != want {
			t.Fatalf("got %v remaining %d, want allow %d", res.Outcome, res.Decision.Remaining, want)
		}
	}
	if res := p.Evaluate(t.Context(), r, t0); res.Outcome != Deny {
		t.Fatalf("third: %v", res.Outcome)
	}
}

func TestPolicyRulesAndBackends(t *testing.T) {
	stores := memStores(t)
	stores["memcached"] = stores["memory"]
	p := mustLoad(t, `
rules:
  - {name: a, key: k, limits: [{algorithm: fixed_window, limit: 1, window: 1s}]}
  - {name: b, key: k, limits: [{algorithm: fixed_window, limit: 1, window: 1s, backend: memcached}]}
`, Options{Stores: stores})
	if got := strings.Join(p.Rules(), ","); got != "a,b" {
		t.Errorf("Rules = %q", got)
	}
	if got := strings.Join(p.Backends(Options{}), ","); got != "memcached,memory" {
		t.Errorf("Backends = %q", got)
	}
}

func BenchmarkEvaluate(b *testing.B) {
	p := mustLoad(b, `
rules:
  - name: per-ip
    key: "{ip}"
    limits:
      - {algorithm: sliding_window, limit: 1000000000, window: 1m}
      - {algorithm: token_bucket, max_amount: 1000000000, refill_time: 1s}
`, Options{})
	r := get("192.0.2.1", "/")
	b.ReportAllocs()
	for b.Loop() {
		p.Evaluate(context.Background(), r, t0)
	}
}
