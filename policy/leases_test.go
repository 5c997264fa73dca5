package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

const hotRule = `
rules:
  - name: global
    key: "all"
    limits:
      - {algorithm: sliding_window, limit: 100000, window: 1m%s}
`

// hotCalls evaluates one request a millisecond for 2 s of stamps and
// counts the reasons and the store requests.
func hotCalls(t *testing.T, doc string, opts Options) (map[Reason]int, int64, limiter.LeaseStats) {
	t.Helper()
	cs := newCounting(t)
	opts.Stores = map[string]storage.Store{"memory": cs}
	p := mustLoad(t, doc, opts)
	reasons := map[Reason]int{}
	for i := range 2000 {
		res := p.Evaluate(t.Context(), get("192.0.2.9", "/"), t0.Add(time.Duration(i)*time.Millisecond))
		if res.Outcome != Allow {
			t.Fatalf("request %d: %v (%s)", i, res.Outcome, res.Reason)
		}
		reasons[res.Reason]++
	}
	return reasons, cs.requests(), p.LeaseStats("global")
}

// TestLeases: a hot key of a rule's window is decided from capacity
// leases by default (reason lease, a fraction of the store requests), and
// not with lease: off or Options.NoLeases.
func TestLeases(t *testing.T) {
	on, onReq, onStats := hotCalls(t, strings.ReplaceAll(hotRule, "%s", ""), Options{})
	off, offReq, offStats := hotCalls(t, strings.ReplaceAll(hotRule, "%s", ", lease: off"), Options{})
	global, globalReq, _ := hotCalls(t, strings.ReplaceAll(hotRule, "%s", ""), Options{NoLeases: true})
	t.Logf("leases: %v, %d store requests, %+v; lease: off: %v, %d; NoLeases: %v, %d", on, onReq, onStats, off, offReq, global, globalReq)
	if on[ReasonLease] < 1500 || onReq > 300 {
		t.Errorf("with leases: %v and %d store requests for 2,000 requests, want most from leases", on, onReq)
	}
	if onStats.Takes == 0 || onStats.Decisions != int64(on[ReasonLease]) || offStats != (limiter.LeaseStats{}) {
		t.Errorf("LeaseStats: %+v with leases (%d lease decisions), %+v with lease: off", onStats, on[ReasonLease], offStats)
	}
	for _, c := range []struct {
		name string
		r    map[Reason]int
		req  int64
	}{{"lease: off", off, offReq}, {"NoLeases", global, globalReq}} {
		if c.r[ReasonLease] != 0 || c.req < 2000 {
			t.Errorf("%s: %v and %d store requests, want no lease and one request each", c.name, c.r, c.req)
		}
	}
}

// TestLeaseSetting: lease takes auto or off, on the algorithms that
// lease.
func TestLeaseSetting(t *testing.T) {
	for _, c := range []struct{ doc, err string }{
		{"{algorithm: token_bucket, max_amount: 5, refill_time: 1s, lease: off}", ""},
		{"{algorithm: sliding_window, limit: 5, window: 1m, lease: auto}", ""},
		{"{algorithm: sliding_window, limit: 5, window: 1m, lease: sometimes}", `"sometimes" is not auto or off`},
		{"{algorithm: fixed_window, limit: 5, window: 1m, lease: off}", "not a field of fixed_window"},
	} {
		_, err := Parse([]byte("rules:\n  - name: r\n    key: all\n    limits:\n      - " + c.doc + "\n"))
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.doc, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want one containing %q", c.doc, err, c.err)
		}
	}
}

// TestScope: a rule's scope is region (the default) or global, and a
// global rule's every limit names backend dynamo.
func TestScope(t *testing.T) {
	for _, c := range []struct{ scope, limits, err string }{
		{"", "{algorithm: token_bucket, max_amount: 5, refill_time: 1s}", ""},
		{"scope: region", "{algorithm: token_bucket, max_amount: 5, refill_time: 1s, backend: memcached}", ""},
		{"scope: global", "{algorithm: token_bucket, max_amount: 5, refill_time: 1s, backend: dynamo}", ""},
		{"scope: global", "{algorithm: token_bucket, max_amount: 5, refill_time: 1s}", `global needs every limit on backend dynamo`},
		{"scope: global", "{algorithm: sliding_window, limit: 5, window: 1m, backend: memcached}", `has backend "memcached"`},
		{"scope: everywhere", "{algorithm: token_bucket, max_amount: 5, refill_time: 1s, backend: dynamo}", `"everywhere" is not region or global`},
	} {
		doc := "rules:\n  - name: r\n    key: all\n    " + c.scope + "\n    limits:\n      - " + c.limits + "\n"
		_, err := Load([]byte(doc), Options{})
		if c.err == "" && err != nil && !strings.Contains(err.Error(), "not configured") {
			t.Errorf("%s %s: %v", c.scope, c.limits, err)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s %s: error %v, want one containing %q", c.scope, c.limits, err, c.err)
		}
	}
	rules, err := Parse([]byte("rules:\n  - name: r\n    key: all\n    scope: global\n    limits:\n      - {algorithm: token_bucket, max_amount: 5, refill_time: 1s, backend: dynamo}\n"))
	if err != nil || rules[0].Scope != ScopeGlobal || rules[0].Scope.String() != "global" {
		t.Errorf("parsed %+v, %v: want scope global", rules, err)
	}
}
