package authz

import (
	"errors"
	"fmt"
	"testing"
)

// TestHTTPNamedStage: an HTTP API on a named stage carries the stage in
// rawPath and requestContext.http.path; it is removed as REST events do, so
// a rule on /demo/** applies on both APIs. On a custom domain the path has
// no stage and is kept.
func TestHTTPNamedStage(t *testing.T) {
	const ev = `{"version":"2.0","type":"REQUEST","routeArn":"arn:aws:execute-api:r:1:abcdef123/%[1]s/GET/demo/hello","rawPath":%[2]q,
"requestContext":{"stage":%[1]q,"domainName":%[3]q,"http":{"method":"GET","path":%[2]q,"sourceIp":"192.0.2.1"}}}`
	const execute = "abcdef123.execute-api.us-east-1.amazonaws.com"
	for _, tt := range []struct{ stage, path, domain, want string }{
		{"prod", "/prod/demo/hello", execute, "/demo/hello"},
		{"prod", "/prod/demo/hello", "", "/demo/hello"},
		{"prod", "/prod", execute, "/"},
		{"prod", "/prod/", execute, "/"},
		{"prod", "/production/x", execute, "/production/x"},
		{"prod", "/demo/hello", execute, "/demo/hello"},
		{"prod", "/prod/demo/hello", "api.example.com", "/prod/demo/hello"},
		{"$default", "/$default/x", execute, "/$default/x"},
		{"$default", "/demo/hello", execute, "/demo/hello"},
	} {
		e, err := DecodeEvent(fmt.Appendf(nil, ev, tt.stage, tt.path, tt.domain))
		if err != nil {
			t.Fatalf("%+v: %v", tt, err)
		}
		if e.Request.Path != tt.want {
			t.Errorf("stage %q path %q on %q: %q, want %q", tt.stage, tt.path, tt.domain, e.Request.Path, tt.want)
		}
	}
	// The reviewer's case: the embedded demo rule (3 a minute) applies on
	// a named stage and denies the fourth request.
	h := newTestHandler(t, string(DefaultRules), nil)
	for i := range 4 {
		resp, _, err := h.Decide(t.Context(), fmt.Appendf(nil, ev, "prod", "/prod/demo/hello", execute))
		if err != nil {
			t.Fatal(err)
		}
		if c := resp.AuthContext(); c.Rule != "demo" || resp.Allowed() != (i < 3) {
			t.Errorf("request %d: allowed %v, %+v; want the demo rule to allow 3", i+1, resp.Allowed(), c)
		}
	}
}

// TestBlankTokens: a token or Authorization header of whitespace only, or
// the Bearer scheme without a credential, is no token: a TOKEN event is
// refused (401), a rule keyed by {token} with skip_if_missing does not
// apply, and require: [token] refuses the request.
func TestBlankTokens(t *testing.T) {
	for _, tok := range []string{"   ", "\t", "Bearer", "bearer   ", " Bearer \t"} {
		token := fmt.Appendf(nil, `{"type":"TOKEN","authorizationToken":%q,"methodArn":"arn:aws:execute-api:r:1:a/prod/GET/x"}`, tok)
		if _, err := DecodeEvent(token); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("TOKEN %q: %v, want Unauthorized", tok, err)
		}
		rest := fmt.Appendf(nil, `{"type":"REQUEST","methodArn":"arn:aws:execute-api:r:1:a/prod/GET/x","httpMethod":"GET","path":"/x",
"headers":{"Authorization":%q},"requestContext":{"identity":{"sourceIp":"192.0.2.1"}}}`, tok)
		h := newTestHandler(t, oneRule, nil)
		_, res, err := h.Decide(t.Context(), rest)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Evals) != 1 || res.Evals[0].Rule != "per-ip" {
			t.Errorf("Authorization %q: rules %+v, want per-ip only (no token)", tok, res.Evals)
		}
		req := newTestHandler(t, `
rules:
  - name: need-token
    key: "{token}"
    require: [token]
    limits: [{algorithm: fixed_window, limit: 10, window: 1m}]
`, nil)
		if _, _, err := req.Decide(t.Context(), rest); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("Authorization %q with require [token]: %v, want Unauthorized", tok, err)
		}
	}
	// A real token keeps its key whatever whitespace surrounds it.
	h := newTestHandler(t, oneRule, nil)
	var keys []string
	for _, tok := range []string{"Bearer abc", "  Bearer abc\t"} {
		_, res, err := h.Decide(t.Context(), fmt.Appendf(nil, `{"type":"REQUEST","methodArn":"arn:aws:execute-api:r:1:a/prod/GET/x","httpMethod":"GET","path":"/x",
"headers":{"Authorization":%q},"requestContext":{"identity":{"sourceIp":"192.0.2.1"}}}`, tok))
		if err != nil || len(res.Evals) != 2 {
			t.Fatalf("%q: %v %+v", tok, err, res.Evals)
		}
		keys = append(keys, res.Evals[1].Key)
	}
	if keys[0] != keys[1] {
		t.Errorf("keys %q differ", keys)
	}
}
