package policy

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const tiersDoc = `
rules:
  - name: per-key
    key: "{api_key}"
    tier: "{header:X-Plan}"
    limits:
      - {name: free, algorithm: fixed_window, limit: 10, window: 1m}
    tiers:
      pro:
        - {name: pro, algorithm: fixed_window, limit: 100, window: 1m}
      enterprise:
        - {algorithm: token_bucket, max_amount: 1000, refill_time: 1ms}
    shadow: true
    concurrency: {limit: 10, lease_ttl: 45s}
`

func TestParseRuleFields(t *testing.T) {
	rules, err := Parse([]byte(tiersDoc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	r := rules[0]
	if !r.Shadow || r.Tier != "{header:X-Plan}" || r.TierLookup {
		t.Errorf("shadow/tier = %v/%q/%v", r.Shadow, r.Tier, r.TierLookup)
	}
	if len(r.Tiers) != 2 || r.Tiers[0].Name != "pro" || r.Tiers[1].Name != "enterprise" || r.Tiers[0].Limits[0].Limit != 100 {
		t.Errorf("tiers = %+v (want pro, enterprise in document order)", r.Tiers)
	}
	if r.Concurrency == nil || *r.Concurrency != (ConcurrencyLimit{Limit: 10, LeaseTTL: 45 * time.Second}) {
		t.Errorf("concurrency = %+v", r.Concurrency)
	}
	c, err := compile(r, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.Tiers[1].Limits[0].Name != "per-key/enterprise/0" {
		t.Errorf("default name of a tier's limit = %q", c.Tiers[1].Limits[0].Name)
	}
	if c.Concurrency.Name != "per-key.concurrency" {
		t.Errorf("default concurrency name = %q", c.Concurrency.Name)
	}
	// Defaults: a concurrency limit without a TTL gets DefaultLeaseTTL.
	rules, err = Parse([]byte("rules: [{name: a, key: k, concurrency: {limit: 3}, limits: [{algorithm: fixed_window, limit: 1, window: 1s}]}]"))
	if err != nil {
		t.Fatal(err)
	}
	if c, err := compile(rules[0], 0); err != nil || c.Concurrency.LeaseTTL != DefaultLeaseTTL {
		t.Errorf("compile = %+v, %v", c.Concurrency, err)
	}
}

func TestTierIndex(t *testing.T) {
	rules, err := Parse([]byte(tiersDoc))
	if err != nil {
		t.Fatal(err)
	}
	c, err := compile(rules[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		plan  string
		index int
		name  string
	}{
		{"", -1, DefaultTier},
		{"pro", 0, "pro"},
		{"enterprise", 1, "enterprise"},
		{"PRO", -1, DefaultTier}, // tier names are exact
		{"default", -1, DefaultTier},
		{"gold\x00", -1, DefaultTier},
	} {
		req := &Request{Headers: Header{}}
		if tt.plan != "" {
			req.Headers.(Header)["x-plan"] = tt.plan
		}
		i, name := c.tierIndex(req, nil)
		if i != tt.index || name != tt.name {
			t.Errorf("plan %q: tier %d %q, want %d %q", tt.plan, i, name, tt.index, tt.name)
		}
		if got := c.tierLimits(i)[0].Name; tt.index == 0 && got != "pro" || tt.index < 0 && got != "free" {
			t.Errorf("plan %q: limits of tier %d start with %q", tt.plan, i, got)
		}
	}
	// tier_lookup maps the value (an API key) through TierOf.
	rules, err = Parse([]byte(strings.Replace(tiersDoc, `tier: "{header:X-Plan}"`, `tier: "{api_key}"`+"\n    tier_lookup: true", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if c, err = compile(rules[0], 0); err != nil {
		t.Fatal(err)
	}
	lookup := Tiers{"key-of-a-pro": "pro", "key-of-nobody": "platinum"}.Lookup
	for key, want := range map[string]string{"key-of-a-pro": "pro", "key-of-nobody": DefaultTier, "unknown": DefaultTier, "pro": DefaultTier} {
		if _, name := c.tierIndex(&Request{APIKey: key}, lookup); name != want {
			t.Errorf("api key %q: tier %q, want %q", key, name, want)
		}
	}
	if _, name := c.tierIndex(&Request{APIKey: "key-of-a-pro"}, nil); name != DefaultTier {
		t.Errorf("no lookup: tier %q", name)
	}
}

func TestParseRuleFieldErrors(t *testing.T) {
	const limit = `limits: [{algorithm: fixed_window, limit: 1, window: 1s}]`
	const tl = `{algorithm: fixed_window, limit: 5, window: 1s}`
	tests := []struct{ doc, want string }{
		{"{name: a, key: k, shadow: maybe, " + limit + "}", `rule "a" (rules[0]): shadow: want true or false`},
		{"{name: a, key: k, tiers: {pro: [" + tl + "]}, " + limit + "}", `rule "a" (rules[0]): tier: required with tiers`},
		{"{name: a, key: k, tier_lookup: true, " + limit + "}", `rule "a" (rules[0]): tier_lookup: only applies with tier`},
		{"{name: a, key: k, tier: 'plan-{header:X}', tiers: {pro: [" + tl + "]}, " + limit + "}", `tier: "plan-{header:X}" must be one attribute in braces`},
		{"{name: a, key: k, tier: '{plan}', tiers: {pro: [" + tl + "]}, " + limit + "}", "tier: {plan} is not an attribute"},
		{"{name: a, key: k, tier: '{header:X}', tiers: [" + tl + "], " + limit + "}", "tiers: want a mapping of tier names"},
		{"{name: a, key: k, tier: '{header:X}', tiers: {pro: " + tl + "}, " + limit + "}", "tiers.pro: want a list of limits"},
		{"{name: a, key: k, tier: '{header:X}', tiers: {pro: []}, " + limit + "}", "tiers.pro: at least one limit"},
		{"{name: a, key: k, tier: '{header:X}', tiers: {default: [" + tl + "]}, " + limit + "}", `tiers.default: "default" is the rule's own limits`},
		{"{name: a, key: k, tier: '{header:X}', tiers: {'a b': [" + tl + "]}, " + limit + "}", `tiers[0]: "a b" must be`},
		{"{name: a, key: k, tier: '{header:X}', tiers: {pro: [{algorithm: fixed_window, limit: 0, window: 1s}]}, " + limit + "}", `rule "a" (rules[0]): tiers.pro[0]: limit: 0 is outside`},
		{"{name: a, key: k, tier: '{header:X}', tiers: {pro: [{algorithm: fixed_window, limit: 5, window: 1s, max_amount: 3}]}, " + limit + "}", "tiers.pro[0].max_amount: not a field of fixed_window"},
		{"{name: a, key: k, tier: '{header:X}', tiers: {pro: [{name: x, algorithm: fixed_window, limit: 5, window: 1s}]}, limits: [{name: x, algorithm: fixed_window, limit: 1, window: 1s}]}", `tiers.pro[0].name: "x" is used twice`},
		{"{name: a, key: k, cost: 3, tier: '{header:X}', tiers: {pro: [{algorithm: fixed_window, limit: 2, window: 1s}]}, limits: [{algorithm: fixed_window, limit: 9, window: 1s}]}", "cost: 3 is outside 1..2"},
		{"{name: a, key: k, concurrency: {limit: 0}, " + limit + "}", `rule "a" (rules[0]): concurrency.limit: 0 is outside 1..1000`},
		{"{name: a, key: k, concurrency: {limit: 1001}, " + limit + "}", "concurrency.limit: 1001"},
		{"{name: a, key: k, concurrency: {limit: 5, lease_ttl: 1h}, " + limit + "}", "concurrency.lease_ttl: 1h0m0s is outside"},
		{"{name: a, key: k, concurrency: {limit: 5, lease_ttl: -1s}, " + limit + "}", "concurrency.lease_ttl"},
		{"{name: a, key: k, concurrency: {limit: 5, name: 'x y'}, " + limit + "}", "concurrency.name"},
		{"{name: a, key: k, concurrency: {limit: 5, ttl: 1s}, " + limit + "}", "concurrency.ttl: unknown field"},
		{"{name: a, key: k, concurrency: 5, " + limit + "}", "concurrency"},
	}
	for _, tt := range tests {
		_, err := Parse([]byte("rules: [" + tt.doc + "]"))
		if err == nil || !errors.Is(err, ErrInvalidRule) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%s)\n = %v\nwant an error containing %q", tt.doc, err, tt.want)
		}
	}
	var b strings.Builder
	b.WriteString("rules: [{name: a, key: k, tier: '{header:X}', " + limit + ", tiers: {")
	for i := 0; i <= MaxTiers; i++ {
		fmt.Fprintf(&b, "t%d: [%s],", i, tl)
	}
	b.WriteString("}}]")
	if _, err := Parse([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "tiers: 17 tiers; at most 16") {
		t.Errorf("too many tiers: %v", err)
	}
}
