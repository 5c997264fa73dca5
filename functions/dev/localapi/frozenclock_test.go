package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/functions/wiring"
)

// frozenRules: a concurrency limit of 1 whose lease lasts 50 ms (no
// request releases it: no releaser), and a window of 2 per 50 ms.
const frozenRules = `
rules:
  - {name: in-flight, key: "all", match: {paths: ["/c"]}, concurrency: {limit: 1, lease_ttl: 50ms},
     limits: [{algorithm: sliding_window, limit: 100000, window: 1m}]}
  - {name: window, key: "all", match: {paths: ["/w"]}, limits: [{algorithm: fixed_window, limit: 2, window: 50ms}]}
`

// TestFrozenClockStores: with SLUICE_TEST_CLOCK, the local API's memory
// stores keep time by the frozen clock too: a lease and a window's count
// taken at the frozen time are still there after more real time than
// their life (on the wall clock, the lease lapsed and the count expired
// after 50 ms of real time, and the same requests were admitted again:
// the answers hung on how long the run took).
func TestFrozenClockStores(t *testing.T) {
	built := buildFrom(t, map[string]string{config.EnvRulesYAML: frozenRules, config.EnvTestClock: "2026-01-02T03:04:05Z"},
		wiring.Outputs{Stdout: io.Discard, Stderr: io.Discard})
	ts := httptest.NewServer(newServer(built.Handler, kindREST, "local", nil))
	t.Cleanup(ts.Close)
	get := func(path string, want int) {
		t.Helper()
		if got := status(t, http.DefaultClient, ts.URL+path); got != want {
			t.Errorf("%s: %d, want %d", path, got, want)
		}
	}
	get("/c", http.StatusOK)              // takes the lease
	get("/c", http.StatusTooManyRequests) // it is held
	get("/w", http.StatusOK)              // 1 of 2
	if t.Failed() {
		t.FailNow()
	}
	time.Sleep(500 * time.Millisecond)    // real time: ten lives of the lease and of the window
	get("/c", http.StatusTooManyRequests) // still held: the clock is frozen
	get("/w", http.StatusOK)              // 2 of 2
	get("/w", http.StatusTooManyRequests) // the first still counts

}
