package authz

import (
	"io"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/policy"
)

// DefaultNamespace is the CloudWatch namespace of the metrics.
const DefaultNamespace = "Sluice"

// NoRule is the Rule dimension of the metric line of a request no rule
// matched (rule names cannot contain parentheses).
const NoRule = "(none)"

// Metrics writes CloudWatch Embedded Metric Format lines: one JSON object
// per line, with the dimension sets [["Rule"], []] and the metrics Allowed,
// Denied, Shed, FailOpen, FailClosed, BackendErrors, ShedErrors,
// CacheDenied (Count: denials answered by the deny cache, without a store
// request; they are in Denied too), Throttled (rule checks whose key the
// store refused for capacity: DynamoDB throttled its partition; counted
// in Denied when they decided the rule), Leased (rule checks allowed from
// a capacity lease, without a store request; in Allowed too),
// ShadowDenied (a shadow rule's
// would-be denials; the line counts Allowed), DenyListed and AllowListed
// (requests the lists decided, without a store request: one "(none)" line
// each, counted in Denied or Allowed too) and BackendLatency
// (Milliseconds), and LeaseTakes, LeaseReturns and LeaseUnitsLost
// (Count: the rule's capacity lease takes, returns and units not given
// back in this instance since its previous line; docs/leases.md), and
// ConcurrencyUnknown, ConcurrencyCleanups, ConcurrencyCleanupErrors and
// ConcurrencyCleanupsSkipped (Count: the clean-ups of the rule's
// concurrency limit since its previous line, limiter.ConcurrencyStats:
// acquires whose outcome was unknown, and the background releases of
// their lease IDs sent, failed and skipped; docs/shedding.md). Every
// line carries the property Reason (the rule's, or
// the request's on a "(none)" line: policy.Reason), which Logs Insights
// can group by without another dimension. A request gets one line per matching rule
// that was checked (or shed); a request no rule matched gets one line with
// Rule "(none)". The dimensionless metrics therefore count rule checks,
// except ShedErrors, which only the first line of a request carries: it
// counts requests whose load shedder failed (they were let through unless
// the shedder's decision stood). The lease and concurrency counts carry
// over a rules reload (Record). Safe for concurrent use; each line is one
// Write.
type Metrics struct {
	w      io.Writer
	ns     string
	prefix []byte // {"_aws":{"Timestamp":
	middle []byte // ,"CloudWatchMetrics":[...]},"Rule":
	mu     sync.Mutex
	buf    []byte
	// pols are the policies whose counters the lines follow, at most
	// keepPolicies (followed).
	pols []followed
}

// followed is a policy whose counters Metrics reports: each rule's
// counters at its previous line, and when a request last used it.
type followed struct {
	p    *policy.Policy
	used time.Time
	last map[string]policy.RuleStats
}

// A reload makes a new Policy; the previous one's background work
// (concurrency clean-up releases up to 1.5 s after their request, lease
// returns up to 1 s, requests in flight) still counts in its own limiters.
// Metrics follows each policy a request used until keepPolicy after its
// last use, and at most keepPolicies of them (the current one and the two
// before it): the previous policy's late counts reach its rules' lines for
// a minute after a reload, and at most two replaced policies stay in
// memory meanwhile. A policy used again after it was dropped would start
// from zero again (its counts reported twice): a request would have to
// stay in flight over two reloads, or a minute.
const (
	keepPolicies = 3
	keepPolicy   = time.Minute
)

// NewMetrics returns a Metrics writing to w (Lambda: os.Stdout) in the
// CloudWatch namespace ns (DefaultNamespace when empty).
func NewMetrics(w io.Writer, ns string) *Metrics {
	if ns == "" {
		ns = DefaultNamespace
	}
	m := &Metrics{w: w, ns: ns}
	m.prefix = []byte(`{"_aws":{"Timestamp":`)
	mid := []byte(`,"CloudWatchMetrics":[{"Namespace":`)
	mid = appendJSONString(mid, ns)
	mid = append(mid, `,"Dimensions":[["Rule"],[]],"Metrics":[`+
		`{"Name":"Allowed","Unit":"Count"},{"Name":"Denied","Unit":"Count"},{"Name":"Shed","Unit":"Count"},`+
		`{"Name":"FailOpen","Unit":"Count"},{"Name":"FailClosed","Unit":"Count"},{"Name":"BackendErrors","Unit":"Count"},`+
		`{"Name":"ShedErrors","Unit":"Count"},{"Name":"CacheDenied","Unit":"Count"},{"Name":"Throttled","Unit":"Count"},{"Name":"Leased","Unit":"Count"},`+
		`{"Name":"ShadowDenied","Unit":"Count"},{"Name":"DenyListed","Unit":"Count"},{"Name":"AllowListed","Unit":"Count"},`+
		`{"Name":"LeaseTakes","Unit":"Count"},{"Name":"LeaseReturns","Unit":"Count"},{"Name":"LeaseUnitsLost","Unit":"Count"},`+
		`{"Name":"ConcurrencyUnknown","Unit":"Count"},{"Name":"ConcurrencyCleanups","Unit":"Count"},`+
		`{"Name":"ConcurrencyCleanupErrors","Unit":"Count"},{"Name":"ConcurrencyCleanupsSkipped","Unit":"Count"},`+
		`{"Name":"BackendLatency","Unit":"Milliseconds"}]}]},"Rule":`...)
	m.middle = mid
	return m
}

