package authz

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// reloadRules: a rule with a concurrency limit (failing open) on /slow,
// and a rule whose window leases on /hot.
const reloadRules = `
rules:
  - name: in-flight
    match: {paths: ["/slow"]}
    key: "{ip}"
    fail: open
    concurrency: {limit: 100}
    limits: [{algorithm: fixed_window, limit: 1000, window: 1m}]
  - name: hot
    match: {paths: ["/hot"]}
    key: "all"
    limits: [{algorithm: sliding_window, limit: 100000, window: 1m}]
`

// reloadLine is a decision line's rule and counters.
type reloadLine struct {
	Rule                                                                                          string
	LeaseTakes, LeaseReturns, LeaseUnitsLost                                                      int64
	ConcurrencyUnknown, ConcurrencyCleanups, ConcurrencyCleanupErrors, ConcurrencyCleanupsSkipped int64
}

// reloadPolicy loads reloadRules on a memory store of its own, with its
// concurrency leases behind a stallLeases switch, as a rules reload does
// (every limiter and counter new).
func reloadPolicy(t *testing.T) (*policy.Policy, *stallLeases) {
	t.Helper()
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	lm, err := memory.NewLeases(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	leases := &stallLeases{Leases: lm}
	p, err := policy.Load([]byte(reloadRules), policy.Options{Stores: map[string]storage.Store{"memory": mem}, Leases: leases})
	if err != nil {
		t.Fatal(err)
	}
	return p, leases
}

// TestMetricsPolicyReload swaps the policy under Metrics, as policy.Cache
// does on a rules reload (a new Policy, its limiters' counters from
// zero), with counts on both sides of the swap, on synctest's clock:
//   - the first line of a request cut short on the new policy says its
//     own ConcurrencyUnknown and first clean-up release (although the new
//     policy's counters equal what the old one's last line saw), and
//     those of a request of the old policy cut short meanwhile (in flight
//     over the swap);
//   - that request's own line, recorded after, says 0 (not twice);
//   - the old policy's clean-up releases that land after the swap (1 s
//     after their acquires) are on the rule's next line, and so are the
//     old policy's lease returns;
//   - over the run, each rule's lines sum to both policies' counters
//     (lease takes, returns and units lost of a leasing rule too).
//
// Each line is recorded once the request's background work has settled
// (synctest.Wait), so that every line's counts are exact.
func TestMetricsPolicyReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		m := NewMetrics(&buf, "")
		p1, s1 := reloadPolicy(t)
		p2, s2 := reloadPolicy(t)
		var lines []reloadLine
		// eval evaluates a request for path on p, its concurrency
		// acquire cut short (50 ms deadline) when hang.
		eval := func(p *policy.Policy, s *stallLeases, path string, at time.Time, hang bool) policy.Result {
			t.Helper()
			s.hang.Store(hang)
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			res := p.Evaluate(ctx, &policy.Request{SourceIP: "192.0.2.9", Method: "GET", Path: path}, at)
			if res.Outcome != policy.Allow || len(res.Evals) != 1 || res.Evals[0].Failed != hang {
				t.Fatalf("%s: %v (%s), evals %+v", path, res.Outcome, res.Reason, res.Evals)
			}
			return res
		}
		// record records res with p and returns its line.
		record := func(p *policy.Policy, res policy.Result) reloadLine {
			t.Helper()
			synctest.Wait()
			buf.Reset()
			m.Record(time.Now(), &res, p)
			var l reloadLine
			if err := json.Unmarshal(buf.Bytes(), &l); err != nil || strings.Count(buf.String(), "\n") != 1 {
				t.Fatalf("line %q: %v", buf.String(), err)
			}
			lines = append(lines, l)
			return l
		}
		slow := func(name string, p *policy.Policy, res policy.Result, unknown, cleanups int64) {
			t.Helper()
			l := record(p, res)
			if l.Rule != "in-flight" || l.ConcurrencyUnknown != unknown || l.ConcurrencyCleanups != cleanups || l.ConcurrencyCleanupErrors != 0 || l.ConcurrencyCleanupsSkipped != 0 {
				t.Errorf("%s: %+v, want ConcurrencyUnknown %d, ConcurrencyCleanups %d", name, l, unknown, cleanups)
			}
		}
		hot := func(p *policy.Policy, s *stallLeases, from time.Time) {
			t.Helper()
			for i := range 500 {
				record(p, eval(p, s, "/hot", from.Add(time.Duration(i)*time.Millisecond), false))
			}
		}
		start := time.Now()

		hot(p1, s1, start)
		slow("cut short on the old policy", p1, eval(p1, s1, "/slow", time.Now(), true), 1, 1)
		inFlight := eval(p1, s1, "/slow", time.Now(), true) // recorded after the swap
		// The swap: p2's counters reach what p1's last line saw.
		slow("cut short on the new policy", p2, eval(p2, s2, "/slow", time.Now(), true), 2, 2)
		slow("the old policy's request in flight over the swap", p1, inFlight, 0, 0)
		// The second releases, 1 s after each acquire: two of p1's (after
		// the swap), one of p2's.
		time.Sleep(3 * time.Second)
		slow("the next line after the late releases", p2, eval(p2, s2, "/slow", time.Now(), false), 0, 3)
		// The old policy's leases given back after the swap (as a reload
		// that returned them would).
		if err := p1.ReturnLeases(t.Context(), start.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		hot(p2, s2, start.Add(time.Minute))

		var got, want reloadLine
		for _, p := range []*policy.Policy{p1, p2} {
			ls, cs := p.LeaseStats("hot"), p.ConcurrencyStats("in-flight")
			if ls.Takes == 0 || p == p1 && ls.Returns == 0 {
				t.Errorf("the hot rule took no lease: %+v", ls)
			}
			want.LeaseTakes += ls.Takes
			want.LeaseReturns += ls.Returns
			want.LeaseUnitsLost += ls.Lost
			want.ConcurrencyUnknown += cs.Unknown
			want.ConcurrencyCleanups += cs.Releases
			want.ConcurrencyCleanupErrors += cs.Failed
			want.ConcurrencyCleanupsSkipped += cs.Skipped
		}
		for _, l := range lines {
			got.LeaseTakes += l.LeaseTakes
			got.LeaseReturns += l.LeaseReturns
			got.LeaseUnitsLost += l.LeaseUnitsLost
			got.ConcurrencyUnknown += l.ConcurrencyUnknown
			got.ConcurrencyCleanups += l.ConcurrencyCleanups
			got.ConcurrencyCleanupErrors += l.ConcurrencyCleanupErrors
			got.ConcurrencyCleanupsSkipped += l.ConcurrencyCleanupsSkipped
		}
		if got != want {
			t.Errorf("the lines sum to %+v, want both policies' counters %+v", got, want)
		}
		t.Logf("sums %+v", got)
	})
}

