package policy

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// Bounds on rules, so that a rules file cannot make the authorizer allocate
// or store without limit.
const (
	// MaxRules is the largest number of rules in a document.
	MaxRules = 1000
	// MaxLimitsPerRule is the largest number of stacked limits in a rule.
	MaxLimitsPerRule = 8
	// MaxCount is the largest limit, max_amount or cost.
	MaxCount = 1 << 40
	// MaxWindow is the longest window or refill time (memcached reads an
	// expiry beyond 30 days as a date).
	MaxWindow = 30 * 24 * time.Hour
	// MaxXFFHops is the largest client_ip.hops.
	MaxXFFHops = 16
	// MaxLeaseTTL is the longest concurrency.lease_ttl (a Lambda's longest
	// run).
	MaxLeaseTTL = 15 * time.Minute
)

// ErrInvalidRule is wrapped by every error about a rule or a rules document.
var ErrInvalidRule = errors.New("policy: invalid rules")

// Rule is one rate-limiting rule. Rules are usually parsed from a rules
// document with [Parse]; a Rule built in Go is validated by [New] with the
// same messages.
type Rule struct {
	// Name identifies the rule in decisions, metrics and keys: 1 to 64
	// bytes of letters, digits, '.', '_' and '-', starting with a letter
	// or digit. Unique within a document.
	Name string `rule:"name"`
	// Description is free text for people.
	Description string `rule:"description"`
	// Match selects the requests the rule applies to; the zero Match
	// selects every request.
	Match Match `rule:"match"`
	// Key is the key template, e.g. "{ip}" or "tenant:{header:X-Tenant}"
	// (see docs/rules.md). Requests with the same rendered key share the
	// rule's limits.
	Key string `rule:"key"`
	// ClientIP says where {ip} comes from.
	ClientIP ClientIP `rule:"client_ip"`
	// SkipIfMissing makes the rule not apply to a request that lacks a
	// value for one of its key's attributes (no such header, an empty
	// token). By default such a request renders the value as empty, so all
	// of them share one key.
	SkipIfMissing bool `rule:"skip_if_missing"`
	// Limits are checked together on the key (all must pass).
	Limits []Limit `rule:"limits" required:": a list of limits"`
	// Cost is the units one request takes from each limit. Zero means 1.
	Cost int64 `rule:"cost"`
	// Priority ranks the requests the rule matches, for the load shedders
	// (the zero value is limiter.PriorityNormal). A request's priority is
	// the highest of its matching rules'.
	Priority limiter.Priority `rule:"priority"`
	// Fail says what happens when a backend errs or times out.
	Fail FailMode `rule:"fail"`
	// Require lists attributes (as in key templates, without braces:
	// "token", "api_key", "header:X-Api-Key") that a matching request must
	// carry; a request without one gets an authentication failure rather
	// than a rate-limit decision.
	Require []string `rule:"require"`
	// Shadow evaluates the rule without enforcing it: its limits are
	// checked and counted, a would-be denial is reported (Eval.Shadow,
	// the ShadowDenied metric, a log line) and the request goes on. A
	// shadow rule takes no capacity from the enforcing rules.
	Shadow bool `rule:"shadow"`
	// Tier is a template of one placeholder, e.g. "{header:X-Plan}", whose
	// value picks the rule's limits per request among Tiers; a request
	// whose value is missing or names no tier gets Limits (the default
	// tier). With TierLookup the value is first mapped to a tier name by
	// Options.TierOf (the rules table's tier items).
	Tier string `rule:"tier"`
	// TierLookup maps the Tier value through Options.TierOf instead of
	// taking it as a tier name (for values that are secrets or too many to
	// list, such as API keys).
	TierLookup bool `rule:"tier_lookup"`
	// Tiers are the rule's limits per tier, besides the default tier
	// (Limits). Only with Tier.
	Tiers []Tier `rule:"tiers"`
	// Concurrency, when not nil, is Stripe's concurrent-requests limit on
	// the rule's key: at most Concurrency.Limit requests of one key in
	// flight. The authorizer acquires a lease and passes it on in its
	// context; the integration releases it (lambdawrap).
	Concurrency *ConcurrencyLimit `rule:"concurrency"`
	// Scope says where the rule's limits hold: ScopeRegion (the zero
	// value, "region": a limit per region, whatever the store) or
	// ScopeGlobal ("global": one limit across the deployment's regions;
	// every limit of the rule then names backend dynamo). A DynamoDB
	// table strongly consistent across regions (MRSC) keeps it as one
	// limit; a global table in the default mode keeps it as regional
	// shares ([Options.Shares], [CheckShares]); the construct refuses the
	// rule on a regional table (docs/regions.md).
	Scope Scope `rule:"scope"`
}

