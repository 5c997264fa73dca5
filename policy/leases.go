package policy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// DenyListRetryAfter is the RetryAfter of a deny-listed request's denial:
// the list does not lapse, so a client is told to stay away for an hour.
const DenyListRetryAfter = time.Hour

// Lease is a concurrency lease a request holds: Limit names the rule's
// concurrency limit (its stored key space), Lease the slot. Pass it to the
// code that sees the request end (lambdawrap.NamedLease has the same
// fields), or give it back with [Policy.Release].
type Lease struct {
	Limit string
	Lease limiter.Lease
}

// ErrNoLeaseStore is wrapped by New's error for a rule with a concurrency
// limit when Options.Leases is nil.
var ErrNoLeaseStore = errors.New("policy: a concurrency limit needs Options.Leases")

// bindExtras builds the limiters of a rule's tiers and its concurrency
// limit, as New builds its own limits.
func bindExtras(c *compiledRule, index int, opts Options, def string) ([][]limiter.Limiter, *limiter.Concurrency, error) {
	var tiers [][]limiter.Limiter
	for ti, t := range c.Tiers {
		lims, err := bindList(c, index, c.Tiers[ti].Limits, "tiers."+t.Name, def, &opts)
		if err != nil {
			return nil, nil, err
		}
		tiers = append(tiers, lims)
	}
	if c.Concurrency == nil {
		return tiers, nil, nil
	}
	if opts.Leases == nil {
		return nil, nil, ruleError(c.Name, index, "concurrency", "%v (the shed store: memcached or dynamo)", ErrNoLeaseStore)
	}
	cc, err := limiter.NewConcurrency(opts.Leases, limiter.ConcurrencyConfig{
		Name: c.Concurrency.Name, Capacity: c.Concurrency.Limit, LeaseTTL: c.Concurrency.LeaseTTL,
	})
	if err != nil {
		return nil, nil, ruleError(c.Name, index, "concurrency", "%v", err)
	}
	return tiers, cc, nil
}

// acquireLeases takes a lease on every matched rule's concurrency limit,
// before the rate limits. It reports false when the request is denied (a
// full enforcing limit, or a fail-closed store failure): res then holds the
// denial, and the leases taken so far are given back.
func (p *Policy) acquireLeases(ctx context.Context, now time.Time, matched []*boundRule, res *Result) bool {
	for i, r := range matched {
		if r.cc == nil {
			continue
		}
		ev := &res.Evals[i]
		shadow := r.Shadow || p.shadow
		start := time.Now() // a duration measurement
		l, d, err := r.cc.Acquire(ctx, ev.Key, now)
		ev.Latency += time.Since(start)
		switch {
		case err != nil:
			ev.Err = errors.Join(ev.Err, err)
			if r.Fail == FailOpen || shadow {
				ev.Failed = true
				continue
			}
			d = limiter.Decision{Name: r.Concurrency.Name, Limit: r.Concurrency.Limit, RetryAfter: FailClosedRetryAfter, ResetAfter: FailClosedRetryAfter}
			ev.Failed, ev.Reason = true, ReasonFailClosed
		case d.Allowed:
			res.Leases = append(res.Leases, Lease{Limit: r.Concurrency.Name, Lease: l})
			continue
		case shadow:
			ev.ShadowDenied = true
			continue
		default:
			ev.Reason = ReasonLimit
		}
		ev.Outcome, ev.Decision = Deny, d
		res.Outcome, res.Rule, res.Decision, res.Reason = Deny, r.Name, d, ev.Reason
		p.releaseLeases(ctx, res)
		return false
	}
	return true
}

// releaseLeases gives back res.Leases (a denied request's) and forgets them.
//
// The release does not share the decision's deadline: a request denied
// because a limit failed on that deadline (fail closed) would otherwise
// ask the store to release with a spent context, be refused, and hold its
// slot until the lease TTL. It has releaseTimeout of its own.
func (p *Policy) releaseLeases(ctx context.Context, res *Result) {
	if len(res.Leases) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	p.Release(rctx, res.Leases...) //nolint:errcheck // a lost release lapses after the lease TTL
	res.Leases = nil
}

// releaseTimeout bounds the release of a denied request's leases.
const releaseTimeout = 250 * time.Millisecond

// Release gives back leases a request held (Result.Leases: the rules'
// concurrency leases and a LeasingShedder's), for callers that see the
// request end themselves. A lease of a limit this policy does not have is
// an error; a lost release lapses after the limit's lease TTL.
func (p *Policy) Release(ctx context.Context, leases ...Lease) error {
	var errs []error
	for _, l := range leases {
		var cc *limiter.Concurrency
		for _, r := range p.rules {
			if r.cc != nil && r.Concurrency.Name == l.Limit {
				cc = r.cc
				break
			}
		}
		if cc == nil {
			if ls, ok := p.shedder.(LeasingShedder); ok {
				errs = append(errs, ls.ReleaseLease(ctx, l))
				continue
			}
			errs = append(errs, fmt.Errorf("policy: release: no concurrency limit %q", l.Limit))
			continue
		}
		if err := cc.Release(ctx, l.Lease); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// LeasingShedder is a Shedder that holds a slot for each request it lets
// through (the fleet-usage shedder) and hands the lease out, so that the
// code that sees the request end can release it instead of leaving the
// slot to its lease TTL. Evaluate calls CheckLease instead of Check, puts
// the lease in Result.Leases, and gives it back with ReleaseLease when the
// rules deny the request.
type LeasingShedder interface {
	limiter.Shedder
	// CheckLease is Check, with the lease of an allowed request (the
	// zero Lease when none was taken: critical traffic, an error).
	CheckLease(ctx context.Context, p limiter.Priority, now time.Time) (limiter.Decision, Lease, error)
	// ReleaseLease gives back a lease CheckLease returned; a lease of
	// another limit is an error.
	ReleaseLease(ctx context.Context, l Lease) error
}

// checkShedder asks the shedder, keeping a LeasingShedder's lease in res.
func (p *Policy) checkShedder(ctx context.Context, prio limiter.Priority, now time.Time, res *Result) (limiter.Decision, error) {
	ls, ok := p.shedder.(LeasingShedder)
	if !ok {
		return p.shedder.Check(ctx, prio, now)
	}
	d, l, err := ls.CheckLease(ctx, prio, now)
	if d.Allowed && l.Lease.Held() {
		res.Leases = append(res.Leases, l)
	}
	return d, err
}
