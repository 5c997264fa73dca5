package policy

import (
	"fmt"
	"net/netip"
	"slices"
)

// Bounds on allow and deny lists.
const (
	// MaxListEntries is the largest number of entries (CIDRs and values
	// together) of one list.
	MaxListEntries = 10000
	// MaxListValueLen is the longest value of a list's keys.
	MaxListValueLen = 4096
)

// Lists are a rule set's allow and deny lists. They are decided in memory,
// before the load shedders and the limits, without a store request: a
// request on the deny list is denied (Reason deny_list), one on the allow
// list is let through without being shed or limited (Reason allow_list).
// The deny list wins over the allow list. They are part of the rules
// document, so they reload with it.
type Lists struct {
	// Allow lists requests that are never limited nor shed (an internal
	// health checker, a partner's fixed addresses).
	Allow List
	// Deny lists requests that are always denied (a known-bad client, a
	// leaked API key).
	Deny List
}

// Empty reports whether both lists are empty.
func (l *Lists) Empty() bool { return l.Allow.empty() && l.Deny.empty() }

// List matches requests by client address or by exact attribute values.
type List struct {
	// CIDRs are addresses ("192.0.2.7", "2001:db8::1") and prefixes
	// ("10.0.0.0/8", "2001:db8::/32") matched against the request's source
	// IP, the address API Gateway saw (never a header).
	CIDRs []string
	// Keys match exact values of request attributes.
	Keys []ListKey
}

func (l *List) empty() bool { return len(l.CIDRs) == 0 && len(l.Keys) == 0 }

// ListKey matches one attribute against exact values.
type ListKey struct {
	// Attribute is an attribute as in key templates, without braces:
	// "api_key", "token", "header:X-Client-Id", "query:client", "path",
	// "route", "stage", "method".
	Attribute string
	// Values are the exact values (case-sensitive) that match.
	Values []string
}

// compiledList is a List ready for matching.
type compiledList struct {
	prefixes map[netip.Prefix]struct{}
	bits4    []int // the prefix lengths of IPv4 entries, longest first
	bits6    []int
	keys     []compiledListKey
}

type compiledListKey struct {
	part   keyPart
	attr   string
	values map[string]struct{}
}

// compileLists validates lists; errors name the list and the entry.
func compileLists(l *Lists) (allow, deny *compiledList, err error) {
	if allow, err = compileList(&l.Allow, "allow"); err != nil {
		return nil, nil, err
	}
	if deny, err = compileList(&l.Deny, "deny"); err != nil {
		return nil, nil, err
	}
	return allow, deny, nil
}

func compileList(l *List, name string) (*compiledList, error) {
	if l.empty() {
		return nil, nil
	}
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s.%s: %s", ErrInvalidRule, name, field, fmt.Sprintf(format, args...))
	}
	n := len(l.CIDRs)
	for _, k := range l.Keys {
		n += len(k.Values)
	}
	if n > MaxListEntries {
		return nil, fmt.Errorf("%w: %s: %d entries; at most %d", ErrInvalidRule, name, n, MaxListEntries)
	}
	c := &compiledList{prefixes: make(map[netip.Prefix]struct{}, len(l.CIDRs))}
	for i, s := range l.CIDRs {
		p, err := parseCIDR(s)
		if err != nil {
			return nil, bad(fmt.Sprintf("cidrs[%d]", i), "%q is not an IP address or a CIDR prefix such as 10.0.0.0/8", clip(s))
		}
		c.prefixes[p] = struct{}{}
		bits := &c.bits6
		if p.Addr().Is4() {
			bits = &c.bits4
		}
		if !slices.Contains(*bits, p.Bits()) {
			*bits = append(*bits, p.Bits())
		}
	}
	slices.Sort(c.bits4)
	slices.Reverse(c.bits4)
	slices.Sort(c.bits6)
	slices.Reverse(c.bits6)
	seen := map[string]int{}
	for i, k := range l.Keys {
		field := fmt.Sprintf("keys[%d]", i)
		part, err := parsePlaceholder(k.Attribute)
		if err != nil {
			return nil, bad(field, "%v", err)
		}
		if part.kind == kindIP {
			return nil, bad(field, "match addresses with cidrs, not the ip attribute")
		}
		if j, dup := seen[k.Attribute]; dup {
			return nil, bad(field, "%q is already listed in keys[%d]", k.Attribute, j)
		}
		seen[k.Attribute] = i
		if len(k.Values) == 0 {
			return nil, bad(field, "%q: at least one value is required", k.Attribute)
		}
		ck := compiledListKey{part: part, attr: k.Attribute, values: make(map[string]struct{}, len(k.Values))}
		for j, v := range k.Values {
			if v == "" || len(v) > MaxListValueLen {
				return nil, bad(fmt.Sprintf("%s.values[%d]", field, j), "a value must be 1 to %d bytes", MaxListValueLen)
			}
			ck.values[v] = struct{}{}
		}
		c.keys = append(c.keys, ck)
	}
	return c, nil
}

// parseCIDR parses an address (a prefix of its full length) or a prefix,
// masked to its length; IPv4-mapped IPv6 addresses count as IPv4.
func parseCIDR(s string) (netip.Prefix, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		a = a.Unmap().WithZone("")
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}

// match reports whether req is on the list, and by what: "cidr" or the
// attribute ("api_key", "header:X-Client-Id"). A nil list matches nothing.
// It costs a map lookup per distinct prefix length and per attribute.
func (c *compiledList) match(req *Request) (string, bool) {
	if c == nil {
		return "", false
	}
	if len(c.prefixes) > 0 && req.Absent&AttrSourceIP == 0 {
		if a, err := netip.ParseAddr(req.SourceIP); err == nil {
			a = a.Unmap().WithZone("")
			bits := c.bits6
			if a.Is4() {
				bits = c.bits4
			}
			for _, b := range bits {
				if p, err := a.Prefix(b); err == nil {
					if _, ok := c.prefixes[p]; ok {
						return "cidr", true
					}
				}
			}
		}
	}
	for i := range c.keys {
		k := &c.keys[i]
		if req.Absent&k.part.attr != 0 {
			continue
		}
		v, ok := listValue(k.part, req)
		if !ok || v == "" {
			continue
		}
		if _, ok := k.values[v]; ok {
			return k.attr, true
		}
	}
	return "", false
}

// listValue is the raw value of the attribute p of req (no client_ip
// settings apply: lists never read X-Forwarded-For).
func listValue(p keyPart, req *Request) (string, bool) {
	var none compiledRule
	return none.value(p, req)
}

// ListMatch says which list decided a request, if any.
type ListMatch struct {
	// List is "allow" or "deny"; empty when neither matched.
	List string
	// By is what matched: "cidr" or the attribute.
	By string
}

// lists are a Policy's compiled allow and deny lists.
type lists struct {
	allow, deny *compiledList
}

// check decides req by the lists: the deny list first.
func (l *lists) check(req *Request) ListMatch {
	if by, ok := l.deny.match(req); ok {
		return ListMatch{List: "deny", By: by}
	}
	if by, ok := l.allow.match(req); ok {
		return ListMatch{List: "allow", By: by}
	}
	return ListMatch{}
}
