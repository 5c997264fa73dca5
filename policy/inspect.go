package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// For tools that look at one rule's state without an event (cmd/sluice):
// the limits a rule checks and its key rendered from attribute values,
// exactly as Evaluate uses them.

// ErrUnknown is wrapped when a rule or a tier named by a tool is not in the
// policy.
var ErrUnknown = errors.New("policy: unknown rule or tier")

// rule returns the bound rule named name.
func (p *Policy) rule(name string) (*boundRule, error) {
	for _, r := range p.rules {
		if r.Name == name {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%w: no rule %q (rules: %s)", ErrUnknown, name, strings.Join(p.Rules(), ", "))
}

// Limits returns the limiters rule checks for a request of tier ("" or
// DefaultTier: the rule's own limits), built on the policy's stores as
// Evaluate uses them, and their definitions (defaults applied: every
// limit has a Name), in order.
func (p *Policy) Limits(rule, tier string) ([]limiter.Limiter, []Limit, error) {
	r, err := p.rule(rule)
	if err != nil {
		return nil, nil, err
	}
	if tier == "" || tier == DefaultTier {
		return slices.Clone(r.limits), slices.Clone(r.Limits), nil
	}
	names := []string{DefaultTier}
	for i, t := range r.Tiers {
		if t.Name == tier {
			return slices.Clone(r.tiers[i]), slices.Clone(t.Limits), nil
		}
		names = append(names, t.Name)
	}
	return nil, nil, fmt.Errorf("%w: rule %q has no tier %q (tiers: %s)", ErrUnknown, rule, tier, strings.Join(names, ", "))
}

// KeyAttrs returns the attributes rule's key template reads, spelled as in
// templates ("ip", "token", "header:X-Tenant"), in the template's order:
// what [RequestOf] needs to render the rule's key.
func (p *Policy) KeyAttrs(rule string) ([]string, error) {
	r, err := p.rule(rule)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, part := range r.key.parts {
		if part.kind != kindLiteral {
			out = append(out, placeholderName(part))
		}
	}
	return out, nil
}

// Key returns the key rule renders for req, as Evaluate does: the rule's
// name, ':', and its key template with req's values escaped, IP addresses
// in canonical form (IPv6 cut to the rule's prefix), tokens and API keys
// hashed. The rule's limits keep their state under it.
func (p *Policy) Key(rule string, req *Request) (string, error) {
	r, err := p.rule(rule)
	if err != nil {
		return "", err
	}
	return string(r.renderKey(nil, req)), nil
}

// RequestOf returns a request carrying the given attribute values, named as
// in key templates: ip (the source IP), method, path, route, stage,
// api_key, token, header:NAME, query:NAME. A name that is not an attribute
// is an error naming it.
func RequestOf(attrs map[string]string) (*Request, error) {
	req := &Request{}
	var headers Header
	var query Query
	names := make([]string, 0, len(attrs))
	for n := range attrs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		v := attrs[n]
		p, err := parsePlaceholder(n)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUnknown, err)
		}
		switch p.kind {
		case kindIP:
			req.SourceIP = v
		case kindMethod:
			req.Method = v
		case kindPath:
			req.Path = v
		case kindRoute:
			req.RouteKey = v
		case kindStage:
			req.Stage = v
		case kindAPIKey:
			req.APIKey = v
		case kindToken:
			req.Token = v
		case kindHeader:
			if headers == nil {
				headers = Header{}
			}
			headers[p.text] = v
		case kindQuery:
			if query == nil {
				query = Query{}
			}
			query[p.text] = v
		}
	}
	if headers != nil {
		req.Headers = headers
	}
	if query != nil {
		req.Query = query
	}
	return req, nil
}

// placeholderName is the template spelling of a placeholder.
func placeholderName(p keyPart) string {
	switch p.kind {
	case kindHeader:
		return "header:" + p.text
	case kindQuery:
		return "query:" + p.text
	}
	for name, k := range placeholderKinds {
		if k.kind == p.kind {
			return name
		}
	}
	return "?"
}

// RuleStats are the counters of one rule's limiters in this process.
type RuleStats struct {
	// Lease sums the capacity lease counters of the rule's limits, every
	// tier's included: zero when none leases.
	Lease limiter.LeaseStats
	// Concurrency is the clean-up counters of the rule's concurrency
	// limit: zero without one.
	Concurrency limiter.ConcurrencyStats
}

// RuleStats returns rule's counters (one look-up of the rule): zero for an
// unknown rule. A Policy's counters only grow; a reloaded Policy's limiters
// start from zero.
func (p *Policy) RuleStats(rule string) RuleStats {
	var s RuleStats
	r, err := p.rule(rule)
	if err != nil {
		return s
	}
	r.eachLimit(func(l limiter.Limiter) {
		if ls, ok := l.(interface{ LeaseStats() limiter.LeaseStats }); ok {
			s.Lease = s.Lease.Add(ls.LeaseStats())
		}
	})
	if r.cc != nil {
		s.Concurrency = r.cc.Stats()
	}
	return s
}

// LeaseStats is RuleStats(rule).Lease.
func (p *Policy) LeaseStats(rule string) limiter.LeaseStats { return p.RuleStats(rule).Lease }

// ConcurrencyStats is RuleStats(rule).Concurrency.
func (p *Policy) ConcurrencyStats(rule string) limiter.ConcurrencyStats {
	return p.RuleStats(rule).Concurrency
}

// ReturnLeases gives back, at now, the unspent units of every capacity
// lease this process holds for the policy's limits (waiting for the
// writes): for a process about to stop. It returns the errors of the
// writes that failed; their units stay counted until they expire.
func (p *Policy) ReturnLeases(ctx context.Context, now time.Time) error {
	var errs []error
	for _, r := range p.rules {
		r.eachLimit(func(l limiter.Limiter) {
			if rl, ok := l.(interface {
				ReturnLeases(context.Context, time.Time) error
			}); ok {
				if err := rl.ReturnLeases(ctx, now); err != nil {
					errs = append(errs, err)
				}
			}
		})
	}
	return errors.Join(errs...)
}

// eachLimit calls f with each of the rule's limiters, every tier's
// included.
func (r *boundRule) eachLimit(f func(limiter.Limiter)) {
	for _, l := range r.limits {
		f(l)
	}
	for _, t := range r.tiers {
		for _, l := range t {
			f(l)
		}
	}
}
