package policy

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

const inspectRules = `
rules:
  - name: per-ip
    key: "{ip}"
    limits:
      - {name: per-minute, algorithm: sliding_window, limit: 3, window: 1m}
      - {algorithm: token_bucket, max_amount: 2, refill_time: 1s}
  - name: tenant
    key: "t:{header:X-Tenant}:{query:page}:{token}"
    tier: "{header:X-Plan}"
    limits:
      - {algorithm: fixed_window, limit: 1, window: 1m}
    tiers:
      pro:
        - {name: pro-minute, algorithm: sliding_log, limit: 5, window: 1m}
`

// TestInspectAPI: the limits and key a tool gets for a rule are the ones
// Evaluate checks: a key rendered from attribute values equals the key of
// a request carrying them, and the limiters hold the state Evaluate wrote.
func TestInspectAPI(t *testing.T) {
	p, err := Load([]byte(inspectRules), Options{Stores: memStores(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Date(2026, 3, 1, 0, 0, 10, 0, time.UTC)

	attrs, err := p.KeyAttrs("tenant")
	if want := []string{"header:X-Tenant", "query:page", "token"}; err != nil || !slices.Equal(attrs, want) {
		t.Fatalf("KeyAttrs(tenant) = %q, %v; want %q", attrs, err, want)
	}
	for _, c := range []struct {
		rule  string
		attrs map[string]string
		req   Request
	}{
		{"per-ip", map[string]string{"ip": "2001:db8:1:2:3:4:5:6"}, Request{SourceIP: "2001:db8:1:2:3:4:5:6"}},
		{"tenant", map[string]string{"header:X-Tenant": "a b/c", "query:page": "7", "token": "Bearer s3cret"},
			Request{Headers: Header{"x-tenant": "a b/c"}, Query: Query{"page": "7"}, Token: "Bearer s3cret"}},
	} {
		req, err := RequestOf(c.attrs)
		if err != nil {
			t.Fatal(err)
		}
		key, err := p.Key(c.rule, req)
		if err != nil {
			t.Fatal(err)
		}
		res := p.Evaluate(ctx, &c.req, now)
		if len(res.Evals) != 2 || res.Evals[slices.IndexFunc(res.Evals, func(e Eval) bool { return e.Rule == c.rule })].Key != key {
			t.Fatalf("%s: Key = %q; Evaluate's evals %+v", c.rule, key, res.Evals)
		}
		limits, defs, err := p.Limits(c.rule, "")
		if err != nil || len(limits) != len(defs) || len(limits) == 0 {
			t.Fatalf("Limits(%s) = %v, %v, %v", c.rule, limits, defs, err)
		}
		for i, l := range limits {
			d, err := l.(limiter.Inspector).Peek(ctx, key, now)
			if err != nil || d.Remaining != d.Limit-1 || d.Name != defs[i].Name {
				t.Fatalf("%s limit %d (%s): Peek after one request = %+v, %v; want one taken", c.rule, i, defs[i].Name, d, err)
			}
		}
	}
	if _, defs, err := p.Limits("tenant", "pro"); err != nil || len(defs) != 1 || defs[0].Name != "pro-minute" {
		t.Fatalf("Limits(tenant, pro) = %v, %v", defs, err)
	}
	if _, defs, err := p.Limits("per-ip", DefaultTier); err != nil || defs[1].Name != "per-ip/1" {
		t.Fatalf("Limits(per-ip, default) = %v, %v; want the default names filled in", defs, err)
	}
	for _, bad := range []func() error{
		func() error { _, _, err := p.Limits("nope", ""); return err },
		func() error { _, _, err := p.Limits("tenant", "gold"); return err },
		func() error { _, err := p.Key("nope", &Request{}); return err },
		func() error { _, err := p.KeyAttrs("nope"); return err },
		func() error { _, err := RequestOf(map[string]string{"ipv4": "x"}); return err },
	} {
		if err := bad(); !errors.Is(err, ErrUnknown) {
			t.Errorf("got %v, want ErrUnknown", err)
		}
	}
}
