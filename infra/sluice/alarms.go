package sluice

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/config"
)

// The circuit breakers' metric lines (functions/authz, metrics_breaker.go):
// dimension set [Backend], one line per transition of a breaker. A
// memcached node's breaker writes under Backend "memcached" with the node
// in the line's property "Node".
const (
	MetricBreakerOpened = "BreakerOpened" // Count: 1 when a breaker opened or a probe failed
	MetricBreakerClosed = "BreakerClosed" // Count: 1 when a probe closed it
	MetricBreakerOpen   = "BreakerOpen"   // None: the state entered, 1 open, 0.5 half-open, 0 closed
	DimensionBackend    = "Backend"
)

// Alarms configures the construct's CloudWatch alarms.
type Alarms struct {
	// Off creates no alarms.
	Off bool
	// Topic, when set, is notified when an alarm fires and when it
	// clears (alarm and OK actions).
	Topic awssns.ITopic
}

// buildAlarms adds one alarm per network backend the authorizer uses
// (memcached with a cache, DynamoDB always), unless the breakers or the
// alarms are off: BreakerOpened summed over one minute at least 1, that
// is some breaker of the backend opened, or stayed open through a failed
// probe, in that minute. Missing data (no transition) is not breaching,
// so the alarm clears in the first minute without one.
func (r *RateLimiter) buildAlarms() {
	p := &r.props
	if p.Alarms.Off || p.Function.BreakerFailures < 0 {
		return
	}
	r.alarms = map[string]awscloudwatch.Alarm{}
	backends := []string{config.BackendDynamo}
	if r.cache != nil {
		backends = append(backends, config.BackendMemcached)
	}
	for _, backend := range backends {
		a := awscloudwatch.NewAlarm(r, jsii.String("BreakerOpened-"+backend), &awscloudwatch.AlarmProps{
			AlarmDescription: jsii.String("Sluice: a circuit breaker of the " + backend + " backend opened: decisions on its keys follow each rule's fail mode " +
				"without reaching the store (" + p.Function.MetricsNamespace + " " + MetricBreakerOpened + "; memcached lines name the node in the property Node)"),
			Metric:             r.BreakerOpened(backend),
			Threshold:          jsii.Number(1),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
			EvaluationPeriods:  jsii.Number(1),
			DatapointsToAlarm:  jsii.Number(1),
			TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
		})
		if p.Alarms.Topic != nil {
			action := awscloudwatchactions.NewSnsAction(p.Alarms.Topic)
			a.AddAlarmAction(action)
			a.AddOkAction(action)
		}
		r.alarms[backend] = a
	}
}

// BreakerOpened is the metric of backend's breaker openings ("memcached"
// or "dynamo"), summed per minute.
func (r *RateLimiter) BreakerOpened(backend string) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:     jsii.String(r.props.Function.MetricsNamespace),
		MetricName:    jsii.String(MetricBreakerOpened),
		DimensionsMap: &map[string]*string{DimensionBackend: jsii.String(backend)},
		Statistic:     jsii.String("Sum"),
		Period:        awscdk.Duration_Minutes(jsii.Number(1)),
	})
}

// BreakerAlarms are the circuit-breaker alarms by backend ("memcached",
// "dynamo"); empty when Alarms.Off or the breakers are off
// (Function.BreakerFailures negative).
func (r *RateLimiter) BreakerAlarms() map[string]awscloudwatch.Alarm { return r.alarms }
