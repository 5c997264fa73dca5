package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// FailClosedRetryAfter is the RetryAfter of a denial made by a fail-closed
// rule whose backend failed.
const FailClosedRetryAfter = time.Second

// DefaultBackend is the backend of limits that name none, unless
// Options.DefaultBackend says otherwise.
const DefaultBackend = "memory"

// Options configures [New].
type Options struct {
	// Stores maps backend names ("memory", "memcached", "dynamo") to
	// stores.
	Stores map[string]storage.Store
	// DefaultBackend is used for limits that name no backend. Empty means
	// DefaultBackend ("memory").
	DefaultBackend string
	// Shedder, when not nil, is asked before any limit whether to shed the
	// request (the load shedders of package limiter), with the request's
	// priority: the highest of its matching rules', limiter.PriorityNormal
	// when no rule matches. A decision with Allowed false sheds it (HTTP
	// 503). Critical requests are never offered to it; requests no rule
	// matches are. An error with a valid decision (Limit or Allowed set, as
	// limiter.ErrNoUtilization) is reported in Result.ShedErr; an error
	// without one lets the request through (load shedding fails open). It
	// must be safe for concurrent use and answer quickly.
	Shedder limiter.Shedder
	// NoDenyCache turns off every limit's deny cache (limiter.DenyCache):
	// by default a key a store denied is denied again in this process,
	// without a store request, until the denial's RetryAfter has passed.
	NoDenyCache bool
	// NoLeases turns off every limit's capacity leases (SLUICE_LEASES=
	// false): by default a hot key of a limit that allows them is decided
	// in process from units leased from the store ([Limit.Lease]).
	NoLeases bool
	// Lists are the rule set's allow and deny lists ([Load] takes them
	// from the document when this is empty).
	Lists Lists
	// Shadow runs every rule in shadow mode (SLUICE_SHADOW): evaluated and
	// counted, never denying. The deny list still denies.
	Shadow bool
	// TierOf maps tier values for rules with tier_lookup (the rules
	// table's tier items); nil: such rules use their default tier.
	TierOf TierOf
	// Leases holds the rules' concurrency limits' leases (the shed store);
	// required when a rule has a concurrency limit.
	Leases storage.LeaseStore
	// Shares, when not nil, keeps the limits of rules with scope global
	// as regional shares (an eventual global table; see [Shares]).
	Shares *Shares
}

// Policy is a compiled set of rules bound to stores. It is immutable and
// safe for concurrent use.
type Policy struct {
	rules   []*boundRule
	shedder limiter.Shedder
	lists   lists
	shadow  bool
	tierOf  TierOf
}

// boundRule is a compiled rule with its limits built on stores.
type boundRule struct {
	*compiledRule
	limits []limiter.Limiter
	// failed holds the decision of each limit (by index in Limits) whose
	// backend failed: the fail mode's, with the limit's own capacity and
	// name; tierFailed likewise by tier.
	failed     []limiter.Decision
	tiers      [][]limiter.Limiter  // by index in Tiers
	tierFailed [][]limiter.Decision // by index in Tiers
	cc         *limiter.Concurrency // nil without a concurrency limit
	// windows are the limits' windows (Limit.Period), tierWindows by tier.
	windows     []time.Duration
	tierWindows [][]time.Duration
}

// periods is the Period of every limit of limits.
func periods(limits []Limit) []time.Duration {
	out := make([]time.Duration, len(limits))
	for i := range limits {
		out[i] = limits[i].Period()
	}
	return out
}

// failDecision is the decision of the limit l when its backend fails and
// the fail mode decides: a fail-open limit reports its capacity as limit
// and remaining (its usage is unknown), a fail-closed one denies for
// FailClosedRetryAfter.
func failDecision(l *Limit, mode FailMode) limiter.Decision {
	capacity := l.Capacity()
	if mode == FailOpen {
		return limiter.Decision{Allowed: true, Limit: capacity, Remaining: capacity, Name: l.Name}
	}
	return limiter.Decision{Limit: capacity, ResetAfter: FailClosedRetryAfter, RetryAfter: FailClosedRetryAfter, Name: l.Name}
}

