package stacks

import (
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/jsii-runtime-go"
)

// EMF metric names emitted by the authorizer, with the dimension sets [Rule]
// and [] (the alarms use the dimensionless aggregate).
const (
	MetricAllowed        = "Allowed"
	MetricDenied         = "Denied"
	MetricShed           = "Shed"
	MetricFailOpen       = "FailOpen"
	MetricFailClosed     = "FailClosed"
	MetricBackendErrors  = "BackendErrors"
	MetricShedErrors     = "ShedErrors"     // the load shedders' store or signal failed (fail open)
	MetricBackendLatency = "BackendLatency" // Milliseconds
	DimensionRule        = "Rule"
)

// newMonitoring adds the region's alarms and dashboard, built on the
// authorizer's EMF metrics (which land in the region the function runs in).
func newMonitoring(s awscdk.Stack, c *Config, region string, fn awslambda.Function) {
	ns := c.Authorizer.MetricsNamespace
	minute := awscdk.Duration_Minutes(jsii.Number(1))
	metric := func(name, stat string) awscloudwatch.Metric {
		return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
			Namespace:  jsii.String(ns),
			MetricName: jsii.String(name),
			Statistic:  jsii.String(stat),
			Period:     minute,
		})
	}
	allowed, denied := metric(MetricAllowed, "Sum"), metric(MetricDenied, "Sum")
	deniedRatio := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression:   jsii.String("IF(allowed + denied > 0, denied / (allowed + denied), 0)"),
		UsingMetrics: &map[string]awscloudwatch.IMetric{"allowed": allowed, "denied": denied},
		Label:        jsii.String("Denied ratio"),
		Period:       minute,
	})
	latencyP99 := metric(MetricBackendLatency, "p99")

	alarms := []awscloudwatch.Alarm{
		awscloudwatch.NewAlarm(s, jsii.String("DeniedRateAlarm"), &awscloudwatch.AlarmProps{
			AlarmDescription:   jsii.String(fmt.Sprintf("Sluice (%s): more than %g of decisions denied for 5 minutes", region, c.Alarms.DeniedRatio)),
			Metric:             deniedRatio,
			Threshold:          jsii.Number(c.Alarms.DeniedRatio),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
			EvaluationPeriods:  jsii.Number(5),
			TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
		}),
		awscloudwatch.NewAlarm(s, jsii.String("FailOpenAlarm"), &awscloudwatch.AlarmProps{
			AlarmDescription:   jsii.String(fmt.Sprintf("Sluice (%s): a backend failed and a rule failed open (requests admitted without a limit)", region)),
			Metric:             metric(MetricFailOpen, "Sum"),
			Threshold:          jsii.Number(0),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
			EvaluationPeriods:  jsii.Number(1),
			TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
		}),
		awscloudwatch.NewAlarm(s, jsii.String("BackendLatencyAlarm"), &awscloudwatch.AlarmProps{
			AlarmDescription:   jsii.String(fmt.Sprintf("Sluice (%s): backend latency p99 above %g ms in 3 of 5 minutes", region, c.Alarms.BackendLatencyP99Ms)),
			Metric:             latencyP99,
			Threshold:          jsii.Number(c.Alarms.BackendLatencyP99Ms),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
			EvaluationPeriods:  jsii.Number(5),
			DatapointsToAlarm:  jsii.Number(3),
			TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
		}),
	}
	if arn, ok := c.Alarms.TopicArns[region]; ok {
		topic := awssns.Topic_FromTopicArn(s, jsii.String("AlarmTopic"), jsii.String(arn))
		for _, a := range alarms {
			a.AddAlarmAction(awscloudwatchactions.NewSnsAction(topic))
		}
	}

	perRule := func(name string) awscloudwatch.IMetric {
		return awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
			Expression: jsii.String(fmt.Sprintf(`SEARCH('{%s,%s} MetricName="%s"', 'Sum', 60)`, ns, DimensionRule, name)),
			Label:      jsii.String(""),
			Period:     minute,
		})
	}
	graph := func(title string, left ...awscloudwatch.IMetric) awscloudwatch.IWidget {
		return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{
			Title: jsii.String(title), Left: &left, Width: jsii.Number(12), Height: jsii.Number(6),
		})
	}
	dash := awscloudwatch.NewDashboard(s, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		DashboardName: jsii.String(c.StackPrefix + "-" + region),
	})
	dash.AddWidgets(
		graph("Decisions", allowed, denied, metric(MetricShed, "Sum")),
		graph("Denied ratio", deniedRatio),
	)
	dash.AddWidgets(
		graph("Backend failures", metric(MetricFailOpen, "Sum"), metric(MetricFailClosed, "Sum"), metric(MetricBackendErrors, "Sum"), metric(MetricShedErrors, "Sum")),
		graph("Backend latency (ms)", metric(MetricBackendLatency, "p50"), latencyP99),
	)
	dash.AddWidgets(
		graph("Denied by rule", perRule(MetricDenied)),
		graph("Allowed by rule", perRule(MetricAllowed)),
	)
	dash.AddWidgets(
		graph("Shed by rule (503)", perRule(MetricShed)),
		graph("Load shedder failures (fail open)", metric(MetricShedErrors, "Sum")),
	)
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
