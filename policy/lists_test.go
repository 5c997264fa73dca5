package policy

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/backends/memory"
)

const listsDoc = `
deny:
  cidrs: ["203.0.113.0/24", "2001:db8:bad::/48", "198.51.100.7"]
  keys:
    api_key: [leaked-key]
    "header:X-Client-Id": [scraper-1, scraper-2]
allow:
  cidrs: ["10.0.0.0/8", "203.0.113.9"]
  keys:
    "header:User-Agent": [internal-health-checker/1.0]
rules:
  - name: per-ip
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]
`

func TestParseLists(t *testing.T) {
	doc, err := ParseDocument([]byte(listsDoc))
	if err != nil {
		t.Fatalf("ParseDocument: %v", err)
	}
	if got := strings.Join(doc.Lists.Deny.CIDRs, " "); got != "203.0.113.0/24 2001:db8:bad::/48 198.51.100.7" {
		t.Errorf("deny cidrs = %q", got)
	}
	if len(doc.Lists.Deny.Keys) != 2 || doc.Lists.Deny.Keys[0].Attribute != "api_key" || doc.Lists.Deny.Keys[1].Values[1] != "scraper-2" {
		t.Errorf("deny keys = %+v", doc.Lists.Deny.Keys)
	}
	if len(doc.Rules) != 1 {
		t.Errorf("rules = %+v", doc.Rules)
	}
	// Parse still returns the rules of a document with lists.
	if rules, err := Parse([]byte(listsDoc)); err != nil || len(rules) != 1 {
		t.Errorf("Parse = %v, %v", rules, err)
	}
	l, err := ParseLists([]byte(`{deny: {cidrs: ["192.0.2.1"]}}`))
	if err != nil || l.Deny.CIDRs[0] != "192.0.2.1" {
		t.Errorf("ParseLists = %+v, %v", l, err)
	}
}

func TestListsMatch(t *testing.T) {
	doc, err := ParseDocument([]byte(listsDoc))
	if err != nil {
		t.Fatal(err)
	}
	allow, deny, err := compileLists(&doc.Lists)
	if err != nil {
		t.Fatal(err)
	}
	l := lists{allow: allow, deny: deny}
	tests := []struct {
		name string
		req  Request
		want ListMatch
	}{
		{name: "nothing", req: Request{SourceIP: "192.0.2.1"}},
		{name: "denied prefix", req: Request{SourceIP: "203.0.113.77"}, want: ListMatch{"deny", "cidr"}},
		{name: "denied address", req: Request{SourceIP: "198.51.100.7"}, want: ListMatch{"deny", "cidr"}},
		{name: "neighbour of a denied address", req: Request{SourceIP: "198.51.100.8"}},
		{name: "mapped IPv4", req: Request{SourceIP: "::ffff:198.51.100.7"}, want: ListMatch{"deny", "cidr"}},
		{name: "denied IPv6 prefix", req: Request{SourceIP: "2001:db8:bad:1::5"}, want: ListMatch{"deny", "cidr"}},
		{name: "IPv6 outside", req: Request{SourceIP: "2001:db8:bae::5"}},
		{name: "deny wins over allow", req: Request{SourceIP: "203.0.113.9"}, want: ListMatch{"deny", "cidr"}},
		{name: "allowed prefix", req: Request{SourceIP: "10.1.2.3"}, want: ListMatch{"allow", "cidr"}},
		{name: "denied api key", req: Request{SourceIP: "10.1.2.3", APIKey: "leaked-key"}, want: ListMatch{"deny", "api_key"}},
		{name: "api key is exact", req: Request{APIKey: "leaked-key2"}},
		{name: "denied header any case", req: Request{Headers: Header{"x-client-id": "scraper-2"}}, want: ListMatch{"deny", "header:X-Client-Id"}},
		{name: "header value is case-sensitive", req: Request{Headers: Header{"x-client-id": "Scraper-2"}}},
		{name: "allowed header", req: Request{SourceIP: "192.0.2.1", Headers: Header{"User-Agent": "internal-health-checker/1.0"}}, want: ListMatch{"allow", "header:User-Agent"}},
		{name: "source ip absent", req: Request{SourceIP: "203.0.113.1", Absent: AttrSourceIP}},
		{name: "not an address", req: Request{SourceIP: "not-an-ip\x00"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := l.check(&tt.req); got != tt.want {
				t.Errorf("check = %+v, want %+v", got, tt.want)
			}
		})
	}
	// An empty Lists matches nothing.
	var none lists
	if got := none.check(&Request{SourceIP: "203.0.113.1"}); got != (ListMatch{}) {
		t.Errorf("empty lists matched: %+v", got)
	}
}

func TestListsErrors(t *testing.T) {
	const rules = "\nrules: []"
	tests := []struct{ doc, want string }{
		{"deny: {cidrs: [not-an-ip]}", `deny.cidrs[0]: "not-an-ip" is not an IP address or a CIDR prefix`},
		{"deny: {cidrs: [10.0.0.0/33]}", "deny.cidrs[0]"},
		{"allow: {keys: {ip: [1.2.3.4]}}", "allow.keys[0]: match addresses with cidrs"},
		{"allow: {keys: {password: [x]}}", "allow.keys[0]: {password} is not an attribute"},
		{"allow: {keys: {api_key: []}}", "allow.keys[0]"},
		{"allow: {keys: {api_key: ['']}}", "allow.keys[0].values[0]: a value must be 1 to"},
		{"allow: {colour: red}", "allow.colour: unknown field"},
		{"allow: [1]", "allow"},
		{"deny: {cidrs: {a: b}}", "deny.cidrs: want a list"},
		{"deny: {keys: [api_key]}", "deny.keys: want a mapping"},
	}
	for _, tt := range tests {
		_, err := ParseDocument([]byte(tt.doc + rules))
		if err == nil || !errors.Is(err, ErrInvalidRule) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseDocument(%q) = %v; want an error containing %q", tt.doc, err, tt.want)
		}
	}
	// Too many entries.
	var b strings.Builder
	b.WriteString("deny: {cidrs: [")
	for i := 0; i <= MaxListEntries; i++ {
		b.WriteString("10.0.0.1,")
	}
	b.WriteString("]}" + rules)
	if _, err := ParseDocument([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("too many entries: err = %v", err)
	}
}

func memLeases(t testing.TB) *memory.Leases {
	t.Helper()
	l, err := memory.NewLeases(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// BenchmarkListsMatch: a request against lists of 5000 prefixes.
func BenchmarkListsMatch(b *testing.B) {
	l := Lists{}
	for i := range 5000 {
		l.Deny.CIDRs = append(l.Deny.CIDRs, netAddr(i))
	}
	_, deny, err := compileLists(&l)
	if err != nil {
		b.Fatal(err)
	}
	ls := lists{deny: deny}
	req := &Request{SourceIP: "192.0.2.1"}
	b.ReportAllocs()
	for b.Loop() {
		ls.check(req)
	}
}

func netAddr(i int) string {
	return fmt.Sprintf("10.%d.%d.0/%d", i>>8&255, i&255, 16+i%9)
}
