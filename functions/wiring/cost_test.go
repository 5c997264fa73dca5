package wiring

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/functions/dev/golden"
	"github.com/sluicehq/sluice/internal/testserver"
)

// costEvent is a REST REQUEST event for path from ip, with a bearer token
// when token is not empty.
func costEvent(path, ip, token string) []byte {
	headers := `{}`
	if token != "" {
		headers = fmt.Sprintf(`{"Authorization":"Bearer %s"}`, token)
	}
	return fmt.Appendf(nil, `{"type":"REQUEST","methodArn":"arn:aws:execute-api:us-east-1:1:api/prod/GET%s","httpMethod":"GET","path":%q,
		"headers":%s,"requestContext":{"stage":"prod","identity":{"sourceIp":%q}}}`, path, path, headers, ip)
}

// costCase is one kind of request of the embedded rules, and what each
// one costs at the servers.
type costCase struct {
	name string
	// run makes the case's requests at the clock and returns how many
	// decisions it measured; warm-up it does first is not counted (see
	// measure).
	warm, run func(t *testing.T, d func(path, ip, token string) bool) int
}

// costCases are the rows of docs/cost.md's table, with the embedded rules:
// per-ip (a sliding window of 600 a minute and a bucket of 50) on {ip},
// per-token (1200 a minute) on {token}, and the /demo/** rules (3 a minute
// on one key, and a shadow of 2).
func costCases(clock *fakeClock) []costCase {
	n := 0
	ip := func() string { n++; return fmt.Sprintf("198.51.100.%d", n%250+1) }
	tok := func() string { n++; return fmt.Sprintf("tok-%d", n) }
	// allowed runs k allowed requests, one every 2 s, from one client.
	allowed := func(path string, token bool) func(t *testing.T, d func(string, string, string) bool) int {
		return func(t *testing.T, d func(string, string, string) bool) int {
			a, tk := ip(), ""
			if token {
				tk = tok()
			}
			for i := range 10 {
				clock.Advance(2 * time.Second)
				if !d(path, a, tk) {
					t.Fatalf("%s request %d denied", path, i)
				}
			}
			return 10
		}
	}
	// drained returns a run that drains a client's bucket (50 at one
	// stamp, warm-up) then measures the one request the store denies
	// (the next ones the deny cache answers).
	drained := func(token bool) (warm, run func(t *testing.T, d func(string, string, string) bool) int) {
		var a, tk string
		warm = func(t *testing.T, d func(string, string, string) bool) int {
			a = ip()
			if token {
				tk = tok()
			}
			clock.Advance(time.Minute)
			for range 50 {
				d("/x", a, tk)
			}
			return 0
		}
		run = func(t *testing.T, d func(string, string, string) bool) int {
			if d("/x", a, tk) {
				t.Fatal("allowed past the bucket")
			}
			return 1
		}
		return warm, run
	}
	cached := func(t *testing.T, d func(string, string, string) bool) int {
		a := ip()
		clock.Advance(time.Minute)
		for range 51 {
			d("/x", a, "")
		}
		for range 9 {
			if d("/x", a, "") {
				t.Fatal("allowed past the bucket")
			}
		}
		return 0
	}
	dw, dr := drained(false)
	tw, tr := drained(true)
	return []costCase{
		{name: "allowed, no token", run: allowed("/x", false)},
		{name: "allowed, with a token", run: allowed("/x", true)},
		{name: "/demo/** request, no token", run: func(t *testing.T, d func(string, string, string) bool) int {
			// The demo rules' key is one for everyone: a new minute each.
			clock.Advance(time.Minute)
			if !d("/demo/hello", ip(), "") {
				t.Fatal("/demo denied")
			}
			return 1
		}},
		{name: "denied by the bucket, no token", warm: dw, run: dr},
		{name: "denied by the bucket, with a token", warm: tw, run: tr},
		{name: "denied from the deny cache", warm: cached, run: func(t *testing.T, d func(string, string, string) bool) int {
			if d("/x", fmt.Sprintf("198.51.100.%d", n%250+1), "") {
				t.Fatal("allowed past the bucket")
			}
			return 1
		}},
	}
}