// Scope is where a rule's limits hold ([Rule.Scope]).
type Scope uint8

const (
	// ScopeRegion: a limit per region.
	ScopeRegion Scope = iota
	// ScopeGlobal: one limit across regions.
	ScopeGlobal
)

// String returns "region" or "global".
func (s Scope) String() string {
	if s == ScopeGlobal {
		return "global"
	}
	return "region"
}

// Tier is one named set of a rule's limits.
type Tier struct {
	// Name is the tier's name, as the Tier attribute gives it: 1 to 64
	// letters, digits, '.', '_' or '-'; "default" is the name of the
	// rule's own Limits and cannot be used.
	Name string
	// Limits are the tier's limits (as a rule's Limits).
	Limits []Limit
}

// DefaultTier is the name of a rule's own limits in decisions and metrics.
const DefaultTier = "default"

// MaxTiers is the largest number of tiers of a rule, besides the default.
const MaxTiers = 16

// ConcurrencyLimit is a rule's concurrent-requests limit.
type ConcurrencyLimit struct {
	// Name identifies the limit (it is part of the stored key); default
	// "<rule>.concurrency".
	Name string `rule:"name"`
	// Limit is the number of requests of one key in flight, 1 to
	// storage.MaxLeases.
	Limit int64 `rule:"limit"`
	// LeaseTTL bounds how long a lease whose release was lost holds its
	// slot: set it above the integration's timeout. Zero means
	// DefaultLeaseTTL.
	LeaseTTL time.Duration `rule:"lease_ttl"`
}

// DefaultLeaseTTL is a concurrency limit's lease TTL when the rule gives
// none: API Gateway's longest integration timeout (29 s) and a margin.
const DefaultLeaseTTL = 30 * time.Second

// Match selects requests. Each non-empty list must contain the request's
// value; empty lists match everything.
type Match struct {
	// Methods are HTTP methods (case-insensitive); "ANY" or "*" matches
	// every method.
	Methods []string `rule:"methods"`
	// Paths are globs over the request path: '*' and '?' match within one
	// segment, a "**" segment matches any number of segments.
	Paths []string `rule:"paths"`
	// Stages are API stage names.
	Stages []string `rule:"stages"`
	// Routes are route keys ("GET /pets/{id}", "$default"); REST APIs
	// give "METHOD resource".
	Routes []string `rule:"routes"`
	// CaseSensitive compares Paths with the request path in exact case,
	// and renders {path} keys in it. By default paths are compared and
	// keyed lower-cased: "/DEMO/hello" is "/demo/hello", as servers that
	// route ignoring case (Express by default) serve it.
	CaseSensitive bool `rule:"case_sensitive"`
}

// ClientIP configures the {ip} attribute.
type ClientIP struct {
	// From is "source_ip" (the default: the request context's source
	// address, which the client cannot forge) or "x-forwarded-for" (only
	// behind proxies you trust, which append the client's address).
	From string `rule:"from"`
	// Hops picks the Hops-th address from the right of X-Forwarded-For:
	// 1 (the default) is the address the last proxy appended. Addresses
	// further left are client-controlled. When the header is missing or
	// too short, {ip} falls back to the source IP.
	Hops int `rule:"hops"`
	// IPv6Prefix groups IPv6 clients by network prefix length, since one
	// subscriber usually holds a whole /64. Zero means 64; 128 keys every
	// address apart.
	IPv6Prefix int `rule:"ipv6_prefix"`
}

// The values of ClientIP.From.
const (
	FromSourceIP      = "source_ip"
	FromXForwardedFor = "x-forwarded-for"
)

