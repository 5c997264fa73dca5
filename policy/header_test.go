package policy

import (
	"testing"
)

// TestHeaderSpellings: a header the event holds under two spellings is
// read the same way on every call and whatever spelling a rule uses (the
// values joined with commas in the byte order of the spellings), so a tier
// or a key cannot flip between calls with Go's map order.
func TestHeaderSpellings(t *testing.T) {
	h := Header{"X-Plan": "pro", "x-plan": "free", "Accept": "a"}
	for range 200 {
		for _, name := range []string{"X-PLAN", "x-Plan", "X-Plan", "x-plan"} {
			if v, ok := h.Get(name); !ok || v != "pro,free" {
				t.Fatalf("Get(%q) = %q, %v; want \"pro,free\" every time", name, v, ok)
			}
		}
	}
	if v, ok := h.Get("accept"); !ok || v != "a" {
		t.Errorf("Get(accept) = %q, %v", v, ok)
	}
	if _, ok := h.Get("X-Missing"); ok {
		t.Error("a missing header is present")
	}
	if n := testing.AllocsPerRun(100, func() { h.Get("Accept") }); n != 0 {
		t.Errorf("a one-spelling lookup costs %v allocations", n)
	}

	// Through a rule: the reviewer's tier flip (limit 3 on some calls, 6 on
	// others). Joined, the value names no tier: always the default tier.
	p, err := Load([]byte(`
rules:
  - name: demo
    key: "all:{header:x-PLAN}"
    tier: "{header:X-PLAN}"
    limits: [{algorithm: fixed_window, limit: 1000, window: 1m}]
    tiers:
      pro: [{algorithm: fixed_window, limit: 6000, window: 1m}]
`), Options{Stores: memStores(t)})
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		res := p.Evaluate(t.Context(), &Request{Headers: Header{"X-Plan": "pro", "x-plan": "free"}}, t0)
		if ev := res.Evals[0]; ev.Tier != DefaultTier || ev.Key != "demo:all:pro%2Cfree" {
			t.Fatalf("tier %q key %q; want the default tier and the joined value every time", ev.Tier, ev.Key)
		}
	}

	// X-Forwarded-For under two spellings: which one the trusted proxy
	// appended to is unknown, so {ip} is the source address.
	xff, err := Load([]byte(`
rules:
  - name: xff
    key: "{ip}"
    client_ip: {from: x-forwarded-for}
    limits: [{algorithm: fixed_window, limit: 10, window: 1m}]
`), Options{Stores: memStores(t)})
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{SourceIP: "192.0.2.1", Headers: Header{"X-Forwarded-For": "198.51.100.7", "x-forwarded-for": "203.0.113.9"}}
	if k := xff.Evaluate(t.Context(), req, t0).Evals[0].Key; k != "xff:192.0.2.1" {
		t.Errorf("two X-Forwarded-For spellings: key %q, want the source address", k)
	}
}
