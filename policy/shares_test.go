package policy

import (
	"context"
	"errors"
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
