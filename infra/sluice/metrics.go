package sluice

import (
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/jsii-runtime-go"
)

// Metric names of the authorizer's Embedded Metric Format lines, with the
// dimension sets [Rule] and [] (docs/authorizer.md).
const (
	MetricAllowed        = "Allowed"
	MetricDenied         = "Denied"
	MetricShed           = "Shed"
	MetricFailOpen       = "FailOpen"
	MetricFailClosed     = "FailClosed"
	MetricBackendErrors  = "BackendErrors"
	MetricShedErrors     = "ShedErrors"     // the load shedders' store or signal failed (fail open)
	MetricThrottled      = "Throttled"      // denied because the store throttled the request's key
	MetricBackendLatency = "BackendLatency" // Milliseconds
	DimensionRule        = "Rule"
	// A rule's concurrency acquires whose outcome was unknown (the
	// deadline, a timeout, no answer), and the background releases of
	// their lease IDs: sent, failed, and skipped (64 running already);
	// docs/shedding.md, "Acquires cut short".
	MetricConcurrencyUnknown         = "ConcurrencyUnknown"
	MetricConcurrencyCleanups        = "ConcurrencyCleanups"
	MetricConcurrencyCleanupErrors   = "ConcurrencyCleanupErrors"
	MetricConcurrencyCleanupsSkipped = "ConcurrencyCleanupsSkipped"
)

// Metrics are the authorizer's metrics, dimensionless (every rule), summed
// per minute; BackendLatency is its p99 per minute. Use them in your own
// alarms and dashboards; [Metrics.ByRule] graphs one per rule.
type Metrics struct {
	Namespace      string
	Allowed        awscloudwatch.Metric
	Denied         awscloudwatch.Metric
	Shed           awscloudwatch.Metric
	FailOpen       awscloudwatch.Metric
	FailClosed     awscloudwatch.Metric
	BackendErrors  awscloudwatch.Metric
	ShedErrors     awscloudwatch.Metric
	Throttled      awscloudwatch.Metric
	BackendLatency awscloudwatch.Metric
	// The rules' concurrency acquires cut short and their clean-up
	// releases (MetricConcurrency*).
	ConcurrencyUnknown, ConcurrencyCleanups, ConcurrencyCleanupErrors, ConcurrencyCleanupsSkipped awscloudwatch.Metric
	// DeniedRatio is Denied / (Allowed + Denied), 0 without traffic.
	DeniedRatio awscloudwatch.MathExpression
}

func newMetrics(ns string) *Metrics {
	minute := awscdk.Duration_Minutes(jsii.Number(1))
	metric := func(name, stat string) awscloudwatch.Metric {
		return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
			Namespace:  jsii.String(ns),
			MetricName: jsii.String(name),
			Statistic:  jsii.String(stat),
			Period:     minute,
		})
	}
	m := &Metrics{
		Namespace:      ns,
		Allowed:        metric(MetricAllowed, "Sum"),
		Denied:         metric(MetricDenied, "Sum"),
		Shed:           metric(MetricShed, "Sum"),
		FailOpen:       metric(MetricFailOpen, "Sum"),
		FailClosed:     metric(MetricFailClosed, "Sum"),
		BackendErrors:  metric(MetricBackendErrors, "Sum"),
		ShedErrors:     metric(MetricShedErrors, "Sum"),
		Throttled:      metric(MetricThrottled, "Sum"),
		BackendLatency: metric(MetricBackendLatency, "p99"),

		ConcurrencyUnknown:         metric(MetricConcurrencyUnknown, "Sum"),
		ConcurrencyCleanups:        metric(MetricConcurrencyCleanups, "Sum"),
		ConcurrencyCleanupErrors:   metric(MetricConcurrencyCleanupErrors, "Sum"),
		ConcurrencyCleanupsSkipped: metric(MetricConcurrencyCleanupsSkipped, "Sum"),
	}
	m.DeniedRatio = awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression:   jsii.String("IF(allowed + denied > 0, denied / (allowed + denied), 0)"),
		UsingMetrics: &map[string]awscloudwatch.IMetric{"allowed": m.Allowed, "denied": m.Denied},
		Label:        jsii.String("Denied ratio"),
		Period:       minute,
	})
	return m
}

// ByRule is one series per rule of the metric name (a SEARCH over the Rule
// dimension), summed per minute.
func (m *Metrics) ByRule(name string) awscloudwatch.IMetric {
	return awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String(fmt.Sprintf(`SEARCH('{%s,%s} MetricName="%s"', 'Sum', 60)`, m.Namespace, DimensionRule, name)),
		Label:      jsii.String(""),
		Period:     awscdk.Duration_Minutes(jsii.Number(1)),
	})
}