// TestMetricsPolicyRetention: Metrics follows at most keepPolicies
// policies, most recently used first, and none unused for keepPolicy:
// after four reloads a second apart, the oldest policy's late counts are
// no longer reported and the second's still are; a minute later only the
// current policy is followed.
func TestMetricsPolicyRetention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		m := NewMetrics(&buf, "")
		start := time.Now()
		// hot records 500 requests of the hot rule on p at now, and
		// returns their lines' LeaseReturns and the growth of p's.
		hot := func(p *policy.Policy, now time.Time) (line, own int64) {
			t.Helper()
			before := p.LeaseStats("hot").Returns
			for i := range 500 {
				res := p.Evaluate(t.Context(), &policy.Request{SourceIP: "192.0.2.9", Method: "GET", Path: "/hot"}, start.Add(time.Duration(i)*time.Millisecond))
				synctest.Wait()
				buf.Reset()
				m.Record(now, &res, p)
				var l reloadLine
				if err := json.Unmarshal(buf.Bytes(), &l); err != nil || l.Rule != "hot" {
					t.Fatalf("line %q: %v", buf.String(), err)
				}
				line += l.LeaseReturns
			}
			return line, p.LeaseStats("hot").Returns - before
		}
		var ps []*policy.Policy
		for i := range 4 {
			p, _ := reloadPolicy(t)
			ps = append(ps, p)
			hot(p, start.Add(time.Duration(i)*time.Second))
			if len(m.pols) != min(i+1, keepPolicies) || m.pols[0].p != p {
				t.Fatalf("after policy %d: %d followed, the first %p", i+1, len(m.pols), m.pols[0].p)
			}
		}
		for i, f := range m.pols {
			if want := ps[len(ps)-1-i]; f.p != want {
				t.Errorf("followed %d is not policy %d", i, len(ps)-i)
			}
		}
		// Late counts of the first policy (no longer followed) and the
		// second (still followed): only the second's are reported.
		for _, p := range ps[:2] {
			if err := p.ReturnLeases(t.Context(), start.Add(time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		late := ps[1].LeaseStats("hot").Returns
		if ps[0].LeaseStats("hot").Returns == 0 || late == 0 {
			t.Fatalf("no lease returned: %+v, %+v", ps[0].LeaseStats("hot"), ps[1].LeaseStats("hot"))
		}
		if line, own := hot(ps[3], start.Add(4*time.Second)); line != late+own {
			t.Errorf("LeaseReturns %d on the lines, want the second policy's %d and the current one's %d", line, late, own)
		}
		hot(ps[3], start.Add(4*time.Second+keepPolicy+time.Second))
		if len(m.pols) != 1 {
			t.Errorf("%d policies followed a minute after the reloads, want the current one", len(m.pols))
		}
	})
}
