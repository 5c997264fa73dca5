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

// FailClosedRetryAfter is the RetryAfter of a denial made by a fail-closed
// rule whose backend failed.
const FailClosedRetryAfter = time.Second

// DefaultBackend is the backend of limits that name none, unless
// Options.DefaultBackend says otherwise.
const DefaultBackend = "memory"

// Options configures [New].
type Options struct {
	// Stores maps backend names ("memory", "memcached", "dynamo") to
	// stores. A store implements the interfaces of the algorithms it
	// serves: [limiter.Counter] for sliding_window and fixed_window,
	// [limiter.BucketStore] for token_bucket, [limiter.LogStore] for
	// sliding_log.
	Stores map[string]any
	// DefaultBackend is used for limits that name no backend. Empty means
	// DefaultBackend ("memory").
	DefaultBackend string
	// Shedder, when not nil, is asked before any limit whether to shed the
	// request (the load shedders of package limiter).
	Shedder Shedder
}

// Shedder decides whether to shed a request of priority p (the highest
// priority of its matching rules; limiter.PriorityNormal for a request no
// rule matches) at now, before its limits are checked: a decision with
// Allowed false sheds it (HTTP 503). Critical requests are never offered to
// it; requests no rule matches are. An error with a valid decision (Limit or Allowed
// set, as limiter.ErrNoUtilization) is reported in Result.ShedErr; an error
// without one lets the request through (load shedding fails open).
// [limiter.UtilizationShedder] implements it. It must be safe for
// concurrent use and answer quickly.
type Shedder interface {
	Check(ctx context.Context, p limiter.Priority, now time.Time) (limiter.Decision, error)
}

// Policy is a compiled set of rules bound to stores. It is immutable and
// safe for concurrent use.
type Policy struct {
	rules   []*boundRule
	shedder Shedder
}

// boundRule is a compiled rule with its limits built on stores.
type boundRule struct {
	*compiledRule
	stack    *limiter.Stack
	capacity int64 // the first limit's capacity, reported when a backend fails
}

// Source supplies the current Policy: a *Policy supplies itself, a *Cache
// the last one loaded.
type Source interface {
	Policy() *Policy
}

// Policy returns p, so that a *Policy is a [Source].
func (p *Policy) Policy() *Policy { return p }

// New validates rules (as [Parse] does) and builds their limits on the
// stores of opts. A limit whose backend is not in opts.Stores, or whose store
// does not serve its algorithm, is an error naming the rule and the limit.
func New(rules []Rule, opts Options) (*Policy, error) {
	if len(rules) > MaxRules {
		return nil, fmt.Errorf("%w: %d rules; at most %d", ErrInvalidRule, len(rules), MaxRules)
	}
	def := opts.DefaultBackend
	if def == "" {
		def = DefaultBackend
	}
	p := &Policy{shedder: opts.Shedder}
	seen := make(map[string]int, len(rules))
	for i, r := range rules {
		c, err := compile(r, i)
		if err != nil {
			return nil, err
		}
		if j, dup := seen[c.Name]; dup {
			return nil, ruleError(c.Name, i, "name", "already used by rules[%d]", j)
		}
		seen[c.Name] = i
		limits := make([]limiter.Limiter, len(c.Limits))
		for j := range c.Limits {
			l := &c.Limits[j]
			backend := l.Backend
			if backend == "" {
				backend = def
			}
			lim, err := build(l, backend, opts.Stores)
			if err != nil {
				return nil, ruleError(c.Name, i, fmt.Sprintf("limits[%d].backend", j), "%v", err)
			}
			limits[j] = lim
		}
		stack, err := limiter.NewStack(limits...)
		if err != nil {
			return nil, ruleError(c.Name, i, "limits", "%v", err)
		}
		p.rules = append(p.rules, &boundRule{compiledRule: c, stack: stack, capacity: c.Limits[0].Capacity()})
	}
	return p, nil
}

// Load parses a rules document and builds it: [Parse] then [New].
func Load(data []byte, opts Options) (*Policy, error) {
	rules, err := Parse(data)
	if err != nil {
		return nil, err
	}
	return New(rules, opts)
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

// build makes the limiter of l on the store named backend.
func build(l *Limit, backend string, stores map[string]any) (limiter.Limiter, error) {
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
	unsupported := fmt.Errorf("%q does not support %s", backend, l.Algorithm)
	switch l.Algorithm {
	case TokenBucket:
		s, ok := store.(limiter.BucketStore)
		if !ok {
			return nil, unsupported
		}
		return limiter.NewTokenBucket(s, limiter.TokenBucketConfig{
			Name: l.Name, MaxAmount: l.MaxAmount, RefillTime: l.RefillTime, RefillAmount: l.RefillAmount, Strict: l.Strict,
		})
	case SlidingWindow:
		s, ok := store.(limiter.Counter)
		if !ok {
			return nil, unsupported
		}
		return limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{
			Name: l.Name, Limit: l.Limit, Window: l.Window, SubWindows: l.SubWindows, Estimator: l.Estimator, CountDenied: l.CountDenied,
		})
	case FixedWindow:
		s, ok := store.(limiter.Counter)
		if !ok {
			return nil, unsupported
		}
		return limiter.NewFixedWindow(s, limiter.FixedWindowConfig{
			Name: l.Name, Limit: l.Limit, Window: l.Window, CountDenied: l.CountDenied,
		})
	case SlidingLog:
		s, ok := store.(limiter.LogStore)
		if !ok {
			return nil, unsupported
		}
		return limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Name: l.Name, Limit: l.Limit, Window: l.Window})
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

