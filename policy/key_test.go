package policy

import (
	"strings"
	"testing"
)

func renderFor(t *testing.T, doc string, req *Request) string {
	t.Helper()
	rules, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	c, err := compile(rules[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	return string(c.renderKey(nil, req))
}

func rule(key, extra string) string {
	return "rules: [{name: r, key: '" + key + "', " + extra + " limits: [{algorithm: fixed_window, limit: 1, window: 1s}]}]"
}

func TestRenderKey(t *testing.T) {
	long := strings.Repeat("a", MaxValueLen+1)
	tests := []struct {
		name string
		doc  string
		req  Request
		want string
	}{
		{name: "ip", doc: rule("{ip}", ""), req: Request{SourceIP: "192.0.2.1"}, want: "r:192.0.2.1"},
		{name: "mapped ipv4", doc: rule("{ip}", ""), req: Request{SourceIP: "::ffff:192.0.2.1"}, want: "r:192.0.2.1"},
		{name: "ipv6 grouped by /64", doc: rule("{ip}", ""), req: Request{SourceIP: "2001:db8:1:2:3:4:5:6"}, want: "r:2001%3Adb8%3A1%3A2%3A%3A%2F64"},
		{name: "ipv6 per address", doc: rule("{ip}", "client_ip: {ipv6_prefix: 128},"), req: Request{SourceIP: "2001:db8::1"}, want: "r:2001%3Adb8%3A%3A1"},
		{name: "not an ip", doc: rule("{ip}", ""), req: Request{SourceIP: "a b"}, want: "r:a%20b"},
		{name: "literal and header", doc: rule("t:{header:X-Tenant}/{method}", ""), req: Request{Method: "GET", Headers: Header{"x-tenant": "acme"}}, want: "r:t:acme/GET"},
		{name: "missing header renders empty", doc: rule("t:{header:X-Tenant}", ""), req: Request{}, want: "r:t:"},
		{name: "separator in value is escaped", doc: rule("{header:a}:{header:b}", ""), req: Request{Headers: Header{"a": "x:y", "b": "z"}}, want: "r:x%3Ay:z"},
		{name: "control bytes escaped", doc: rule("{header:a}", ""), req: Request{Headers: Header{"a": "\x00\r\n\x7f\xff"}}, want: "r:%00%0D%0A%7F%FF"},
		{name: "query", doc: rule("{query:page}", ""), req: Request{Query: Query{"page": "2"}}, want: "r:2"},
		{name: "token hashed", doc: rule("{token}", ""), req: Request{Token: "secret"}, want: "r:#K7gNU3sdo-OL0wNhqoVWhg"},
		{name: "api key hashed", doc: rule("{api_key}", ""), req: Request{APIKey: "secret"}, want: "r:#K7gNU3sdo-OL0wNhqoVWhg"},
		{name: "long value hashed", doc: rule("{path}", ""), req: Request{Path: long}, want: "r:#" + string(appendHash(nil, long)[1:])},
		{name: "constant key", doc: rule("all", ""), req: Request{SourceIP: "192.0.2.1"}, want: "r:all"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := renderFor(t, tt.doc, &tt.req); got != tt.want {
				t.Errorf("key = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestRenderKeyHostile feeds huge and binary values: keys stay bounded,
// printable, and distinct for distinct values.
func TestRenderKeyHostile(t *testing.T) {
	doc := rule("{header:a}{header:b}{header:c}{header:d}{header:e}{header:f}{header:g}{header:h}", "")
	big := strings.Repeat("\x01\xfe{}%#", 10<<10/6) // 10 KB
	h := Header{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		h[n] = big[:60] // escaped to 180 bytes each: the whole key is hashed
	}
	k1 := renderFor(t, doc, &Request{Headers: h})
	h["h"] = big[1:61]
	k2 := renderFor(t, doc, &Request{Headers: h})
	for _, k := range []string{k1, k2} {
		if len(k) > MaxKeyLen {
			t.Errorf("key of %d bytes", len(k))
		}
		for i := 0; i < len(k); i++ {
			if k[i] <= 0x20 || k[i] >= 0x7f {
				t.Fatalf("key %q has byte %#x", k, k[i])
			}
		}
	}
	if k1 == k2 {
		t.Error("different values rendered the same key")
	}
	if !strings.HasPrefix(k1, "r:#") {
		t.Errorf("over-long key not hashed: %q", k1)
	}
	single := renderFor(t, rule("{header:a}", ""), &Request{Headers: Header{"a": big}})
	if len(single) != len("r:")+hashLen {
		t.Errorf("10 KB header rendered as %q", single)
	}
}

func TestForwardedFor(t *testing.T) {
	doc := rule("{ip}", "client_ip: {from: x-forwarded-for, hops: 2},")
	tests := []struct {
		xff  string
		want string
	}{
		{"203.0.113.9, 198.51.100.7, 192.0.2.200", "r:198.51.100.7"},
		{"198.51.100.7,192.0.2.200", "r:198.51.100.7"},
		{"192.0.2.200", "r:10.0.0.1"},                               // too short: the source IP
		{"bogus, 192.0.2.200", "r:10.0.0.1"},                        // not an address: the source IP
		{"", "r:10.0.0.1"},                                          // empty
		{strings.Repeat("1.1.1.1,", 2000) + "2.2.2.2", "r:1.1.1.1"}, // long
	}
	for _, tt := range tests {
		req := &Request{SourceIP: "10.0.0.1", Headers: Header{"X-Forwarded-For": tt.xff}}
		if got := renderFor(t, doc, req); got != tt.want {
			t.Errorf("xff %.40q: key %q, want %q", tt.xff, got, tt.want)
		}
	}
	// Without the rule's say-so, X-Forwarded-For is ignored.
	req := &Request{SourceIP: "10.0.0.1", Headers: Header{"X-Forwarded-For": "203.0.113.9"}}
	if got := renderFor(t, rule("{ip}", ""), req); got != "r:10.0.0.1" {
		t.Errorf("default rule used X-Forwarded-For: %q", got)
	}
}

func TestGlob(t *testing.T) {
	tests := []struct {
		pattern string
		yes     []string
		no      []string
	}{
		{"/", []string{"/"}, []string{"/a", ""}},
		{"/api", []string{"/api"}, []string{"/api/", "/apis", "/"}},
		{"/api/*", []string{"/api/x", "/api/"}, []string{"/api", "/api/x/y"}},
		{"/api/**", []string{"/api", "/api/", "/api/x", "/api/x/y/z"}, []string{"/apix", "/x/api"}},
		{"/**", []string{"/", "/a", "/a/b/c"}, []string{"", "a"}},
		{"/**/health", []string{"/health", "/a/health", "/a/b/health"}, []string{"/health/x", "/healthz"}},
		{"/v?/users/*/orders/**", []string{"/v1/users/7/orders", "/v2/users/x/orders/1/2"}, []string{"/v10/users/7/orders", "/v1/users/orders"}},
		{"/a/**/b/**/c", []string{"/a/b/c", "/a/x/b/y/c", "/a/b/b/c/c"}, []string{"/a/b/x", "/a/c"}},
		{"/[ab]*", []string{"/apple", "/b"}, []string{"/cat"}},
	}
	for _, tt := range tests {
		g, err := compileGlob(tt.pattern, false)
		if err != nil {
			t.Fatalf("%q: %v", tt.pattern, err)
		}
		for _, p := range tt.yes {
			if !g.match(p) {
				t.Errorf("%q does not match %q", tt.pattern, p)
			}
		}
		for _, p := range tt.no {
			if g.match(p) {
				t.Errorf("%q matches %q", tt.pattern, p)
			}
		}
	}
}

// TestGlobHostile checks that a pathological path does not take
// exponential time (it would hang the test).
func TestGlobHostile(t *testing.T) {
	g, err := compileGlob("/**/a/**/a/**/a/**/a/**/b", false)
	if err != nil {
		t.Fatal(err)
	}
	p := strings.Repeat("/a", 5000)
	if g.match(p) {
		t.Error("matched")
	}
}
