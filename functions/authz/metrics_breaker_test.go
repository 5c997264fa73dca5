package authz

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// Each transition is one EMF line: the declared metrics are present, with
// the values of the transition.
func TestMetricsBreaker(t *testing.T) {
	var buf bytes.Buffer
	m := NewMetrics(&buf, "NS")
	now := time.UnixMilli(1700000000123)
	m.Breaker(now, "dynamo", "closed", "open")
	m.Breaker(now, "dynamo", "open", "half-open")
	m.Breaker(now, "dynamo", "half-open", "closed")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines", len(lines))
	}
	type line struct {
		AWS struct {
			Timestamp         int64
			CloudWatchMetrics []struct {
				Namespace  string
				Dimensions [][]string
				Metrics    []struct{ Name, Unit string }
			}
		} `json:"_aws"`
		Backend, BreakerState                     string
		BreakerOpened, BreakerClosed, BreakerOpen *float64
	}
	want := []struct {
		state                  string
		opened, closed, isOpen float64
	}{{"open", 1, 0, 1}, {"half-open", 0, 0, 0.5}, {"closed", 0, 1, 0}}
	for i, s := range lines {
		var l line
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("line %q: %v", s, err)
		}
		cw := l.AWS.CloudWatchMetrics
		if l.AWS.Timestamp != now.UnixMilli() || len(cw) != 1 || cw[0].Namespace != "NS" || len(cw[0].Dimensions) != 1 || cw[0].Dimensions[0][0] != "Backend" || len(cw[0].Metrics) != 3 {
			t.Fatalf("line %d: %s", i, s)
		}
		if l.BreakerOpened == nil || l.BreakerClosed == nil || l.BreakerOpen == nil {
			t.Fatalf("line %d lacks a declared metric: %s", i, s)
		}
		w := want[i]
		if l.Backend != "dynamo" || l.BreakerState != w.state || *l.BreakerOpened != w.opened || *l.BreakerClosed != w.closed || *l.BreakerOpen != w.isOpen {
			t.Errorf("line %d: %s, want %+v", i, s, w)
		}
	}
}