// Limit is one limit of a rule. Which numeric fields apply depends on the
// algorithm; setting another algorithm's field is an error.
type Limit struct {
	// Name identifies the limit in decisions; default "<rule>/<index>".
	Name string `rule:"name"`
	// Algorithm is required.
	Algorithm Algorithm `rule:"algorithm"`
	// Backend names the store ("memory", "memcached", "dynamo"); empty
	// means the policy's default backend.
	Backend string `rule:"backend"`

	// Limit and Window: sliding_window, fixed_window, sliding_log.
	Limit  int64         `rule:"limit" algs:"sliding_window fixed_window sliding_log"`
	Window time.Duration `rule:"window" algs:"sliding_window fixed_window sliding_log"`
	// SubWindows, Estimator, Representation and Slots: sliding_window.
	// Representation zero is limiter.Auto: packed counters at Slots slots
	// per window (zero: limiter.DefaultSlots) where the window allows it,
	// else SubWindows sub-windows (zero: limiter.DefaultSubWindows). Naming
	// sub_windows asks for sub-window counters.
	SubWindows     int                    `rule:"sub_windows" algs:"sliding_window"`
	Estimator      limiter.Estimator      `rule:"estimator" algs:"sliding_window"`
	Representation limiter.Representation `rule:"representation" algs:"sliding_window"`
	Slots          int                    `rule:"slots" algs:"sliding_window"`
	// CountDenied keeps denied requests in a window's count (ClassDojo).
	CountDenied bool `rule:"count_denied" algs:"sliding_window fixed_window"`

	// MaxAmount, RefillTime, RefillAmount (zero means 1) and Strict:
	// token_bucket (Smyte's parameters).
	MaxAmount    int64         `rule:"max_amount" algs:"token_bucket"`
	RefillTime   time.Duration `rule:"refill_time" algs:"token_bucket"`
	RefillAmount int64         `rule:"refill_amount" algs:"token_bucket"`
	Strict       bool          `rule:"strict" algs:"token_bucket"`

	// Lease: sliding_window and token_bucket. LeaseAuto (the zero value,
	// "auto") decides a hot key from capacity leases where the limit
	// allows them (a bounded window that refunds denials, a bucket that
	// is not strict; docs/leases.md): a cold key is decided as without
	// them. LeaseOff ("off") sends every decision to the store.
	Lease LeaseMode `rule:"lease" algs:"sliding_window token_bucket"`
}

// LeaseMode is a limit's capacity lease setting ([Limit.Lease]).
type LeaseMode uint8

const (
	// LeaseAuto leases a hot key where the limit allows it.
	LeaseAuto LeaseMode = iota
	// LeaseOff never leases.
	LeaseOff
)

// String returns "auto" or "off".
func (m LeaseMode) String() string {
	if m == LeaseOff {
		return "off"
	}
	return "auto"
}

// leases reports whether l's limiter takes capacity leases (Options.
// NoLeases aside).
func (l *Limit) leases() bool {
	switch {
	case l.Lease == LeaseOff:
		return false
	case l.Algorithm == TokenBucket:
		return !l.Strict
	case l.Algorithm == SlidingWindow:
		return l.Estimator == limiter.Bounded && !l.CountDenied
	}
	return false
}

// Period is the time over which the limit grants its Capacity: a
// window's length, or the time a token bucket takes to refill from empty
// (ceil(MaxAmount/RefillAmount) refills). It is the "w" of the
// RateLimit-Policy header field.
func (l *Limit) Period() time.Duration {
	if l.Algorithm != TokenBucket {
		return l.Window
	}
	ra := max(l.RefillAmount, 1)
	refills := (l.MaxAmount + ra - 1) / ra
	if refills > int64(MaxWindow/max(l.RefillTime, 1)) {
		return MaxWindow
	}
	return time.Duration(refills) * l.RefillTime
}

// Capacity is the largest cost the limit could ever allow.
func (l *Limit) Capacity() int64 {
	if l.Algorithm == TokenBucket {
		return l.MaxAmount
	}
	return l.Limit
}

var (
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	backendRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
	methodRE  = regexp.MustCompile(`^[A-Z]{1,16}$`)
)

// ruleError is an error about a field of a rule.
func ruleError(rule string, index int, field, format string, args ...any) error {
	return &fieldError{rule: rule, index: index, field: field, msg: fmt.Sprintf(format, args...)}
}

// fieldError is an error about a field of rules[index]; line, when not
// zero, is where the rules document gives it (atLine).
type fieldError struct {
	rule  string
	index int
	field string
	msg   string
	line  int
}

