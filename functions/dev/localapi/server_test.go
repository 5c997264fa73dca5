package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/functions/wiring"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// now is the frozen clock of these tests: 20 s into a minute.
var now = time.Date(2026, 1, 2, 3, 4, 20, 0, time.UTC)

func startServer(t *testing.T, rules, kind string, shedder limiter.Shedder) *httptest.Server {
	t.Helper()
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load([]byte(rules), policy.Options{Stores: map[string]storage.Store{"memory": mem}, Shedder: shedder})
	if err != nil {
		t.Fatal(err)
	}
	h, err := authz.New(authz.Config{Policy: p, Clock: limiter.ClockFunc(func() time.Time { return now })})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(newServer(h, kind, "local", nil))
	t.Cleanup(ts.Close)
	return ts
}

func get(t *testing.T, url string, header ...string) (*http.Response, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	return resp, body
}

// TestNPlusOne: against a rule of N per window, N requests pass and the
// next gets 429 with the right Retry-After and RateLimit headers.
func TestNPlusOne(t *testing.T) {
	for _, tt := range []struct {
		algorithm string
		retry     int // seconds
	}{
		{"fixed_window", 40},   // the window ends at the next minute
		{"sliding_window", 64}, // bounded: the 6 s sub-window [3:04:18, 3:04:24) counts in full until all of it left the window, at 3:05:24
		{"sliding_log", 60},    // the first request leaves the log a minute after it
		{"token_bucket", 60},   // one token per 60 s
	} {
		t.Run(tt.algorithm, func(t *testing.T) {
			const n = 5
			limit := fmt.Sprintf("{algorithm: %s, limit: %d, window: 1m}", tt.algorithm, n)
			if tt.algorithm == "token_bucket" {
				limit = fmt.Sprintf("{algorithm: token_bucket, max_amount: %d, refill_time: 1m}", n)
			}
			if tt.algorithm == "sliding_window" {
				limit = fmt.Sprintf("{algorithm: sliding_window, limit: %d, window: 1m, sub_windows: 10}", n)
			}
			ts := startServer(t, `rules: [{name: per-ip, key: "{ip}", limits: [`+limit+`]}]`, kindREST, nil)
			window := 60 // w: the window, or the time a bucket takes to refill from empty
			if tt.algorithm == "token_bucket" {
				window = n * 60
			}
			for i := 1; i <= n; i++ {
				resp, body := get(t, ts.URL+"/pets/42")
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: %d %v", i, resp.StatusCode, body)
				}
				if got, want := resp.Header.Get("RateLimit"), fmt.Sprintf(`"per-ip/0";r=%d;t=`, n-i); !strings.HasPrefix(got, want) {
					t.Errorf("request %d: RateLimit %q, want %s...", i, got, want)
				}
				if got := resp.Header.Get("RateLimit-Remaining"); got != "" {
					t.Errorf("request %d: RateLimit-Remaining %q without -legacy-ratelimit-headers", i, got)
				}
				if body["path"] != "/pets/42" {
					t.Errorf("request %d: upstream saw %v", i, body)
				}
			}
			resp, body := get(t, ts.URL+"/pets/42")
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("request %d: %d %v, want 429", n+1, resp.StatusCode, body)
			}
			want := map[string]string{
				"Retry-After":      strconv.Itoa(tt.retry),
				"RateLimit-Policy": fmt.Sprintf(`"per-ip/0";q=%d;w=%d`, n, window),
				"Cache-Control":    "no-store",
				"Content-Type":     "application/json",
			}
			for k, v := range want {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
			rl := resp.Header.Get("RateLimit")
			reset, err := strconv.Atoi(strings.TrimPrefix(rl, `"per-ip/0";r=0;t=`))
			if err != nil || reset < tt.retry {
				t.Errorf("RateLimit %q: want r=0 and t no earlier than Retry-After %d (the draft's section 6)", rl, tt.retry)
			}
			if body["message"] != "Too Many Requests" || body["rule"] != "per-ip" || body["retryAfter"] != strconv.Itoa(tt.retry) {
				t.Errorf("429 body %v", body)
			}
		})
	}
}

