package policy

import (
	"fmt"
	"strings"
)

// TierOf maps a rule's tier value to a tier name, for rules with
// tier_lookup: (rule, value) -> (tier, found). It must be safe for
// concurrent use and answer from memory (it runs in every decision): the
// rules table's tier items, loaded and cached with the rules
// ([Options.TierOf]).
type TierOf func(rule, value string) (string, bool)

// Tiers is a TierOf over a map from value to tier name, the same for every
// rule.
type Tiers map[string]string

// Lookup implements TierOf.
func (t Tiers) Lookup(_, value string) (string, bool) {
	name, ok := t[value]
	return name, ok
}

// compileTier parses a rule's tier attribute: exactly one placeholder, as
// in key templates ("{header:X-Plan}", "{api_key}").
func compileTier(src string) (keyPart, error) {
	inner, ok := strings.CutPrefix(src, "{")
	if ok {
		inner, ok = strings.CutSuffix(inner, "}")
	}
	if !ok || strings.ContainsAny(inner, "{}") {
		return keyPart{}, fmt.Errorf("%q must be one attribute in braces, such as \"{header:X-Plan}\" or \"{api_key}\"", src)
	}
	return parsePlaceholder(inner)
}

// tierIndex returns the index in c.Tiers of the tier req belongs to, and
// its name; -1 and DefaultTier for the rule's own limits (no tier
// attribute, a missing or empty value, or a value that names no tier).
// lookup maps the value for tier_lookup rules (nil: none found).
func (c *compiledRule) tierIndex(req *Request, lookup TierOf) (int, string) {
	if c.tier == nil {
		return -1, DefaultTier
	}
	v, ok := c.value(*c.tier, req)
	if !ok || v == "" {
		return -1, DefaultTier
	}
	if c.TierLookup {
		if lookup == nil {
			return -1, DefaultTier
		}
		if v, ok = lookup(c.Name, v); !ok {
			return -1, DefaultTier
		}
	}
	for i := range c.Tiers {
		if c.Tiers[i].Name == v {
			return i, v
		}
	}
	return -1, DefaultTier
}

// tierLimits returns the limits of tier i (-1: the rule's own).
func (c *compiledRule) tierLimits(i int) []Limit {
	if i < 0 {
		return c.Limits
	}
	return c.Tiers[i].Limits
}
