package authz

import (
	"encoding/json"
	"strings"
	"testing"
)

// edgeEvents builds the events of a request that reached API Gateway from
// a CloudFront server (130.176.0.1) with the given headers, one per event
// kind that carries headers.
func edgeEvents(t *testing.T, headers map[string]string) map[string][]byte {
	t.Helper()
	h, _ := json.Marshal(headers)
	lower := map[string]string{}
	for k, v := range headers {
		lower[strings.ToLower(k)] = v
	}
	l, _ := json.Marshal(lower)
	return map[string][]byte{
		"REST REQUEST": []byte(`{"type":"REQUEST","methodArn":"arn:aws:execute-api:r:1:a/prod/GET/x","httpMethod":"GET","path":"/x","headers":` + string(h) +
			`,"requestContext":{"identity":{"sourceIp":"130.176.0.1"}}}`),
		"HTTP 1.0": []byte(`{"version":"1.0","type":"REQUEST","methodArn":"arn:aws:execute-api:r:1:a/prod/GET/x","httpMethod":"GET","path":"/x","headers":` + string(h) +
			`,"requestContext":{"identity":{"sourceIp":"130.176.0.1"}}}`),
		"HTTP 2.0": []byte(`{"version":"2.0","type":"REQUEST","routeArn":"arn:aws:execute-api:r:1:a/$default/GET/x","headers":` + string(l) +
			`,"requestContext":{"http":{"method":"GET","path":"/x","sourceIp":"130.176.0.1"}}}`),
	}
}

const ipRule = `
rules:
  - name: per-ip
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 100, window: 1m}]
`

// TestViewerAddress: behind the CloudFront edge, with ClientIP
// ClientIPViewerAddress, a request that carries the edge secret is keyed
// by the viewer's address; one that does not (it reached the API
// directly, and its CloudFront-Viewer-Address is the caller's to forge) or
// whose header is unusable is keyed by its source IP; with the option off
// the header is ignored.
func TestViewerAddress(t *testing.T) {
	on := newTestHandler(t, ipRule, func(c *Config) { c.ClientIP, c.EdgeSecret = ClientIPViewerAddress, "s3cret" })
	off := newTestHandler(t, ipRule, nil)
	tests := []struct {
		name    string
		h       *testHandler
		headers map[string]string
		wantKey string // the rendered key: "per-ip:" and the address (IPv6 by /64, escaped)
	}{
		{"ipv4", on, map[string]string{"CloudFront-Viewer-Address": "203.0.113.7:46532", "X-Sluice-Edge-Secret": "s3cret"}, "203.0.113.7"},
		{"ipv6 unbracketed, grouped by /64", on, map[string]string{"CloudFront-Viewer-Address": "2001:db8:1:2:3:4:5:6:443", "X-Sluice-Edge-Secret": "s3cret"}, "2001%3Adb8%3A1%3A2%3A%3A%2F64"},
		{"ipv6 bracketed", on, map[string]string{"CloudFront-Viewer-Address": "[2001:db8::9]:443", "X-Sluice-Edge-Secret": "s3cret"}, "2001%3Adb8%3A%3A%2F64"},
		{"ipv4-mapped", on, map[string]string{"CloudFront-Viewer-Address": "::ffff:203.0.113.8:443", "X-Sluice-Edge-Secret": "s3cret"}, "203.0.113.8"},
		{"no secret: forged", on, map[string]string{"CloudFront-Viewer-Address": "203.0.113.7:46532"}, "130.176.0.1"},
		{"wrong secret: forged", on, map[string]string{"CloudFront-Viewer-Address": "203.0.113.7:46532", "X-Sluice-Edge-Secret": "guess"}, "130.176.0.1"},
		{"no viewer header", on, map[string]string{"X-Sluice-Edge-Secret": "s3cret"}, "130.176.0.1"},
		{"no port", on, map[string]string{"CloudFront-Viewer-Address": "203.0.113.7", "X-Sluice-Edge-Secret": "s3cret"}, "130.176.0.1"},
		{"not an address", on, map[string]string{"CloudFront-Viewer-Address": "evil.example:443", "X-Sluice-Edge-Secret": "s3cret"}, "130.176.0.1"},
		{"two values", on, map[string]string{"CloudFront-Viewer-Address": "203.0.113.7:1,198.51.100.1:2", "X-Sluice-Edge-Secret": "s3cret"}, "130.176.0.1"},
		{"zone", on, map[string]string{"CloudFront-Viewer-Address": "[fe80::1%eth0]:443", "X-Sluice-Edge-Secret": "s3cret"}, "130.176.0.1"},
		{"option off", off, map[string]string{"CloudFront-Viewer-Address": "203.0.113.7:46532", "X-Sluice-Edge-Secret": "s3cret"}, "130.176.0.1"},
	}
	for _, tt := range tests {
		for kind, ev := range edgeEvents(t, tt.headers) {
			_, res, err := tt.h.Decide(t.Context(), ev)
			if err != nil {
				t.Fatalf("%s, %s: %v", tt.name, kind, err)
			}
			if len(res.Evals) != 1 || res.Evals[0].Key != "per-ip:"+tt.wantKey {
				t.Errorf("%s, %s: evals %+v, want the key per-ip:%s", tt.name, kind, res.Evals, tt.wantKey)
			}
		}
	}
	if !strings.Contains(on.logs.String(), "carries no valid CloudFront-Viewer-Address") {
		t.Errorf("no warning about a missing viewer address:\n%s", on.logs.String())
	}
	if strings.Count(on.logs.String(), "carries no valid CloudFront-Viewer-Address") != 1 {
		t.Errorf("the warning is logged more than once")
	}
}

// TestViewerAddressTOKEN: TOKEN events carry no address and no headers;
// the option changes nothing for them.
func TestViewerAddressTOKEN(t *testing.T) {
	h := newTestHandler(t, oneRule, func(c *Config) { c.ClientIP, c.EdgeSecret = ClientIPViewerAddress, "s3cret" })
	_, res, err := h.Decide(t.Context(), readEvent(t, "rest-token"))
	if err != nil || len(res.Evals) != 1 || res.Evals[0].Rule != "per-token" {
		t.Fatalf("%+v, %v", res.Evals, err)
	}
}

func TestClientIPConfig(t *testing.T) {
	p := newTestHandler(t, oneRule, nil).cfg.Policy
	for _, cfg := range []Config{
		{Policy: p, ClientIP: ClientIPViewerAddress},
		{Policy: p, ClientIP: "x-forwarded-for"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(ClientIP %q, EdgeSecret %q) accepted", cfg.ClientIP, cfg.EdgeSecret)
		}
	}
}
