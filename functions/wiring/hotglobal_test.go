package wiring

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/policy"
)

// TestHotGlobalKeyStaysOnItsKey is TestHotKeyStaysOnItsKey for rules with
// scope global on an eventual table (regional shares, regions.Keys),
// through the authorizer as Build wires it from the construct's
// environment: two regions, four containers in region 0 and two in
// region 1, each deciding one request at a time. The regions' tables are
// one DynamoDB Local table (a global table whose replication takes no
// time; each region writes only its own items), each region behind its
// own partition-cap proxy (real DynamoDB's caps at 1/50: 20 write units a
// second per partition key). At once:
//
//   - a hot key, decided in region 0's four containers, offered 150 a
//     second (paced; fewer when the machine is loaded) under a limit of
//     200 a second (region 0's base share 100; nobody in region 1 decides
//     it, so region 1 never gives its share): its items in region 0 are
//     throttled by the partition cap;
//   - a slow key of the per-IP limit, decided in region 1 only (one
//     container, 10 a second), so that region 1 lists it as wanted and
//     region 0's in-line sweeps, run in decisions of any key of the
//     limit, tick region 0's agent of it; every request of region 0 that
//     names it is held until its client gives up;
//   - a victim key of the per-IP limit (20 per 30 s), decided 10 a second
//     in each region: in region 0 by the first container, between its hot
//     decisions; in region 1 by the other container; for 2 s more after
//     the others stop (units its shares moved reach their region).
//
// It checks that the victim is admitted exactly what one exact window
// admits on the same calls, its limit (so its denials are exact's), that
// none of its decisions was throttled, failed (fail mode) or ran to the
// deadline (a sweep's tick of the slow key waited for), that the hot key
// was throttled and never went over its limit in any window of stamps,
// nor region 0 over its base share, and that no breaker opened. Latencies
// are logged: the victim's per region (region 1 has neither the hot nor
// the slow key).
//
// Before in-line sweeps bounded their ticks by KeysConfig.SweepDeadline,
// each victim decision in region 0 whose sweep ticked the slow key waited
// for the whole deadline: 6 of 57 ran to it (p99 2.03 s), and the
// container fell behind (its stamps spread over 17 s for a 6 s run).
func TestHotGlobalKeyStaysOnItsKey(t *testing.T) {
	if testing.Short() {
		t.Skip("a 6 s run against DynamoDB Local")
	}
	h := startHotGlobal(t)
	run := h.run(t)
	h.check(t, run)
}

const (
	hgScale     = 0.02 // of DynamoDB's caps: 20 write units a second per partition key
	hgHotLimit  = 200  // a second
	hgHotRate   = 150  // hot decisions a second, region 0
	hgVictimMax = 20   // per 30 s
	// The deadline is generous (the production default is 250 ms) so that
	// a loaded test machine's slow answers do not send decisions to the
	// fail mode, nor run them to the deadline.
	hgDeadline = 2 * time.Second
	hgDuration = 4 * time.Second
	// The victim goes on alone for hgDrain, so that the units its shares
	// moved between the regions during the run (region 0's container,
	// slowed by the slow key's ticks, shows less demand) reach the region
	// that asks for them before the end: a grant takes about a second.
	hgDrain    = 2 * time.Second
	hgHotIP    = "198.51.100.7"
	hgSlowIP   = "203.0.113.66"
	hgVictimIP = "192.0.2.10"
	hgProcs0   = 4 // containers in region 0
	hgProcs1   = 2 // in region 1
	// Every hgVictimEvery-th slot of region 0's first container decides
	// the victim too: 150/4/4, about 10 a second.
	hgVictimEvery = 4
	// Region 1's first container decides the victim every 100 ms, its
	// second the slow key.
	hgSlot1 = 100 * time.Millisecond
)

var hgRegions = []string{"us-east-1", "eu-west-1"}

const hgRules = `rules:
  - name: hot
    match: {paths: ["/hot/**"]}
    key: "{ip}"
    scope: global
    fail: open
    limits:
      - {name: hot-window, algorithm: sliding_window, limit: 200, window: 1s, sub_windows: 4, backend: dynamo}
  - name: per-ip
    match: {paths: ["/ip/**"]}
    key: "{ip}"
    scope: global
    fail: open
    limits:
      - {name: ip-window, algorithm: sliding_window, limit: 20, window: 30s, sub_windows: 4, backend: dynamo}
`

// hgContainer is one authorizer (a Lambda container) of a region.
type hgContainer struct {
	region int
	built  *Built
	clock  *stampClock
}

