package policy

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestErrorLines: a validation error of a parsed document names the line
// of the field it is about (the field's own line when the document gives
// it, else its limit's or the rule's); a rule built in Go has no line.
func TestErrorLines(t *testing.T) {
	const limits = `rules:
  - name: a
    key: k
    limits:
      - algorithm: fixed_window
        limit: 1
        window: 1s
      - algorithm: fixed_window
        limit: -5
        window: 1s
`
	const tier = `rules:
  - name: b
    key: k
    tier: "{header:X-Plan}"
    tiers:
      pro.v2:
        - algorithm: token_bucket
          max_amount: 3
          refill_time: 1s
          refill_amount: 4
    limits: [{algorithm: fixed_window, limit: 10, window: 1s}]
`
	const cost = `rules:
  - name: b
    key: k
    cost: 11
    limits: [{algorithm: fixed_window, limit: 10, window: 1s}]
`
	const twice = `rules:
  - name: a
    key: k
    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]
  - key: k
    name: a
    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]
`
	tests := []struct {
		name, doc, want string
	}{
		{"a limit's field", limits, `rule "a" (rules[0]): limits[1]: limit: -5 is outside 1..1099511627776 (line 9)`},
		{"a tier's limit, the tier named with a dot", tier, `rule "b" (rules[0]): tiers.pro.v2[0]: refill_amount: 4 is outside 1..3 (line 10)`},
		{"a rule's field", cost, `rule "b" (rules[0]): cost: 11 is outside 1..10 (a request costing more than a limit's capacity could never pass) (line 4)`},
		{"a name used twice", twice, `rule "a" (rules[1]): name: already used by rules[0] (line 6)`},
		{"a field the rule lacks: the rule's line", "rules:\n  - name: c\n    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]\n", `rule "c" (rules[0]): key: required (for example "{ip}", or a constant such as "all" for one limit shared by every request) (line 2)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v\nwant it to contain %s", err, tt.want)
			}
		})
	}
	if _, err := ParseRule([]byte("key: k\nlimits:\n  - {algorithm: sliding_log, limit: 0, window: 1s}\n"), "r"); err == nil || !strings.HasSuffix(err.Error(), "limits[0]: limit: 0 is outside 1..10000 (line 3)") {
		t.Errorf("ParseRule: err = %v", err)
	}
	_, err := New([]Rule{{Name: "go", Key: "k", Limits: []Limit{{Algorithm: FixedWindow, Limit: -5, Window: time.Second}}}}, Options{Stores: memStores(t)})
	if err == nil || strings.Contains(err.Error(), "line") {
		t.Errorf("a rule built in Go: err = %v, want one without a line", err)
	}
}

// TestSchemaCoversEveryField: every exported field of the rule's structs
// has a name in the schema, and a document giving every field decodes, so
// a new field is added in one place (its tag, and its checks in compile).
func TestSchemaCoversEveryField(t *testing.T) {
	for _, v := range []any{Rule{}, Match{}, ClientIP{}, ConcurrencyLimit{}, Limit{}} {
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			if f := rt.Field(i); f.IsExported() && f.Tag.Get("rule") == "" {
				t.Errorf("%s.%s has no rule tag", rt.Name(), f.Name)
			}
		}
	}
	const all = `rules:
  - name: every-field
    description: d
    match: {methods: [GET], paths: ["/a/**"], stages: [prod], routes: ["GET /a"], case_sensitive: true}
    key: "{ip}"
    client_ip: {from: x-forwarded-for, hops: 2, ipv6_prefix: 56}
    skip_if_missing: true
    cost: 1
    priority: high
    fail: closed
    require: [token]
    shadow: true
    tier: "{header:X-Plan}"
    tier_lookup: true
    tiers: {pro: [{algorithm: fixed_window, limit: 10, window: 1s, count_denied: true}]}
    concurrency: {name: c, limit: 3, lease_ttl: 10s}
    limits:
      - {name: w, algorithm: sliding_window, backend: memory, limit: 5, window: 1m, sub_windows: 6, estimator: interpolated, representation: subwindows}
      - {algorithm: sliding_window, limit: 5, window: 1m, slots: 160, representation: packed}
      - {algorithm: token_bucket, max_amount: 5, refill_time: 1s, refill_amount: 2, strict: true}
      - {algorithm: sliding_log, limit: 5, window: 1m}
`
	rules, err := Parse([]byte(all))
	if err != nil {
		t.Fatal(err)
	}
	r := rules[0]
	if r.ClientIP.Hops != 2 || r.Priority != 1 || r.Fail != FailClosed || !r.TierLookup || r.Concurrency.LeaseTTL != 10*time.Second ||
		len(r.Tiers) != 1 || !r.Tiers[0].Limits[0].CountDenied || r.Limits[0].SubWindows != 6 || r.Limits[1].Slots != 160 || !r.Limits[2].Strict {
		t.Errorf("decoded %+v", r)
	}
}
