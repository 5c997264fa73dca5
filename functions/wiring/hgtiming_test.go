package wiring

import (
	"time"

	"github.com/sluicehq/sluice/internal/testserver"
)

// within returns, for the requests p recorded naming key
// (testserver.NewTaggedHTTPProxy) that overlap [from, to], the sum of the
// time each spent inside it and the longest of them:
// TestHotGlobalKeyStaysOnItsKey reads from it how long a decision's own
// requests took and how long a sweep's request of another key held it.
func within(p *testserver.HTTPProxy, key string, from, to time.Time) (sum, longest time.Duration) {
	for _, r := range p.Since(0) {
		if r.Key != key || r.End.Before(from) || r.Start.After(to) {
			continue
		}
		s, e := r.Start, r.End
		if s.Before(from) {
			s = from
		}
		if e.After(to) {
			e = to
		}
		sum += e.Sub(s)
		longest = max(longest, r.End.Sub(r.Start))
	}
	return sum, longest
}