// failDecisions is failDecision of every limit of limits.
func failDecisions(limits []Limit, mode FailMode) []limiter.Decision {
	out := make([]limiter.Decision, len(limits))
	for i := range limits {
		out[i] = failDecision(&limits[i], mode)
	}
	return out
}

// Source supplies the current Policy: a *Policy supplies itself, a *Cache
// the last one loaded.
type Source interface {
	Policy() *Policy
}

// Policy returns p, so that a *Policy is a [Source].
func (p *Policy) Policy() *Policy { return p }

// New validates rules (as [Parse] does) and builds their limits on the
// stores of opts. A limit whose backend is not in opts.Stores, or that its
// store cannot serve, is an error naming the rule and the limit.
func New(rules []Rule, opts Options) (*Policy, error) {
	if len(rules) > MaxRules {
		return nil, fmt.Errorf("%w: %d rules; at most %d", ErrInvalidRule, len(rules), MaxRules)
	}
	def := opts.DefaultBackend
	if def == "" {
		def = DefaultBackend
	}
	p := &Policy{shedder: opts.Shedder, shadow: opts.Shadow, tierOf: opts.TierOf}
	var err error
	if p.lists.allow, p.lists.deny, err = compileLists(&opts.Lists); err != nil {
		return nil, err
	}
	seen, global := make(map[string]int, len(rules)), globalNames{}
	for i, r := range rules {
		c, err := compile(r, i)
		if err != nil {
			return nil, err
		}
		if j, dup := seen[c.Name]; dup {
			return nil, ruleError(c.Name, i, "name", "already used by rules[%d]", j)
		}
		seen[c.Name] = i
		if err := global.check(c, i); err != nil {
			return nil, err
		}
		if err := checkShares(c, i, &opts); err != nil {
			return nil, err
		}
		limits, err := bindList(c, i, c.Limits, "limits", def, &opts)
		if err != nil {
			return nil, err
		}
		if len(limits) == 0 {
			return nil, ruleError(c.Name, i, "limits", "needs at least one limit")
		}
		tiers, cc, err := bindExtras(c, i, opts, def)
		if err != nil {
			return nil, err
		}
		br := &boundRule{compiledRule: c, limits: limits, failed: failDecisions(c.Limits, c.Fail), tiers: tiers, cc: cc, windows: periods(c.Limits)}
		for _, t := range c.Tiers {
			br.tierFailed = append(br.tierFailed, failDecisions(t.Limits, c.Fail))
			br.tierWindows = append(br.tierWindows, periods(t.Limits))
		}
		p.rules = append(p.rules, br)
	}
	return p, nil
}

// Load parses a rules document and builds it: [Parse] then [New].
func Load(data []byte, opts Options) (*Policy, error) {
	doc, err := ParseDocument(data)
	if err != nil {
		return nil, err
	}
	if opts.Lists.Empty() {
		opts.Lists = doc.Lists
	}
	return New(doc.Rules, opts)
}

// Rules returns the names of the policy's rules, in order.
func (p *Policy) Rules() []string {
	names := make([]string, len(p.rules))
	for i, r := range p.rules {
		names[i] = r.Name
	}
	return names
}

// Backends returns the backends the policy's limits use, sorted.
func (p *Policy) Backends(opts Options) []string {
	def := opts.DefaultBackend
	if def == "" {
		def = DefaultBackend
	}
	var out []string
	for _, r := range p.rules {
		for _, l := range r.Limits {
			b := l.Backend
			if b == "" {
				b = def
			}
			if !slices.Contains(out, b) {
				out = append(out, b)
			}
		}
	}
	slices.Sort(out)
	return out
}

