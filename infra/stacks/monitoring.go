package stacks

import (
	"fmt"
	"maps"
	"slices"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/infra/sluice"
)

// newMonitoring adds the region's alarms and dashboard, built on the
// metrics the construct exposes (the authorizer's EMF metrics, which land
// in the region the function runs in): what a user does with them in their
// own dashboards.
func newMonitoring(s awscdk.Stack, c *Config, region string, limiter *sluice.RateLimiter) {
	m := limiter.Metrics()
	fn := limiter.Function()
	alarms := newAlarms(s, c, region, limiter)
	graph := func(title string, left ...awscloudwatch.IMetric) awscloudwatch.IWidget {
		return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{
			Title: jsii.String(title), Left: &left, Width: jsii.Number(12), Height: jsii.Number(6),
		})
	}
	dash := awscloudwatch.NewDashboard(s, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		DashboardName: jsii.String(c.StackPrefix + "-" + region),
	})
	p50 := m.BackendLatency.With(&awscloudwatch.MetricOptions{Statistic: jsii.String("p50")})
	dash.AddWidgets(
		graph("Decisions", m.Allowed, m.Denied, m.Shed),
		graph("Denied ratio", m.DeniedRatio),
	)
	dash.AddWidgets(
		graph("Backend failures", m.FailOpen, m.FailClosed, m.BackendErrors, m.ShedErrors),
		graph("Backend latency (ms)", p50, m.BackendLatency),
	)
	dash.AddWidgets(
		graph("Denied by rule", m.ByRule(sluice.MetricDenied)),
		graph("Allowed by rule", m.ByRule(sluice.MetricAllowed)),
	)
	dash.AddWidgets(
		graph("Shed by rule (503)", m.ByRule(sluice.MetricShed)),
		graph("Load shedder failures (fail open)", m.ShedErrors),
	)
	dash.AddWidgets(
		graph("State table throttled requests (this region)", limiter.TableThrottledRequests()),
		graph("Throttled by rule (decided without the store)", m.ByRule(sluice.MetricThrottled)),
	)
	dash.AddWidgets(
		graph("Concurrency acquires cut short, and their clean-up releases: sent, failed, skipped",
			m.ConcurrencyUnknown, m.ConcurrencyCleanups, m.ConcurrencyCleanupErrors, m.ConcurrencyCleanupsSkipped),
		graph("Concurrency acquires cut short by rule", m.ByRule(sluice.MetricConcurrencyUnknown)),
	)
	if len(limiter.SharesAlarms()) > 0 {
		// The construct runs the keeper: it makes the shares' alarms
		// exactly then (unless asked not to, which this app never does).
		dash.AddWidgets(sharesGraphs(limiter, graph)...)
	}
	dash.AddWidgets(
		graph("Authorizer duration (ms)", fn.MetricDuration(&awscloudwatch.MetricOptions{Statistic: jsii.String("p99")})),
		graph("Authorizer errors and throttles", fn.MetricErrors(nil), fn.MetricThrottles(nil)),
	)
	widgets := []awscloudwatch.IWidget{}
	for _, a := range alarms {
		widgets = append(widgets, awscloudwatch.NewAlarmWidget(&awscloudwatch.AlarmWidgetProps{
			Alarm: a, Title: a.Node().Id(), Width: jsii.Number(8), Height: jsii.Number(6),
		}))
	}
	dash.AddWidgets(widgets...)
}

// sharesGraphs are the regional shares' graphs (a global rule on an
// eventual table): their troubles, and the units they moved, each summed
// over every limit (the construct's SharesMetric; per limit with the
// dimension Limit).
func sharesGraphs(limiter *sluice.RateLimiter, graph func(string, ...awscloudwatch.IMetric) awscloudwatch.IWidget) []awscloudwatch.IWidget {
	metrics := func(names ...string) []awscloudwatch.IMetric {
		var out []awscloudwatch.IMetric
		for _, n := range names {
			out = append(out, limiter.SharesMetric(n))
		}
		return out
	}
	return []awscloudwatch.IWidget{
		graph("Regional shares: stale decisions, dropped keys, tick errors, roles lost",
			metrics(config.MetricSharesStale, config.MetricSharesDropped, config.MetricSharesTickErrors, config.MetricSharesRoleLost)...),
		graph("Regional shares: units given to and received from other regions",
			metrics(config.MetricSharesGiven, config.MetricSharesReceived)...),
	}
}

// newAlarms adds the region's alarms (its own and the construct's), with
// the region's alarm topic as their action when it has one.
func newAlarms(s awscdk.Stack, c *Config, region string, limiter *sluice.RateLimiter) []awscloudwatch.Alarm {
	m := limiter.Metrics()
	alarms := []awscloudwatch.Alarm{
		awscloudwatch.NewAlarm(s, jsii.String("DeniedRateAlarm"), &awscloudwatch.AlarmProps{
			AlarmDescription:   jsii.String(fmt.Sprintf("Sluice (%s): more than %g of decisions denied for 5 minutes", region, c.Alarms.DeniedRatio)),
			Metric:             m.DeniedRatio,
			Threshold:          jsii.Number(c.Alarms.DeniedRatio),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
			EvaluationPeriods:  jsii.Number(5),
			TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
		}),
		awscloudwatch.NewAlarm(s, jsii.String("FailOpenAlarm"), &awscloudwatch.AlarmProps{
			AlarmDescription:   jsii.String(fmt.Sprintf("Sluice (%s): a backend failed and a rule failed open (requests admitted without a limit)", region)),
			Metric:             m.FailOpen,
			Threshold:          jsii.Number(0),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
			EvaluationPeriods:  jsii.Number(1),
			TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
		}),
		awscloudwatch.NewAlarm(s, jsii.String("BackendLatencyAlarm"), &awscloudwatch.AlarmProps{
			AlarmDescription:   jsii.String(fmt.Sprintf("Sluice (%s): backend latency p99 above %g ms in 3 of 5 minutes", region, c.Alarms.BackendLatencyP99Ms)),
			Metric:             m.BackendLatency,
			Threshold:          jsii.Number(c.Alarms.BackendLatencyP99Ms),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
			EvaluationPeriods:  jsii.Number(5),
			DatapointsToAlarm:  jsii.Number(3),
			TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
		}),
	}
	// The construct's alarms on the circuit breakers (one per backend),
	// on throttling (the state table's replica in this region, and the
	// authorizer's decisions) and, with global rules on an eventual
	// table, on the regional shares, in a fixed order: the dashboard
	// lists them, and a template that changes on every synth redeploys it.
	for _, m := range []map[string]awscloudwatch.Alarm{limiter.BreakerAlarms(), limiter.ThrottleAlarms(), limiter.SharesAlarms()} {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			alarms = append(alarms, m[k])
		}
	}
	if arn, ok := c.Alarms.TopicArns[region]; ok {
		topic := awssns.Topic_FromTopicArn(s, jsii.String("AlarmTopic"), jsii.String(arn))
		for _, a := range alarms {
			a.AddAlarmAction(awscloudwatchactions.NewSnsAction(topic))
		}
	}
	return alarms
}
