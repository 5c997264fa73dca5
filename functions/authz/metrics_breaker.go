package authz

import "time"

// Breaker writes the metric line of a circuit breaker's transition (see
// package breaker), in the same namespace as the decision lines, with the
// dimension set [["Backend"]]: BreakerOpened is 1 when the breaker of
// backend opened (from closed, or after a failed probe), BreakerClosed 1
// when a probe closed it, and BreakerOpen (None) is the state it entered:
// 1 open, 0.5 half-open (probing), 0 closed. The line also carries the
// state by name ("BreakerState"). Safe for concurrent use.
func (m *Metrics) Breaker(now time.Time, backend, from, to string) {
	m.NodeBreaker(now, backend, "", from, to)
}

// NodeBreaker writes the metric line of a transition of the breaker of
// one node of backend (a memcached node; see backends/memcached): the
// line of Breaker, under the same dimension (Backend), with the node's
// address as the property "Node" (not a dimension: nodes come and go with
// auto discovery, and an alarm per backend sees every node's). An empty
// node writes Breaker's line.
func (m *Metrics) NodeBreaker(now time.Time, backend, node, from, to string) {
	if m == nil {
		return
	}
	opened, closed, open := 0, 0, "0"
	switch to {
	case "open":
		opened, open = 1, "1"
	case "half-open":
		open = "0.5"
	case "closed":
		if from != "closed" {
			closed = 1
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.head(now)
	b = append(b, `,"Dimensions":[["Backend"]],"Metrics":[`+
		`{"Name":"BreakerOpened","Unit":"Count"},{"Name":"BreakerClosed","Unit":"Count"},{"Name":"BreakerOpen","Unit":"None"}]}]},"Backend":`...)
	b = appendJSONString(b, backend)
	if node != "" {
		b = append(b, `,"Node":`...)
		b = appendJSONString(b, node)
	}
	b = append(b, `,"BreakerState":`...)
	b = appendJSONString(b, to)
	b = appendField(b, "BreakerOpened", opened)
	b = appendField(b, "BreakerClosed", closed)
	b = append(b, `,"BreakerOpen":`...)
	b = append(b, open...)
	b = append(b, "}\n"...)
	m.buf = b
	m.w.Write(b) //nolint:errcheck // metrics must never fail a decision
}
