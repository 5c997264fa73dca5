package policy

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

const goodDoc = `
version: 1
rules:
  - name: per-ip
    description: every client
    key: "{ip}"
    limits:
      - algorithm: sliding_window
        limit: 100
        window: 1m
        sub_windows: 6
        estimator: interpolated
      - algorithm: token_bucket
        max_amount: 10
        refill_time: 1s
        refill_amount: 2
        strict: true
        backend: memory
  - name: writes
    match:
      methods: [post, PUT]
      paths: ["/api/**", "/v?/*"]
      stages: prod
      routes: ["POST /orders"]
    key: "tenant:{header:X-Tenant}:{token}"
    client_ip: {from: x-forwarded-for, hops: 2, ipv6_prefix: 56}
    limits:
      - {algorithm: fixed_window, limit: 5, window: 1s, count_denied: true, name: burst}
      - {algorithm: sliding_log, limit: 50, window: 1h}
    cost: 2
    priority: critical
    fail: closed
    require: [token, "header:X-Tenant"]
`

// The representation fields reach the limit, and an unnamed one is Auto
// with no sub-windows filled in (the limiter picks packed where it fits).
func TestParseRepresentation(t *testing.T) {
	rules, err := Parse([]byte(`
rules:
  - name: a
    key: k
    limits:
      - {algorithm: sliding_window, limit: 100, window: 1m}
      - {algorithm: sliding_window, limit: 100, window: 1h, representation: packed, slots: 240}
      - {algorithm: sliding_window, limit: 100, window: 2m, representation: subwindows}
      - {algorithm: sliding_window, limit: 100000, window: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := rules[0].Limits
	want := []Limit{
		{Algorithm: SlidingWindow, Limit: 100, Window: time.Minute, Representation: limiter.Auto},
		{Algorithm: SlidingWindow, Limit: 100, Window: time.Hour, Representation: limiter.Packed, Slots: 240},
		{Algorithm: SlidingWindow, Limit: 100, Window: 2 * time.Minute, Representation: limiter.SubWindowCounters},
		{Algorithm: SlidingWindow, Limit: 100000, Window: time.Minute},
	}
	for i := range want {
		g := got[i]
		g.Name = ""
		if g != want[i] {
			t.Errorf("limit %d = %+v, want %+v", i, g, want[i])
		}
	}
	// Built on the memory store: Auto is packed where it fits.
	p, err := New(rules, Options{Stores: memStores(t)})
	if err != nil {
		t.Fatal(err)
	}
	reps := []limiter.Representation{limiter.Packed, limiter.Packed, limiter.SubWindowCounters, limiter.SubWindowCounters}
	for i, l := range p.rules[0].limits {
		w, ok := l.(*limiter.SlidingWindow)
		if !ok {
			t.Fatalf("limit %d is a %T", i, l)
		}
		if c := w.Config(); c.Representation != reps[i] {
			t.Errorf("limit %d built as %v, want %v (%+v)", i, c.Representation, reps[i], c)
		}
	}
}

// TestRepresentationCost: a rule's cost is its sliding windows' MaxCost.
// Auto keeps a window packed only up to limiter.PackedMaxCost (beyond it,
// denied requests in flight could overflow the packed fields: docs/rules.md);
// a window pinned to packed with a larger cost is refused with an error
// that names the rule, the limit and the way out.
func TestRepresentationCost(t *testing.T) {
	doc := func(cost int64, rep string) []byte {
		return []byte(fmt.Sprintf(`
rules:
  - name: costly
    key: k
    cost: %d
    limits:
      - {algorithm: sliding_window, limit: 600, window: 1m%s}
`, cost, rep))
	}
	for _, c := range []struct {
		cost int64
		want limiter.Representation
	}{{1, limiter.Packed}, {limiter.PackedMaxCost, limiter.Packed}, {limiter.PackedMaxCost + 1, limiter.SubWindowCounters}, {600, limiter.SubWindowCounters}} {
		p, err := Load(doc(c.cost, ""), Options{Stores: memStores(t)})
		if err != nil {
			t.Fatalf("cost %d: %v", c.cost, err)
		}
		w := p.rules[0].limits[0].(*limiter.SlidingWindow)
		if got := w.Config(); got.Representation != c.want || got.MaxCost != c.cost {
			t.Errorf("cost %d: built as %v with MaxCost %d, want %v with %d", c.cost, got.Representation, got.MaxCost, c.want, c.cost)
		}
	}
	_, err := Load(doc(limiter.PackedMaxCost+1, ", representation: packed"), Options{Stores: memStores(t)})
	if err == nil || !errors.Is(err, ErrInvalidRule) || !strings.Contains(err.Error(), `"costly"`) ||
		!strings.Contains(err.Error(), "max-cost") || !strings.Contains(err.Error(), "use subwindows") {
		t.Fatalf("a packed window with cost %d: %v; want an ErrInvalidRule naming the rule, max-cost and subwindows", limiter.PackedMaxCost+1, err)
	}
}

func TestParseGood(t *testing.T) {
	rules, err := Parse([]byte(goodDoc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(rules) != 2 {
		t.Fatalf("got %d rules, want 2", len(rules))
	}
	r := rules[0]
	if r.Name != "per-ip" || r.Key != "{ip}" || r.Description != "every client" {
		t.Errorf("rule 0 = %+v", r)
	}
	want0 := Limit{Algorithm: SlidingWindow, Limit: 100, Window: time.Minute, SubWindows: 6, Estimator: limiter.Interpolated}
	if r.Limits[0] != want0 {
		t.Errorf("limit 0 = %+v, want %+v", r.Limits[0], want0)
	}
	want1 := Limit{Algorithm: TokenBucket, MaxAmount: 10, RefillTime: time.Second, RefillAmount: 2, Strict: true, Backend: "memory"}
	if r.Limits[1] != want1 {
		t.Errorf("limit 1 = %+v, want %+v", r.Limits[1], want1)
	}
	w := rules[1]
	if w.Cost != 2 || w.Priority != limiter.PriorityCritical || w.Fail != FailClosed {
		t.Errorf("rule 1 cost/priority/fail = %d/%v/%v", w.Cost, w.Priority, w.Fail)
	}
	if got := strings.Join(w.Match.Methods, ","); got != "post,PUT" {
		t.Errorf("methods = %q", got)
	}
	if got := strings.Join(w.Match.Stages, ","); got != "prod" {
		t.Errorf("stages = %q (a single value is a list of one)", got)
	}
	if w.ClientIP != (ClientIP{From: FromXForwardedFor, Hops: 2, IPv6Prefix: 56}) {
		t.Errorf("client_ip = %+v", w.ClientIP)
	}
	if w.Limits[0].Name != "burst" || !w.Limits[0].CountDenied {
		t.Errorf("limit = %+v", w.Limits[0])
	}
}

func TestParseJSON(t *testing.T) {
	doc := `{"rules": [{"name": "j", "key": "{ip}", "limits": [{"algorithm": "fixed_window", "limit": 3, "window": "1m"}]}]}`
	rules, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if rules[0].Limits[0].Window != time.Minute {
		t.Errorf("window = %v", rules[0].Limits[0].Window)
	}
}

func TestParseEmptyList(t *testing.T) {
	for _, doc := range []string{"rules: []", "rules:"} {
		rules, err := Parse([]byte(doc))
		if err != nil || len(rules) != 0 {
			t.Errorf("Parse(%q) = %v, %v; want no rules", doc, rules, err)
		}
	}
}

// TestParseErrors checks that every invalid rule fails with a message
// naming the rule and the field.
func TestParseErrors(t *testing.T) {
	const limit = `limits: [{algorithm: fixed_window, limit: 1, window: 1s}]`
	tests := []struct {
		name string
		doc  string
		want []string // substrings of the error
	}{
		{name: "empty", doc: "", want: []string{"empty document"}},
		{name: "not yaml", doc: "rules: [", want: []string{"invalid rules"}},
		{name: "no rules list", doc: "version: 1", want: []string{`"rules" list is required`}},
		{name: "rules not a list", doc: "rules: 3", want: []string{"rules: want a list"}},
		{name: "bad version", doc: "version: 2\nrules: []", want: []string{"version: 2"}},
		{name: "unknown top field", doc: "rulez: []\nrules: []", want: []string{"rulez", "unknown field"}},
		{name: "two documents", doc: "rules: []\n---\nrules: []", want: []string{"more than one YAML document"}},
		{name: "alias", doc: "rules:\n  - &a {name: x, key: k, " + limit + "}\n  - *a", want: []string{"aliases"}},
		{name: "rule not a mapping", doc: "rules: [3]", want: []string{"rules[0]", "want a mapping"}},
		{name: "no name", doc: "rules: [{key: k, " + limit + "}]", want: []string{"rules[0]: name: required"}},
		{name: "bad name", doc: "rules: [{name: 'a b', key: k, " + limit + "}]", want: []string{"rules[0]", "name:", "letters"}},
		{name: "duplicate name", doc: "rules: [{name: a, key: k, " + limit + "}, {name: a, key: k, " + limit + "}]", want: []string{`rule "a" (rules[1]): name: already used by rules[0]`}},
		{name: "unknown rule field", doc: "rules: [{name: a, key: k, colour: red, " + limit + "}]", want: []string{`rule "a"`, "colour: unknown field"}},
		{name: "no key", doc: "rules: [{name: a, " + limit + "}]", want: []string{`rule "a"`, "key: required"}},
		{name: "unquoted key", doc: "rules: [{name: a, key: {ip}, " + limit + "}]", want: []string{`rule "a"`, "key:", "quote the template"}},
		{name: "bad placeholder", doc: "rules: [{name: a, key: '{ipp}', " + limit + "}]", want: []string{`rule "a"`, "key:", "{ipp} is not an attribute"}},
		{name: "unclosed brace", doc: "rules: [{name: a, key: '{ip', " + limit + "}]", want: []string{"key:", "unclosed"}},
		{name: "bad header name", doc: "rules: [{name: a, key: '{header:a b}', " + limit + "}]", want: []string{"key:", "not a header name"}},
		{name: "space in literal", doc: "rules: [{name: a, key: 'a b', " + limit + "}]", want: []string{"key:", "printable ASCII"}},
		{name: "no limits", doc: "rules: [{name: a, key: k}]", want: []string{`rule "a"`, "limits: required"}},
		{name: "empty limits", doc: "rules: [{name: a, key: k, limits: []}]", want: []string{`rule "a"`, "limits: at least one"}},
		{name: "no algorithm", doc: "rules: [{name: a, key: k, limits: [{limit: 1}]}]", want: []string{`rule "a"`, "limits[0].algorithm: required"}},
		{name: "bad algorithm", doc: "rules: [{name: a, key: k, limits: [{algorithm: leaky}]}]", want: []string{"limits[0].algorithm", "leaky"}},
		{name: "stray field", doc: "rules: [{name: a, key: k, limits: [{algorithm: token_bucket, max_amount: 1, refill_time: 1s, window: 1m}]}]", want: []string{`rule "a"`, "limits[0].window: not a field of token_bucket"}},
		{name: "bad duration", doc: "rules: [{name: a, key: k, limits: [{algorithm: fixed_window, limit: 1, window: 1x}]}]", want: []string{`rule "a"`, "limits[0].window", `"1x" is not a duration`, "line 1"}},
		{name: "duration as number", doc: "rules: [{name: a, key: k, limits: [{algorithm: fixed_window, limit: 1, window: 60}]}]", want: []string{"limits[0].window", "not a duration"}},
		{name: "negative limit", doc: "rules: [{name: a, key: k, limits: [{algorithm: fixed_window, limit: -5, window: 1s}]}]", want: []string{`rule "a"`, "limits[0]: limit: -5 is outside"}},
		{name: "absurd limit", doc: "rules: [{name: a, key: k, limits: [{algorithm: fixed_window, limit: 99999999999999999, window: 1s}]}]", want: []string{"limits[0]: limit:", "outside"}},
		{name: "limit not a number", doc: "rules: [{name: a, key: k, limits: [{algorithm: fixed_window, limit: lots, window: 1s}]}]", want: []string{"limits[0].limit: want a whole number"}},
		{name: "huge window", doc: "rules: [{name: a, key: k, limits: [{algorithm: fixed_window, limit: 1, window: 10000h}]}]", want: []string{"limits[0]: window:", "outside"}},
		{name: "tiny window", doc: "rules: [{name: a, key: k, limits: [{algorithm: fixed_window, limit: 1, window: 1ns}]}]", want: []string{"limits[0]: window:"}},
		{name: "sub windows do not divide", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_window, limit: 1, window: 1s, sub_windows: 7}]}]", want: []string{"limits[0]: sub_windows: 7"}},
		{name: "too many sub windows", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_window, limit: 1, window: 1m, sub_windows: 61}]}]", want: []string{"sub_windows: 61"}},
		{name: "bad representation", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_window, limit: 1, window: 1m, representation: sliced}]}]", want: []string{"limits[0].representation", "sliced"}},
		{name: "packed with sub windows", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_window, limit: 1, window: 1m, representation: packed, sub_windows: 6}]}]", want: []string{"limits[0]: sub_windows: a packed window"}},
		{name: "slots with sub windows", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_window, limit: 1, window: 1m, slots: 160, sub_windows: 6}]}]", want: []string{"limits[0]: slots:", "not both"}},
		{name: "slots on sub-window counters", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_window, limit: 1, window: 1m, representation: subwindows, slots: 160}]}]", want: []string{"limits[0]: slots: only a packed window"}},
		{name: "packed limit too big", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_window, limit: 40000, window: 1m, representation: packed}]}]", want: []string{"limits[0]: limit: 40000", "subwindows"}},
		{name: "packed interpolated", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_window, limit: 1, window: 1m, representation: packed, estimator: interpolated}]}]", want: []string{"limits[0]: estimator: a packed window is bounded"}},
		{name: "packed counts denied", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_window, limit: 1, window: 1m, slots: 160, count_denied: true}]}]", want: []string{"limits[0]: count_denied"}},
		{name: "too few slots", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_window, limit: 1, window: 1m, slots: 10}]}]", want: []string{"limits[0]: slots: 10 is outside 64..512"}},
		{name: "slots do not divide", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_window, limit: 1, window: 1ms, slots: 160}]}]", want: []string{"limits[0]: slots: 160 does not cut"}},
		{name: "slots on a fixed window", doc: "rules: [{name: a, key: k, limits: [{algorithm: fixed_window, limit: 1, window: 1m, slots: 160}]}]", want: []string{"limits[0].slots: not a field of fixed_window"}},
		{name: "bad estimator", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_window, limit: 1, window: 1m, estimator: magic}]}]", want: []string{"limits[0].estimator"}},
		{name: "sliding log too big", doc: "rules: [{name: a, key: k, limits: [{algorithm: sliding_log, limit: 20000, window: 1m}]}]", want: []string{"limits[0]: limit: 20000"}},
		{name: "refill more than max", doc: "rules: [{name: a, key: k, limits: [{algorithm: token_bucket, max_amount: 2, refill_time: 1s, refill_amount: 3}]}]", want: []string{"refill_amount: 3"}},
		{name: "cost above capacity", doc: "rules: [{name: a, key: k, cost: 5, " + limit + "}]", want: []string{`rule "a"`, "cost: 5 is outside 1..1"}},
		{name: "negative cost", doc: "rules: [{name: a, key: k, cost: -1, " + limit + "}]", want: []string{"cost: -1"}},
		{name: "bad priority", doc: "rules: [{name: a, key: k, priority: urgent, " + limit + "}]", want: []string{`rule "a"`, "priority:", "urgent"}},
		{name: "priority out of range", doc: "rules: [{name: a, key: k, priority: 5, " + limit + "}]", want: []string{"priority:", "5"}},
		{name: "bad fail", doc: "rules: [{name: a, key: k, fail: maybe, " + limit + "}]", want: []string{`rule "a"`, "fail:", "maybe"}},
		{name: "bad method", doc: "rules: [{name: a, key: k, match: {methods: ['G T']}, " + limit + "}]", want: []string{"match.methods[0]"}},
		{name: "bad glob", doc: "rules: [{name: a, key: k, match: {paths: ['api/*']}, " + limit + "}]", want: []string{"match.paths[0]", "start with '/'"}},
		{name: "bad glob class", doc: "rules: [{name: a, key: k, match: {paths: ['/[a']}, " + limit + "}]", want: []string{"match.paths[0]", "bad segment"}},
		{name: "partial double star", doc: "rules: [{name: a, key: k, match: {paths: ['/a**']}, " + limit + "}]", want: []string{"match.paths[0]", "whole segment"}},
		{name: "unknown match field", doc: "rules: [{name: a, key: k, match: {hosts: [x]}, " + limit + "}]", want: []string{"match.hosts: unknown field"}},
		{name: "bad ip source", doc: "rules: [{name: a, key: k, client_ip: {from: header}, " + limit + "}]", want: []string{"client_ip.from"}},
		{name: "hops without xff", doc: "rules: [{name: a, key: k, client_ip: {hops: 2}, " + limit + "}]", want: []string{"client_ip.hops"}},
		{name: "bad prefix", doc: "rules: [{name: a, key: k, client_ip: {ipv6_prefix: 200}, " + limit + "}]", want: []string{"client_ip.ipv6_prefix"}},
		{name: "bad require", doc: "rules: [{name: a, key: k, require: [password], " + limit + "}]", want: []string{"require[0]"}},
		{name: "bad backend", doc: "rules: [{name: a, key: k, limits: [{algorithm: fixed_window, limit: 1, window: 1s, backend: 'Redis!'}]}]", want: []string{"limits[0]: backend"}},
		{name: "limit field twice", doc: "rules:\n  - name: a\n    key: k\n    key: j\n    " + limit, want: []string{"key"}},
		{name: "too many limits", doc: "rules: [{name: a, key: k, limits: [" + strings.Repeat("{algorithm: fixed_window, limit: 1, window: 1s},", 9) + "]}]", want: []string{"limits: 9 limits"}},
		{name: "limit names clash", doc: "rules: [{name: a, key: k, limits: [{name: x, algorithm: fixed_window, limit: 1, window: 1s}, {name: x, algorithm: fixed_window, limit: 1, window: 2s}]}]", want: []string{"limits[1].name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			if err == nil {
				t.Fatalf("Parse succeeded; want an error containing %q", tt.want)
			}
			if !errors.Is(err, ErrInvalidRule) {
				t.Errorf("error %v does not wrap ErrInvalidRule", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseDocumentTooLarge(t *testing.T) {
	_, err := Parse(make([]byte, MaxDocumentSize+1))
	if err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("err = %v", err)
	}
}

func TestParseRule(t *testing.T) {
	body := `{key: "{ip}", limits: [{algorithm: token_bucket, max_amount: 5, refill_time: 1s}]}`
	r, err := ParseRule([]byte(body), "from-table")
	if err != nil {
		t.Fatalf("ParseRule: %v", err)
	}
	if r.Name != "from-table" {
		t.Errorf("name = %q", r.Name)
	}
	if _, err := ParseRule([]byte(`{name: other, key: k, limits: [{algorithm: token_bucket, max_amount: 5, refill_time: 1s}]}`), "from-table"); err == nil ||
		!strings.Contains(err.Error(), "does not match") {
		t.Errorf("mismatched name: err = %v", err)
	}
	if _, err := ParseRule([]byte(`rules: []`), "x"); err == nil {
		t.Error("a rules document accepted as one rule")
	}
}

// TestNewValidatesGoRules checks that rules built in Go get the same checks.
func TestNewValidatesGoRules(t *testing.T) {
	_, err := New([]Rule{{Name: "go", Key: "{ip}", Limits: []Limit{{Algorithm: FixedWindow, Limit: 0, Window: time.Second}}}}, Options{Stores: memStores(t)})
	if err == nil || !strings.Contains(err.Error(), `rule "go" (rules[0]): limits[0]: limit: 0 is outside`) {
		t.Fatalf("err = %v", err)
	}
}

func TestNewBackendErrors(t *testing.T) {
	rules := []Rule{{Name: "r", Key: "{ip}", Limits: []Limit{{Algorithm: FixedWindow, Limit: 1, Window: time.Second, Backend: "memcached"}}}}
	_, err := New(rules, Options{Stores: memStores(t)})
	if err == nil || !strings.Contains(err.Error(), `rule "r" (rules[0]): limits[0].backend: "memcached" is not configured (configured: memory)`) {
		t.Fatalf("err = %v", err)
	}
}

// FuzzParse checks that no document makes Parse panic, and that whatever
// parses also builds and evaluates.
func FuzzParse(f *testing.F) {
	f.Add([]byte(goodDoc))
	f.Add([]byte(`{"rules":[{"name":"a","key":"{header:x}","limits":[{"algorithm":"sliding_log","limit":2,"window":"1s"}]}]}`))
	f.Add([]byte("rules:\n  - name: a\n    key: '{ip}:{query:q}'\n    match: {paths: ['/**/x/*']}\n    limits: [{algorithm: sliding_window, limit: 3, window: 3s, sub_windows: 3}]\n"))
	f.Add([]byte("rules: [{name: a, key: '{ip}', limits: [{algorithm: token_bucket, max_amount: 1e3, refill_time: 1s}]}]"))
	f.Add([]byte(tiersDoc))
	f.Add([]byte(listsDoc))
	f.Add([]byte(`{"deny":{"cidrs":["::ffff:10.0.0.0/104"],"keys":{"query:k":["v"]}},"rules":[{"name":"a","key":"{ip}","tier":"{api_key}","tier_lookup":true,"tiers":{"p":[{"algorithm":"fixed_window","limit":2,"window":"1s"}]},"limits":[{"algorithm":"fixed_window","limit":1,"window":"1s"}]}]}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		d, err := ParseDocument(doc)
		if err != nil {
			if !errors.Is(err, ErrInvalidRule) {
				t.Fatalf("error %v does not wrap ErrInvalidRule", err)
			}
			return
		}
		rules := d.Rules
		allow, deny, err := compileLists(&d.Lists)
		if err != nil {
			t.Fatalf("ParseDocument accepted lists that do not compile: %v", err)
		}
		ls := lists{allow: allow, deny: deny}
		ls.check(&Request{SourceIP: "10.0.0.1", APIKey: "k", Headers: Header{"x": "\x00"}, Query: Query{"k": "v"}})
		for i, r := range rules {
			c, err := compile(r, i)
			if err != nil {
				t.Fatalf("ParseDocument accepted a rule compile refuses: %v", err)
			}
			c.tierIndex(&Request{APIKey: "p", Headers: Header{"x-plan": "p"}}, Tiers{"p": "p"}.Lookup)
		}
		p, err := New(rules, Options{Stores: memStores(t), Leases: memLeases(t), Lists: d.Lists})
		if err != nil {
			if strings.Contains(err.Error(), "not configured") {
				return // a backend this test does not provide
			}
			t.Fatalf("Parse accepted rules that New refuses: %v", err)
		}
		req := &Request{SourceIP: "192.0.2.1", Method: "GET", Path: "/x", Headers: Header{"x": "\x00\xff"}}
		p.Evaluate(t.Context(), req, time.Unix(1e9, 0))
	})
}

func TestParsePriority(t *testing.T) {
	for s, want := range map[string]limiter.Priority{"low": limiter.PriorityLow, "": limiter.PriorityNormal, "1": limiter.PriorityHigh, "2": limiter.PriorityCritical, "-1": limiter.PriorityLow} {
		if got, err := parsePriority(s); err != nil || got != want {
			t.Errorf("parsePriority(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"3", "-2", "urgent", "1.5"} {
		if _, err := parsePriority(s); err == nil {
			t.Errorf("parsePriority(%q) succeeded", s)
		}
	}
}