func (e *fieldError) Error() string {
	who := fmt.Sprintf("rules[%d]", e.index)
	if e.rule != "" {
		who = fmt.Sprintf("rule %q (rules[%d])", e.rule, e.index)
	}
	at := ""
	if e.line > 0 {
		at = fmt.Sprintf(" (line %d)", e.line)
	}
	if e.field == "" {
		return fmt.Sprintf("%v: %s: %s%s", ErrInvalidRule, who, e.msg, at)
	}
	return fmt.Sprintf("%v: %s: %s: %s%s", ErrInvalidRule, who, e.field, e.msg, at)
}

func (e *fieldError) Unwrap() error { return ErrInvalidRule }

// compiledRule is a validated rule with its templates and globs compiled.
type compiledRule struct {
	Rule
	key     keyTemplate
	globs   []glob
	methods []string // upper case; nil matches any
	require []keyPart
	cost    int64
	tier    *keyPart // nil without tiers
}

// compile validates r (rules[index]) and returns it compiled, with defaults
// applied, phase by phase. Error messages use the rules-file names of the
// fields.
func compile(r Rule, index int) (*compiledRule, error) {
	bad := func(field, format string, args ...any) error {
		return ruleError(r.Name, index, field, format, args...)
	}
	if r.Name == "" {
		return nil, bad("name", "required")
	}
	if !nameRE.MatchString(r.Name) {
		return nil, bad("name", "%q must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", r.Name)
	}
	c := &compiledRule{Rule: r}
	if err := c.compileMatch(bad); err != nil {
		return nil, err
	}
	if err := c.compileKey(bad); err != nil {
		return nil, err
	}
	names := map[string]bool{} // limit names, unique across the rule's tiers
	minCap := int64(MaxCount)  // the smallest capacity of its limits
	var err error
	if c.Limits, err = compileLimits(r.Limits, "limits", r.Name, "rule", names, &minCap, bad); err != nil {
		return nil, err
	}
	if err := c.compileTiers(names, &minCap, bad); err != nil {
		return nil, err
	}
	if err := c.compileConcurrency(bad); err != nil {
		return nil, err
	}
	if err := c.compileRest(minCap, bad); err != nil {
		return nil, err
	}
	return c, nil
}

// badFunc makes the error of a field of the rule being compiled.
type badFunc func(field, format string, args ...any) error

// compileMatch validates the match and compiles its methods and globs.
func (c *compiledRule) compileMatch(bad badFunc) error {
	for i, m := range c.Match.Methods {
		u := strings.ToUpper(m)
		if u == "ANY" || u == "*" {
			c.methods = nil
			break
		}
		if !methodRE.MatchString(u) {
			return bad(fmt.Sprintf("match.methods[%d]", i), "%q is not an HTTP method", m)
		}
		c.methods = append(c.methods, u)
	}
	for i, p := range c.Match.Paths {
		g, err := compileGlob(p, !c.Match.CaseSensitive)
		if err != nil {
			return bad(fmt.Sprintf("match.paths[%d]", i), "%v", err)
		}
		c.globs = append(c.globs, g)
	}
	for i, s := range c.Match.Stages {
		if err := checkText(s, 128); err != nil {
			return bad(fmt.Sprintf("match.stages[%d]", i), "%v", err)
		}
	}
	for i, s := range c.Match.Routes {
		if err := checkText(s, 512); err != nil {
			return bad(fmt.Sprintf("match.routes[%d]", i), "%v", err)
		}
	}
	return nil
}

// compileKey compiles the key template and validates client_ip, filling
// in its defaults.
func (c *compiledRule) compileKey(bad badFunc) error {
	if c.Key == "" {
		return bad("key", `required (for example "{ip}", or a constant such as "all" for one limit shared by every request)`)
	}
	k, err := compileKey(c.Key)
	if err != nil {
		return bad("key", "%v", err)
	}
	c.key = k
	ip := &c.ClientIP
	switch ip.From {
	case "", FromSourceIP:
		ip.From = FromSourceIP
		if ip.Hops != 0 {
			return bad("client_ip.hops", "only applies with from: %s", FromXForwardedFor)
		}
	case FromXForwardedFor:
		if ip.Hops == 0 {
			ip.Hops = 1
		}
		if ip.Hops < 1 || ip.Hops > MaxXFFHops {
			return bad("client_ip.hops", "%d is outside 1..%d", ip.Hops, MaxXFFHops)
		}
	default:
		return bad("client_ip.from", "%q is not %s or %s", ip.From, FromSourceIP, FromXForwardedFor)
	}
	if ip.IPv6Prefix == 0 {
		ip.IPv6Prefix = 64
	}
	if ip.IPv6Prefix < 1 || ip.IPv6Prefix > 128 {
		return bad("client_ip.ipv6_prefix", "%d is outside 1..128", ip.IPv6Prefix)
	}
	return nil
}

