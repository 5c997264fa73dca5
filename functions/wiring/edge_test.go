package wiring

import (
	"fmt"
	"testing"
)

// TestEdgeClientIP: SLUICE_CLIENT_IP=cloudfront-viewer-address and
// SLUICE_EDGE_SECRET reach the handler: a request through CloudFront (it
// carries the secret) is keyed by its CloudFront-Viewer-Address, any other
// by its source IP.
func TestEdgeClientIP(t *testing.T) {
	const secret = "0123456789abcdef-edge"
	b, _ := buildEnv(t, map[string]string{
		"SLUICE_CLIENT_IP":   "cloudfront-viewer-address",
		"SLUICE_EDGE_SECRET": secret,
		"SLUICE_RULES_YAML":  `rules: [{name: per-ip, key: "{ip}", limits: [{algorithm: fixed_window, limit: 10, window: 1m}]}]`,
	})
	event := func(secretHeader string) []byte {
		return fmt.Appendf(nil, `{"type":"REQUEST","methodArn":"arn:aws:execute-api:us-east-1:1:api/prod/GET/x","httpMethod":"GET","path":"/x",
			"headers":{"CloudFront-Viewer-Address":"203.0.113.7:50123","X-Sluice-Edge-Secret":%q},
			"requestContext":{"stage":"prod","identity":{"sourceIp":"130.176.0.1"}}}`, secretHeader)
	}
	for _, tt := range []struct{ secret, key string }{
		{secret, "per-ip:203.0.113.7"},
		{"forged", "per-ip:130.176.0.1"},
	} {
		_, res, err := b.Handler.Decide(t.Context(), event(tt.secret))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Evals) != 1 || res.Evals[0].Key != tt.key {
			t.Errorf("secret %q: evals %+v, want the key %s", tt.secret, res.Evals, tt.key)
		}
	}
}