// build makes the limiter of l on the store named backend, for a rule
// whose requests cost cost (a sliding window's MaxCost: a packed window
// only where its fields stay exact, limiter.PackedMaxCost).
func build(l *Limit, backend string, opts *Options, cost int64, tag string) (limiter.Limiter, error) {
	stores, noDenyCache, leases := opts.Stores, opts.NoDenyCache, !opts.NoLeases && l.leases()
	store, ok := stores[backend]
	if !ok || store == nil {
		names := make([]string, 0, len(stores))
		for n, s := range stores {
			if s != nil {
				names = append(names, n)
			}
		}
		slices.Sort(names)
		return nil, fmt.Errorf("%q is not configured (configured: %s)", backend, strings.Join(names, ", "))
	}
	switch l.Algorithm {
	case TokenBucket:
		return limiter.NewTokenBucket(store, limiter.TokenBucketConfig{
			Name: l.Name, Tag: tag, MaxAmount: l.MaxAmount, RefillTime: l.RefillTime, RefillAmount: l.RefillAmount, Strict: l.Strict,
			NoDenyCache: noDenyCache, Leases: leases,
		})
	case SlidingWindow:
		return limiter.NewSlidingWindow(store, limiter.SlidingWindowConfig{
			Name: l.Name, Tag: tag, Limit: l.Limit, Window: l.Window, SubWindows: l.SubWindows, Estimator: l.Estimator, CountDenied: l.CountDenied,
			Representation: l.Representation, Slots: l.Slots, NoDenyCache: noDenyCache, MaxCost: cost, Leases: leases,
		})
	case FixedWindow:
		return limiter.NewFixedWindow(store, limiter.FixedWindowConfig{
			Name: l.Name, Tag: tag, Limit: l.Limit, Window: l.Window, CountDenied: l.CountDenied,
			NoDenyCache: noDenyCache,
		})
	case SlidingLog:
		return limiter.NewSlidingLog(store, limiter.SlidingLogConfig{Name: l.Name, Tag: tag, Limit: l.Limit, Window: l.Window, NoDenyCache: noDenyCache})
	}
	return nil, fmt.Errorf("unknown algorithm %d", l.Algorithm)
}

// Outcome is what happens to a request, or to one rule's check of it.
type Outcome uint8

const (
	// Allow lets the request through.
	Allow Outcome = iota
	// Deny refuses it: rate limited (HTTP 429).
	Deny
	// Shed refuses it to protect the service (HTTP 503).
	Shed
	// Unauthenticated refuses it for lack of a required credential (HTTP
	// 401).
	Unauthenticated
	// Skipped marks a rule not checked because an earlier rule denied.
	Skipped
)

// outcomeNames are the Outcomes' names, in their order.
var outcomeNames = [...]string{Allow: "allow", Deny: "deny", Shed: "shed", Unauthenticated: "unauthenticated", Skipped: "skipped"}

// String returns "allow", "deny", "shed", "unauthenticated" or "skipped".
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "outcome(" + fmt.Sprint(uint8(o)) + ")"
}

// Reason says why a request got its outcome: in the authorizer's response
// context, its log line and its metrics.
type Reason string

const (
	// ReasonNone: no rule matched (the request is allowed).
	ReasonNone Reason = "none"
	// ReasonLimit: the stores answered; the limits decided.
	ReasonLimit Reason = "limit"
	// ReasonCache: denied by the deny cache (a store denied the key
	// earlier and its RetryAfter has not passed): no store request.
	ReasonCache Reason = "cache"
	// ReasonDenyList: the request is on a deny list: no store request.
	ReasonDenyList Reason = "deny_list"
	// ReasonAllowList: the request is on an allow list: no store request.
	ReasonAllowList Reason = "allow_list"
	// ReasonFailOpen: a backend failed and a fail-open rule let the request
	// through (no answering limit was tighter).
	ReasonFailOpen Reason = "fail_open"
	// ReasonFailClosed: a backend failed and a fail-closed rule denied.
	ReasonFailClosed Reason = "fail_closed"
	// ReasonShed: a load shedder refused the request.
	ReasonShed Reason = "shed"
	// ReasonThrottled: the store refused the rule's key for capacity
	// (DynamoDB throttled its partition), or the key was so contended that
	// its writes lost every race within their retries: denied with a
	// short RetryAfter (limiter.ThrottledRetryAfter), whatever the fail
	// mode, so a hot key is never admitted uncounted.
	ReasonThrottled Reason = "throttled"
	// ReasonLease: allowed from a capacity lease this process holds on
	// the key (docs/leases.md): no store request.
	ReasonLease Reason = "lease"
	// ReasonUnauthenticated: a required credential is missing.
	ReasonUnauthenticated Reason = "unauthenticated"
)

