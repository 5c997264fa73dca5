package wiring

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestBreakerOutage: memcached stops under the authorizer; after
// SLUICE_BREAKER_FAILURES failed decisions the breaker opens, and the
// next decisions follow each rule's fail mode without reaching the store
// (their error wraps storage.ErrBreakerOpen); the transitions are metric
// lines and log lines; after the server is back, the first decision past
// SLUICE_BREAKER_OPEN_FOR probes and closes the breaker.
func TestBreakerOutage(t *testing.T) {
	srv := testserver.StartMemcached(t)
	const openFor = 300 * time.Millisecond
	vars := map[string]string{
		"SLUICE_MEMCACHED_ADDRS":  srv.Addr(),
		"SLUICE_RULES_YAML":       failModeRules,
		"SLUICE_DEADLINE":         "250ms",
		"SLUICE_BREAKER_FAILURES": "3",
		"SLUICE_BREAKER_OPEN_FOR": openFor.String(),
	}
	env, err := ParseEnv(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	var metrics bytes.Buffer
	logs := &syncBuffer{}
	b, err := Build(t.Context(), env, Outputs{Stdout: &metrics, Stderr: logs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if b.Breakers[BackendMemcached] != nil || b.Breakers[BackendMemory] != nil {
		t.Fatalf("whole-backend breakers %v: want none (memcached's are per node)", b.Breakers)
	}
	if _, ok := b.Stores[BackendMemcached].(*memcached.Store); !ok {
		t.Fatalf("memcached store %T: want the bare store (node breakers inside)", b.Stores[BackendMemcached])
	}
	node := func() memcached.BreakerState {
		if l := b.memcachedBreakers(); len(l) == 1 {
			return l[0]
		}
		t.Fatalf("node breakers %+v: want one", b.memcachedBreakers())
		return memcached.BreakerState{}
	}
	srv.Stop()
	for i := 0; i == 0 || node().State == "closed"; i++ {
		if i == 3 {
			t.Fatalf("node breaker %s after 3 failed decisions", node().State)
		}
		_, res, err := b.Handler.Decide(t.Context(), requestTo("/open"))
		if err != nil || !res.Evals[0].Failed || errors.Is(res.Evals[0].Err, storage.ErrBreakerOpen) {
			t.Fatalf("decision %d: %+v %v; want a failure of the store", i, res.Evals, err)
		}
	}
	if got := b.BreakerStates(); got["memcached "+srv.Addr()] != "open" || len(got) != 1 {
		t.Errorf("BreakerStates() = %v", got)
	}
	before := node()
	metrics.Reset()
	checkFailModes(t, b, &metrics, storage.ErrBreakerOpen)
	if st := node(); st.Rejected != before.Rejected+2 || st.Failures != before.Failures {
		t.Errorf("stats %+v after %+v: want 2 more refused, no more failures", st, before)
	}
	out := logs.String()
	for _, want := range []string{`"msg":"circuit breaker on","backend":"memcached","per":"node","failures":3,"open_for":"300ms"`,
		`"msg":"circuit breaker open","node":"` + srv.Addr() + `","backend":"memcached"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s", want)
		}
	}

	srv.Restart()
	metrics.Reset()
	time.Sleep(openFor)
	resp, res, err := b.Handler.Decide(t.Context(), requestTo("/closed"))
	if err != nil || !resp.Allowed() || res.Evals[0].Failed {
		t.Fatalf("first decision after OpenFor with the server back: %+v %+v %v", resp, res.Evals, err)
	}
	if st := node().State; st != "closed" {
		t.Errorf("node breaker %s after a successful probe", st)
	}
	lines := metrics.String()
	at := `"Backend":"memcached","Node":"` + srv.Addr() + `"`
	for _, want := range []string{at + `,"BreakerState":"half-open"`, at + `,"BreakerState":"closed","BreakerOpened":0,"BreakerClosed":1`} {
		if !strings.Contains(lines, want) {
			t.Errorf("metrics lack %s:\n%s", want, lines)
		}
	}
}

// TestBreakerOff: SLUICE_BREAKER_FAILURES=0 leaves the stores bare.
func TestBreakerOff(t *testing.T) {
	b, _ := buildEnv(t, map[string]string{"SLUICE_MEMCACHED_ADDRS": testserver.Hung(t), "SLUICE_DEADLINE": "50ms", "SLUICE_BREAKER_FAILURES": "0"})
	if b.Breakers != nil {
		t.Errorf("breakers %v", b.Breakers)
	}
	if _, ok := b.Stores[BackendMemcached].(*breaker.Store); ok {
		t.Errorf("memcached behind a breaker")
	}
	if l := b.memcachedBreakers(); l != nil {
		t.Errorf("memcached node breakers %+v", l)
	}
}

// BenchmarkDecisionBreakerOpen is a decision of the authorizer (event
// decoding, rules, fail mode, metrics line) on a memcached that accepts
// connections and never answers (a 250 ms deadline), once the breaker has
// opened: the target is under 5 ms.
func BenchmarkDecisionBreakerOpen(b *testing.B) {
	vars := map[string]string{
		"SLUICE_MEMCACHED_ADDRS":  testserver.Hung(b),
		"SLUICE_RULES_YAML":       failModeRules,
		"SLUICE_DEADLINE":         "250ms",
		"SLUICE_BREAKER_OPEN_FOR": "5m",
	}
	env, err := ParseEnv(func(k string) string { return vars[k] })
	if err != nil {
		b.Fatal(err)
	}
	built, err := Build(b.Context(), env, Outputs{Stdout: io.Discard, Stderr: io.Discard})
	if err != nil {
		b.Fatal(err)
	}
	defer built.Close()
	ev := requestTo("/open")
	for built.BreakerStates()[BackendMemcached+" "+built.Env.MemcachedAddrs[0]] != "open" {
		built.Handler.Decide(b.Context(), ev)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, res, err := built.Handler.Decide(b.Context(), ev)
		if err != nil || !resp.Allowed() || !errors.Is(res.Evals[0].Err, storage.ErrBreakerOpen) {
			b.Fatalf("%+v %+v %v", resp, res.Evals, err)
		}
	}
}

// The fleet shedder's store (memcached leases, on the store's client)
// shares the node's breaker: once it opened,
// the shedder's error wraps storage.ErrBreakerOpen too (and the request
// goes on: shedding fails open).
func TestBreakerShedStore(t *testing.T) {
	b, _ := buildEnv(t, map[string]string{
		"SLUICE_MEMCACHED_ADDRS":     testserver.Hung(t),
		"SLUICE_RULES_YAML":          failModeRules,
		"SLUICE_DEADLINE":            "50ms",
		"SLUICE_SHED_FLEET_CAPACITY": "10",
		"SLUICE_BREAKER_FAILURES":    "2",
		"SLUICE_BREAKER_OPEN_FOR":    "5m",
	})
	open := func() bool { l := b.memcachedBreakers(); return len(l) == 1 && l[0].State == "open" }
	for i := 0; !open(); i++ {
		if i == 3 {
			t.Fatalf("node breakers %+v after %d decisions", b.memcachedBreakers(), i)
		}
		b.Handler.Decide(t.Context(), requestTo("/open"))
	}
	resp, res, err := b.Handler.Decide(t.Context(), requestTo("/open"))
	if err != nil || !resp.Allowed() || !errors.Is(res.ShedErr, storage.ErrBreakerOpen) || !errors.Is(res.Evals[0].Err, storage.ErrBreakerOpen) {
		t.Errorf("with the breaker open: %+v shed error %v, evals %+v, %v", resp, res.ShedErr, res.Evals, err)
	}
}