// TestCostPerDecision counts what one request of each kind costs at the
// servers, through the authorizer with the embedded rules: DynamoDB write
// and read units as DynamoDB bills them, at a cap proxy of its own in
// front of DynamoDB Local; memcached storage, arithmetic and retrieval
// commands from a private memcached's own stats. docs/cost.md's table is
// these figures; the assertions are its DynamoDB claims (one write unit
// per key per allowed request, a failed condition billed, nothing for a
// cached denial).
//
// Capacity leases are off (SLUICE_LEASES=false): the warm-ups decide one
// client dozens of times at one stamp, which makes its keys hot, and a
// hot key decided from a lease costs a tenth of this (docs/cost.md, "A
// hot key with capacity leases", measured by TestLeasesHotKeyCapped).
func TestCostPerDecision(t *testing.T) {
	t.Run("dynamo", func(t *testing.T) {
		proxy := testserver.NewCapProxy(t, testserver.DynamoDBLocal(t), testserver.CapConfig{})
		sdkEnv(t, proxy.URL())
		table := fmt.Sprintf("sluice-cost-%d", time.Now().UnixNano())
		clock := newFakeClock(golden.Clock)
		b := buildCost(t, map[string]string{"SLUICE_DYNAMO_TABLE": table, "SLUICE_DEADLINE": "2s", "SLUICE_LEASES": "false"}, clock)
		want := map[string]float64{ // write units per decision
			"allowed, no token":                  1,
			"allowed, with a token":              2,
			"denied by the bucket, no token":     1, // the failed condition, billed
			"denied from the deny cache":         0,
			"denied by the bucket, with a token": 3, // the per-ip failed condition; the per-token take and its refund
		}
		for _, c := range costCases(clock) {
			var before testserver.CapCounts
			n := measure(t, b, c, func() { before = proxy.TableStats(table) })
			after := proxy.TableStats(table)
			wu, ru := (after.WriteUnits-before.WriteUnits)/float64(n), (after.ReadUnits-before.ReadUnits)/float64(n)
			reqs := float64(after.Requests-before.Requests) / float64(n)
			t.Logf("dynamo | %-36s | %.2f WRU | %.2f RRU | %.2f requests", c.name, wu, ru, reqs)
			if w, ok := want[c.name]; ok && wu != w {
				t.Errorf("%s: %.2f write units per decision at the proxy, want %v", c.name, wu, w)
			}
			if ru != 0 {
				t.Errorf("%s: %.2f read units per decision, want none", c.name, ru)
			}
		}
	})
	t.Run("memcached", func(t *testing.T) {
		srv := testserver.StartMemcached(t)
		clock := newFakeClock(golden.Clock)
		b := buildCost(t, map[string]string{"SLUICE_MEMCACHED_ADDRS": srv.Addr(), "SLUICE_DEFAULT_BACKEND": "memcached", "SLUICE_DEADLINE": "2s", "SLUICE_LEASES": "false"}, clock)
		for _, c := range costCases(clock) {
			var before map[string]int64
			n := measure(t, b, c, func() { before = memcachedSettled(t, srv.Addr()) })
			after := memcachedSettled(t, srv.Addr())
			d := func(names ...string) float64 {
				var sum int64
				for _, k := range names {
					sum += after[k] - before[k]
				}
				return float64(sum) / float64(n)
			}
			writes := d("cmd_set", "incr_hits", "incr_misses", "decr_hits", "decr_misses", "cmd_touch")
			t.Logf("memcached | %-36s | %.2f writes (set/add/cas %.2f, incr/decr %.2f) | %.2f keys read", c.name, writes,
				d("cmd_set"), d("incr_hits", "incr_misses", "decr_hits", "decr_misses"), d("cmd_get"))
			if c.name == "denied from the deny cache" && writes+d("cmd_get") != 0 {
				t.Errorf("%s: %.2f commands, want none", c.name, writes+d("cmd_get"))
			}
		}
	})
}

// buildCost builds the authorizer on the embedded rules with vars and a
// fake clock.
func buildCost(t *testing.T, vars map[string]string, clock *fakeClock) *Built {
	t.Helper()
	env, err := ParseEnv(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(t.Context(), env, Outputs{Stdout: io.Discard, Stderr: io.Discard, Clock: clock, CreateTable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// measure runs c's warm-up, waits for its refunds, calls mark, then runs
// c and waits for its refunds, and returns the decisions run counted (at
// least 1).
func measure(t *testing.T, b *Built, c costCase, mark func()) int {
	t.Helper()
	d := func(path, ip, token string) bool {
		resp, _, err := b.Handler.Decide(t.Context(), costEvent(path, ip, token))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		return resp.Allowed()
	}
	if c.warm != nil {
		c.warm(t, d)
	}
	waitAll(b)
	mark()
	n := c.run(t, d)
	waitAll(b)
	return max(n, 1)
}

// memcachedSettled reads a memcached server's statistics once its
// command counters have stopped moving (two reads 20 ms apart agree, for
// up to a second): a window's refund is a noreply decr, which the
// store's connection sends without an answer to wait for, so the server
// may still be executing it on its connection's thread when a stats
// request on another connection is answered.
func memcachedSettled(t *testing.T, addr string) map[string]int64 {
	t.Helper()
	prev := memcachedStats(t, addr)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		cur := memcachedStats(t, addr)
		same := true
		for _, k := range []string{"cmd_get", "cmd_set", "cmd_touch", "incr_hits", "incr_misses", "decr_hits", "decr_misses"} {
			same = same && cur[k] == prev[k]
		}
		if same {
			return cur
		}
		prev = cur
	}
	return prev
}

// memcachedStats reads a memcached server's general-purpose statistics.
func memcachedStats(t *testing.T, addr string) map[string]int64 {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(conn, "stats\r\n"); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		line := sc.Text()
		if line == "END" {
			return out
		}
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "STAT" {
			if v, err := strconv.ParseInt(f[2], 10, 64); err == nil {
				out[f[1]] = v
			}
		}
	}
	t.Fatalf("stats: %v", sc.Err())
	return nil
}

// waitAll waits for the refunds b's stores sent without waiting, so that
// a measure counts its own refunds and none of the case before.
func waitAll(b *Built) {
	for _, st := range b.Stores {
		if s, ok := unwrap(st).(interface{ WaitRefunds(context.Context) error }); ok {
			waitRefunds(s, 2*time.Second)
		}
	}
}
