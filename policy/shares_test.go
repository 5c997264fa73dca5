package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// sharesFake is a limiter Options.Shares builds: it records the limits.
type sharesFake struct{ name string }

func (f *sharesFake) AllowN(context.Context, string, time.Time, int64) (limiter.Decision, error) {
	return limiter.Decision{Allowed: true, Name: f.name}, nil
}
func (f *sharesFake) Refund(context.Context, string, time.Time, int64) error { return nil }

// With Options.Shares, a global rule's limits (its tiers' too) are built
// by Shares.Build after CheckShares; a regional rule's are not; a limit
// the shares cannot serve fails at load, naming the rule and the limit.
func TestShares(t *testing.T) {
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var built []string
	opts := Options{Stores: map[string]storage.Store{"memory": mem, "dynamo": mem}, Shares: &Shares{Regions: 3,
		Build: func(l *Limit, cost int64, leases bool) (limiter.Limiter, error) {
			built = append(built, l.Name)
			return &sharesFake{name: l.Name}, nil
		}}}
	doc := `rules:
  - name: g
    key: "{ip}"
    scope: global
    tier: "{header:X-Plan}"
    limits: [{name: w, algorithm: sliding_window, limit: 100, window: 4s, sub_windows: 4, backend: dynamo}]
    tiers: {pro: [{name: b, algorithm: token_bucket, max_amount: 10, refill_time: 1s, backend: dynamo}]}
  - name: r
    key: "{ip}"
    limits: [{name: local, algorithm: fixed_window, limit: 5, window: 1s}]
`
	p, err := Load([]byte(doc), opts)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(built, ",") != "w,b" {
		t.Errorf("shares built for %v, want w,b (the global rule's limits only)", built)
	}
	res := p.Evaluate(t.Context(), &Request{SourceIP: "192.0.2.1", Method: "GET", Path: "/"}, time.Now())
	if res.Outcome != Allow || len(res.Evals) != 2 || res.Evals[0].Decision.Name != "w" {
		t.Errorf("result %+v: want the global rule decided by its shares", res)
	}
	for _, tc := range []struct{ limit, want string }{
		{"{algorithm: fixed_window, limit: 100, window: 4s}", "g/0 is a fixed_window: regional shares"},
		{"{algorithm: sliding_log, limit: 100, window: 4s}", "g/0 is a sliding_log: regional shares"},
		{"{algorithm: sliding_window, limit: 100, window: 4s, estimator: interpolated}", "g/0 has estimator interpolated"},
		{"{algorithm: sliding_window, limit: 100, window: 4s, count_denied: true}", "g/0 counts denied requests"},
		{"{algorithm: sliding_window, limit: 100, window: 4s, representation: packed}", "g/0 is packed"},
		{"{algorithm: sliding_window, limit: 2, window: 4s, sub_windows: 4}", "g/0: limit 2 is below the 3 regions"},
		{"{algorithm: token_bucket, max_amount: 10, refill_time: 1s, strict: true}", "g/0 is strict"},
		{"{algorithm: token_bucket, max_amount: 5, refill_time: 1s}", "g/0: max_amount 5 is below 6"},
	} {
		limit := strings.Replace(tc.limit, "}", ", backend: dynamo}", 1)
		_, err := Load([]byte("rules: [{name: g, key: k, scope: global, limits: ["+limit+"]}]"), opts)
		if !errors.Is(err, ErrInvalidRule) || !strings.Contains(err.Error(), `rule "g" (rules[0]): scope: `+tc.want) {
			t.Errorf("%s: got %v, want %q", tc.limit, err, tc.want)
		}
	}
}