// hotGlobal is the run's deployment.
type hotGlobal struct {
	table string
	caps  [2]*testserver.CapProxy
	// throttles are the proxies' lines of throttled requests.
	throttles [2]*throttleLog
	delay     *keyDelay // region 0's endpoint
	cs        []*hgContainer
}

func startHotGlobal(t *testing.T) *hotGlobal {
	t.Helper()
	local := testserver.DynamoDBLocal(t)
	h := &hotGlobal{table: fmt.Sprintf("sluice-hotglobal-%d", time.Now().UnixNano())}
	for r := range h.caps {
		h.throttles[r] = &throttleLog{}
		h.caps[r] = testserver.NewCapProxy(t, local, testserver.CapConfig{Scale: hgScale, Log: h.throttles[r]})
	}
	h.delay = newKeyDelay(t, h.caps[0].URL())
	endpoints := []string{h.delay.URL(), h.caps[1].URL()}
	c := dynamodb.New(dynamodb.Options{BaseEndpoint: aws.String(local), Region: "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "test"}, nil
		})})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, c, h.table); err != nil {
		t.Fatal(err)
	}
	for r, region := range hgRegions {
		sdkSetenv(t, endpoints[r])
		n := hgProcs0
		if r == 1 {
			n = hgProcs1
		}
		raw := map[string]string{
			config.EnvDynamoTable: h.table, config.EnvDeadline: hgDeadline.String(), config.EnvRulesYAML: hgRules,
			config.EnvTableMode: config.TableEventual, config.EnvRegions: strings.Join(hgRegions, ","), config.EnvAWSRegion: region,
		}
		env, err := ParseEnv(func(k string) string { return raw[k] })
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			clock := &stampClock{}
			b, err := Build(t.Context(), env, Outputs{Stdout: discard{}, Stderr: discard{}, Clock: clock})
			if err != nil {
				t.Fatalf("region %s: %v", region, err)
			}
			t.Cleanup(b.Close)
			h.cs = append(h.cs, &hgContainer{region: r, built: b, clock: clock})
		}
	}
	return h
}

// throttleLog keeps a cap proxy's lines of throttled requests (each
// names the partition keys it asked for).
type throttleLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *throttleLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, strings.Split(strings.TrimSpace(string(p)), "\n")...)
	return len(p), nil
}

// Count is how many throttled requests named s (all: "").
func (l *throttleLog) Count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// hgEvent is the HTTP API request from ip on path.
func hgEvent(t *testing.T, ip, path string) []byte {
	t.Helper()
	event, err := os.ReadFile("../../events/http-request.json")
	if err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(string(event), "198.51.100.7", ip)
	return []byte(strings.ReplaceAll(s, "/pets/42", path))
}

// hgCall is one decision of the run.
type hgCall struct {
	limitertest.Call
	region            int
	failed, throttled bool
	latency           time.Duration
	err               error
	rendered          string // the rule's key
}

// hgRun is what became of a run's decisions, by key.
type hgRun struct {
	byKey map[string][]hgCall
}

func (h *hotGlobal) run(t *testing.T) hgRun {
	t.Helper()
	h.delay.Hold(hgSlowIP)
	events := map[string][]byte{
		hgHotIP:    hgEvent(t, hgHotIP, "/hot/1"),
		hgVictimIP: hgEvent(t, hgVictimIP, "/ip/1"),
		hgSlowIP:   hgEvent(t, hgSlowIP, "/ip/1"),
	}
	var (
		mu  sync.Mutex
		out = hgRun{byKey: map[string][]hgCall{}}
		wg  sync.WaitGroup
	)
	start := time.Now()
	decide := func(w int, c *hgContainer, ip string) bool {
		t0 := time.Now()
		_, res, err := c.built.Handler.Decide(t.Context(), events[ip])
		t1 := time.Now()
		if err != nil {
			t.Errorf("decide: %v", err)
			return false
		}
		call := hgCall{region: c.region, latency: t1.Sub(t0)}
		call.Call = limitertest.Call{Worker: w, Key: ip, Stamp: time.Unix(0, c.clock.last.Load()), Cost: 1,
			Start: t0.Sub(start), End: t1.Sub(start), Reached: true, Allowed: res.Outcome == policy.Allow}
		if len(res.Evals) > 0 {
			e := &res.Evals[0]
			call.failed, call.throttled, call.err = e.Failed, e.Throttled, e.Err
			call.rendered = e.Key
		}
		mu.Lock()
		out.byKey[ip] = append(out.byKey[ip], call)
		mu.Unlock()
		return true
	}
	// Warm-up: each container decides each of its keys once, one after
	// another, so that the first container of a region takes each key's
	// role and publishes before the others decide it (decided at once, a
	// new key's first decisions in the containers that lose the race for
	// the role find no entry yet: ErrStale, the fail mode).
	for w, c := range h.cs {
		keys := []string{hgHotIP}
		switch {
		case w == 0:
			keys = append(keys, hgVictimIP)
		case w == hgProcs0:
			keys = []string{hgVictimIP}
		case c.region == 1:
			keys = []string{hgSlowIP}
		}
		for _, ip := range keys {
			if !decide(w, c, ip) {
				return out
			}
		}
	}
	start = time.Now()
	for w, c := range h.cs {
		switch {
		case c.region == 0:
			every := time.Second * hgProcs0 / hgHotRate
			// Staggered over the slot.
			begin := start.Add(time.Duration(w) * every / hgProcs0)
			d := hgDuration
			if w == 0 {
				d += hgDrain
			}
			wg.Go(func() {
				n := 0
				paced(begin, d, every, func() bool {
					n++
					if w == 0 && n%hgVictimEvery == 0 && !decide(w, c, hgVictimIP) {
						return false
					}
					if time.Duration(n-1)*every >= hgDuration {
						return true // the drain: the victim only
					}
					return decide(w, c, hgHotIP)
				})
			})
		default:
			ip, d := hgVictimIP, hgDuration+hgDrain
			if w > hgProcs0 {
				ip, d = hgSlowIP, hgDuration
			}
			wg.Go(func() {
				paced(start, d, hgSlot1, func() bool { return decide(w, c, ip) })
			})
		}
	}
	wg.Wait()
	h.delay.Hold("")
	return out
}

