package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/functions/wiring"
	"github.com/sluicehq/sluice/internal/testserver"
)

// BenchmarkOutageBreakerOpen is one request through the local API (HTTP
// client, server, REST event, authorizer, echo upstream) while memcached
// accepts connections and never answers, under a 250 ms deadline, once
// the breaker has opened: the fail-open rule answers 200 at once. The target
// asks for under 5 ms. The no-breaker case (SLUICE_BREAKER_FAILURES=0)
// waits the deadline on every request.
func BenchmarkOutage(b *testing.B) {
	b.Run("breaker", func(b *testing.B) { benchOutage(b, true) })
	b.Run("no-breaker", func(b *testing.B) { benchOutage(b, false) })
}

func benchOutage(b *testing.B, withBreaker bool) {
	vars := map[string]string{
		"SLUICE_MEMCACHED_ADDRS":  testserver.Hung(b),
		"SLUICE_RULES_YAML":       `rules: [{name: open, key: "{ip}", fail: open, limits: [{algorithm: token_bucket, max_amount: 100, refill_time: 1s}]}]`,
		"SLUICE_DEADLINE":         "250ms",
		"SLUICE_BREAKER_OPEN_FOR": "5m",
	}
	if !withBreaker {
		vars["SLUICE_BREAKER_FAILURES"] = "0"
	}
	env, err := wiring.ParseEnv(func(k string) string { return vars[k] })
	if err != nil {
		b.Fatal(err)
	}
	built, err := wiring.Build(b.Context(), env, wiring.Outputs{Stdout: io.Discard, Stderr: io.Discard})
	if err != nil {
		b.Fatal(err)
	}
	defer built.Close()
	ts := httptest.NewServer(newServer(built.Handler, kindREST, "local", nil))
	defer ts.Close()
	get := func() int {
		resp, err := http.Get(ts.URL + "/x")
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	node := wiring.BackendMemcached + " " + built.Env.MemcachedAddrs[0]
	for withBreaker && built.BreakerStates()[node] != "open" {
		get()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if code := get(); code != http.StatusOK {
			b.Fatalf("status %d, want 200 (fail open)", code)
		}
	}
	b.StopTimer()
	if !withBreaker {
		return
	}
	mc := built.Stores[wiring.BackendMemcached].(*memcached.Store)
	if st := mc.Breakers(); len(st) != 1 || st[0].State != "open" || st[0].Rejected < int64(b.N) {
		b.Fatalf("node breakers %+v after %d requests", st, b.N)
	}
}