// head starts a metric line of its own (not a decision's) in m.buf: the
// EMF envelope up to its namespace, at now. m.mu is held.
func (m *Metrics) head(now time.Time) []byte {
	b := append(m.buf[:0], m.prefix...)
	b = strconv.AppendInt(b, now.UnixMilli(), 10)
	b = append(b, `,"CloudWatchMetrics":[{"Namespace":`...)
	return appendJSONString(b, m.ns)
}

// Line is one metric line's values.
type Line struct {
	Rule                                                                  string
	Allowed, Denied, Shed, FailOpen, FailClosed, BackendErr, ShedErrors   int
	CacheDenied, Throttled, Leased, ShadowDenied, DenyListed, AllowListed int
	LeaseTakes, LeaseReturns, LeaseUnitsLost                              int64
	// The rule's concurrency clean-ups (limiter.ConcurrencyStats).
	ConcurrencyUnknown, ConcurrencyCleanups              int64
	ConcurrencyCleanupErrors, ConcurrencyCleanupsSkipped int64
	BackendLatency                                       time.Duration
	Reason                                               policy.Reason
}

// Record writes the lines of one evaluated request. pol, when not nil, is
// the policy that evaluated it: each rule's line carries what its lease
// and concurrency counters (policy.Policy.RuleStats) grew by since its
// previous line, in pol and in the policies replaced before it that
// Metrics still follows.
func (m *Metrics) Record(now time.Time, res *policy.Result, pol *policy.Policy) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if pol != nil {
		m.follow(now, pol)
	}
	shedErr := 0
	if res.ShedErr != nil {
		shedErr = 1
	}
	if len(res.Evals) == 0 {
		l := Line{Rule: NoRule, ShedErrors: shedErr, Reason: res.Reason}
		switch res.Outcome {
		case policy.Allow:
			l.Allowed = 1
		case policy.Deny:
			l.Denied = 1
		case policy.Shed:
			l.Shed = 1
		}
		switch res.Reason {
		case policy.ReasonDenyList:
			l.DenyListed = 1
		case policy.ReasonAllowList:
			l.AllowListed = 1
		}
		m.write(now, &l)
		return
	}
	for i := range res.Evals {
		ev := &res.Evals[i]
		l := Line{Rule: ev.Rule, BackendLatency: ev.Latency, Reason: ev.Reason}
		if ev.Outcome == policy.Shed {
			l.Reason = policy.ReasonShed
		}
		switch ev.Outcome {
		case policy.Allow:
			l.Allowed = 1
		case policy.Deny:
			l.Denied = 1
		case policy.Shed:
			l.Shed = 1
		default:
			continue // skipped, or refused for authentication: not a rate-limit outcome
		}
		if ev.Failed {
			if ev.Fail == policy.FailClosed {
				l.FailClosed = 1
			} else {
				l.FailOpen = 1
			}
		}
		if ev.Err != nil {
			l.BackendErr = 1
		}
		if ev.Cached {
			l.CacheDenied = 1
		}
		if ev.Throttled {
			l.Throttled = 1
		}
		if ev.Leased {
			l.Leased = 1
		}
		if ev.ShadowDenied {
			l.ShadowDenied = 1
		}
		l.ShedErrors, shedErr = shedErr, 0
		if pol != nil {
			m.statsDelta(&l)
		}
		m.write(now, &l)
	}
}