// hgLatencies is the p50, p99 and maximum of calls' latencies.
func hgLatencies(calls []hgCall) (p50, p99, top time.Duration) {
	if len(calls) == 0 {
		return 0, 0, 0
	}
	ls := make([]time.Duration, len(calls))
	for i, c := range calls {
		ls[i] = c.latency
	}
	slices.Sort(ls)
	return ls[len(ls)/2], ls[len(ls)*99/100], ls[len(ls)-1]
}

// hgCount is how many of calls were admitted, failed (the fail mode
// decided), throttled, and ran to the deadline.
func hgCount(calls []hgCall) (admitted, failed, throttled, late int) {
	for _, c := range calls {
		if c.Allowed {
			admitted++
		}
		if c.failed {
			failed++
		}
		if c.throttled {
			throttled++
		}
		if c.latency >= hgDeadline {
			late++
		}
	}
	return
}

// hgFirstErr is the first error of calls, and the span of their stamps.
func hgFirstErr(calls []hgCall) string {
	var lo, hi time.Time
	first := "no error"
	for _, c := range calls {
		if c.err != nil && first == "no error" {
			first = c.err.Error()
		}
		if lo.IsZero() || c.Stamp.Before(lo) {
			lo = c.Stamp
		}
		if c.Stamp.After(hi) {
			hi = c.Stamp
		}
	}
	return fmt.Sprintf("stamps over %v; first error: %s", hi.Sub(lo), first)
}

func hgInRegion(calls []hgCall, r int) []hgCall {
	var out []hgCall
	for _, c := range calls {
		if c.region == r {
			out = append(out, c)
		}
	}
	return out
}

func hgPlain(calls []hgCall) []limitertest.Call {
	out := make([]limitertest.Call, len(calls))
	for i, c := range calls {
		out[i] = c.Call
	}
	return out
}