// Result is the evaluation of one request.
type Result struct {
	// Outcome is the request's fate.
	Outcome Outcome
	// Rule is the deciding rule: the one that denied, among allowing rules
	// the one with the least remaining, or for a shed request the first
	// matching rule. Empty when no rule matched.
	Rule string
	// Decision is the deciding rule's decision (its deciding limit's).
	Decision limiter.Decision
	// Window is the deciding limit's period ([Limit.Period]); zero when
	// no limit decided (lists, shedding, no rule).
	Window time.Duration
	// Priority is the request's priority: the highest of the matching
	// rules', limiter.PriorityNormal when none matched.
	Priority limiter.Priority
	// ShedErr is the shedder's error, if any (the request was then let
	// through by the shedder, or its decision stood).
	ShedErr error
	// Reason says why: see [Reason].
	Reason Reason
	// List says which list decided (Reason deny_list or allow_list).
	List ListMatch
	// Leases are the concurrency leases an allowed request holds: pass
	// them to the code that sees the request end (the authorizer puts
	// them in its context), which releases them.
	Leases []Lease
	// Evals has one entry per matching rule, in rule order.
	Evals []Eval
}

// Eval is one matching rule's part in a Result.
type Eval struct {
	// Rule is the rule's name.
	Rule string
	// Key is the rendered key. It may hold client addresses: hash it
	// before logging it.
	Key string
	// Outcome is Allow, Deny, Shed, Unauthenticated or Skipped.
	Outcome Outcome
	// Decision is the rule's decision (zero when not checked).
	Decision limiter.Decision
	// Window is the period of the limit that gave Decision.
	Window time.Duration
	// Err is the backend's error, if any. When Failed, the fail mode
	// decided; otherwise the decision stands (a failed refund).
	Err error
	// Failed reports that a backend failed and Fail decided the rule: a
	// rule with a limit that failed and none that denied. (A rule that
	// another of its limits denied has Err set and Failed false.)
	Failed bool
	// Fail is the rule's fail mode.
	Fail FailMode
	// Latency is the time spent in the request's backend calls: the rules
	// of a request are decided in one batch, so they share it.
	Latency time.Duration
	// Refunded reports that what the rule took was given back because
	// another rule (or another limit of the rule) denied.
	Refunded bool
	// Cached reports that the rule was denied from the deny cache.
	Cached bool
	// Throttled reports that the store refused the rule's key for
	// capacity (Reason throttled, when it decided the rule).
	Throttled bool
	// Leased reports that the deciding limit allowed the request from a
	// capacity lease, without a store request (ReasonLease).
	Leased bool
	// Reason says why the rule had its outcome (ReasonLimit, ReasonCache,
	// ReasonFailOpen, ReasonFailClosed, ...).
	Reason Reason
	// Tier is the tier whose limits were checked (DefaultTier for the
	// rule's own).
	Tier string
	// Shadow reports a rule in shadow mode; ShadowDenied that it would have
	// denied the request (its Outcome is then Allow).
	Shadow, ShadowDenied bool
}

