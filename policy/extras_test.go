package policy

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

func evalAt(t *testing.T, p *Policy, req *Request, at time.Time) Result {
	t.Helper()
	return p.Evaluate(context.Background(), req, at)
}

// TestShadow: a shadow rule is checked and counted but never denies; its
// would-be denials are flagged; it takes nothing from the enforcing rule,
// whose own denials stand. Options.Shadow turns every rule into a shadow.
func TestShadow(t *testing.T) {
	const doc = `
rules:
  - name: enforced
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 4, window: 1m}]
  - name: trial
    key: "{ip}"
    shadow: true
    limits: [{algorithm: fixed_window, limit: 2, window: 1m}]
`
	store := newCounting(t)
	p := mustLoad(t, doc, Options{Stores: map[string]storage.Store{"memory": store}})
	req := get("192.0.2.1", "/x")
	var wouldDeny int
	for i := 1; i <= 6; i++ {
		res := evalAt(t, p, req, t0)
		trial := res.Evals[1]
		switch {
		case i == 6:
			// The enforcing rule's denial of request 5 is in its deny
			// cache: request 6 is denied without a store request and
			// nothing else is checked.
			if trial.Outcome != Skipped || res.Reason != ReasonCache {
				t.Fatalf("request 6: %+v, shadow eval %+v", res, trial)
			}
		case !trial.Shadow || trial.Outcome != Allow:
			t.Fatalf("request %d: shadow eval %+v", i, trial)
		}
		if trial.ShadowDenied {
			wouldDeny++
		}
		if trial.ShadowDenied != (i > 2 && i <= 5) {
			t.Errorf("request %d: ShadowDenied %v", i, trial.ShadowDenied)
		}
		wantAllow := i <= 4
		if (res.Outcome == Allow) != wantAllow {
			t.Errorf("request %d: outcome %v (rule %s), want allowed %v: the enforcing limit of 4 decides", i, res.Outcome, res.Rule, wantAllow)
		}
		if res.Outcome == Deny && res.Rule != "enforced" {
			t.Errorf("request %d: denied by %q", i, res.Rule)
		}
	}
	if wouldDeny != 3 {
		t.Errorf("%d would-be denials, want 3", wouldDeny)
	}
	if store.requests() == 0 {
		t.Fatal("the counting store saw nothing")
	}

	// The global switch: nothing denies, denials are flagged.
	p = mustLoad(t, doc, Options{Shadow: true})
	for i := 1; i <= 6; i++ {
		res := evalAt(t, p, req, t0)
		if res.Outcome != Allow {
			t.Fatalf("request %d denied with the global shadow switch: %+v", i, res)
		}
		if got, want := res.Evals[0].ShadowDenied, i > 4; got != want {
			t.Errorf("request %d: enforced ShadowDenied %v, want %v", i, got, want)
		}
	}
}

// TestTiers: a pro key gets the pro tier's limit, a free key (no header, or
// an unknown plan) the default; tier_lookup maps API keys through TierOf.
func TestTiers(t *testing.T) {
	p := mustLoad(t, `
rules:
  - name: per-key
    key: "{api_key}"
    tier: "{header:X-Plan}"
    limits: [{name: free, algorithm: fixed_window, limit: 2, window: 1m}]
    tiers:
      pro: [{name: pro, algorithm: fixed_window, limit: 5, window: 1m}]
`, Options{})
	allowed := func(key, plan string) (n int, tier, limit string) {
		for range 10 {
			req := &Request{APIKey: key, Headers: Header{}}
			if plan != "" {
				req.Headers.(Header)["X-Plan"] = plan
			}
			res := evalAt(t, p, req, t0)
			tier, limit = res.Evals[0].Tier, res.Decision.Name
			if res.Outcome == Allow {
				n++
			}
		}
		return n, tier, limit
	}
	for _, tt := range []struct {
		key, plan, tier, limit string
		n                      int
	}{
		{"pro-key", "pro", "pro", "pro", 5},
		{"free-key", "", DefaultTier, "free", 2},
		{"odd-key", "gold", DefaultTier, "free", 2},
	} {
		n, tier, limit := allowed(tt.key, tt.plan)
		if n != tt.n || tier != tt.tier || limit != tt.limit {
			t.Errorf("key %s plan %q: %d allowed in tier %q by %q, want %d in %q by %q", tt.key, tt.plan, n, tier, limit, tt.n, tt.tier, tt.limit)
		}
	}

	p = mustLoad(t, `
rules:
  - name: looked-up
    key: "{api_key}"
    tier: "{api_key}"
    tier_lookup: true
    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]
    tiers:
      pro: [{algorithm: fixed_window, limit: 3, window: 1m}]
`, Options{TierOf: Tiers{"k-pro": "pro"}.Lookup})
	for key, want := range map[string]int{"k-pro": 3, "k-free": 1} {
		n := 0
		for range 5 {
			if evalAt(t, p, &Request{APIKey: key}, t0).Outcome == Allow {
				n++
			}
		}
		if n != want {
			t.Errorf("looked-up key %s: %d allowed, want %d", key, n, want)
		}
	}
}

