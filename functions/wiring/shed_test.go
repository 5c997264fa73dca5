package wiring

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/functions/dev/golden"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// shedRules: /health is critical, /reports low, everything else normal
// (the catch-all rule, and requests no rule matches). The limits are
// generous: only the shedders refuse anything here.
const shedRules = `
rules:
  - name: health
    match: {paths: ["/health"]}
    priority: critical
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 1000000, window: 1m}]
  - name: reports
    match: {paths: ["/reports"]}
    priority: low
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 1000000, window: 1m}]
  - name: api
    match: {paths: ["/api/*"]}
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 1000000, window: 1m}]
`

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.ns.Store(t.UnixNano())
	return c
}
func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// buildShed builds the handler through FromEnv's path (ParseEnv, then
// Build) with the shedders' store and the clock injected, capturing
// metrics and logs.
func buildShed(t *testing.T, vars map[string]string, store breaker.ShedStore, clock limiter.Clock) (b *Built, metrics, logs *bytes.Buffer) {
	t.Helper()
	env, err := ParseEnv(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	metrics, logs = &bytes.Buffer{}, &bytes.Buffer{}
	b, err = Build(t.Context(), env, Outputs{Stdout: syncWriter(metrics), Stderr: syncWriter(logs), ShedStore: store, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b, metrics, logs
}

// syncWriter serializes writes to a buffer shared by goroutines.
func syncWriter(b *bytes.Buffer) *lockedWriter { return &lockedWriter{b: b} }

type lockedWriter struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// memLeases is a memory lease store whose own expiry runs on the wall
// clock: it forgets a key's lease set LeaseTTL of wall time after the
// set's last write, whatever time the callers pass.
func memLeases(t *testing.T) *memory.Leases { return memLeasesOn(t, nil) }

// memLeasesOn is a memory lease store whose own expiry runs on clock (the
// wall clock when nil). A test whose handler runs on a frozen clock needs
// its store on that clock too for its leases never to lapse: on the wall
// clock, every second of a slow run (-race, a loaded machine) freed the
// fleet shedder's slots again.
func memLeasesOn(t *testing.T, clock *fakeClock) *memory.Leases {
	t.Helper()
	var cfg memory.Config
	if clock != nil {
		cfg.Clock = clock.Now
	}
	l, err := memory.NewLeases(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// request is a REST REQUEST event for path from ip.
func request(path, ip string) []byte {
	return fmt.Appendf(nil, `{"type":"REQUEST","methodArn":"arn:aws:execute-api:us-east-1:1:api/prod/GET%s","httpMethod":"GET","path":%q,
		"requestContext":{"stage":"prod","identity":{"sourceIp":%q}}}`, path, path, ip)
}

// metricLines decodes the EMF lines written so far.
func metricLines(t *testing.T, metrics *bytes.Buffer) []emfShedLine {
	t.Helper()
	var out []emfShedLine
	for _, l := range strings.Split(strings.TrimSpace(metrics.String()), "\n") {
		if l == "" {
			continue
		}
		var m emfShedLine
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

type emfShedLine struct {
	Rule                              string
	Allowed, Denied, Shed, ShedErrors int
}

// TestShedFleetSaturated saturates the fleet shedder (capacity 10, reserve
// 0.2: non-critical traffic may hold 8 slots) with non-critical traffic:
// the 9th non-critical request fails the invocation with the authz.ShedError the
// infra maps to 503, counted and logged, while critical requests keep
// passing.
func TestShedFleetSaturated(t *testing.T) {
	clock := newFakeClock(golden.Clock) // frozen, the store's too: leases never lapse here
	b, metrics, logs := buildShed(t, map[string]string{
		"SLUICE_RULES_YAML":          shedRules,
		"SLUICE_SHED_FLEET_CAPACITY": "10",
		"SLUICE_SHED_FLEET_RESERVE":  "0.2",
		"SLUICE_SHED_LEASE_TTL":      "1s",
		"SLUICE_DEADLINE":            "30s", // no shedder call fails open on a slow machine
	}, memLeasesOn(t, clock), clock)
	if b.Shedding == nil || b.Shedding.Fleet == nil || b.Shedding.Utilization != nil || b.Shedding.Backend != "injected" {
		t.Fatalf("shedding %+v, want the fleet shedder only, on the injected store", b.Shedding)
	}
	if got := b.Shedding.Fleet.Limit(limiter.PriorityNormal); got != 8 {
		t.Fatalf("non-critical limit %d, want 8", got)
	}
	paths := []string{"/api/a", "/reports", "/unmatched"} // normal, low, normal without a rule
	for i := range 8 {
		if _, _, err := b.Handler.Decide(t.Context(), request(paths[i%3], "192.0.2.1")); err != nil {
			t.Fatalf("non-critical request %d: %v", i+1, err)
		}
	}
	for _, p := range paths {
		metrics.Reset()
		logs.Reset()
		_, err := b.Handler.Handle(t.Context(), request(p, "192.0.2.1"))
		var se *authz.ShedError
		if !errors.As(err, &se) || err.Error() != "sluice: load shed, retry later" || authz.ErrorType(err) != "ShedError" {
			t.Fatalf("%s past the fleet's share: err %v (%T), want the authz.ShedError", p, err, err)
		}
		if se.Shedder != "fleet" || se.RetryAfter != time.Second {
			t.Errorf("%s: authz.ShedError %+v, want shedder fleet, retry after 1s", p, se)
		}
		ms := metricLines(t, metrics)
		if len(ms) != 1 || ms[0].Shed != 1 || ms[0].Allowed+ms[0].Denied != 0 {
			t.Errorf("%s: metric lines %+v, want one Shed line", p, ms)
		}
		if p == "/unmatched" && ms[0].Rule != authz.NoRule {
			t.Errorf("unmatched request's metric line is for rule %q", ms[0].Rule)
		}
		if !strings.Contains(logs.String(), `"decision":"shed"`) || !strings.Contains(logs.String(), `"shedder":"fleet"`) {
			t.Errorf("%s: no shed log line:\n%s", p, logs.String())
		}
	}
	for i := range 100 {
		resp, res, err := b.Handler.Decide(t.Context(), request("/health", "192.0.2.1"))
		if err != nil || !resp.Allowed() || res.Priority != limiter.PriorityCritical {
			t.Fatalf("critical request %d under saturation: %v %+v", i+1, err, res)
		}
	}
}

// TestShedFleetConcurrent: 64 goroutines of mixed traffic against a
// capacity of 10. Exactly 8 non-critical requests get through, and every
// critical one does. The leases never lapse: the handler's clock and the
// store's are the same frozen clock (on the wall clock the store forgot
// them every second of a slow run: 16, 24, 32 admitted). The deadline is
// long: a shedder call that misses it fails open by design (the request
// passes without a slot), and a loaded -race run missed 250 ms.
func TestShedFleetConcurrent(t *testing.T) {
	clock := newFakeClock(golden.Clock)
	b, metrics, _ := buildShed(t, map[string]string{
		"SLUICE_RULES_YAML":          shedRules,
		"SLUICE_SHED_FLEET_CAPACITY": "10",
		"SLUICE_DEADLINE":            "30s",
	}, memLeasesOn(t, clock), clock)
	var admitted, failedOpen, shed, critical atomic.Int64
	var openErr atomic.Value // the first fail-open's error
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ip := fmt.Sprintf("198.51.100.%d", g)
			for i := range 20 {
				path := "/api/x"
				if g%4 == 0 {
					path = "/reports"
				}
				if i%2 == 1 {
					path = "/health"
				}
				_, res, err := b.Handler.Decide(t.Context(), request(path, ip))
				var se *authz.ShedError
				switch {
				case path == "/health":
					if err != nil {
						t.Errorf("critical request refused: %v", err)
					}
					critical.Add(1)
				case errors.As(err, &se):
					shed.Add(1)
				case err != nil:
					t.Errorf("unexpected error %v", err)
				case res.Outcome == policy.Allow && res.ShedErr != nil:
					failedOpen.Add(1)
					openErr.CompareAndSwap(nil, res.ShedErr.Error())
				case res.Outcome == policy.Allow:
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := failedOpen.Load(); n > 0 {
		t.Fatalf("%d non-critical requests failed open (let through without a slot), one with %v", n, openErr.Load())
	}
	if admitted.Load() != 8 || shed.Load() != 64*10-8 || critical.Load() != 64*10 {
		t.Errorf("admitted %d, shed %d non-critical requests, %d critical passed; want 8, %d, %d", admitted.Load(), shed.Load(), critical.Load(), 64*10-8, 64*10)
	}
	var shedLines int
	for _, m := range metricLines(t, metrics) {
		shedLines += m.Shed
		if m.Shed == 1 && m.Rule == "health" {
			t.Errorf("a critical request was counted as shed")
		}
	}
	if int64(shedLines) != shed.Load() {
		t.Errorf("%d Shed metric lines, want %d", shedLines, shed.Load())
	}
}

// TestShedUtilizationPinned publishes a utilization of 1 every simulated
// second and sends one low, one normal and one critical request per
// second: Stripe's controller waits 28 s, then sheds low traffic with a
// growing chance until all of it is shed (from 28 + 40 s), then normal
// traffic (all of it from 28 + 80 s); critical traffic never.
func TestShedUtilizationPinned(t *testing.T) {
	clock := newFakeClock(golden.Clock)
	store := memLeases(t)
	b, _, _ := buildShed(t, map[string]string{
		"SLUICE_RULES_YAML":       shedRules,
		"SLUICE_SHED_UTILIZATION": "orders-fleet",
	}, store, clock)
	if b.Shedding == nil || b.Shedding.Utilization == nil || b.Shedding.Fleet != nil {
		t.Fatalf("shedding %+v, want the utilization shedder only", b.Shedding)
	}
	pub := &limiter.PublishedUtilization{Store: store, Name: "orders-fleet", Clock: clock}
	firstShed := map[string]int{}
	allShedFrom := map[string]int{}
	for sec := 0; sec <= 150; sec++ {
		if err := pub.Publish(t.Context(), 1, clock.Now()); err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{"/reports", "/api/x", "/health"} {
			_, res, err := b.Handler.Decide(t.Context(), request(path, "192.0.2.7"))
			var se *authz.ShedError
			switch {
			case errors.As(err, &se):
				if se.Shedder != "utilization" {
					t.Fatalf("shed by %q", se.Shedder)
				}
				if _, ok := firstShed[path]; !ok {
					firstShed[path] = sec
				}
				if _, ok := allShedFrom[path]; !ok {
					allShedFrom[path] = sec
				}
			case err != nil:
				t.Fatalf("second %d %s: %v", sec, path, err)
			default:
				if res.ShedErr != nil {
					t.Fatalf("second %d %s: shedder error %v", sec, path, res.ShedErr)
				}
				delete(allShedFrom, path) // let through: not yet all shed
			}
		}
		clock.Advance(time.Second)
	}
	t.Logf("first shed at %v, all shed from %v (seconds)", firstShed, allShedFrom)
	if _, ok := firstShed["/health"]; ok {
		t.Fatalf("critical traffic was shed")
	}
	// Low traffic's drop chance is clamp(3s, 0, 1) and normal traffic's
	// clamp(3s-1, 0, 1), with s = (second-28)/120 here.
	for path, tt := range map[string]struct{ notBefore, allBy int }{"/reports": {28, 28 + 40}, "/api/x": {28 + 40, 28 + 80}} {
		first, ok := firstShed[path]
		if !ok || first <= tt.notBefore {
			t.Errorf("%s: first shed at second %d (%v), want after second %d", path, first, ok, tt.notBefore)
		}
		want := tt.allBy
		if all, ok := allShedFrom[path]; !ok || all > want {
			t.Errorf("%s: all shed from second %d (%v), want from %d at the latest", path, all, ok, want)
		}
	}
	if st := b.Shedding.Utilization.State(); st.Amount != 1 || st.Utilization != 1 {
		t.Errorf("controller state %+v, want shedding everything at utilization 1", st)
	}
}

// failingStore is a shed store whose every call fails.
type failingStore struct{}

var errStoreDown = errors.New("store down")

func (failingStore) AcquireLease(context.Context, storage.Key, storage.LeaseOp) (storage.Decision, error) {
	return storage.Decision{}, errStoreDown
}
func (failingStore) ReleaseLease(context.Context, storage.Key, storage.ReleaseOp) error {
	return errStoreDown
}
func (failingStore) PutGauge(context.Context, storage.Key, storage.Gauge, time.Duration) error {
	return errStoreDown
}
func (failingStore) GetGauge(context.Context, storage.Key) (storage.Gauge, bool, error) {
	return storage.Gauge{}, false, errStoreDown
}

// TestShedStoreDownFailsOpen: with the shedders' store failing, requests
// pass (Stripe fails open), and each failure is counted (ShedErrors on the
// request's first metric line) and logged.
func TestShedStoreDownFailsOpen(t *testing.T) {
	b, metrics, logs := buildShed(t, map[string]string{
		"SLUICE_RULES_YAML":          shedRules,
		"SLUICE_SHED_FLEET_CAPACITY": "1",
		"SLUICE_SHED_UTILIZATION":    "orders-fleet",
	}, failingStore{}, nil)
	for _, path := range []string{"/api/x", "/reports", "/unmatched"} {
		metrics.Reset()
		logs.Reset()
		for range 3 { // capacity 1: only a failing store lets three through
			resp, res, err := b.Handler.Decide(t.Context(), request(path, "192.0.2.9"))
			if err != nil || !resp.Allowed() {
				t.Fatalf("%s with the shed store down: %v allowed=%v, want allowed", path, err, resp != nil && resp.Allowed())
			}
			if !errors.Is(res.ShedErr, errStoreDown) || !errors.Is(res.ShedErr, limiter.ErrNoUtilization) {
				t.Errorf("%s: shed error %v, want the fleet's and the utilization's", path, res.ShedErr)
			}
		}
		var counted int
		for _, m := range metricLines(t, metrics) {
			counted += m.ShedErrors
		}
		if counted != 3 {
			t.Errorf("%s: ShedErrors %d, want 3\n%s", path, counted, metrics.String())
		}
		if n := strings.Count(logs.String(), `"msg":"shedder failed, fail open"`); n != 3 {
			t.Errorf("%s: %d shedder failure log lines, want 3:\n%s", path, n, logs.String())
		}
	}
	// Critical requests do not even ask.
	metrics.Reset()
	if _, res, err := b.Handler.Decide(t.Context(), request("/health", "192.0.2.9")); err != nil || res.ShedErr != nil {
		t.Errorf("critical: %v, shed error %v", err, res.ShedErr)
	}
}

func TestParseShedEnv(t *testing.T) {
	e, err := ParseEnv(envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if e.Shed.Enabled() || e.Shed.FleetReserve != 0.2 || e.Shed.LeaseTTL != time.Second || e.Shed.FleetName != "fleet" ||
		e.Shed.UtilizationMaxAge != 30*time.Second || e.Shed.Backend != "" {
		t.Errorf("defaults %+v", e.Shed)
	}
	b, err := Build(t.Context(), e, Outputs{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if b.Shedding != nil {
		t.Errorf("shedding is on by default: %+v", b.Shedding)
	}

	e, err = ParseEnv(envOf(map[string]string{
		"SLUICE_MEMCACHED_ADDRS": "a:1", "SLUICE_DYNAMO_TABLE": "t",
		"SLUICE_SHED_FLEET_CAPACITY": "500", "SLUICE_SHED_FLEET_RESERVE": "0.3", "SLUICE_SHED_FLEET_SHARES": "low=0.4, normal=0.6",
		"SLUICE_SHED_FLEET_NAME": "orders", "SLUICE_SHED_LEASE_TTL": "2s",
		"SLUICE_SHED_UTILIZATION": "orders-util", "SLUICE_SHED_UTILIZATION_MAX_AGE": "1m",
	}))
	if err != nil {
		t.Fatal(err)
	}
	s := e.Shed
	if !s.Enabled() || s.FleetCapacity != 500 || s.FleetReserve != 0.3 || s.FleetShares[limiter.PriorityLow] != 0.4 ||
		s.FleetShares[limiter.PriorityNormal] != 0.6 || len(s.FleetShares) != 2 || s.FleetName != "orders" || s.LeaseTTL != 2*time.Second ||
		s.Utilization != "orders-util" || s.UtilizationMaxAge != time.Minute || s.Backend != BackendMemcached {
		t.Errorf("parsed %+v", s)
	}
	if e, _ := ParseEnv(envOf(map[string]string{"SLUICE_DYNAMO_TABLE": "t", "SLUICE_SHED_UTILIZATION": "u"})); e.Shed.Backend != BackendDynamo {
		t.Errorf("shed backend with only a table: %q", e.Shed.Backend)
	}
	if e, _ := ParseEnv(envOf(map[string]string{"SLUICE_MEMCACHED_ADDRS": "a:1", "SLUICE_DYNAMO_TABLE": "t", "SLUICE_SHED_BACKEND": "dynamo",
		"SLUICE_SHED_FLEET_CAPACITY": "5"})); e.Shed.Backend != BackendDynamo {
		t.Errorf("SLUICE_SHED_BACKEND=dynamo: %q", e.Shed.Backend)
	}
}

func TestParseShedEnvErrors(t *testing.T) {
	on := map[string]string{"SLUICE_MEMCACHED_ADDRS": "a:1", "SLUICE_SHED_FLEET_CAPACITY": "10"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range on {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tt := range []struct {
		env  map[string]string
		want string
	}{
		{with("SLUICE_SHED_FLEET_CAPACITY", "lots"), "SLUICE_SHED_FLEET_CAPACITY"},
		{with("SLUICE_SHED_FLEET_CAPACITY", "-1"), "SLUICE_SHED_FLEET_CAPACITY"},
		{with("SLUICE_SHED_FLEET_CAPACITY", "1001"), "SLUICE_SHED_FLEET_CAPACITY"},
		{with("SLUICE_SHED_FLEET_RESERVE", "1"), "SLUICE_SHED_FLEET_RESERVE"},
		{with("SLUICE_SHED_FLEET_RESERVE", "-0.1"), "SLUICE_SHED_FLEET_RESERVE"},
		{with("SLUICE_SHED_FLEET_RESERVE", "NaN"), "SLUICE_SHED_FLEET_RESERVE"},
		{with("SLUICE_SHED_FLEET_SHARES", "critical=0.5"), "SLUICE_SHED_FLEET_SHARES"},
		{with("SLUICE_SHED_FLEET_SHARES", "low"), "SLUICE_SHED_FLEET_SHARES"},
		{with("SLUICE_SHED_FLEET_SHARES", "low=half"), "SLUICE_SHED_FLEET_SHARES"},
		{with("SLUICE_SHED_FLEET_SHARES", "low=0.9"), "SLUICE_SHED_FLEET_SHARES"},            // above 1 - reserve
		{with("SLUICE_SHED_FLEET_SHARES", "low=0.5,normal=0.3"), "SLUICE_SHED_FLEET_SHARES"}, // decreasing
		{with("SLUICE_SHED_FLEET_SHARES", "low=0.5,low=0.6"), "SLUICE_SHED_FLEET_SHARES"},    // twice
		{with("SLUICE_SHED_FLEET_NAME", "my fleet"), "SLUICE_SHED_FLEET_NAME"},               // a space
		{with("SLUICE_SHED_LEASE_TTL", "0s"), "SLUICE_SHED_LEASE_TTL"},
		{with("SLUICE_SHED_LEASE_TTL", "1h"), "SLUICE_SHED_LEASE_TTL"},
		{with("SLUICE_SHED_LEASE_TTL", "soon"), "SLUICE_SHED_LEASE_TTL"},
		{with("SLUICE_SHED_UTILIZATION", "bad\x01name"), "SLUICE_SHED_UTILIZATION"},
		{with("SLUICE_SHED_UTILIZATION_MAX_AGE", "-1s"), "SLUICE_SHED_UTILIZATION_MAX_AGE"},
		{with("SLUICE_SHED_BACKEND", "memory"), "SLUICE_SHED_BACKEND: memory counts per Lambda container"},
		{with("SLUICE_SHED_BACKEND", "redis"), "SLUICE_SHED_BACKEND"},
		{with("SLUICE_SHED_BACKEND", "dynamo"), "SLUICE_SHED_BACKEND: dynamo is not configured (set SLUICE_DYNAMO_TABLE)"},
		{map[string]string{"SLUICE_SHED_BACKEND": "memory"}, "SLUICE_SHED_BACKEND"}, // refused even with shedding off
	} {
		if _, err := ParseEnv(envOf(tt.env)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want %q", tt.env, err, tt.want)
		}
	}
	// Shedding without a store shared by the fleet is an init error.
	env, err := ParseEnv(envOf(map[string]string{"SLUICE_SHED_FLEET_CAPACITY": "10"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Build(t.Context(), env, Outputs{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}); err == nil ||
		!strings.Contains(err.Error(), "SLUICE_SHED_BACKEND") || !strings.Contains(err.Error(), "SLUICE_MEMCACHED_ADDRS or SLUICE_DYNAMO_TABLE") {
		t.Errorf("shedding without memcached or dynamo: %v", err)
	}
}

// TestShedMemcached runs the fleet shedder on the real memcached, as
// deployed (the store chosen by the environment, not injected).
func TestShedMemcached(t *testing.T) {
	addr := testserver.Memcached(t)
	fleet := fmt.Sprintf("fleet-%d", time.Now().UnixNano())
	b, _, _ := buildShed(t, map[string]string{
		"SLUICE_MEMCACHED_ADDRS":     addr,
		"SLUICE_RULES_YAML":          shedRules,
		"SLUICE_SHED_FLEET_CAPACITY": "5",
		"SLUICE_SHED_FLEET_RESERVE":  "0.4",
		"SLUICE_SHED_FLEET_NAME":     fleet,
		"SLUICE_SHED_LEASE_TTL":      "1m",
		"SLUICE_DEADLINE":            "2s",
	}, nil, nil)
	if b.Shedding.Backend != BackendMemcached {
		t.Fatalf("shed backend %q", b.Shedding.Backend)
	}
	checkFleet(t, b, 3)
}

// TestShedDynamo runs both shedders on DynamoDB Local.
func TestShedDynamo(t *testing.T) {
	client := dynamoEnv(t)
	table := fmt.Sprintf("sluice-wiring-shed-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, client, table); err != nil {
		t.Fatal(err)
	}
	b, _, _ := buildShed(t, map[string]string{
		"SLUICE_DYNAMO_TABLE":        table,
		"SLUICE_RULES_YAML":          shedRules,
		"SLUICE_SHED_FLEET_CAPACITY": "5",
		"SLUICE_SHED_FLEET_RESERVE":  "0.4",
		"SLUICE_SHED_LEASE_TTL":      "1m",
		"SLUICE_SHED_UTILIZATION":    "orders",
		"SLUICE_DEADLINE":            "2s",
	}, nil, nil)
	if b.Shedding.Backend != BackendDynamo {
		t.Fatalf("shed backend %q", b.Shedding.Backend)
	}
	// Nothing published yet: the utilization shedder fails open (at rest)
	// and says so; the fleet shedder decides.
	_, res, err := b.Handler.Decide(t.Context(), request("/api/x", "192.0.2.3"))
	if err != nil || !errors.Is(res.ShedErr, limiter.ErrStaleUtilization) {
		t.Fatalf("first request: %v, shed error %v; want allowed with a stale utilization", err, res.ShedErr)
	}
	checkFleet(t, b, 2) // one of the 3 non-critical slots is taken
}

// checkFleet sends n non-critical requests that pass, one more that is
// shed, and critical ones that pass.
func checkFleet(t *testing.T, b *Built, n int) {
	t.Helper()
	for i := range n {
		if _, res, err := b.Handler.Decide(t.Context(), request("/api/x", "192.0.2.3")); err != nil || res.Outcome != policy.Allow {
			t.Fatalf("non-critical request %d: %v %v", i+1, err, res.Outcome)
		}
	}
	var se *authz.ShedError
	if _, _, err := b.Handler.Decide(t.Context(), request("/reports", "192.0.2.3")); !errors.As(err, &se) {
		t.Fatalf("past the share: %v, want a authz.ShedError", err)
	}
	for range 3 {
		if _, res, err := b.Handler.Decide(t.Context(), request("/health", "192.0.2.3")); err != nil || res.Outcome != policy.Allow {
			t.Fatalf("critical request: %v %v", err, res.Outcome)
		}
	}
}

// TestShedMemcachedStopped stops the memcached under a running authorizer:
// the fleet shedder's store fails, requests go through within the
// deadline, and the failure is counted.
func TestShedMemcachedStopped(t *testing.T) {
	srv := testserver.StartMemcached(t)
	b, metrics, _ := buildShed(t, map[string]string{
		"SLUICE_MEMCACHED_ADDRS":     srv.Addr(),
		"SLUICE_RULES_YAML":          `rules: [{name: api, key: "{ip}", limits: [{algorithm: fixed_window, limit: 100, window: 1m, backend: memory}]}]`,
		"SLUICE_SHED_FLEET_CAPACITY": "1",
		"SLUICE_SHED_LEASE_TTL":      "1m",
		"SLUICE_DEADLINE":            "250ms",
	}, nil, nil)
	var se *authz.ShedError
	if _, _, err := b.Handler.Decide(t.Context(), request("/a", "192.0.2.4")); err != nil {
		t.Fatalf("first request: %v", err)
	}
	if _, _, err := b.Handler.Decide(t.Context(), request("/a", "192.0.2.4")); !errors.As(err, &se) {
		t.Fatalf("second request at capacity 1: %v, want shed", err)
	}
	srv.Stop()
	metrics.Reset()
	start := time.Now()
	_, res, err := b.Handler.Decide(t.Context(), request("/a", "192.0.2.4"))
	if elapsed := time.Since(start); err != nil || res.Outcome != policy.Allow || res.ShedErr == nil || elapsed > 2*time.Second {
		t.Fatalf("memcached stopped: %v %v shed error %v in %v; want allowed with the error, within the deadline", err, res.Outcome, res.ShedErr, elapsed)
	}
	if ms := metricLines(t, metrics); len(ms) != 1 || ms[0].ShedErrors != 1 || ms[0].Allowed != 1 {
		t.Errorf("metric lines %+v, want one Allowed line with ShedErrors", ms)
	}
}