// String returns "allow", "deny", "shed", "unauthenticated" or "skipped".
func (o Outcome) String() string {
	switch o {
	case Allow:
		return "allow"
	case Deny:
		return "deny"
	case Shed:
		return "shed"
	case Unauthenticated:
		return "unauthenticated"
	case Skipped:
		return "skipped"
	}
	return "outcome(" + fmt.Sprint(uint8(o)) + ")"
}

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
	// Priority is the request's priority: the highest of the matching
	// rules', limiter.PriorityNormal when none matched.
	Priority limiter.Priority
	// ShedErr is the shedder's error, if any (the request was then let
	// through by the shedder, or its decision stood).
	ShedErr error
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
	// Err is the backend's error, if any. When Failed, the fail mode
	// decided; otherwise the decision stands (a failed refund).
	Err error
	// Failed reports that the backend failed and Fail decided.
	Failed bool
	// Fail is the rule's fail mode.
	Fail FailMode
	// Latency is the time spent in the rule's backend calls.
	Latency time.Duration
	// Refunded reports that what the rule took was given back because a
	// later rule denied.
	Refunded bool
}

// Evaluate checks req against every matching rule at time now, under ctx
// (whose deadline bounds every backend call). It never fails: backend errors
// are resolved by each rule's fail mode and reported in the Evals.
func (p *Policy) Evaluate(ctx context.Context, req *Request, now time.Time) Result {
	res := Result{Outcome: Allow}
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
					res.Outcome, res.Rule = Unauthenticated, r.Name
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
		d, err := p.shedder.Check(ctx, res.Priority, now)
		res.ShedErr = err
		if !d.Allowed && (err == nil || d.RetryAfter > 0) {
			res.Outcome, res.Decision = Shed, d
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

	var keyBuf [MaxKeyLen + hashLen + 64]byte
	for i, r := range matched {
		ev := &res.Evals[i]
		ev.Key = string(r.renderKey(keyBuf[:0], req))
		start := time.Now() // a duration measurement, not algorithm time
		d, err := r.stack.AllowN(ctx, ev.Key, now, r.cost)
		ev.Latency = time.Since(start)
		switch {
		case err == nil || errors.Is(err, limiter.ErrRefund) && d.Limit != 0:
			ev.Err = err
			ev.Decision = d
		case r.Fail == FailOpen:
			ev.Err, ev.Failed = err, true
			ev.Decision = limiter.Decision{Allowed: true, Limit: r.capacity, Remaining: r.capacity}
		default:
			ev.Err, ev.Failed = err, true
			ev.Decision = limiter.Decision{Limit: r.capacity, ResetAfter: FailClosedRetryAfter, RetryAfter: FailClosedRetryAfter}
		}
		if ev.Decision.Allowed {
			ev.Outcome = Allow
			continue
		}
		ev.Outcome = Deny
		res.Outcome, res.Rule, res.Decision = Deny, r.Name, ev.Decision
		// Give back what the earlier rules took.
		for j := 0; j < i; j++ {
			prev := &res.Evals[j]
			if prev.Failed {
				continue
			}
			start := time.Now()
			rerr := matched[j].stack.Refund(ctx, prev.Key, now, matched[j].cost)
			prev.Latency += time.Since(start)
			prev.Refunded = rerr == nil
			if rerr != nil {
				prev.Err = errors.Join(prev.Err, rerr)
			}
		}
		return res
	}
	// Every rule allowed: report the tightest.
	best := -1
	for i := range res.Evals {
		ev := &res.Evals[i]
		switch {
		case best < 0:
			best = i
		case res.Evals[best].Failed && !ev.Failed:
			best = i
		case ev.Failed:
		case ev.Decision.Remaining < res.Evals[best].Decision.Remaining,
			ev.Decision.Remaining == res.Evals[best].Decision.Remaining && ev.Decision.ResetAfter > res.Evals[best].Decision.ResetAfter:
			best = i
		}
	}
	res.Rule, res.Decision = res.Evals[best].Rule, res.Evals[best].Decision
	return res
}