// hgExact is what one serialized per-IP window admits on calls.
func hgExact(t *testing.T, calls []hgCall) int64 {
	t.Helper()
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	exact, err := limiter.NewSlidingWindow(mem, limiter.SlidingWindowConfig{Name: "exact", Limit: hgVictimMax, Window: 30 * time.Second,
		SubWindows: 4, Representation: limiter.SubWindowCounters})
	if err != nil {
		t.Fatal(err)
	}
	n, err := limitertest.ExactAdmitted(t.Context(), exact, hgPlain(calls))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (h *hotGlobal) check(t *testing.T, run hgRun) {
	t.Helper()
	hot, victim, slow := run.byKey[hgHotIP], run.byKey[hgVictimIP], run.byKey[hgSlowIP]
	if len(hot) == 0 || len(victim) == 0 || len(slow) == 0 {
		t.Fatalf("%d hot, %d victim, %d slow decisions: the run failed", len(hot), len(victim), len(slow))
	}
	ha, hf, ht, _ := hgCount(hot)
	va, vf, vt, vlate := hgCount(victim)
	exact := hgExact(t, victim)
	h.logRun(t, run, exact)

	// The run tested what it is about: the store throttled the hot key
	// (and its decisions were denied as throttled, not failed), and
	// region 0 held the slow key's requests (its sweeps ticked it).
	switch n := h.throttles[0].Count(hgHotIP); {
	case n == 0:
		t.Errorf("no request of the hot key was throttled: the run did not reach the partition's cap")
	case ht == 0:
		t.Errorf("hot key: %d requests throttled, no decision denied as throttled", n)
	}
	if h.delay.Held() == 0 {
		t.Errorf("no request of the slow key was held in region 0: no sweep ticked it")
	}
	// The victim: exactly what one exact window admits, its limit, with
	// no decision failed, throttled, or run to the deadline.
	if int64(va) != exact || va != hgVictimMax {
		t.Errorf("victim admitted %d, exact %d, limit %d: want all three equal", va, exact, hgVictimMax)
	}
	if n := h.throttles[0].Count(hgVictimIP) + h.throttles[1].Count(hgVictimIP); vf != 0 || vt != 0 || n != 0 {
		t.Errorf("victim: %d decisions failed (decided by the fail mode), %d denied as throttled, %d requests throttled: want none", vf, vt, n)
	}
	if vlate != 0 {
		t.Errorf("victim: %d decisions ran to the deadline %v (waited for another key's requests)", vlate, hgDeadline)
	}
	// The hot key: never over its limit, nor region 0 over its base
	// share (region 1 never gives it: nobody there decides the key).
	for _, v := range limitertest.CheckTrailingWindow(hgPlain(hot), hgHotLimit, time.Second) {
		t.Errorf("hot key over its limit: %v", v)
	}
	for _, v := range limitertest.CheckTrailingWindow(hgPlain(hot), hgHotLimit/2, time.Second) {
		t.Errorf("hot key over region 0's base share: %v", v)
	}
	if hf != 0 {
		// Its own: a share entry not renewed in time while its item is
		// throttled (logged: the first error).
		t.Logf("hot key: %d decisions failed (fail mode), %d admitted in all", hf, ha)
	}
	for i, c := range h.cs {
		if br := c.built.Breakers[BackendDynamo]; br != nil {
			if s := br.Stats(); s.Opens != 0 || s.Rejected != 0 {
				t.Errorf("container %d: breaker %+v, want never opened", i, s)
			}
		}
	}
}

// logRun logs the run's counts and latencies.
func (h *hotGlobal) logRun(t *testing.T, run hgRun, exact int64) {
	t.Helper()
	hot, victim, slow := run.byKey[hgHotIP], run.byKey[hgVictimIP], run.byKey[hgSlowIP]
	st := h.caps[0].Stats()
	ha, hf, ht, _ := hgCount(hot)
	va, vf, vt, vlate := hgCount(victim)
	sa, sf, _, _ := hgCount(slow)
	t.Logf("hot: %d decisions, %d admitted (limit %d a second, region 0's share %d), %d denied as throttled, %d failed (%s); region 0's proxy: %d requests, %.0f write units, %d throttled (%d naming the hot key, %d its ledger entry)",
		len(hot), ha, hgHotLimit, hgHotLimit/2, ht, hf, hgFirstErr(hot), st.Requests, st.WriteUnits, st.Throttled, h.throttles[0].Count(hgHotIP),
		h.throttles[0].Count("regions/hot-window:"))
	t.Logf("victim: %d decisions, %d admitted (exact %d, limit %d), %d failed, %d denied as throttled, %d ran to the deadline %v",
		len(victim), va, exact, hgVictimMax, vf, vt, vlate, hgDeadline)
	t.Logf("slow key: %d decisions in region 1, %d admitted, %d failed; %d requests held in region 0", len(slow), sa, sf, h.delay.Held())
	for r := range hgRegions {
		in := hgInRegion(victim, r)
		p50, p99, top := hgLatencies(in)
		a, f, _, late := hgCount(in)
		t.Logf("victim in region %d: %d decisions, %d admitted, %d failed, %d ran to the deadline; latency p50 %v, p99 %v, max %v (%s)",
			r, len(in), a, f, late, p50, p99, top, hgFirstErr(in))
	}
	p50, p99, top := hgLatencies(hot)
	t.Logf("hot latency: p50 %v, p99 %v, max %v", p50, p99, top)
	for _, c := range victim {
		if c.failed || c.latency >= hgDeadline {
			t.Logf("victim: region %d worker %d at %v took %v: %v", c.region, c.Worker, c.Start, c.latency, c.err)
		}
	}
	for _, k := range h.cs[0].built.shares {
		if s, ok := k.Stats(slow[0].rendered); ok {
			t.Logf("region 0, container 0: the slow key's agent %+v, table %+v; sweeps %+v", s.Agent, s.Table, k.SweepStats())
		}
	}
}