// compileLimits validates the limits at field (of the rule or of one of
// its tiers, per; owner names their default names), returning them with
// their defaults. names holds the limit names seen so far in the rule,
// minCap the smallest capacity.
func compileLimits(limits []Limit, field, owner, per string, names map[string]bool, minCap *int64, bad badFunc) ([]Limit, error) {
	if len(limits) == 0 {
		return nil, bad(field, "at least one limit is required")
	}
	if len(limits) > MaxLimitsPerRule {
		return nil, bad(field, "%d limits; at most %d per %s", len(limits), MaxLimitsPerRule, per)
	}
	out := make([]Limit, len(limits))
	for i, l := range limits {
		lfield := fmt.Sprintf("%s[%d]", field, i)
		if err := checkLimit(&l, owner, i); err != nil {
			return nil, bad(lfield, "%v", err)
		}
		if names[l.Name] {
			if per == "tier" {
				return nil, bad(lfield+".name", "%q is used twice in this rule (limit names are unique across its tiers)", l.Name)
			}
			return nil, bad(lfield+".name", "%q is used twice in this rule", l.Name)
		}
		names[l.Name] = true
		*minCap = min(*minCap, l.Capacity())
		out[i] = l
	}
	return out, nil
}

// compileTiers validates tier, tier_lookup and tiers, and compiles the
// tier template.
func (c *compiledRule) compileTiers(names map[string]bool, minCap *int64, bad badFunc) error {
	switch {
	case c.Tier == "" && len(c.Tiers) > 0:
		return bad("tier", `required with tiers (for example "{header:X-Plan}")`)
	case c.Tier == "" && c.TierLookup:
		return bad("tier_lookup", "only applies with tier")
	case c.Tier != "":
		p, err := compileTier(c.Tier)
		if err != nil {
			return bad("tier", "%v", err)
		}
		c.tier = &p
	}
	if len(c.Tiers) > MaxTiers {
		return bad("tiers", "%d tiers; at most %d per rule", len(c.Tiers), MaxTiers)
	}
	tiers := slices.Clone(c.Tiers)
	seen := map[string]bool{DefaultTier: true}
	for ti, t := range c.Tiers {
		tfield := "tiers." + t.Name
		if !nameRE.MatchString(t.Name) {
			return bad(fmt.Sprintf("tiers[%d]", ti), "%q must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", t.Name)
		}
		if seen[t.Name] {
			if t.Name == DefaultTier {
				return bad(tfield, "%q is the rule's own limits: give them under limits", t.Name)
			}
			return bad(tfield, "given twice")
		}
		seen[t.Name] = true
		limits, err := compileLimits(t.Limits, tfield, c.Name+"/"+t.Name, "tier", names, minCap, bad)
		if err != nil {
			return err
		}
		tiers[ti] = Tier{Name: t.Name, Limits: limits}
	}
	c.Tiers = tiers
	return nil
}

// compileConcurrency validates the concurrency limit, filling in its
// defaults.
func (c *compiledRule) compileConcurrency(bad badFunc) error {
	if c.Concurrency == nil {
		return nil
	}
	cc := *c.Concurrency
	if cc.Name == "" {
		cc.Name = c.Name + ".concurrency"
	} else if !nameRE.MatchString(cc.Name) {
		return bad("concurrency.name", "%q must be 1 to 64 letters, digits, '.', '_' or '-'", cc.Name)
	}
	if cc.Limit < 1 || cc.Limit > storage.MaxLeases {
		return bad("concurrency.limit", "%d is outside 1..%d", cc.Limit, storage.MaxLeases)
	}
	if cc.LeaseTTL == 0 {
		cc.LeaseTTL = DefaultLeaseTTL
	}
	if cc.LeaseTTL < time.Millisecond || cc.LeaseTTL > MaxLeaseTTL {
		return bad("concurrency.lease_ttl", "%v is outside 1ms..%v", cc.LeaseTTL, MaxLeaseTTL)
	}
	c.Concurrency = &cc
	return nil
}

