package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// twinLimits are limits of 4 units a minute, each given twice in one
// rule (and once in a tier) by twinDoc: every algorithm, a packed and a
// sub-window window, and two estimators on one key space.
var twinLimits = [][2]string{
	{`algorithm: sliding_window, limit: 4, window: 1m`, ""},
	{`algorithm: sliding_window, limit: 4, window: 1m, sub_windows: 6`, ""},
	{`algorithm: sliding_window, limit: 4, window: 1m, sub_windows: 6`, `algorithm: sliding_window, limit: 4, window: 1m, sub_windows: 6, estimator: interpolated`},
	{`algorithm: fixed_window, limit: 4, window: 1m`, ""},
	{`algorithm: sliding_log, limit: 4, window: 1m`, ""},
	{`algorithm: token_bucket, max_amount: 4, refill_time: 1m`, ""},
}

// twinDoc is a rule "twins" with the limits a and b (b as a when empty)
// and a tier "t" with c and d alike, and a rule "lone" with a alone.
func twinDoc(a, b string) string {
	if b == "" {
		b = a
	}
	return fmt.Sprintf(`rules:
  - {name: twins, key: "{ip}", match: {paths: ["/twins"]}, tier: "{header:X-Plan}",
     limits: [{name: a, %[1]s}, {name: b, %[2]s}], tiers: {t: [{name: c, %[1]s}, {name: d, %[2]s}]}}
  - {name: lone, key: "{ip}", match: {paths: ["/lone"]}, limits: [{name: a, %[1]s}]}
`, a, b)
}

// TestTwinLimits: two limits of one rule (or of one tier) with the same
// parameters and different names keep a counter each, so a client gets
// the limit's 4 requests a minute, not 2 (each request counted twice on
// one shared counter, as with brokenTwins). The first of the two keeps
// the key space a limit alone has (the counters of rules without twins,
// and the first twin's, are named as before); the second's is tagged with
// its name.
func TestTwinLimits(t *testing.T) {
	testTwins(t, Options{Stores: memStores(t)})
}

// testTwins runs TestTwinLimits on opts' stores.
func testTwins(t *testing.T, opts Options) {
	for i, lim := range twinLimits {
		p := mustLoad(t, twinDoc(lim[0], lim[1]), opts)
		now := time.Unix(1_700_000_000, 0)
		for _, tier := range []string{"", "t"} {
			ip := fmt.Sprintf("192.0.2.%d", 1+i*2+len(tier))
			admitted := 0
			for range 6 {
				req := get(ip, "/twins")
				req.Headers = Header{"x-plan": tier}
				if p.Evaluate(t.Context(), req, now).Outcome == Allow {
					admitted++
				}
			}
			if admitted != 4 {
				t.Errorf("%s / %s, tier %q: %d admitted of 6 at a limit of 4", lim[0], lim[1], tier, admitted)
			}
			lims, _, err := p.Limits("twins", tier)
			if err != nil {
				t.Fatal(err)
			}
			lone, _, err := p.Limits("lone", "")
			if err != nil {
				t.Fatal(err)
			}
			first, second, plain := space(t, lims[0]), space(t, lims[1]), space(t, lone[0])
			if first != plain || second == plain || !strings.HasSuffix(second, "#"+[]string{"b", "d"}[len(tier)]) {
				t.Errorf("%s, tier %q: key spaces %q and %q; want %q (a limit alone's) and that tagged with the second's name", lim[0], tier, first, second, plain)
			}
		}
	}
}

// space is l's key space.
func space(t *testing.T, l limiter.Limiter) string {
	t.Helper()
	sp, ok := l.(interface{ Space() string })
	if !ok {
		t.Fatalf("%T has no key space", l)
	}
	return sp.Space()
}
