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
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/infra/sluice"
)

// TestSharesAlarms: with the keeper (a global rule on an eventual
// table) the construct alarms on the regional shares' SharesStale and
// SharesDropped, in the authorizer's namespace without dimensions (the
// sum over every limit), Sum per minute >= 1 by default, missing data
// not breaching, the topic of Alarms.Topic as alarm and OK action; set
// thresholds replace the defaults, a negative one drops its alarm, and
// SharesTickErrors and SharesRoleLost get one only when set. None
// without a global rule, on MRSC (no shares), with Alarms.Shares.Off or
// Alarms.Off.
func TestSharesAlarms(t *testing.T) {
	synth(t) // the shared app first: one jsii process, one synthesis at a time
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(filepath.Join(tmpRoot, "shares-alarms"))})
	eventual := sluice.Props{TableMode: sluice.TableEventual, TableRegions: []string{"eu-west-1", region}}
	with := func(p sluice.Props, f func(*sluice.Props)) sluice.Props { f(&p); return p }
	type build struct {
		name  string
		props sluice.Props
		rules string
		topic bool
		want  map[string]float64 // metric -> threshold
		ns    string
		stack awscdk.Stack
		r     *sluice.RateLimiter
	}
	builds := []*build{
		{name: "Default", props: eventual, rules: globalRule, topic: true,
			want: map[string]float64{config.MetricSharesStale: 1, config.MetricSharesDropped: 1}},
		{name: "Thresholds", props: with(eventual, func(p *sluice.Props) {
			p.Function.MetricsNamespace = "Pets"
			p.Alarms.Shares = sluice.SharesAlarms{Stale: 5, Dropped: -1, TickErrors: 30, RoleLost: 10}
		}), rules: globalRule, ns: "Pets",
			want: map[string]float64{config.MetricSharesStale: 5, config.MetricSharesTickErrors: 30, config.MetricSharesRoleLost: 10}},
		{name: "SharesOff", props: with(eventual, func(p *sluice.Props) { p.Alarms.Shares.Off = true }), rules: globalRule},
		{name: "AlarmsOff", props: with(eventual, func(p *sluice.Props) { p.Alarms.Off = true }), rules: globalRule},
		{name: "EventualRegional", props: eventual, rules: rulesYAML},
		{name: "MRSCGlobal", props: sluice.Props{TableMode: sluice.TableMRSC}, rules: globalRule},
	}
	for _, b := range builds { // the whole tree before the first synthesis
		b.stack = awscdk.NewStack(app, jsii.String("Shares"+b.name), &awscdk.StackProps{Env: env})
		p := b.props
		p.RestAPI, p.BootstrapDir, p.Rules, p.Cache = petsAPI(b.stack), bootDir, sluice.Rules{YAML: b.rules}, &sluice.Cache{Mode: sluice.CacheNone}
		if b.topic {
			p.Alarms.Topic = awssns.NewTopic(b.stack, jsii.String("Alarms"), nil)
		}
		b.r = sluice.New(b.stack, "RateLimit", &p)
		if b.ns == "" {
			b.ns = config.DefaultMetricsNamespace
		}
	}
	shares := []string{config.MetricSharesGiven, config.MetricSharesReceived, config.MetricSharesTicks, config.MetricSharesTickErrors,
		config.MetricSharesTakeovers, config.MetricSharesRoleLost, config.MetricSharesStale, config.MetricSharesStaleEntries,
		config.MetricSharesSweeps, config.MetricSharesExpired, config.MetricSharesWanted, config.MetricSharesListed, config.MetricSharesDropped}
	for _, b := range builds {
		if errs := b.r.Errors(); len(errs) != 0 {
			t.Errorf("%s: errors %q", b.name, errs)
			continue
		}
		tmpl := assertions.Template_FromStack(b.stack, nil)
		var topicID string
		for id := range *tmpl.FindResources(jsii.String("AWS::SNS::Topic"), nil) {
			topicID = id
		}
		got := map[string]float64{}
		for id, res := range *tmpl.FindResources(jsii.String("AWS::CloudWatch::Alarm"), nil) {
			p := (*res)["Properties"].(map[string]any)
			name, _ := p["MetricName"].(string)
			if !slices.Contains(shares, name) {
				continue
			}
			th, _ := p["Threshold"].(float64)
			got[name] = th
			if p["Namespace"] != b.ns || p["Statistic"] != "Sum" || render(p["Period"]) != "60" || p["Dimensions"] != nil ||
				p["ComparisonOperator"] != "GreaterThanOrEqualToThreshold" || render(p["EvaluationPeriods"]) != "1" ||
				render(p["DatapointsToAlarm"]) != "1" || p["TreatMissingData"] != "notBreaching" {
				t.Errorf("%s %s: %v, want Sum per minute in %s without dimensions, >= threshold, missing data not breaching", b.name, id, p, b.ns)
			}
			actions := render(p["AlarmActions"]) + " " + render(p["OKActions"])
			if b.topic != (topicID != "" && actions == "[${Ref:"+topicID+"}] [${Ref:"+topicID+"}]") {
				t.Errorf("%s %s: actions %s (topic %q)", b.name, id, actions, topicID)
			}
		}
		if !maps.Equal(got, b.want) {
			t.Errorf("%s: shares alarms %v, want %v", b.name, got, b.want)
		}
		acc := slices.Sorted(maps.Keys(b.r.SharesAlarms()))
		if want := slices.Sorted(maps.Keys(b.want)); !slices.Equal(acc, want) {
			t.Errorf("%s: SharesAlarms() on %v, want %v", b.name, acc, want)
		}
		for _, a := range b.r.SharesAlarms() {
			if a == nil {
				t.Errorf("%s: a nil alarm", b.name)
			}
		}
		if m := b.r.SharesMetric(config.MetricSharesStale); *m.MetricName() != config.MetricSharesStale || *m.Namespace() != b.ns || *m.Statistic() != "Sum" {
			t.Errorf("%s: SharesMetric: %s %s %s", b.name, *m.Namespace(), *m.MetricName(), *m.Statistic())
		}
	}
}

// TestSharesAlarmsDimensionless: the alarms watch the shares metrics
// without dimensions, which exist only if the authorizer's shares line
// declares the empty dimension set after [Limit]
// (functions/authz/metrics_shares.go; TestMetricsShares parses it).
func TestSharesAlarmsDimensionless(t *testing.T) {
	src, err := os.ReadFile("../../functions/authz/metrics_shares.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"b = appendJSONString(b, config.DimensionLimit)\n\tb = append(b, `],[]],\"Metrics\":[`...)",
		"config.MetricSharesStale", "config.MetricSharesDropped", "config.MetricSharesTickErrors", "config.MetricSharesRoleLost",
	} {
		if !strings.Contains(string(src), want) {
			t.Errorf("the authorizer's shares metric line lacks %s", want)
		}
	}
}