// compileRest validates cost (against minCap, the smallest capacity of
// the rule's limits), priority, fail and require.
func (c *compiledRule) compileRest(minCap int64, bad badFunc) error {
	c.cost = c.Cost
	if c.cost == 0 {
		c.cost = 1
	}
	if c.cost < 1 || c.cost > minCap {
		return bad("cost", "%d is outside 1..%d (a request costing more than a limit's capacity could never pass)", c.Cost, minCap)
	}
	if c.Priority < limiter.PriorityLow || c.Priority > limiter.PriorityCritical {
		return bad("priority", "%d is outside %d (low) to %d (critical)", c.Priority, limiter.PriorityLow, limiter.PriorityCritical)
	}
	if c.Fail != FailOpen && c.Fail != FailClosed {
		return bad("fail", "unknown fail mode %d", c.Fail)
	}
	for i, a := range c.Require {
		p, err := parsePlaceholder(a)
		if err != nil {
			return bad(fmt.Sprintf("require[%d]", i), "%v", err)
		}
		c.require = append(c.require, p)
	}
	if c.Scope == ScopeGlobal {
		for _, l := range c.allLimits() {
			if l.Backend != "dynamo" {
				return bad("scope", "global needs every limit on backend dynamo (memcached and memory keep a limit per region); %s has backend %q", l.Name, l.Backend)
			}
		}
	}
	return nil
}

// allLimits is every limit of the rule, every tier's included.
func (c *compiledRule) allLimits() []Limit {
	ls := append([]Limit(nil), c.Limits...)
	for _, t := range c.Tiers {
		ls = append(ls, t.Limits...)
	}
	return ls
}

// checkLimit validates l and fills in its defaults (Name, SubWindows,
// RefillAmount).
func checkLimit(l *Limit, rule string, index int) error {
	if l.Name == "" {
		l.Name = fmt.Sprintf("%s/%d", rule, index)
	} else if !nameRE.MatchString(l.Name) {
		return fmt.Errorf("name: %q must be 1 to 64 letters, digits, '.', '_' or '-'", l.Name)
	}
	if l.Backend != "" && !backendRE.MatchString(l.Backend) {
		return fmt.Errorf("backend: %q is not a backend name (memory, memcached, dynamo)", l.Backend)
	}
	window := func(d time.Duration, field string) error {
		if d < time.Millisecond || d > MaxWindow {
			return fmt.Errorf("%s: %v is outside 1ms..%v", field, d, MaxWindow)
		}
		return nil
	}
	count := func(n int64, field string, hi int64) error {
		if n < 1 || n > hi {
			return fmt.Errorf("%s: %d is outside 1..%d", field, n, hi)
		}
		return nil
	}
	stray := l.strays() // fields that do not belong to the algorithm
	var err error
	switch l.Algorithm {
	case TokenBucket:
		if l.RefillAmount == 0 {
			l.RefillAmount = 1
		}
		err = errors.Join(count(l.MaxAmount, "max_amount", MaxCount), window(l.RefillTime, "refill_time"))
		if err == nil {
			err = count(l.RefillAmount, "refill_amount", l.MaxAmount)
		}
	case SlidingWindow:
		err = errors.Join(count(l.Limit, "limit", MaxCount), window(l.Window, "window"))
		if err == nil {
			err = checkSliding(l)
		}
	case FixedWindow:
		err = errors.Join(count(l.Limit, "limit", MaxCount), window(l.Window, "window"))
	case SlidingLog:
		err = errors.Join(count(l.Limit, "limit", storage.MaxLogLimit), window(l.Window, "window"))
	case 0:
		return fmt.Errorf("algorithm: required (token_bucket, sliding_window, fixed_window or sliding_log)")
	default:
		return fmt.Errorf("algorithm: unknown algorithm %d", l.Algorithm)
	}
	if len(stray) > 0 {
		return fmt.Errorf("%s: not a field of %s", strings.Join(stray, ", "), l.Algorithm)
	}
	return err
}

// checkText accepts non-empty printable text of at most n bytes.
func checkText(s string, n int) error {
	if s == "" {
		return fmt.Errorf("empty")
	}
	if len(s) > n {
		return fmt.Errorf("longer than %d bytes", n)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return fmt.Errorf("%q contains a control byte", s)
		}
	}
	return nil
}

