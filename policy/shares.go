package policy

import (
	"fmt"
	"reflect"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Shares keeps the limits of the rules with scope global as regional
// shares, for a deployment whose DynamoDB table is a global table in the
// default (eventual) mode: each region decides a key against a share of
// the limit that moves with demand, and the shares never sum above it
// (docs/regions.md). Without Shares, a global rule's limits are built on
// their store like any other (an MRSC table keeps one limit across
// regions).
type Shares struct {
	// Regions is the number of regions that share each limit (two or
	// more).
	Regions int
	// Build returns the limiter of l, a global rule's limit that
	// [CheckShares] accepted, for requests of cost units; leases says
	// whether it may lease capacity.
	Build func(l *Limit, cost int64, leases bool) (limiter.Limiter, error)
}

// CheckShares reports why l, a limit of a rule with scope global, cannot
// be kept as shares among regions regions (nil: it can). Regional shares
// serve a token_bucket that is not strict, of max_amount at least twice
// the regions, and a bounded sliding_window of sub-window counters that
// does not count denials, of a limit at least the regions.
func CheckShares(l *Limit, regions int) error {
	const serves = "regional shares (scope global on an eventual table) serve a token_bucket (not strict) or a bounded sliding_window of sub-window counters"
	switch l.Algorithm {
	case TokenBucket:
		switch {
		case l.Strict:
			return fmt.Errorf("%s is strict: %s", l.Name, serves)
		case l.MaxAmount < 2*int64(regions):
			return fmt.Errorf("%s: max_amount %d is below %d, two units per region (%d regions share it)", l.Name, l.MaxAmount, 2*regions, regions)
		}
		return nil
	case SlidingWindow:
		subs := l.SubWindows
		if subs == 0 {
			subs = limiter.DefaultSubWindows
		}
		switch {
		case l.Estimator != limiter.Bounded:
			return fmt.Errorf("%s has estimator %v: %s", l.Name, l.Estimator, serves)
		case l.CountDenied:
			return fmt.Errorf("%s counts denied requests: %s", l.Name, serves)
		case l.Representation == limiter.Packed || l.Slots != 0:
			return fmt.Errorf("%s is packed: %s (representation: subwindows)", l.Name, serves)
		case l.Window%time.Duration(subs) != 0 || l.Window/time.Duration(subs) < time.Millisecond:
			return fmt.Errorf("%s: %d sub-windows do not cut the window %v into whole sub-windows of at least 1ms (give sub_windows)", l.Name, subs, l.Window)
		case l.Limit < int64(regions):
			return fmt.Errorf("%s: limit %d is below the %d regions that share it", l.Name, l.Limit, regions)
		}
		return nil
	}
	return fmt.Errorf("%s is a %s: %s", l.Name, l.Algorithm, serves)
}

// bindLimit builds the limiter of l, a limit of the rule c on the store
// named backend, tagged tag (twins.go): as regional shares when c is
// global and opts say so (their keys are named by the limit's name).
func bindLimit(c *compiledRule, l *Limit, backend string, opts *Options, tag string) (limiter.Limiter, error) {
	if c.Scope == ScopeGlobal && opts.Shares != nil {
		return opts.Shares.Build(l, c.cost, !opts.NoLeases && l.leases())
	}
	return build(l, backend, opts, c.cost, tag)
}

// checkShares checks every limit of c, the rule at index, against
// opts.Shares (nothing without it, or when c is regional).
func checkShares(c *compiledRule, index int, opts *Options) error {
	if c.Scope != ScopeGlobal || opts.Shares == nil {
		return nil
	}
	for _, l := range c.allLimits() {
		if err := CheckShares(&l, opts.Shares.Regions); err != nil {
			return ruleError(c.Name, index, "scope", "%v", err)
		}
	}
	return nil
}

// globalNames are the limits of the global rules checked so far, by
// name. A global limit's name names its regional shares in the state
// table (their items and their wants index: docs/regions.md), which every
// limit of that name shares: two global rules may each name a limit
// alike only with the same parameters (their keys, which begin with the
// rule's name, stay apart), or two limits of different parameters would
// tick each other's keys. A regional limit's counters are named by its
// parameters and the rule's key, never by its name: it has no such bound.
type globalNames map[string]globalLimit

// globalLimit is where a global limit's name was first given.
type globalLimit struct {
	rule  string
	index int
	field string
	limit Limit
}

// check adds the limits of c, the rule at index, when c is global: a
// name an earlier global rule gave other parameters is an error naming
// both rules, the field and the first parameter that differs.
func (g globalNames) check(c *compiledRule, index int) error {
	if c.Scope != ScopeGlobal {
		return nil
	}
	add := func(field string, l Limit) error {
		l.Backend = "" // a global limit is on dynamo (compile)
		if l.Algorithm == SlidingWindow && l.SubWindows == 0 {
			l.SubWindows = limiter.DefaultSubWindows
		}
		first, ok := g[l.Name]
		if !ok {
			g[l.Name] = globalLimit{rule: c.Name, index: index, field: field, limit: l}
			return nil
		}
		if first.limit == l {
			return nil
		}
		tag, here, there := firstDiff(&l, &first.limit)
		return ruleError(c.Name, index, field+".name", "%q is also the name of %s of the global rule %q (rules[%d]), with %s %v there and %v here: "+
			"global rules may share a limit name only with the same parameters (the name names its regional shares in the state table); rename one",
			l.Name, first.field, first.rule, first.index, tag, there, here)
	}
	for j, l := range c.Limits {
		if err := add(fmt.Sprintf("limits[%d]", j), l); err != nil {
			return err
		}
	}
	for _, t := range c.Tiers {
		for j, l := range t.Limits {
			if err := add(fmt.Sprintf("tiers.%s[%d]", t.Name, j), l); err != nil {
				return err
			}
		}
	}
	return nil
}

// firstDiff returns the rule field (its `rule` tag) of the first field in
// which a and b differ, and their values.
func firstDiff(a, b *Limit) (tag string, av, bv any) {
	va, vb := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	for i := range va.NumField() {
		if x, y := va.Field(i).Interface(), vb.Field(i).Interface(); x != y {
			return va.Type().Field(i).Tag.Get("rule"), x, y
		}
	}
	return "", nil, nil
}
