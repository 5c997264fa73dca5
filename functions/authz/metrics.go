package authz

import (
	"io"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/limiter"
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
// the shedder's decision stood). Safe for concurrent use; each line is one
// Write.
type Metrics struct {
	w      io.Writer
	ns     string
	prefix []byte // {"_aws":{"Timestamp":
	middle []byte // ,"CloudWatchMetrics":[...]},"Rule":
	mu     sync.Mutex
	buf    []byte
	// last holds each rule's counters at its previous line.
	last map[string]ruleStats
}

// RuleStats gives the counters of a rule's limiters in this process:
// *policy.Policy.
type RuleStats interface {
	LeaseStats(rule string) limiter.LeaseStats
	ConcurrencyStats(rule string) limiter.ConcurrencyStats
}

// ruleStats are a rule's counters (RuleStats) at one time.
type ruleStats struct {
	lease limiter.LeaseStats
	cc    limiter.ConcurrencyStats
}

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

// Record writes the lines of one evaluated request. stats, when not nil,
// gives a rule's lease and concurrency counters (the request's
// *policy.Policy): each rule's line carries what they grew by since its
// previous line.
func (m *Metrics) Record(now time.Time, res *policy.Result, stats RuleStats) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
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
		if stats != nil {
			m.statsDelta(&l, ruleStats{stats.LeaseStats(ev.Rule), stats.ConcurrencyStats(ev.Rule)})
		}
		m.write(now, &l)
	}
}

// statsDelta sets l's lease and concurrency counts to what cur grew by
// since the rule's previous line (all of cur when a counter went down:
// the policy was loaded again, its limits anew). Call with m.mu held.
func (m *Metrics) statsDelta(l *Line, cur ruleStats) {
	if m.last == nil {
		m.last = map[string]ruleStats{}
	}
	last := m.last[l.Rule]
	lt, ct := last.lease, last.cc
	if cur.lease.Takes < lt.Takes || cur.lease.Returns < lt.Returns || cur.lease.Lost < lt.Lost {
		lt = limiter.LeaseStats{}
	}
	if cur.cc.Unknown < ct.Unknown || cur.cc.Releases < ct.Releases || cur.cc.Failed < ct.Failed || cur.cc.Skipped < ct.Skipped {
		ct = limiter.ConcurrencyStats{}
	}
	l.LeaseTakes, l.LeaseReturns, l.LeaseUnitsLost = cur.lease.Takes-lt.Takes, cur.lease.Returns-lt.Returns, cur.lease.Lost-lt.Lost
	l.ConcurrencyUnknown, l.ConcurrencyCleanups = cur.cc.Unknown-ct.Unknown, cur.cc.Releases-ct.Releases
	l.ConcurrencyCleanupErrors, l.ConcurrencyCleanupsSkipped = cur.cc.Failed-ct.Failed, cur.cc.Skipped-ct.Skipped
	if cur != last {
		m.last[l.Rule] = cur
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
