package sluice_test

import (
	"os"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"

	"github.com/sluicehq/sluice/infra/sluice"
)

// TestMetricNamesMatchAuthorizer: the construct's Metrics are the metrics
// the authorizer declares on its decision lines, with their units
// (functions/authz/metrics.go), in the function's namespace.
func TestMetricNamesMatchAuthorizer(t *testing.T) {
	src, err := os.ReadFile("../../functions/authz/metrics.go")
	if err != nil {
		t.Fatal(err)
	}
	// The names of ofMetrics' metrics, in order, and their units.
	want := []struct{ name, unit string }{
		{sluice.MetricAllowed, "Count"}, {sluice.MetricDenied, "Count"}, {sluice.MetricShed, "Count"},
		{sluice.MetricFailOpen, "Count"}, {sluice.MetricFailClosed, "Count"}, {sluice.MetricBackendErrors, "Count"},
		{sluice.MetricShedErrors, "Count"}, {sluice.MetricThrottled, "Count"}, {sluice.MetricBackendLatency, "Milliseconds"},
		{sluice.MetricConcurrencyUnknown, "Count"}, {sluice.MetricConcurrencyCleanups, "Count"},
		{sluice.MetricConcurrencyCleanupErrors, "Count"}, {sluice.MetricConcurrencyCleanupsSkipped, "Count"},
	}
	ofMetrics := func(m *sluice.Metrics) []awscloudwatch.Metric {
		return []awscloudwatch.Metric{
			m.Allowed, m.Denied, m.Shed, m.FailOpen, m.FailClosed, m.BackendErrors, m.ShedErrors, m.Throttled, m.BackendLatency,
			m.ConcurrencyUnknown, m.ConcurrencyCleanups, m.ConcurrencyCleanupErrors, m.ConcurrencyCleanupsSkipped,
		}
	}
	for _, w := range want {
		if decl := `{"Name":"` + w.name + `","Unit":"` + w.unit + `"}`; !strings.Contains(string(src), decl) {
			t.Errorf("the authorizer's decision line does not declare %s", decl)
		}
	}
	checked := 0
	for name, s := range synth(t) {
		if s.limiter == nil {
			continue // an API without the construct
		}
		checked++
		m := s.limiter.Metrics()
		for i, got := range ofMetrics(m) {
			if got == nil || *got.MetricName() != want[i].name || *got.Namespace() != m.Namespace {
				t.Errorf("%s: Metrics' metric %d is not %s in %s", name, i, want[i].name, m.Namespace)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no stack with the construct")
	}
}
