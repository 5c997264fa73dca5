package sluice

import (
	"strings"

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

// Alarms configures the construct's CloudWatch alarms: one per network
// backend's circuit breakers ([RateLimiter.BreakerAlarms]) and two on
// throttling ([RateLimiter.ThrottleAlarms]).
type Alarms struct {
	// Off creates no alarms.
	Off bool
	// Topic, when set, is notified when an alarm fires and when it
	// clears (alarm and OK actions).
	Topic awssns.ITopic
}

// buildAlarms adds the construct's alarms, unless Alarms.Off: the
// circuit breakers' (one per network backend, unless the breakers are
// off) and the throttles' (the state table's and the authorizer's).
func (r *RateLimiter) buildAlarms() {
	if r.props.Alarms.Off {
		return
	}
	r.buildBreakerAlarms()
	r.buildThrottleAlarms()
}

// alarm adds one alarm: threshold or more in a minute, missing data not
// breaching (so it clears in the first minute without any), the topic as
// alarm and OK action.
func (r *RateLimiter) alarm(id, description string, metric awscloudwatch.IMetric, threshold float64) awscloudwatch.Alarm {
	a := awscloudwatch.NewAlarm(r, jsii.String(id), &awscloudwatch.AlarmProps{
		AlarmDescription:   jsii.String(description),
		Metric:             metric,
		Threshold:          jsii.Number(threshold),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		DatapointsToAlarm:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	if t := r.props.Alarms.Topic; t != nil {
		action := awscloudwatchactions.NewSnsAction(t)
		a.AddAlarmAction(action)
		a.AddOkAction(action)
	}
	return a
}

// buildBreakerAlarms adds one alarm per network backend the authorizer
// uses (memcached with a cache, DynamoDB always), unless the breakers
// are off: BreakerOpened summed over one minute at least 1, that is some
// breaker of the backend opened, or stayed open through a failed probe,
// in that minute.
func (r *RateLimiter) buildBreakerAlarms() {
	p := &r.props
	if p.Function.BreakerFailures < 0 {
		return
	}
	r.alarms = map[string]awscloudwatch.Alarm{}
	backends := []string{config.BackendDynamo}
	if r.cache != nil {
		backends = append(backends, config.BackendMemcached)
	}
	for _, backend := range backends {
		r.alarms[backend] = r.alarm("BreakerOpened-"+backend,
			"Sluice: a circuit breaker of the "+backend+" backend opened: decisions on its keys follow each rule's fail mode "+
				"without reaching the store ("+p.Function.MetricsNamespace+" "+MetricBreakerOpened+"; memcached lines name the node in the property Node)",
			r.BreakerOpened(backend), 1)
	}
}

// buildThrottleAlarms adds the throttle alarms, each at one or more in a
// minute: the state table's throttled requests (TableThrottledRequests,
// in the stack's region: on a global table, that region's replica) and
// the authorizer's Throttled decisions.
func (r *RateLimiter) buildThrottleAlarms() {
	ns := r.props.Function.MetricsNamespace
	r.throttleAlarms = map[string]awscloudwatch.Alarm{
		MetricTableThrottledRequests: r.alarm("TableThrottled",
			"Sluice: DynamoDB throttled requests to the state table (AWS/DynamoDB "+MetricTableThrottledRequests+", GetItem and UpdateItem): "+
				"a key above a partition's 1,000 write or 3,000 read units a second, traffic above twice the table's previous peak, "+
				"or above its maximum throughput or the account's per-table quota; see docs/infra.md",
			r.TableThrottledRequests(), 1),
		MetricThrottled: r.alarm("Throttled",
			"Sluice: the authorizer decided requests without the store because the store throttled their key ("+ns+" "+MetricThrottled+
				"; per rule with the dimension Rule); see docs/infra.md",
			r.metrics.Throttled, 1),
	}
}

// MetricTableThrottledRequests is DynamoDB's metric of throttled requests
// (namespace AWS/DynamoDB, dimensions TableName and Operation).
const MetricTableThrottledRequests = "ThrottledRequests"

// TableThrottledRequests is DynamoDB's ThrottledRequests of the state
// table for the operations the authorizer performs (StateTableActions),
// summed per minute: requests DynamoDB refused with a throttling error,
// each retry of the SDK counted again. It is a regional metric: in each
// region it counts that region's table (or replica).
func (r *RateLimiter) TableThrottledRequests() awscloudwatch.IMetric {
	using := map[string]awscloudwatch.IMetric{}
	var terms []string
	for _, action := range StateTableActions {
		op := strings.TrimPrefix(action, "dynamodb:")
		id := strings.ToLower(op)
		using[id] = awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
			Namespace:     jsii.String("AWS/DynamoDB"),
			MetricName:    jsii.String(MetricTableThrottledRequests),
			DimensionsMap: &map[string]*string{"TableName": r.table.TableName(), "Operation": jsii.String(op)},
			Statistic:     jsii.String("Sum"),
			Period:        awscdk.Duration_Minutes(jsii.Number(1)),
		})
		terms = append(terms, "FILL("+id+", 0)")
	}
	return awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression:   jsii.String(strings.Join(terms, " + ")),
		UsingMetrics: &using,
		Label:        jsii.String("State table throttled requests"),
		Period:       awscdk.Duration_Minutes(jsii.Number(1)),
	})
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

// ThrottleAlarms are the throttle alarms by metric:
// MetricTableThrottledRequests (the state table's) and MetricThrottled
// (the authorizer's); empty when Alarms.Off.
func (r *RateLimiter) ThrottleAlarms() map[string]awscloudwatch.Alarm { return r.throttleAlarms }
