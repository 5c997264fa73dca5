package authz

import (
	"strconv"
	"time"

	"github.com/sluicehq/sluice/config"
)

// SharesLine is one limit's regional shares counts in this process over
// a report period (regions.Counts; docs/authorizer.md, "Metrics").
type SharesLine struct {
	Limit                   string
	Given, Received         int64
	Ticks, TickErrors       int64
	Takeovers, RoleLost     int64
	Stale, StaleEntries     int64
	Sweeps, Expired, Wanted int64
	Listed, Dropped         int64
}

// sharesMetrics are the line's metrics in order, with their units.
var sharesMetrics = []struct{ name, unit string }{
	{config.MetricSharesGiven, "Count"}, {config.MetricSharesReceived, "Count"},
	{config.MetricSharesTicks, "Count"}, {config.MetricSharesTickErrors, "Count"},
	{config.MetricSharesTakeovers, "Count"}, {config.MetricSharesRoleLost, "Count"},
	{config.MetricSharesStale, "Count"}, {config.MetricSharesStaleEntries, "Count"},
	{config.MetricSharesSweeps, "Count"}, {config.MetricSharesExpired, "Count"},
	{config.MetricSharesWanted, "None"}, {config.MetricSharesListed, "Count"},
	{config.MetricSharesDropped, "Count"},
}

// Shares writes the metric line of one limit's regional shares, in the
// same namespace as the decision lines, with the dimension sets
// [["Limit"], []] (config.DimensionLimit, and none: the sums over every
// limit, which an alarm can watch without knowing the limits' names).
// Safe for concurrent use.
func (m *Metrics) Shares(now time.Time, l SharesLine) {
	if m == nil {
		return
	}
	vals := []int64{l.Given, l.Received, l.Ticks, l.TickErrors, l.Takeovers, l.RoleLost, l.Stale, l.StaleEntries,
		l.Sweeps, l.Expired, l.Wanted, l.Listed, l.Dropped}
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.head(now)
	b = append(b, `,"Dimensions":[[`...)
	b = appendJSONString(b, config.DimensionLimit)
	b = append(b, `],[]],"Metrics":[`...)
	for i, mt := range sharesMetrics {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"Name":`...)
		b = appendJSONString(b, mt.name)
		b = append(b, `,"Unit":`...)
		b = appendJSONString(b, mt.unit)
		b = append(b, '}')
	}
	b = append(b, `]}]},`...)
	b = appendJSONString(b, config.DimensionLimit)
	b = append(b, ':')
	b = appendJSONString(b, l.Limit)
	for i, mt := range sharesMetrics {
		b = append(b, ',')
		b = appendJSONString(b, mt.name)
		b = append(b, ':')
		b = strconv.AppendInt(b, vals[i], 10)
	}
	b = append(b, "}\n"...)
	m.buf = b
	m.w.Write(b) //nolint:errcheck // metrics must never fail a decision
}