// matches reports whether the rule's match selects req.
func (c *compiledRule) matches(req *Request) bool {
	if c.key.attrs&req.Absent != 0 {
		return false
	}
	if c.SkipIfMissing {
		for _, p := range c.key.parts {
			if v, ok := c.value(p, req); !ok || v == "" {
				return false
			}
		}
	}
	if c.methods != nil && !containsFold(c.methods, req.Method) {
		return false
	}
	if len(c.Match.Stages) > 0 && !contains(c.Match.Stages, req.Stage) {
		return false
	}
	if len(c.Match.Routes) > 0 && !contains(c.Match.Routes, req.RouteKey) {
		return false
	}
	if len(c.globs) > 0 {
		ok := false
		for _, g := range c.globs {
			if g.match(req.Path) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}

// checkSliding validates a sliding window's representation fields: sub_windows
// belong to sub-window counters, slots to packed ones, and a packed window
// must fit its 16-bit fields (limit), be bounded and not count denials.
func checkSliding(l *Limit) error {
	switch {
	case l.Estimator > limiter.Interpolated:
		return fmt.Errorf("estimator: unknown estimator %d", l.Estimator)
	case l.Representation > limiter.Packed:
		return fmt.Errorf("representation: unknown representation %d", l.Representation)
	case l.SubWindows != 0 && l.Representation == limiter.Packed:
		return fmt.Errorf("sub_windows: a packed window has slots, not sub-windows")
	case l.Slots != 0 && l.Representation == limiter.SubWindowCounters:
		return fmt.Errorf("slots: only a packed window has slots (representation: subwindows has sub_windows)")
	case l.Slots != 0 && l.SubWindows != 0:
		return fmt.Errorf("slots: give slots (packed) or sub_windows (sub-window counters), not both")
	}
	packed := l.Representation == limiter.Packed || l.Slots != 0
	if packed {
		slots := l.Slots
		if slots == 0 {
			slots = limiter.DefaultSlots
		}
		switch {
		case l.Limit > limiter.MaxPackedLimit:
			return fmt.Errorf("limit: %d is above %d, the most a packed window holds (use representation: subwindows)", l.Limit, limiter.MaxPackedLimit)
		case l.Estimator != limiter.Bounded:
			return fmt.Errorf("estimator: a packed window is bounded (use representation: subwindows for interpolated)")
		case l.CountDenied:
			return fmt.Errorf("count_denied: a packed window does not count denied requests (use representation: subwindows)")
		case slots < limiter.MinSlots || slots > limiter.MaxSlots:
			return fmt.Errorf("slots: %d is outside %d..%d", slots, limiter.MinSlots, limiter.MaxSlots)
		case l.Window%time.Duration(slots) != 0 || l.Window/time.Duration(slots) < 100*time.Microsecond:
			return fmt.Errorf("slots: %d does not cut the window %v into whole slots of at least 100us", slots, l.Window)
		}
		return nil
	}
	if l.SubWindows != 0 {
		switch {
		case l.SubWindows < 1 || l.SubWindows > limiter.MaxSubWindows:
			return fmt.Errorf("sub_windows: %d is outside 1..%d", l.SubWindows, limiter.MaxSubWindows)
		case l.Window%time.Duration(l.SubWindows) != 0 || l.Window/time.Duration(l.SubWindows) < time.Millisecond:
			return fmt.Errorf("sub_windows: %d does not cut the window %v into whole sub-windows of at least 1ms", l.SubWindows, l.Window)
		}
		return nil
	}
	// Auto with no sub_windows: packed where it fits, else the default
	// sub-windows, which must then cut the window.
	if l.Window%time.Duration(limiter.DefaultSubWindows) != 0 || l.Window/time.Duration(limiter.DefaultSubWindows) < time.Millisecond {
		fits := l.Limit <= limiter.MaxPackedLimit && l.Estimator == limiter.Bounded && !l.CountDenied &&
			l.Window%time.Duration(limiter.DefaultSlots) == 0 && l.Window/time.Duration(limiter.DefaultSlots) >= 100*time.Microsecond
		if !fits {
			return fmt.Errorf("window: %v does not cut into %d sub-windows of at least 1ms (give sub_windows)", l.Window, limiter.DefaultSubWindows)
		}
	}
	return nil
}
