package authz

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/lambdawrap"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

const reasonRules = `
deny:
  cidrs: ["203.0.113.0/24"]
allow:
  keys: {"header:X-Internal": [health-checker]}
rules:
  - name: per-ip
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 3, window: 1m}]
  - name: trial
    key: "{ip}"
    shadow: true
    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]
`

// TestReasons: the reason is in the response context, the decision log
// line and the metric lines; shadow denials, deny and allow lists are
// counted (ShadowDenied, DenyListed, AllowListed) and logged.
func TestReasons(t *testing.T) {
	h := newTestHandler(t, reasonRules, nil)
	ev := readEvent(t, "rest-request")
	var last Response
	for range 2 {
		resp, _, err := h.Decide(t.Context(), ev)
		if err != nil {
			t.Fatal(err)
		}
		last = resp
	}
	if c := last.AuthContext(); !last.Allowed() || c.Reason != "limit" || c.Rule != "per-ip" {
		t.Errorf("second request: allowed %v, context %+v (the shadow rule's limit of 1 must not deny)", last.Allowed(), c)
	}
	if !strings.Contains(h.metrics.String(), `"Rule":"trial","Allowed":1,`) || !strings.Contains(h.metrics.String(), `"ShadowDenied":1`) {
		t.Errorf("metrics: %s", h.metrics.String())
	}
	if !strings.Contains(h.logs.String(), `"msg":"would deny","rule":"trial"`) || !strings.Contains(h.logs.String(), `"reason":"limit"`) {
		t.Errorf("logs: %s", h.logs.String())
	}

	h.metrics.Reset()
	h.logs.Reset()
	resp, _, err := h.Decide(t.Context(), readEvent(t, "rest-request-deny-listed"))
	if err != nil {
		t.Fatal(err)
	}
	if c := resp.AuthContext(); resp.Allowed() || c.Reason != "deny_list" || c.Decision != DecisionDeny || c.RetryAfter != 3600 {
		t.Errorf("deny-listed: %+v", c)
	}
	if !strings.Contains(h.metrics.String(), `"Rule":"(none)","Allowed":0,"Denied":1`) || !strings.Contains(h.metrics.String(), `"DenyListed":1`) || !strings.Contains(h.metrics.String(), `"Reason":"deny_list"`) {
		t.Errorf("metrics: %s", h.metrics.String())
	}
	if !strings.Contains(h.logs.String(), `"reason":"deny_list"`) || !strings.Contains(h.logs.String(), `"list_match":"cidr"`) || strings.Contains(h.logs.String(), "203.0.113") {
		t.Errorf("logs (no raw address): %s", h.logs.String())
	}

	h.metrics.Reset()
	allowEv := strings.Replace(string(ev), `"headers": {`, `"headers": {"X-Internal": "health-checker",`, 1)
	for range 10 {
		resp, _, err = h.Decide(t.Context(), []byte(allowEv))
		if err != nil || !resp.Allowed() || resp.AuthContext().Reason != "allow_list" {
			t.Fatalf("allow-listed: %+v, %v", resp, err)
		}
	}
	if strings.Count(h.metrics.String(), `"AllowListed":1`) != 10 {
		t.Errorf("metrics: %s", h.metrics.String())
	}
}

// TestLeaseInContext: a rule's concurrency lease goes into the context
// under lambdawrap.LeaseContextKey, for the integration to release.
func TestLeaseInContext(t *testing.T) {
	leases, err := memory.NewLeases(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	mem, _ := memory.New(memory.Config{})
	p, err := policy.Load([]byte(`
rules:
  - name: in-flight
    key: "{ip}"
    concurrency: {limit: 1}
    limits: [{algorithm: fixed_window, limit: 100, window: 1m}]
`), policy.Options{Stores: map[string]storage.Store{"memory": mem}, Leases: leases})
	if err != nil {
		t.Fatal(err)
	}
	h := newTestHandler(t, oneRule, func(c *Config) { c.Policy = p })
	resp, _, err := h.Decide(t.Context(), readEvent(t, "rest-request"))
	if err != nil {
		t.Fatal(err)
	}
	b := string(resp.AppendJSON(nil))
	if !strings.Contains(b, `"`+lambdawrap.LeaseContextKey+`":"in-flight.concurrency@`) {
		t.Fatalf("no lease in the context: %s", b)
	}
	got := lambdawrap.LeasesFromContext(map[string]any{lambdawrap.LeaseContextKey: resp.AuthContext().Leases})
	if len(got) != 1 || got[0].Limit != "in-flight.concurrency" {
		t.Fatalf("leases %+v", got)
	}
	// The second request is over the limit: denied, no lease.
	resp, _, _ = h.Decide(t.Context(), readEvent(t, "rest-request"))
	if resp.Allowed() || resp.AuthContext().Leases != "" || resp.AuthContext().Reason != "limit" {
		t.Errorf("second request: %+v", resp.AuthContext())
	}
	// Released by the integration: a slot again.
	if err := lambdawrap.NewStoreReleaser(leases).ReleaseNamed(t.Context(), got[0]); err != nil {
		t.Fatal(err)
	}
	if resp, _, _ = h.Decide(t.Context(), readEvent(t, "rest-request")); !resp.Allowed() {
		t.Errorf("after the release: %+v", resp.AuthContext())
	}
}