// Evaluate checks req against every matching rule at time now, under ctx
// (whose deadline bounds every backend call). It never fails: backend errors
// are resolved by each rule's fail mode and reported in the Evals.
func (p *Policy) Evaluate(ctx context.Context, req *Request, now time.Time) Result {
	res := Result{Outcome: Allow, Reason: ReasonNone}
	// The lists first, in memory: no store request either way.
	if res.List = p.lists.check(req); res.List.List == "deny" {
		d := limiter.Decision{RetryAfter: DenyListRetryAfter, ResetAfter: DenyListRetryAfter}
		res.Outcome, res.Reason, res.Decision = Deny, ReasonDenyList, d
		return res
	} else if res.List.List == "allow" {
		res.Reason = ReasonAllowList
		return res
	}
	var matched []*boundRule
	var buf [8]*boundRule
	matched = buf[:0]
	for _, r := range p.rules {
		if r.matches(req) {
			matched = append(matched, r)
		}
	}
	if len(matched) > 0 {
		res.Evals = make([]Eval, len(matched))
		res.Priority = limiter.PriorityLow
		for i, r := range matched {
			res.Evals[i] = Eval{Rule: r.Name, Fail: r.Fail, Outcome: Skipped}
			res.Priority = max(res.Priority, r.Priority)
		}
		// Authentication first: nothing is taken from a request refused for it.
		for i, r := range matched {
			for _, q := range r.require {
				if v, _ := r.value(q, req); v == "" {
					res.Outcome, res.Rule, res.Reason = Unauthenticated, r.Name, ReasonUnauthenticated
					res.Evals[i].Outcome = Unauthenticated
					return res
				}
			}
		}
	}
	// Load shedding before any limit, for every request that is not
	// critical, matched by a rule or not (then it is normal traffic): the
	// shedders protect the fleet from all of it.
	if p.shedder != nil && res.Priority < limiter.PriorityCritical {
		d, err := p.checkShedder(ctx, res.Priority, now, &res)
		res.ShedErr = err
		if !d.Allowed && (err == nil || d.RetryAfter > 0) {
			res.Outcome, res.Decision, res.Reason = Shed, d, ReasonShed
			if len(matched) > 0 {
				res.Rule = matched[0].Name
			}
			for i := range res.Evals {
				res.Evals[i].Outcome = Shed
			}
			return res
		}
	}
	if len(matched) == 0 {
		return res
	}

	p.decide(ctx, req, now, matched, &res)
	return res
}

// decide checks the limits of the matched rules as one batch
// ([limiter.Decide]): one round trip per store where the store batches, one
// place that refunds and picks the deciding limit.
func (p *Policy) decide(ctx context.Context, req *Request, now time.Time, matched []*boundRule, res *Result) {
	var keyBuf [MaxKeyLen + hashLen + 64]byte
	for i, r := range matched {
		ev := &res.Evals[i]
		ev.Key = string(r.renderKey(keyBuf[:0], req))
		ev.Shadow = r.Shadow || p.shadow
	}
	if !p.acquireLeases(ctx, now, matched, res) {
		return
	}
	var ibuf [16]limiter.Item
	var obuf [16]limiter.Outcome
	var rbuf [16]int
	var wbuf [16]time.Duration
	b := batch{items: ibuf[:0], owner: rbuf[:0], windows: wbuf[:0]}
	b = b.build(req, matched, res, p.tierOf)
	b.out = obuf[:0]
	if len(b.items) > len(obuf) {
		b.out = make([]limiter.Outcome, len(b.items))
	}
	b.out = b.out[:len(b.items)]
	start := time.Now() // a duration measurement, not algorithm time
	decider, err := limiter.Decide(ctx, now, b.items, b.out)
	latency := time.Since(start)
	if err != nil {
		// Every item has a Fail decision, so Decide cannot fail; if it
		// does, deny as a fail-closed rule would, and say why.
		res.Outcome, res.Reason = Deny, ReasonFailClosed
		res.Rule, res.Decision = matched[0].Name, limiter.Decision{RetryAfter: FailClosedRetryAfter, ResetAfter: FailClosedRetryAfter}
		p.releaseLeases(ctx, res)
		for i := range res.Evals {
			res.Evals[i].Err, res.Evals[i].Failed, res.Evals[i].Outcome = err, true, Deny
		}
		return
	}
	b.judge(matched, res, latency)
	if decider < 0 {
		return
	}
	// The deciding rule's own decision: the limit that decided it (its
	// fail mode's when a limit of it failed), with its reason.
	ev := &res.Evals[b.owner[decider]]
	res.Rule, res.Decision, res.Reason, res.Window = ev.Rule, ev.Decision, ev.Reason, ev.Window
	if !b.out[decider].Decision.Allowed {
		res.Outcome = Deny
		p.releaseLeases(ctx, res)
	}
}

