package authz

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestRateLimitFieldsDraftExamples builds the fields of
// draft-ietf-httpapi-ratelimit-headers-11 from the numbers of the draft's
// own examples and compares them with the field values the draft prints
// (sections 3.2 and 4.2, appendices B.1.3, B.2.1, B.2.2, B.2.3 and B.3.1).
func TestRateLimitFieldsDraftExamples(t *testing.T) {
	for _, tt := range []struct {
		section                  string
		name                     string
		q, r                     int64
		w                        time.Duration
		t                        int64
		wantPolicy, wantRateLimt string
	}{
		// 3.2 "RateLimit-Policy: "default";q=100;w=10" and 4.2
		// "RateLimit: "default";r=50;t=30".
		{"3.2, 4.2", "default", 100, 50, 10 * time.Second, 30, `"default";q=100;w=10`, `"default";r=50;t=30`},
		{"B.1.3", "basic", 100, 60, 60 * time.Second, 58, `"basic";q=100;w=60`, `"basic";r=60;t=58`},
		{"B.1.3", "basic", 100, 20, 60 * time.Second, 56, `"basic";q=100;w=60`, `"basic";r=20;t=56`},
		{"B.2.1", "fixedwindow", 100, 99, 60 * time.Second, 50, `"fixedwindow";q=100;w=60`, `"fixedwindow";r=99;t=50`},
		{"B.2.2", "dynamic", 100, 9, 60 * time.Second, 50, `"dynamic";q=100;w=60`, `"dynamic";r=9;t=50`},
		{"B.2.3", "dynamic", 15, 0, 20 * time.Second, 20, `"dynamic";q=15;w=20`, `"dynamic";r=0;t=20`},
		{"B.3.1", "day", 5000, 100, 86400 * time.Second, 36000, `"day";q=5000;w=86400`, `"day";r=100;t=36000`},
		// w is optional and whole seconds only: a sub-second or fractional
		// period is left out rather than rounded.
		{"3.1.3", "burst", 10, 3, 500 * time.Millisecond, 1, `"burst";q=10`, `"burst";r=3;t=1`},
		{"3.1.3", "burst", 10, 3, 1500 * time.Millisecond, 2, `"burst";q=10`, `"burst";r=3;t=2`},
		// Integers are non-negative; a String escapes '"' and '\'.
		{"4.1.1", `a"b\c`, -1, -5, time.Minute, -1, `"a\"b\\c";q=0;w=60`, `"a\"b\\c";r=0;t=0`},
	} {
		p, c := RateLimitFields(tt.name, tt.q, tt.r, tt.w, tt.t)
		if p != tt.wantPolicy || c != tt.wantRateLimt {
			t.Errorf("%s: got RateLimit-Policy: %s / RateLimit: %s; want %s / %s", tt.section, p, c, tt.wantPolicy, tt.wantRateLimt)
		}
	}
	// A list of several policies (3.2: "permin";q=50;w=60,"perhr";q=1000;w=3600)
	// is the items joined with commas.
	a, _ := RateLimitFields("permin", 50, 0, time.Minute, 0)
	b, _ := RateLimitFields("perhr", 1000, 0, time.Hour, 0)
	if got := a + "," + b; got != `"permin";q=50;w=60,"perhr";q=1000;w=3600` {
		t.Errorf("list: %s", got)
	}
}

// sfItem is the grammar of one Item of these fields (RFC 9651: a String
// with Integer parameters).
var sfItem = regexp.MustCompile(`^"(?:[ !#-\[\]-~]|\\["\\])*"(?:;[a-z*][a-z0-9_.*-]*=(?:0|[1-9][0-9]{0,14}))+$`)

// TestRateLimitContext: the handler's context carries both fields for the
// deciding limit, as the embedded rules decide the golden events: the
// demo rule's window (3 a minute) and the per-ip bucket (50, refilled one
// per 100 ms: full after 5 s).
func TestRateLimitContext(t *testing.T) {
	h := newTestHandler(t, string(DefaultRules), nil)
	var c Context
	for range 4 {
		resp, _, err := h.Decide(t.Context(), readEvent(t, "rest-request-denied"))
		if err != nil {
			t.Fatal(err)
		}
		c = resp.AuthContext()
	}
	if c.RateLimitPolicy != `"demo/0";q=3;w=60` || !strings.HasPrefix(c.RateLimit, `"demo/0";r=0;t=`) {
		t.Errorf("denied: %+v", c)
	}
	resp, _, err := h.Decide(t.Context(), readEvent(t, "rest-request"))
	if err != nil {
		t.Fatal(err)
	}
	c = resp.AuthContext()
	if c.RateLimitPolicy != `"burst";q=50;w=5` || c.RateLimit != `"burst";r=46;t=1` {
		t.Errorf("allowed: %+v", c)
	}
	for _, v := range []string{c.RateLimitPolicy, c.RateLimit} {
		if !sfItem.MatchString(v) {
			t.Errorf("%q is not a structured-field item with integer parameters", v)
		}
	}
	// No limit decided: no fields.
	resp, _, err = h.Decide(t.Context(), readEvent(t, "rest-request-deny-listed"))
	if err != nil {
		t.Fatal(err)
	}
	if c := resp.AuthContext(); c.RateLimit != "" || c.RateLimitPolicy != "" {
		t.Errorf("deny-listed: %+v", c)
	}
}
