package stacks

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/infra/sluice"
	"github.com/sluicehq/sluice/policy"
)

// keepsShares names the apps whose rules, read at synth, hold a rule of
// scope global on an eventual table: the construct runs the keeper there,
// and alarms on the regional shares.
var keepsShares = map[string]bool{"global": true}

// sharesThresholds are the shares' alarms the construct makes with the
// app's (default) thresholds, by metric: SharesStale and SharesDropped
// at sluice.DefaultSharesAlarm; SharesTickErrors and SharesRoleLost only
// when set, which the app does not.
var sharesThresholds = map[string]float64{
	config.MetricSharesStale:   sluice.DefaultSharesAlarm,
	config.MetricSharesDropped: sluice.DefaultSharesAlarm,
}

// TestSharesApps: the apps are what their names say, so that the absence
// of the shares' alarms in TestSharesAlarms has its cause: "global" and
// "global-mrsc" pass the same rules, with a rule of scope global, on
// eventual and MRSC tables; "regional" has no global rule on an eventual
// table; "mrsc" reads its rules from a table (unknown at synth).
func TestSharesApps(t *testing.T) {
	eachStack(t, func(t *testing.T, a *synthApp, s *synthStack) {
		env := functionEnv(t, s)
		global := false
		if doc := env[config.EnvRulesYAML]; doc != "" {
			rules, err := policy.Parse([]byte(doc))
			if err != nil {
				t.Fatalf("%s: %v", config.EnvRulesYAML, err)
			}
			for _, r := range rules {
				global = global || r.Scope == policy.ScopeGlobal
			}
		}
		want := map[string]struct {
			mode   string
			global bool
		}{
			"regional":    {sluice.TableEventual, false},
			"mrsc":        {sluice.TableMRSC, false},
			"global":      {sluice.TableEventual, true},
			"global-mrsc": {sluice.TableMRSC, true},
		}[a.name]
		if env[config.EnvTableMode] != want.mode || global != want.global {
			t.Errorf("%s %q, a global rule in %s: %v; want %q, %v", config.EnvTableMode, env[config.EnvTableMode], config.EnvRulesYAML, global, want.mode, want.global)
		}
		if a.name == "mrsc" && env[config.EnvRulesTable] == "" {
			t.Errorf("the mrsc app's rules are not from a table")
		}
	})
}

// TestSharesAlarms: where the construct runs the keeper (the "global"
// app, in every region) the region's stack has the construct's alarms on
// the regional shares, SharesStale and SharesDropped: each on the
// metric's Sum over a minute in the authorizer's namespace, without
// dimensions (every limit), >= 1 in one minute, missing data not
// breaching, with the region's alarm topic as action (monitoring.go lists
// limiter.SharesAlarms()); the dashboard graphs the shares' metrics and
// shows the alarms. Elsewhere (no global rule, MRSC, rules from a table)
// there is no keeper, no shares alarm and no shares graph.
func TestSharesAlarms(t *testing.T) {
	eachStack(t, func(t *testing.T, a *synthApp, s *synthStack) {
		keeper := keeperRules(s)
		alarms := map[string]string{} // metric -> logical id
		for id, al := range s.ofType("AWS::CloudWatch::Alarm") {
			if name := render(al.Properties["MetricName"]); strings.HasPrefix(name, "Shares") {
				if prev, dup := alarms[name]; dup {
					t.Errorf("two alarms on %s: %s and %s", name, prev, id)
				}
				alarms[name] = id
			}
		}
		_, dash := s.one(t, "AWS::CloudWatch::Dashboard")
		body := render(dash.Properties["DashboardBody"])

		if !keepsShares[a.name] {
			if len(keeper) != 0 || len(alarms) != 0 || strings.Contains(body, "Shares") {
				t.Errorf("keeper schedules %v, shares alarms %v, shares on the dashboard: %v; want none", keeper, alarms, strings.Contains(body, "Shares"))
			}
			return
		}
		if len(keeper) != 1 {
			t.Errorf("keeper schedules %v, want one", keeper)
		}
		if got := slices.Sorted(maps.Keys(alarms)); !slices.Equal(got, slices.Sorted(maps.Keys(sharesThresholds))) {
			t.Errorf("shares alarms on %v, want %v", got, slices.Sorted(maps.Keys(sharesThresholds)))
		}
		topic := a.cfg.Alarms.TopicArns[s.region]
		if !strings.HasPrefix(topic, "arn:aws:sns:"+s.region+":") {
			t.Fatalf("the app has no alarm topic of its own in %s (%q)", s.region, topic)
		}
		for metric, id := range alarms {
			p := s.res[id].Properties
			want := map[string]any{
				"Namespace":          a.cfg.Authorizer.MetricsNamespace,
				"Statistic":          "Sum",
				"Period":             float64(60),
				"Threshold":          sharesThresholds[metric],
				"ComparisonOperator": "GreaterThanOrEqualToThreshold",
				"EvaluationPeriods":  float64(1),
				"DatapointsToAlarm":  float64(1),
				"TreatMissingData":   "notBreaching",
			}
			for k, v := range want {
				if p[k] != v {
					t.Errorf("%s alarm: %s = %v, want %v", metric, k, p[k], v)
				}
			}
			if p["Dimensions"] != nil || p["ExtendedStatistic"] != nil || p["Metrics"] != nil {
				t.Errorf("%s alarm: dimensions %v, extended statistic %v, metrics %v; want the sum over every limit", metric, p["Dimensions"], p["ExtendedStatistic"], p["Metrics"])
			}
			if got := sortedStrings(asList(p["AlarmActions"])); !slices.Equal(got, []string{topic}) {
				t.Errorf("%s alarm: actions %v, want this region's topic [%s]", metric, got, topic)
			}
			if !strings.Contains(body, "${"+id+".Arn}") {
				t.Errorf("%s alarm %s is not on the dashboard", metric, id)
			}
		}
		for _, m := range []string{config.MetricSharesStale, config.MetricSharesDropped, config.MetricSharesTickErrors,
			config.MetricSharesRoleLost, config.MetricSharesGiven, config.MetricSharesReceived} {
			if !strings.Contains(body, `"`+a.cfg.Authorizer.MetricsNamespace+`","`+m+`"`) {
				t.Errorf("the dashboard does not graph %s in %s", m, a.cfg.Authorizer.MetricsNamespace)
			}
		}
	})
}

// keeperRules are the logical ids of the EventBridge rules that invoke
// the authorizer every minute: the construct's keeper.
func keeperRules(s *synthStack) []string {
	var out []string
	for id, r := range s.ofType("AWS::Events::Rule") {
		for _, tg := range asList(r.Properties["Targets"]) {
			if refID(tg.(map[string]any)["Arn"]) == AuthorizerLogicalID && r.Properties["ScheduleExpression"] == "rate(1 minute)" {
				out = append(out, id)
			}
		}
	}
	slices.Sort(out)
	return out
}

// functionEnv is the authorizer's environment, rendered.
func functionEnv(t *testing.T, s *synthStack) map[string]string {
	t.Helper()
	fn, ok := s.res[AuthorizerLogicalID]
	if !ok {
		t.Fatalf("no function %s", AuthorizerLogicalID)
	}
	env := map[string]string{}
	if e, ok := fn.Properties["Environment"].(map[string]any); ok {
		for k, v := range e["Variables"].(map[string]any) {
			env[k] = render(v)
		}
	}
	return env
}
