package sluice_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/infra/sluice"
)

// TestBreakerAlarms: one alarm per network backend the authorizer uses
// (DynamoDB always, memcached with a cache) on BreakerOpened in the
// authorizer's namespace, dimension Backend, Sum over one minute >= 1,
// missing data not breaching; the topic of Alarms.Topic as alarm and OK
// action.
func TestBreakerAlarms(t *testing.T) {
	stacks := synth(t)
	for name, want := range map[string]struct {
		ns       string
		backends []string
		topic    bool
	}{
		"RestUser":     {config.DefaultMetricsNamespace, []string{"dynamo", "memcached"}, false},
		"HttpUser":     {config.DefaultMetricsNamespace, []string{"dynamo"}, false},
		"RestExplicit": {"Pets", []string{"dynamo", "memcached"}, true},
	} {
		s := stacks[name]
		var topicID string
		for id := range s.ofType("AWS::SNS::Topic") {
			topicID = id
		}
		var got []string
		for id, a := range s.ofType("AWS::CloudWatch::Alarm") {
			p := a.Properties
			if p["MetricName"] != sluice.MetricBreakerOpened {
				continue
			}
			dims := asList(p["Dimensions"])
			if len(dims) != 1 {
				t.Errorf("%s %s: dimensions %v", name, id, dims)
				continue
			}
			d := dims[0].(map[string]any)
			if d["Name"] != sluice.DimensionBackend {
				t.Errorf("%s %s: dimension %v", name, id, d)
			}
			backend := render(d["Value"])
			got = append(got, backend)
			if p["Namespace"] != want.ns || p["Statistic"] != "Sum" || render(p["Period"]) != "60" || render(p["Threshold"]) != "1" ||
				p["ComparisonOperator"] != "GreaterThanOrEqualToThreshold" || render(p["EvaluationPeriods"]) != "1" || p["TreatMissingData"] != "notBreaching" {
				t.Errorf("%s alarm of %s: %v", name, backend, p)
			}
			actions := render(p["AlarmActions"]) + " " + render(p["OKActions"])
			if want.topic != (topicID != "" && actions == "[${Ref:"+topicID+"}] [${Ref:"+topicID+"}]") {
				t.Errorf("%s alarm of %s: actions %s (topic %q)", name, backend, actions, topicID)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want.backends) {
			t.Errorf("%s: breaker alarms on %v, want %v", name, got, want.backends)
		}
		var acc []string
		for b, a := range s.limiter.BreakerAlarms() {
			if a == nil {
				t.Errorf("%s: nil alarm for %s", name, b)
			}
			acc = append(acc, b)
		}
		slices.Sort(acc)
		if !slices.Equal(acc, want.backends) {
			t.Errorf("%s: BreakerAlarms() on %v, want %v", name, acc, want.backends)
		}
		if m := s.limiter.BreakerOpened("memcached"); *m.MetricName() != sluice.MetricBreakerOpened || *m.Namespace() != want.ns {
			t.Errorf("%s: BreakerOpened: %s %s", name, *m.Namespace(), *m.MetricName())
		}
	}
}

// TestBreakerMetricNamesMatchAuthorizer: the names the alarms watch are
// the ones the authorizer writes (functions/authz/metrics_breaker.go).
func TestBreakerMetricNamesMatchAuthorizer(t *testing.T) {
	src, err := os.ReadFile("../../functions/authz/metrics_breaker.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"Dimensions":[["` + sluice.DimensionBackend + `"]]`,
		`{"Name":"` + sluice.MetricBreakerOpened + `","Unit":"Count"}`,
		`{"Name":"` + sluice.MetricBreakerClosed + `","Unit":"Count"}`,
		`{"Name":"` + sluice.MetricBreakerOpen + `","Unit":"None"}`,
	} {
		if !strings.Contains(string(src), want) {
			t.Errorf("the authorizer's breaker metric line lacks %s", want)
		}
	}
}
