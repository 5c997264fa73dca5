package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/functions/wiring"
	"github.com/sluicehq/sluice/lambdawrap"
)

// The rule fails closed: a decision that fails (past its deadline on a
// loaded machine) is refused, and its client retries. Fail open, the
// default, would admit it without a lease, and the echo could hold more
// than the limit (with a 1 µs deadline: 77-88 at once).
const concurrencyRules = `
rules:
  - name: in-flight
    key: "all"
    fail: closed
    concurrency: {limit: 10, lease_ttl: 30s}
    limits: [{algorithm: sliding_window, limit: 100000, window: 1m}]
`

// startConcurrencyAPI builds the local API as main does (wiring.Build from
// the environment, the built-in memory lease store) in front of upstream.
func startConcurrencyAPI(t *testing.T, upstream http.Handler) *httptest.Server {
	t.Helper()
	built := buildFrom(t, map[string]string{config.EnvRulesYAML: concurrencyRules}, wiring.Outputs{Stdout: io.Discard, Stderr: io.Discard})
	api := newServer(built.Handler, kindREST, "local", nil)
	api.upstream = upstream
	api.releaser = lambdawrap.NewStoreReleaser(built.Leases)
	api.onReleaseError = func(_ context.Context, err error) { t.Errorf("release: %v", err) }
	ts := httptest.NewServer(api)
	t.Cleanup(ts.Close)
	return ts
}

func status(t *testing.T, c *http.Client, url string) int {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		return 0 // the integration crashed: API Gateway would answer 502
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	return resp.StatusCode
}

// TestConcurrencyThroughLocalAPI: 100 clients at once through the local
// API, a concurrency limit of 10 (lease TTL 30 s) and an echo that takes
// 100 ms. Never more than 10 requests are in the echo; every client that
// gets 429 retries after 10 ms, and all 100 are served within a few
// seconds: each lease is released when its request ends. Were leases
// freed at their TTL, the second wave could not start before 30 s.
func TestConcurrencyThroughLocalAPI(t *testing.T) {
	const clients, limit, delay = 100, 10, 100 * time.Millisecond
	var inFlight, peak atomic.Int64
	slow := echoAfter(delay)
	ts := startConcurrencyAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		slow(w, r)
		inFlight.Add(-1)
	}))
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	var refused, served atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for time.Since(start) < 25*time.Second {
				switch code := status(t, c, ts.URL+"/pets/1"); code {
				case http.StatusOK:
					served.Add(1)
					return
				case http.StatusTooManyRequests:
					refused.Add(1)
					time.Sleep(10 * time.Millisecond)
				default:
					t.Errorf("status %d", code)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("%d clients, limit %d, echo %v: %d served in %v, %d refusals (429) retried, at most %d in the echo at once",
		clients, limit, delay, served.Load(), elapsed.Round(time.Millisecond), refused.Load(), peak.Load())
	if served.Load() != clients {
		t.Fatalf("%d of %d served within 25 s (the lease TTL is 30 s)", served.Load(), clients)
	}
	if p := peak.Load(); p > limit || p < limit/2 {
		t.Errorf("at most %d requests in flight at once, want at most %d (and the limit reached)", p, limit)
	}
	if refused.Load() == 0 {
		t.Error("no request was refused: the limit did not bind")
	}
	// 10 waves of 100 ms: about 1 s, plus retries and scheduling.
	if elapsed > 10*time.Second {
		t.Errorf("100 requests took %v: slots are not freed at request end", elapsed)
	}
	// Every slot is free again, long before the TTL: 10 at once all pass.
	var again sync.WaitGroup
	var ok atomic.Int64
	for range limit {
		again.Go(func() {
			if status(t, c, ts.URL+"/pets/2") == http.StatusOK {
				ok.Add(1)
			}
		})
	}
	again.Wait()
	if ok.Load() != limit {
		t.Errorf("after the run, %d of %d concurrent requests passed", ok.Load(), limit)
	}
}

// TestLeaseReleasedOnPanic: an integration that panics (the Lambda crashes
// on the request) still gives its lease back: 30 crashed requests in a row
// never fill the limit of 10.
func TestLeaseReleasedOnPanic(t *testing.T) {
	ts := startConcurrencyAPI(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic(http.ErrAbortHandler) // the server drops the connection quietly
	}))
	c := &http.Client{}
	for i := range 30 {
		if code := status(t, c, ts.URL+"/x"); code == http.StatusTooManyRequests {
			t.Fatalf("request %d: 429: a crashed request kept its lease", i+1)
		}
	}
}