// TestGlobalLimitNames: two global rules may name a limit alike only with
// the same parameters (the name names its regional shares in the state
// table: two sets of shares of one name tick each other's keys); Parse
// and New refuse other parameters, naming both rules, the field and the
// parameter. Regional rules share no storage by a limit's name: any
// parameters.
func TestGlobalLimitNames(t *testing.T) {
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Stores: map[string]storage.Store{"memory": mem, "dynamo": mem}, Shares: &Shares{Regions: 3,
		Build: func(l *Limit, cost int64, leases bool) (limiter.Limiter, error) {
			return &sharesFake{name: l.Name}, nil
		}}}
	const (
		w200 = "{name: shared, algorithm: sliding_window, limit: 200, window: 2s, sub_windows: 4, backend: dynamo}"
		w60  = "{name: shared, algorithm: sliding_window, limit: 60, window: 2s, sub_windows: 4, backend: dynamo}"
		wOff = "{name: shared, algorithm: sliding_window, limit: 200, window: 2s, sub_windows: 4, lease: off, backend: dynamo}"
		tb   = "{name: shared, algorithm: token_bucket, max_amount: 10, refill_time: 1s, backend: dynamo}"
	)
	rule := func(name, scope, limits string) string {
		return fmt.Sprintf("  - {name: %s, key: \"{ip}\", scope: %s, limits: [%s]}\n", name, scope, limits)
	}
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"same parameters", rule("a", "global", w200) + rule("b", "global", w200), ""},
		{"regional", rule("a", "region", w200) + rule("b", "region", w60), ""},
		{"one regional", rule("a", "region", w60) + rule("b", "global", w200), ""},
		{"limit", rule("a", "global", w200) + rule("b", "global", w60),
			`rule "b" (rules[1]): limits[0].name: "shared" is also the name of limits[0] of the global rule "a" (rules[0]), with limit 200 there and 60 here`},
		{"lease", rule("a", "global", w200) + rule("b", "global", wOff), `with lease auto there and off here`},
		{"algorithm", rule("a", "global", w200) + rule("b", "global", "{name: other, algorithm: token_bucket, max_amount: 10, refill_time: 1s, backend: dynamo}, "+tb),
			`rule "b" (rules[1]): limits[1].name: "shared" is also the name of limits[0] of the global rule "a" (rules[0]), with algorithm sliding_window there and token_bucket here`},
		{"tier", rule("a", "global", w200) +
			"  - {name: b, key: \"{ip}\", scope: global, tier: \"{header:X-Plan}\", limits: [" + strings.Replace(w60, "shared", "own", 1) + "], tiers: {pro: [" + w60 + "]}}\n",
			`rule "b" (rules[1]): tiers.pro[0].name: "shared" is also the name of limits[0] of the global rule "a" (rules[0]), with limit 200 there and 60 here`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := "rules:\n" + tc.doc
			_, perr := ParseDocument([]byte(doc))
			_, nerr := Load([]byte(doc), opts)
			for _, err := range []error{perr, nerr} {
				switch {
				case tc.want == "" && err != nil:
					t.Errorf("refused: %v", err)
				case tc.want != "" && (!errors.Is(err, ErrInvalidRule) || !strings.Contains(err.Error(), tc.want)):
					t.Errorf("got %v, want an invalid rule containing %q", err, tc.want)
				}
			}
		})
	}
}

// TestRegionalLimitNames: regional limits of one name in two rules keep
// their own counters (a counter is named by the limit's parameters and
// the rule's key, which begins with the rule's name), even with the same
// parameters.
func TestRegionalLimitNames(t *testing.T) {
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	doc := `rules:
  - {name: a, key: "{ip}", match: {paths: ["/a"]}, limits: [{name: shared, algorithm: sliding_window, limit: 2, window: 1m}]}
  - {name: b, key: "{ip}", match: {paths: ["/b"]}, limits: [{name: shared, algorithm: sliding_window, limit: 2, window: 1m}]}
`
	p, err := Load([]byte(doc), Options{Stores: map[string]storage.Store{"memory": mem}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	for i, path := range []string{"/b", "/b", "/a", "/a", "/b", "/a"} {
		res := p.Evaluate(t.Context(), &Request{SourceIP: "192.0.2.1", Method: "GET", Path: path}, now)
		if want := i < 4; (res.Outcome == Allow) != want {
			t.Errorf("request %d (%s): %v (%s), want allowed %v: each rule's limit of 2 is its own", i, path, res.Outcome, res.Rule, want)
		}
	}
}
