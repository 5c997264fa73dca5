package policy

import (
	"testing"
)

func TestCleanPath(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"/demo/hello", "/demo/hello"},
		{"/", "/"},
		{"/api/", "/api/"},
		{"//demo/hello", "/demo/hello"},
		{"/demo//hello//", "/demo/hello/"},
		{"/pets/..%2fdemo/hello", "/demo/hello"},
		{"/pets/..%2Fdemo/hello", "/demo/hello"},
		{"/pets/%2e%2e/demo/hello", "/demo/hello"},
		{"/pets/%2E%2E%2Fdemo%2Fhello", "/demo/hello"},
		{"/%64emo/hello", "/demo/hello"},
		{"/demo/./hello/.", "/demo/hello"},
		{"/../../demo/hello", "/demo/hello"},
		{"/demo/..", "/"},
		{"/pets/%252e%252e/demo", "/pets/%2e%2e/demo"}, // decoded once
		{"/a%zz/b%2", "/a%zz/b%2"},                     // invalid escapes stay
		{"/a%00b", "/a\x00b"},
		{"relative/../x", "relative/../x"}, // not a path an event carries
		{"", ""},
	} {
		if got := CleanPath(tt.in); got != tt.want {
			t.Errorf("CleanPath(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { CleanPath("/pets/42/photos/") }); n != 0 {
		t.Errorf("a clean path costs %v allocations", n)
	}
}

// TestPathEscapes: a path that a cleaning server serves as /demo/... is
// matched by a /demo/** rule however it is spelled, and keyed by {path}
// as one path; a path that only looks similar is not.
func TestPathEscapes(t *testing.T) {
	p, err := Load([]byte(`
rules:
  - name: demo
    key: "{path}"
    match: {paths: ["/demo/**"]}
    limits: [{algorithm: fixed_window, limit: 100, window: 1m}]
  - name: one-segment
    key: "x"
    match: {paths: ["/files/*"]}
    limits: [{algorithm: fixed_window, limit: 100, window: 1m}]
`), Options{Stores: memStores(t)})
	if err != nil {
		t.Fatal(err)
	}
	eval := func(path string) (rules []string, keys []string) {
		t.Helper()
		res := p.Evaluate(t.Context(), &Request{SourceIP: "192.0.2.1", Method: "GET", Path: path}, t0)
		for _, e := range res.Evals {
			rules = append(rules, e.Rule)
			keys = append(keys, e.Key)
		}
		return rules, keys
	}
	_, want := eval("/demo/hello")
	for _, path := range []string{
		"/demo/hello",
		"//demo/hello",
		"/pets/..%2fdemo/hello",
		"/pets/..%2Fdemo/hello",
		"/pets/%2e%2e/demo/hello",
		"/./demo/./hello",
		"/%64emo/hello",
	} {
		rules, keys := eval(path)
		if len(rules) != 1 || rules[0] != "demo" {
			t.Errorf("%s: matched %v, want the demo rule", path, rules)
			continue
		}
		if keys[0] != want[0] {
			t.Errorf("%s: key %q, want %q (the key of /demo/hello)", path, keys[0], want[0])
		}
	}
	for _, path := range []string{"/demos/hello", "/pets/demo/hello", "/pets/%252e%252e/demo/hello", "/pets/..%5cdemo/hello"} {
		if rules, _ := eval(path); len(rules) != 0 {
			t.Errorf("%s: matched %v, want no rule", path, rules)
		}
	}
	// Cleaning only adds matches: the raw path still matches its globs.
	if rules, _ := eval("/files/a%2fb"); len(rules) != 1 || rules[0] != "one-segment" {
		t.Errorf("/files/a%%2fb: matched %v, want one-segment", rules)
	}
}

// TestPathCase: paths are matched and keyed ignoring case by default, so
// that /DEMO/hello cannot escape a /demo/** rule in front of a server that
// routes ignoring case; a rule with match.case_sensitive keeps exact case.
func TestPathCase(t *testing.T) {
	p, err := Load([]byte(`
rules:
  - name: demo
    key: "{path}"
    match: {paths: ["/demo/**"]}
    limits: [{algorithm: fixed_window, limit: 2, window: 1m}]
  - name: exact
    key: "{path}"
    match: {paths: ["/Exact/*"], case_sensitive: true}
    limits: [{algorithm: fixed_window, limit: 100, window: 1m}]
  - name: classes
    key: "x"
    match: {paths: ["/v[0-9]/[A-Z]*"]}
    limits: [{algorithm: fixed_window, limit: 100, window: 1m}]
`), Options{Stores: memStores(t)})
	if err != nil {
		t.Fatal(err)
	}
	eval := func(path string) Result {
		t.Helper()
		return p.Evaluate(t.Context(), &Request{SourceIP: "192.0.2.1", Method: "GET", Path: path}, t0)
	}
	rulesOf := func(res Result) (rules []string) {
		for _, e := range res.Evals {
			rules = append(rules, e.Rule)
		}
		return rules
	}
	// The reviewer's sequence: /demo/hello exhausted, then other spellings.
	for i, path := range []string{"/demo/hello", "/demo/hello", "/DEMO/hello", "/Demo/hello", "/%44emo/HELLO", "//dEmO/hello"} {
		res := eval(path)
		if r := rulesOf(res); len(r) != 1 || r[0] != "demo" {
			t.Fatalf("%s: matched %v, want the demo rule", path, r)
		}
		if want := i < 2; (res.Outcome == Allow) != want {
			t.Errorf("call %d %s: %v, want allowed %v (one key for every spelling)", i, path, res.Outcome, want)
		}
		if res.Evals[0].Key != "demo:%2Fdemo%2Fhello" {
			t.Errorf("%s: key %q", path, res.Evals[0].Key)
		}
	}
	for path, want := range map[string]bool{"/Exact/a": true, "/exact/a": false, "/EXACT/a": false} {
		res := eval(path)
		if got := len(res.Evals) == 1 && res.Evals[0].Rule == "exact"; got != want {
			t.Errorf("%s: matched %v, want exact %v", path, rulesOf(res), want)
		}
		if want && res.Evals[0].Key != "exact:%2FExact%2Fa" {
			t.Errorf("%s: key %q, want exact case", path, res.Evals[0].Key)
		}
	}
	for path, want := range map[string]bool{"/v1/Users": true, "/V1/users": true, "/vx/users": false} {
		if got := len(eval(path).Evals) == 1; got != want {
			t.Errorf("%s: matched %v, want classes %v", path, got, want)
		}
	}
	// A folding match costs no allocation on a lower-case clean path.
	r := p.rules[0]
	if n := testing.AllocsPerRun(100, func() { r.matches(&Request{Path: "/demo/hello/world"}) }); n != 0 {
		t.Errorf("matching a lower-case path costs %v allocations", n)
	}
}