// batch is one request's limits as a [limiter.Decide] batch (decide
// makes its slices on buffers that cover the usual request without
// allocating).
type batch struct {
	items   []limiter.Item
	out     []limiter.Outcome
	owner   []int           // the rule (index in matched) of each item
	windows []time.Duration // each item's window
}

// build returns b with every limit of the matched rules (of the tier req
// is in) added, with the rule's key and cost.
func (b batch) build(req *Request, matched []*boundRule, res *Result, tierOf TierOf) batch {
	for i, r := range matched {
		ev := &res.Evals[i]
		limits, fails, ws := r.limits, r.failed, r.windows
		ti, tier := r.tierIndex(req, tierOf)
		if ti >= 0 {
			limits, fails, ws = r.tiers[ti], r.tierFailed[ti], r.tierWindows[ti]
		}
		ev.Tier = tier
		for k, l := range limits {
			b.items = append(b.items, limiter.Item{Limit: l, Key: ev.Key, N: r.cost, Fail: &fails[k], Shadow: ev.Shadow})
			b.owner = append(b.owner, i)
			b.windows = append(b.windows, ws[k])
		}
	}
	return b
}

// judge fills in each matched rule's Eval from the outcomes of its limits:
// its first denied limit; else, when a limit's backend failed, that limit
// (the fail mode decides a rule it could not check in full: reason, log
// line and metrics then agree); else its tightest ([limiter.Tighter]).
func (b batch) judge(matched []*boundRule, res *Result, latency time.Duration) {
	var bestBuf [16]int
	best := bestBuf[:0]
	if len(matched) > len(bestBuf) {
		best = make([]int, 0, len(matched))
	}
	for range matched {
		best = append(best, -1)
	}
	for j, o := range b.out {
		i, ev := b.owner[j], &res.Evals[b.owner[j]]
		if o.Skipped {
			continue
		}
		ev.Latency = latency
		if o.Err != nil {
			ev.Err = errors.Join(ev.Err, o.Err)
		}
		ev.Refunded = ev.Refunded || o.Refunded
		ev.Throttled = ev.Throttled || o.Throttled
		if k := best[i]; k < 0 || limiter.Tighter(&b.out[j], &b.out[k], true) {
			best[i] = j
		}
	}
	for i := range matched {
		if j := best[i]; j >= 0 { // else skipped: a cached denial decided
			judgeRule(&res.Evals[i], &b.out[j], b.windows[j], matched[i].Fail)
		}
	}
}

// judgeRule sets ev, the Eval of a rule of fail mode fail, from o, the
// outcome of the limit that decided it, whose window is window.
func judgeRule(ev *Eval, o *limiter.Outcome, window time.Duration, fail FailMode) {
	ev.Decision, ev.Cached, ev.Window = o.Decision, o.Cached, window
	ev.Failed = o.Failed // the fail mode decided (a failure elsewhere in the rule is in Err)
	ev.Outcome, ev.Reason = Allow, ReasonLimit
	if !o.Decision.Allowed {
		ev.Outcome = Deny
	}
	switch {
	case o.Cached:
		ev.Reason = ReasonCache
	case o.Throttled:
		ev.Reason = ReasonThrottled
	case o.Leased:
		ev.Reason, ev.Leased = ReasonLease, true
	case o.Failed && fail == FailOpen:
		ev.Reason = ReasonFailOpen
	case o.Failed:
		ev.Reason = ReasonFailClosed
	}
	if ev.Refunded && ev.Outcome == Deny {
		ev.Refunded = false // its own denial: nothing was taken
	}
	if ev.Shadow && ev.Outcome == Deny {
		ev.Outcome, ev.ShadowDenied = Allow, true // would deny; never does
	}
}