// TestLegacyRateLimitHeaders: with -legacy-ratelimit-headers the earlier
// drafts' three fields come beside the current two.
func TestLegacyRateLimitHeaders(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		ts := startServer(t, `rules: [{name: r, key: "{ip}", limits: [{algorithm: fixed_window, limit: 1, window: 1m}]}]`, kindREST, nil)
		ts.Config.Handler.(*server).legacyHeaders = legacy
		for i, code := range []int{http.StatusOK, http.StatusTooManyRequests} {
			resp, _ := get(t, ts.URL+"/x")
			if resp.StatusCode != code {
				t.Fatalf("request %d: %d", i+1, resp.StatusCode)
			}
			if resp.Header.Get("RateLimit-Policy") != `"r/0";q=1;w=60` || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"r/0";r=0;t=`) {
				t.Errorf("request %d: %v", i+1, resp.Header)
			}
			got := []string{resp.Header.Get("RateLimit-Limit"), resp.Header.Get("RateLimit-Remaining"), resp.Header.Get("RateLimit-Reset")}
			if want := [3]bool{legacy, legacy, legacy}; (got[0] != "") != want[0] || (got[1] != "") != want[1] || (got[2] != "") != want[2] {
				t.Errorf("legacy %v, request %d: RateLimit-Limit/-Remaining/-Reset %q", legacy, i+1, got)
			}
			if legacy && (got[0] != "1" || got[1] != "0") {
				t.Errorf("legacy fields %q", got)
			}
		}
	}
}

func TestHTTPAPIDenialIs403(t *testing.T) {
	ts := startServer(t, `rules: [{name: r, key: "{ip}", limits: [{algorithm: fixed_window, limit: 1, window: 1m}]}]`, kindHTTP, nil)
	if resp, body := get(t, ts.URL+"/x"); resp.StatusCode != http.StatusOK {
		t.Fatalf("first: %d %v", resp.StatusCode, body)
	}
	resp, body := get(t, ts.URL+"/x")
	if resp.StatusCode != http.StatusForbidden || body["message"] != "Forbidden" || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("second: %d %v %v", resp.StatusCode, body, resp.Header)
	}
}

func TestTokenAuthorizer(t *testing.T) {
	ts := startServer(t, `rules: [{name: per-token, key: "{token}", limits: [{algorithm: fixed_window, limit: 1, window: 1m}]}]`, kindToken, nil)
	if resp, _ := get(t, ts.URL+"/x"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %d, want 401", resp.StatusCode)
	}
	if resp, body := get(t, ts.URL+"/x", "Authorization", "Bearer a"); resp.StatusCode != http.StatusOK {
		t.Fatalf("token a: %d %v", resp.StatusCode, body)
	}
	if resp, _ := get(t, ts.URL+"/x", "Authorization", "Bearer a"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("token a again: %d", resp.StatusCode)
	}
	if resp, _ := get(t, ts.URL+"/x", "Authorization", "Bearer b"); resp.StatusCode != http.StatusOK {
		t.Fatalf("token b: %d", resp.StatusCode)
	}
}

type shedAll struct{}

func (shedAll) Check(context.Context, limiter.Priority, time.Time) (limiter.Decision, error) {
	return limiter.Decision{RetryAfter: 1500 * time.Millisecond}, nil
}

func TestShedIs503(t *testing.T) {
	ts := startServer(t, `rules: [{name: r, key: "{ip}", limits: [{algorithm: fixed_window, limit: 9, window: 1m}]}]`, kindREST, shedAll{})
	resp, body := get(t, ts.URL+"/x")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "2" || body["decision"] != "shed" {
		t.Fatalf("%d %v %v", resp.StatusCode, resp.Header, body)
	}
}

// TestFleetShedderIs503 builds the handler as `make run` does, from
// SLUICE_SHED_* variables (with the fleet's leases in a memory store, which
// only tests may use), and saturates the fleet: non-critical requests past
// the share get 503 with Retry-After, critical ones keep getting 200.
func TestFleetShedderIs503(t *testing.T) {
	for _, kind := range []string{kindREST, kindHTTP} {
		t.Run(kind, func(t *testing.T) {
			vars := map[string]string{
				"SLUICE_RULES_YAML": `
rules:
  - {name: health, match: {paths: ["/health"]}, priority: critical, key: "{ip}", limits: [{algorithm: fixed_window, limit: 1000, window: 1m}]}
  - {name: api, key: "{ip}", limits: [{algorithm: fixed_window, limit: 1000, window: 1m}]}
`,
				"SLUICE_SHED_FLEET_CAPACITY": "4",
				"SLUICE_SHED_FLEET_RESERVE":  "0.5",
			}
			env, err := wiring.ParseEnv(func(k string) string { return vars[k] })
			if err != nil {
				t.Fatal(err)
			}
			leases, err := memory.NewLeases(memory.Config{})
			if err != nil {
				t.Fatal(err)
			}
			built, err := wiring.Build(t.Context(), env, wiring.Outputs{Stdout: io.Discard, Stderr: io.Discard, ShedStore: leases,
				Clock: limiter.ClockFunc(func() time.Time { return now })})
			if err != nil {
				t.Fatal(err)
			}
			defer built.Close()
			ts := httptest.NewServer(newServer(built.Handler, kind, "local", nil))
			defer ts.Close()
			for i := range 2 {
				if resp, _ := get(t, ts.URL+"/api"); resp.StatusCode != http.StatusOK {
					t.Fatalf("non-critical request %d: %d", i+1, resp.StatusCode)
				}
			}
			resp, body := get(t, ts.URL+"/api")
			switch kind {
			case kindREST:
				if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || body["decision"] != "shed" {
					t.Errorf("past the share: %d %v %v, want 503", resp.StatusCode, resp.Header, body)
				}
			case kindHTTP:
				if resp.StatusCode != http.StatusInternalServerError {
					t.Errorf("past the share on an HTTP API: %d %v, want 500", resp.StatusCode, body)
				}
			}
			for range 5 {
				if resp, _ := get(t, ts.URL+"/health"); resp.StatusCode != http.StatusOK {
					t.Fatalf("critical request: %d", resp.StatusCode)
				}
			}
		})
	}
}

func TestUpstreamSeesDecision(t *testing.T) {
	ts := startServer(t, `rules: [{name: r, key: "{ip}", limits: [{algorithm: fixed_window, limit: 9, window: 1m}]}]`, kindREST, nil)
	_, body := get(t, ts.URL+"/x?a=1", "Authorization", "secret")
	h := body["headers"].(map[string]any)
	if h["X-Sluice-Rule"] != "r" || h["X-Sluice-Remaining"] != "8" || h["Authorization"] != "[redacted]" {
		t.Fatalf("upstream headers %v", h)
	}
}

func TestRunFlags(t *testing.T) {
	var out, errb bytes.Buffer
	for _, args := range [][]string{{"-event", "soap"}, {"-upstream", "not a url"}, {"extra"}, {"-rules", "/does/not/exist"}} {
		if err := run(args, &out, &errb); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
	if err := run([]string{"-rules", "/does/not/exist"}, &out, &errb); err == nil || !strings.HasPrefix(err.Error(), "-rules: ") || !strings.Contains(err.Error(), "/does/not/exist") {
		t.Errorf("missing rules file: %v, want it named by -rules", err)
	}
	if err := run([]string{"-h"}, &out, &errb); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp (main exits 0 on it)", err)
	}
}

// TestRunNamesFlags: a backend that is asked for but not configured is
// refused with the flags that configure it, not only the variables. The
// first case is the README's DynamoDB command before it gained
// -dynamo-table.
func TestRunNamesFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-backend", "dynamo", "-dynamo-endpoint", "http://127.0.0.1:1"}, "needs -dynamo-table NAME"},
		{[]string{"-backend", "dynamo"}, "-backend dynamo: DynamoDB is not configured: add -dynamo-table NAME, and -dynamo-endpoint URL"},
		{[]string{"-backend", "memcached"}, "-backend memcached: memcached is not configured: add -memcached HOST:PORT"},
		// A bad value is named by the flag that gave it, not its variable.
		{[]string{"-backend", "mongo"}, `-backend: "mongo" is not`},
		{[]string{"-deadline", "soon"}, `-deadline: "soon" is not a Go duration`},
		{[]string{"-memcached", "a b"}, `-memcached: `},
	} {
		for _, k := range []string{"SLUICE_DYNAMO_TABLE", "SLUICE_MEMCACHED_ADDRS", "SLUICE_DEFAULT_BACKEND"} {
			t.Setenv(k, "")
		}
		err := run(tt.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "SLUICE_") && !strings.Contains(err.Error(), "(SLUICE_") {
			t.Errorf("run(%q) = %v, want %q (named by the flag)", tt.args, err, tt.want)
		}
	}
}

// TestDynamoWithoutCredentials: -backend dynamo with a table, no endpoint
// and no AWS credentials stops at start-up with one line naming the
// missing piece and the flag for DynamoDB Local (it used to start, then
// fail open on every request with the SDK's long warning).
func TestDynamoWithoutCredentials(t *testing.T) {
	for _, k := range []string{"SLUICE_DYNAMO_TABLE", "SLUICE_MEMCACHED_ADDRS", "SLUICE_DEFAULT_BACKEND", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB",
		"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"} {
		t.Setenv(k, "")
	}
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	var stdout bytes.Buffer
	err := run([]string{"-backend", "dynamo", "-dynamo-table", "sluice-local", "-addr", "127.0.0.1:0"}, &stdout, io.Discard)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), `DynamoDB table "sluice-local": no AWS credentials found`) ||
		!strings.Contains(err.Error(), "-dynamo-endpoint") {
		t.Fatalf("run = %v; want one line about the credentials and -dynamo-endpoint", err)
	}
	if stdout.Len() != 0 {
		t.Errorf("it started: %s", stdout.String())
	}
}