// follow notes that a request of pol is recorded at now: it starts
// following pol (its counters from zero) and stops following the
// policies unused for keepPolicy, and the least recently used one beyond
// keepPolicies. Call with m.mu held.
func (m *Metrics) follow(now time.Time, pol *policy.Policy) {
	// Most recently used first.
	if len(m.pols) == 0 || m.pols[0].p != pol {
		f := followed{p: pol}
		if i := slices.IndexFunc(m.pols, func(f followed) bool { return f.p == pol }); i >= 0 {
			f = m.pols[i]
			m.pols = slices.Delete(m.pols, i, i+1)
		}
		m.pols = slices.Insert(m.pols, 0, f)
	}
	m.pols[0].used = now
	for i := 1; i < len(m.pols); i++ {
		if i >= keepPolicies || now.Sub(m.pols[i].used) > keepPolicy {
			clear(m.pols[i:]) // drop the references
			m.pols = m.pols[:i]
		}
	}
}

// statsDelta sets l's lease and concurrency counts to what its rule's
// counters grew by since the rule's previous line, in every policy
// followed. Call with m.mu held.
func (m *Metrics) statsDelta(l *Line) {
	for i := range m.pols {
		f := &m.pols[i]
		cur := f.p.RuleStats(l.Rule)
		last := f.last[l.Rule]
		if cur == last {
			continue
		}
		l.LeaseTakes += cur.Lease.Takes - last.Lease.Takes
		l.LeaseReturns += cur.Lease.Returns - last.Lease.Returns
		l.LeaseUnitsLost += cur.Lease.Lost - last.Lease.Lost
		l.ConcurrencyUnknown += cur.Concurrency.Unknown - last.Concurrency.Unknown
		l.ConcurrencyCleanups += cur.Concurrency.Releases - last.Concurrency.Releases
		l.ConcurrencyCleanupErrors += cur.Concurrency.Failed - last.Concurrency.Failed
		l.ConcurrencyCleanupsSkipped += cur.Concurrency.Skipped - last.Concurrency.Skipped
		if f.last == nil {
			f.last = map[string]policy.RuleStats{}
		}
		f.last[l.Rule] = cur
	}
}

// write formats and writes one line. Call with m.mu held.
func (m *Metrics) write(now time.Time, l *Line) {
	b := append(m.buf[:0], m.prefix...)
	b = strconv.AppendInt(b, now.UnixMilli(), 10)
	b = append(b, m.middle...)
	b = appendJSONString(b, l.Rule)
	b = appendField(b, "Allowed", l.Allowed)
	b = appendField(b, "Denied", l.Denied)
	b = appendField(b, "Shed", l.Shed)
	b = appendField(b, "FailOpen", l.FailOpen)
	b = appendField(b, "FailClosed", l.FailClosed)
	b = appendField(b, "BackendErrors", l.BackendErr)
	b = appendField(b, "ShedErrors", l.ShedErrors)
	b = appendField(b, "CacheDenied", l.CacheDenied)
	b = appendField(b, "Throttled", l.Throttled)
	b = appendField(b, "Leased", l.Leased)
	b = appendField(b, "ShadowDenied", l.ShadowDenied)
	b = appendField(b, "DenyListed", l.DenyListed)
	b = appendField(b, "AllowListed", l.AllowListed)
	b = appendField(b, "LeaseTakes", int(l.LeaseTakes))
	b = appendField(b, "LeaseReturns", int(l.LeaseReturns))
	b = appendField(b, "LeaseUnitsLost", int(l.LeaseUnitsLost))
	b = appendField(b, "ConcurrencyUnknown", int(l.ConcurrencyUnknown))
	b = appendField(b, "ConcurrencyCleanups", int(l.ConcurrencyCleanups))
	b = appendField(b, "ConcurrencyCleanupErrors", int(l.ConcurrencyCleanupErrors))
	b = appendField(b, "ConcurrencyCleanupsSkipped", int(l.ConcurrencyCleanupsSkipped))
	b = append(b, `,"Reason":`...)
	b = appendJSONString(b, string(l.Reason))
	b = append(b, `,"BackendLatency":`...)
	b = strconv.AppendFloat(b, float64(l.BackendLatency.Microseconds())/1000, 'f', -1, 64)
	b = append(b, "}\n"...)
	m.buf = b
	m.w.Write(b) //nolint:errcheck // metrics must never fail a decision
}

func appendField(b []byte, name string, v int) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return strconv.AppendInt(b, int64(v), 10)
}

// appendJSONString appends s as a JSON string, escaping quotes,
// backslashes, control bytes and invalid UTF-8.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
