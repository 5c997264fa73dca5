package authz

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
)

// A limit's shares line is one EMF line with the dimension sets
// [["Limit"], []] (per limit, and the sums over every limit, which the
// construct's alarms watch), declaring each shares metric with its unit
// and carrying its value.
func TestMetricsShares(t *testing.T) {
	var buf bytes.Buffer
	m := NewMetrics(&buf, "NS")
	now := time.UnixMilli(1700000000123)
	in := SharesLine{Limit: `global "w"`, Given: 1, Received: 2, Ticks: 3, TickErrors: 4, Takeovers: 5, RoleLost: 6,
		Stale: 7, StaleEntries: 8, Sweeps: 9, Expired: 10, Wanted: 11, Listed: 12, Dropped: 13}
	m.Shares(now, in)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines: %q", len(lines), buf.String())
	}
	var l map[string]json.RawMessage
	if err := json.Unmarshal([]byte(lines[0]), &l); err != nil {
		t.Fatalf("line %q: %v", lines[0], err)
	}
	var aws struct {
		Timestamp         int64
		CloudWatchMetrics []struct {
			Namespace  string
			Dimensions [][]string
			Metrics    []struct{ Name, Unit string }
		}
	}
	if err := json.Unmarshal(l["_aws"], &aws); err != nil || len(aws.CloudWatchMetrics) != 1 {
		t.Fatalf("line %s: %v", lines[0], err)
	}
	cw := aws.CloudWatchMetrics[0]
	if aws.Timestamp != now.UnixMilli() || cw.Namespace != "NS" {
		t.Errorf("timestamp %d, namespace %q", aws.Timestamp, cw.Namespace)
	}
	if len(cw.Dimensions) != 2 || !slices.Equal(cw.Dimensions[0], []string{config.DimensionLimit}) || cw.Dimensions[1] == nil || len(cw.Dimensions[1]) != 0 {
		t.Errorf("dimension sets %q, want [[%s] []]", cw.Dimensions, config.DimensionLimit)
	}
	var limit string
	if err := json.Unmarshal(l[config.DimensionLimit], &limit); err != nil || limit != in.Limit {
		t.Errorf("limit %q (%v), want %q", limit, err, in.Limit)
	}
	want := []struct {
		name, unit string
		v          int64
	}{
		{config.MetricSharesGiven, "Count", 1}, {config.MetricSharesReceived, "Count", 2},
		{config.MetricSharesTicks, "Count", 3}, {config.MetricSharesTickErrors, "Count", 4},
		{config.MetricSharesTakeovers, "Count", 5}, {config.MetricSharesRoleLost, "Count", 6},
		{config.MetricSharesStale, "Count", 7}, {config.MetricSharesStaleEntries, "Count", 8},
		{config.MetricSharesSweeps, "Count", 9}, {config.MetricSharesExpired, "Count", 10},
		{config.MetricSharesWanted, "None", 11}, {config.MetricSharesListed, "Count", 12},
		{config.MetricSharesDropped, "Count", 13},
	}
	if len(cw.Metrics) != len(want) {
		t.Fatalf("%d metrics declared, want %d: %s", len(cw.Metrics), len(want), lines[0])
	}
	for i, w := range want {
		if cw.Metrics[i].Name != w.name || cw.Metrics[i].Unit != w.unit {
			t.Errorf("metric %d declared %+v, want %s in %s", i, cw.Metrics[i], w.name, w.unit)
		}
		var v int64
		if err := json.Unmarshal(l[w.name], &v); err != nil || v != w.v {
			t.Errorf("%s = %d (%v), want %d", w.name, v, err, w.v)
		}
	}
	var nilM *Metrics
	nilM.Shares(now, in) // a nil Metrics writes nothing
}
