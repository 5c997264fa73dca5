package sluice_test

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

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

// TestThrottleAlarms: two alarms on throttling, each at one or more a
// minute, missing data not breaching, the topic of Alarms.Topic as alarm
// and OK action: DynamoDB's ThrottledRequests of the state table (the
// created one, or the user's) for GetItem and UpdateItem, and the
// authorizer's Throttled in its namespace, without dimensions.
func TestThrottleAlarms(t *testing.T) {
	stacks := synth(t)
	for name, want := range map[string]struct {
		ns    string
		table string // rendered TableName
		topic bool
	}{
		"RestUser":     {config.DefaultMetricsNamespace, "${Ref:" + tableID(t, stacks["RestUser"], "RateLimit") + "}", false},
		"HttpUser":     {config.DefaultMetricsNamespace, "${Ref:" + tableID(t, stacks["HttpUser"], "MyState") + "}", false},
		"RestExplicit": {"Pets", "${Ref:" + tableID(t, stacks["RestExplicit"], "RateLimit") + "}", true},
	} {
		s := stacks[name]
		var topicID string
		for id := range s.ofType("AWS::SNS::Topic") {
			topicID = id
		}
		var table, authorizer int
		for id, a := range s.ofType("AWS::CloudWatch::Alarm") {
			p := a.Properties
			if p["MetricName"] == sluice.MetricBreakerOpened {
				continue
			}
			if render(p["Threshold"]) != "1" || p["ComparisonOperator"] != "GreaterThanOrEqualToThreshold" ||
				render(p["EvaluationPeriods"]) != "1" || render(p["DatapointsToAlarm"]) != "1" || p["TreatMissingData"] != "notBreaching" {
				t.Errorf("%s %s: %v, want >= 1 in one minute, missing data not breaching", name, id, p)
			}
			actions := render(p["AlarmActions"]) + " " + render(p["OKActions"])
			if want.topic != (topicID != "" && actions == "[${Ref:"+topicID+"}] [${Ref:"+topicID+"}]") {
				t.Errorf("%s %s: actions %s (topic %q)", name, id, actions, topicID)
			}
			switch {
			case p["MetricName"] == sluice.MetricThrottled:
				authorizer++
				if p["Namespace"] != want.ns || p["Statistic"] != "Sum" || render(p["Period"]) != "60" || p["Dimensions"] != nil {
					t.Errorf("%s Throttled alarm: %v, want Sum per minute in %s without dimensions", name, p, want.ns)
				}
			case p["Metrics"] != nil:
				table++
				checkTableThrottled(t, name, p["Metrics"], want.table)
			default:
				t.Errorf("%s: unexpected alarm %s: %v", name, id, p)
			}
		}
		if table != 1 || authorizer != 1 {
			t.Errorf("%s: %d table and %d authorizer throttle alarms, want 1 and 1", name, table, authorizer)
		}
		got := slices.Sorted(maps.Keys(s.limiter.ThrottleAlarms()))
		if !slices.Equal(got, []string{sluice.MetricThrottled, sluice.MetricTableThrottledRequests}) {
			t.Errorf("%s: ThrottleAlarms() on %v", name, got)
		}
	}
}

