package main

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

const operatorRules = `
deny:
  cidrs: ["127.0.0.0/8"]
  keys: {"header:X-Client-Id": [scraper]}
allow:
  keys: {"header:X-Client-Id": [health-checker]}
rules:
  - name: per-key
    key: "{header:X-Client-Id}"
    tier: "{header:X-Plan}"
    limits: [{algorithm: fixed_window, limit: 2, window: 1m}]
    tiers:
      pro: [{algorithm: fixed_window, limit: 5, window: 1m}]
  - name: trial
    key: "{header:X-Client-Id}"
    shadow: true
    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]
`

// startRulesServer serves rules through the local API on a counting store;
// denyLocal keeps the deny list's 127.0.0.0/8 (the test client's address)
// or drops it.
func startRulesServer(t *testing.T, kind string, denyLocal bool) (*httptest.Server, *limitertest.CountingStore, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store := limitertest.NewCountingStore(mem)
	rules := operatorRules
	if !denyLocal {
		rules = strings.Replace(rules, `cidrs: ["127.0.0.0/8"]`, `cidrs: ["203.0.113.0/24"]`, 1)
	}
	p, err := policy.Load([]byte(rules), policy.Options{Stores: map[string]storage.Store{"memory": store}})
	if err != nil {
		t.Fatal(err)
	}
	var metrics, logs bytes.Buffer
	h, err := authz.New(authz.Config{Policy: p, Clock: limiter.ClockFunc(func() time.Time { return now }),
		Metrics: authz.NewMetrics(&metrics, ""), Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(newServer(h, kind, "local", nil))
	t.Cleanup(ts.Close)
	return ts, store, &metrics, &logs
}

func codeOf(t *testing.T, url string, header ...string) (int, map[string]any) {
	t.Helper()
	resp, body := get(t, url, header...)
	return resp.StatusCode, body
}

// TestDenyListThroughLocalAPI: a deny-listed client gets 429 from the REST
// API (API Gateway's ACCESS_DENIED gateway response, which the infra maps
// to 429 for every Deny: a Lambda authorizer cannot choose another status
// per request) and 403 from an HTTP API (its fixed answer to a Deny), with
// reason deny_list, and the store gets no request at all.
func TestDenyListThroughLocalAPI(t *testing.T) {
	for _, tt := range []struct {
		kind string
		code int
	}{{kindREST, http.StatusTooManyRequests}, {kindHTTP, http.StatusForbidden}} {
		ts, store, metrics, _ := startRulesServer(t, tt.kind, true)
		for i := range 20 {
			code, body := codeOf(t, ts.URL+"/pets/1", "X-Client-Id", "someone")
			if code != tt.code {
				t.Fatalf("%s request %d: %d %v, want %d", tt.kind, i+1, code, body, tt.code)
			}
			if tt.kind == kindREST && (body["reason"] != "deny_list" || body["retryAfter"] != "3600") {
				t.Errorf("429 body %v", body)
			}
		}
		if n := store.Calls(); n != 0 {
			t.Errorf("%s: %d store requests for deny-listed requests, want 0", tt.kind, n)
		}
		if c := strings.Count(metrics.String(), `"DenyListed":1`); c != 20 {
			t.Errorf("%s: DenyListed counted %d times, want 20", tt.kind, c)
		}
	}
	// A deny-listed key, from an address that is not listed.
	ts, store, _, _ := startRulesServer(t, kindREST, false)
	if code, body := codeOf(t, ts.URL+"/pets/1", "X-Client-Id", "scraper"); code != http.StatusTooManyRequests || body["reason"] != "deny_list" {
		t.Errorf("deny-listed key: %d %v", code, body)
	}
	if n := store.Calls(); n != 0 {
		t.Errorf("%d store requests for a deny-listed key", n)
	}
	// The counter does count: an unlisted client reaches the store.
	if code, _ := codeOf(t, ts.URL+"/pets/1", "X-Client-Id", "someone"); code != http.StatusOK || store.Calls() == 0 {
		t.Errorf("unlisted client: %d, %d store requests", code, store.Calls())
	}
}

// TestAllowTiersShadowThroughLocalAPI: an allow-listed client is never
// limited (and costs no store request); a pro client gets the pro tier's 5
// a minute and a free client the default 2; the shadow rule (1 a minute)
// never denies, and its would-be denials are counted and logged.
func TestAllowTiersShadowThroughLocalAPI(t *testing.T) {
	ts, store, metrics, logs := startRulesServer(t, kindREST, false)
	for i := range 50 {
		if code, body := codeOf(t, ts.URL+"/pets/1", "X-Client-Id", "health-checker"); code != http.StatusOK {
			t.Fatalf("allow-listed request %d: %d %v", i+1, code, body)
		}
	}
	if n := store.Calls(); n != 0 {
		t.Errorf("%d store requests for allow-listed requests", n)
	}
	served := func(client, plan string) int {
		n := 0
		for range 8 {
			h := []string{"X-Client-Id", client}
			if plan != "" {
				h = append(h, "X-Plan", plan)
			}
			if code, _ := codeOf(t, ts.URL+"/pets/1", h...); code == http.StatusOK {
				n++
			}
		}
		return n
	}
	if pro, free := served("acme", "pro"), served("smallco", ""); pro != 5 || free != 2 {
		t.Errorf("served: pro client %d (want 5), free client %d (want 2)", pro, free)
	}
	// The shadow rule's limit of 1 a minute would have denied each
	// client's requests from the second on, as long as it was checked:
	// acme's 2nd-6th (the 6th is the one the pro limit denies; the later
	// ones are denied from the deny cache, nothing else checked), smallco's
	// 2nd-3rd. None was denied by it (acme got 5), and each is counted and
	// logged.
	if c := strings.Count(metrics.String(), `"Rule":"trial","Allowed":1,"Denied":0,"Shed":0,"FailOpen":0,"FailClosed":0,"BackendErrors":0,"ShedErrors":0,"CacheDenied":0,"Throttled":0,"Leased":0,"ShadowDenied":1,"DenyListed":0,"AllowListed":0,"LeaseTakes":0`); c != 7 {
		t.Errorf("ShadowDenied counted %d times, want 7", c)
	}
	if c := strings.Count(logs.String(), `"msg":"would deny","rule":"trial"`); c != 7 {
		t.Errorf("%d would-deny log lines, want 7", c)
	}
	if strings.Contains(metrics.String(), `"Rule":"trial","Allowed":0`) {
		t.Error("the shadow rule denied a request")
	}
}