// TestListsEvaluate: a deny-listed request is denied with reason deny_list
// and an allow-listed one allowed with allow_list, neither with a store
// request (the store's request count does not move), and neither is shed.
func TestListsEvaluate(t *testing.T) {
	store := newCounting(t)
	shedder := &countShedder{}
	p := mustLoad(t, `
deny:
  cidrs: ["203.0.113.0/24"]
  keys: {api_key: [leaked]}
allow:
  cidrs: ["10.0.0.0/8"]
rules:
  - name: tight
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]
`, Options{Stores: map[string]storage.Store{"memory": store}, Shedder: shedder})
	for i := range 50 {
		res := evalAt(t, p, get("203.0.113.9", "/x"), t0)
		if res.Outcome != Deny || res.Reason != ReasonDenyList || res.List != (ListMatch{"deny", "cidr"}) || res.Decision.RetryAfter != DenyListRetryAfter {
			t.Fatalf("deny-listed request %d: %+v", i, res)
		}
		res = evalAt(t, p, &Request{SourceIP: "192.0.2.1", APIKey: "leaked"}, t0)
		if res.Outcome != Deny || res.List.By != "api_key" {
			t.Fatalf("deny-listed key %d: %+v", i, res)
		}
		res = evalAt(t, p, get("10.1.2.3", "/x"), t0)
		if res.Outcome != Allow || res.Reason != ReasonAllowList || len(res.Evals) != 0 {
			t.Fatalf("allow-listed request %d: %+v (limit 1 a minute would deny it)", i, res)
		}
	}
	if n := store.requests(); n != 0 {
		t.Errorf("%d store requests for listed requests, want 0", n)
	}
	if shedder.calls != 0 {
		t.Errorf("the shedder was asked %d times about listed requests", shedder.calls)
	}
	// The same policy does reach the store for others.
	evalAt(t, p, get("192.0.2.1", "/x"), t0)
	if store.requests() == 0 || shedder.calls != 1 {
		t.Errorf("an unlisted request: %d store requests, %d shedder calls", store.requests(), shedder.calls)
	}
}

type countShedder struct{ calls int }

func (c *countShedder) Check(context.Context, limiter.Priority, time.Time) (limiter.Decision, error) {
	c.calls++
	return limiter.Decision{Allowed: true}, nil
}