// checkTableThrottled checks an alarm's metric math: the sum, gaps filled
// with 0, of ThrottledRequests of table for each action of
// StateTableActions, per minute.
func checkTableThrottled(t *testing.T, name string, metrics any, table string) {
	t.Helper()
	var expr string
	ops := map[string]string{} // id -> Operation
	for _, m := range asList(metrics) {
		mm := m.(map[string]any)
		if e, ok := mm["Expression"].(string); ok {
			expr = e
			if mm["ReturnData"] != nil && mm["ReturnData"] != true {
				t.Errorf("%s: the expression does not return data: %v", name, mm)
			}
			continue
		}
		stat := mm["MetricStat"].(map[string]any)
		metric := stat["Metric"].(map[string]any)
		if metric["Namespace"] != "AWS/DynamoDB" || metric["MetricName"] != sluice.MetricTableThrottledRequests ||
			stat["Stat"] != "Sum" || render(stat["Period"]) != "60" || mm["ReturnData"] != false {
			t.Errorf("%s: table metric %v, want AWS/DynamoDB ThrottledRequests Sum per minute", name, mm)
		}
		dims := map[string]string{}
		for _, d := range asList(metric["Dimensions"]) {
			dm := d.(map[string]any)
			dims[render(dm["Name"])] = render(dm["Value"])
		}
		if len(dims) != 2 || dims["TableName"] != table {
			t.Errorf("%s: dimensions %v, want TableName %s and Operation", name, dims, table)
		}
		ops[render(mm["Id"])] = dims["Operation"]
	}
	var terms, wantOps, gotOps []string
	for _, a := range sluice.StateTableActions {
		op := strings.TrimPrefix(a, "dynamodb:")
		wantOps = append(wantOps, op)
		terms = append(terms, "FILL("+strings.ToLower(op)+", 0)")
	}
	for id, op := range ops {
		gotOps = append(gotOps, op)
		if id != strings.ToLower(op) {
			t.Errorf("%s: metric id %s for Operation %s", name, id, op)
		}
	}
	slices.Sort(gotOps)
	slices.Sort(wantOps)
	if !slices.Equal(gotOps, wantOps) || expr != strings.Join(terms, " + ") {
		t.Errorf("%s: %q over %v, want %q over %v", name, expr, gotOps, strings.Join(terms, " + "), wantOps)
	}
}

// tableID is the logical id of the one GlobalTable whose id starts with
// prefix.
func tableID(t *testing.T, s *stack, prefix string) string {
	t.Helper()
	var ids []string
	for id := range s.ofType("AWS::DynamoDB::GlobalTable") {
		if strings.HasPrefix(id, prefix) {
			ids = append(ids, id)
		}
	}
	if len(ids) != 1 {
		t.Fatalf("tables %v with prefix %s, want one", ids, prefix)
	}
	return ids[0]
}

// TestAlarmsOff: Alarms.Off makes no alarm at all; the breakers off
// leave the throttle alarms.
func TestAlarmsOff(t *testing.T) {
	synth(t) // the shared app first: one jsii process, one synthesis at a time
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(filepath.Join(tmpRoot, "alarms-off"))})
	type build struct {
		name    string
		props   sluice.Props
		alarms  int
		breaker int
		stack   awscdk.Stack
		limiter *sluice.RateLimiter
	}
	builds := []*build{
		{name: "Off", props: sluice.Props{Alarms: sluice.Alarms{Off: true}}},
		{name: "NoBreakers", props: sluice.Props{Function: sluice.Function{BreakerFailures: -1}}, alarms: 2},
	}
	for _, b := range builds { // the whole tree before the first synthesis
		b.stack = awscdk.NewStack(app, jsii.String(b.name), &awscdk.StackProps{Env: env})
		p := b.props
		p.RestAPI, p.BootstrapDir, p.Rules, p.Cache = petsAPI(b.stack), bootDir, sluice.Rules{YAML: rulesYAML}, &sluice.Cache{Mode: sluice.CacheNone}
		b.limiter = sluice.New(b.stack, "RateLimit", &p)
	}
	for _, b := range builds {
		assertMatches(t, func() {
			assertions.Template_FromStack(b.stack, nil).ResourceCountIs(jsii.String("AWS::CloudWatch::Alarm"), jsii.Number(float64(b.alarms)))
		})
		if n := len(b.limiter.BreakerAlarms()) + len(b.limiter.ThrottleAlarms()); n != b.alarms || len(b.limiter.BreakerAlarms()) != b.breaker {
			t.Errorf("%s: %d breaker and %d throttle alarms", b.name, len(b.limiter.BreakerAlarms()), len(b.limiter.ThrottleAlarms()))
		}
	}
}