// TestConcurrencyLimit: a rule's concurrency limit holds a lease per
// allowed request; a full limit denies without counting the rate limits;
// a rate-limit denial gives its lease back at once; Release frees a slot.
func TestConcurrencyLimit(t *testing.T) {
	leases := memLeases(t)
	store := newCounting(t)
	p := mustLoad(t, `
rules:
  - name: in-flight
    key: "{ip}"
    concurrency: {limit: 2, lease_ttl: 1m}
    limits: [{algorithm: fixed_window, limit: 3, window: 1m}]
`, Options{Stores: map[string]storage.Store{"memory": store}, Leases: leases})
	req := get("192.0.2.1", "/x")
	r1, r2 := evalAt(t, p, req, t0), evalAt(t, p, req, t0)
	if r1.Outcome != Allow || r2.Outcome != Allow || len(r1.Leases) != 1 || r1.Leases[0].Limit != "in-flight.concurrency" || !r2.Leases[0].Lease.Held() {
		t.Fatalf("two requests: %+v / %+v", r1, r2)
	}
	before := store.requests()
	r3 := evalAt(t, p, req, t0)
	if r3.Outcome != Deny || r3.Reason != ReasonLimit || r3.Decision.Name != "in-flight.concurrency" || r3.Decision.Limit != 2 || len(r3.Leases) != 0 {
		t.Fatalf("third request in flight: %+v", r3)
	}
	if store.requests() != before {
		t.Errorf("a request over the concurrency limit reached the rate limits")
	}
	if err := p.Release(context.Background(), r1.Leases...); err != nil {
		t.Fatal(err)
	}
	r4 := evalAt(t, p, req, t0) // the 3rd rate-limited unit
	if r4.Outcome != Allow {
		t.Fatalf("after a release: %+v", r4)
	}
	p.Release(context.Background(), r2.Leases...) //nolint:errcheck
	p.Release(context.Background(), r4.Leases...) //nolint:errcheck
	// The rate limit (3 a minute) now denies: the lease taken for the
	// denied request is given back, so two slots are free.
	if r5 := evalAt(t, p, req, t0); r5.Outcome != Deny || r5.Decision.Name == "in-flight.concurrency" || len(r5.Leases) != 0 {
		t.Fatalf("rate-limited request: %+v", r5)
	}
	cc, _ := limiter.NewConcurrency(leases, limiter.ConcurrencyConfig{Name: "in-flight.concurrency", Capacity: 2, LeaseTTL: time.Minute})
	for i := range 2 {
		if _, d, err := cc.Acquire(context.Background(), r1.Evals[0].Key, t0); err != nil || !d.Allowed {
			t.Fatalf("slot %d is not free after a rate-limit denial: %+v %v", i, d, err)
		}
	}
	if err := p.Release(context.Background(), Lease{Limit: "nope"}); err == nil {
		t.Error("releasing a lease of an unknown limit succeeded")
	}
}

// slowLeases is a lease store whose acquires take the slot, then answer
// only when the decision's context is done: the request's rate limits then
// fail on the spent deadline.
type slowLeases struct{ *memory.Leases }

func (s slowLeases) AcquireLease(ctx context.Context, k storage.Key, op storage.LeaseOp) (storage.Decision, error) {
	d, err := s.Leases.AcquireLease(ctx, k, op)
	<-ctx.Done()
	return d, err
}

// TestConcurrencyLeaseGivenBackPastDeadline: a request whose concurrency
// slot was taken, and whose rate limit then failed on the decision's spent
// deadline (fail closed: denied), gives the slot back though its context
// is done. Released with that context, the store refused the release and
// the slot stayed taken until the lease TTL (a fresh-clone CI's local API
// ended a run with 2 of 10 slots held).
func TestConcurrencyLeaseGivenBackPastDeadline(t *testing.T) {
	leases := memLeases(t)
	p := mustLoad(t, `
rules:
  - name: in-flight
    key: "{ip}"
    fail: closed
    concurrency: {limit: 2, lease_ttl: 1m}
    limits: [{algorithm: fixed_window, limit: 100, window: 1m}]
`, Options{Stores: map[string]storage.Store{"memory": newCounting(t)}, Leases: slowLeases{leases}})
	var key string
	for i := range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
		res := p.Evaluate(ctx, get("192.0.2.1", "/x"), t0)
		cancel()
		if res.Outcome != Deny || res.Reason != ReasonFailClosed || len(res.Leases) != 0 {
			t.Fatalf("request %d past its deadline: %v (%s), %d leases", i, res.Outcome, res.Reason, len(res.Leases))
		}
		key = res.Evals[0].Key
	}
	cc, err := limiter.NewConcurrency(leases, limiter.ConcurrencyConfig{Name: "in-flight.concurrency", Capacity: 2, LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, d, err := cc.Acquire(t.Context(), key, t0); err != nil || !d.Allowed {
			t.Fatalf("slot %d is still taken after the denials past the deadline: %+v %v", i, d, err)
		}
	}
}
