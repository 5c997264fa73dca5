package sluice

import (
	"fmt"
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
// backend's circuit breakers ([RateLimiter.BreakerAlarms]), two on
// throttling ([RateLimiter.ThrottleAlarms]) and, with regional shares,
// on their metrics ([RateLimiter.SharesAlarms]).
type Alarms struct {
	// Off creates no alarms.
	Off bool
	// Topic, when set, is notified when an alarm fires and when it
	// clears (alarm and OK actions).
	Topic awssns.ITopic
	// Shares configures the alarms on the regional shares of the global
	// rules.
	Shares SharesAlarms
}

// SharesAlarms configures the alarms on the regional shares' metrics
// (functions/authz, metrics_shares.go; names in package config), each on
// the metric's sum over every limit (the dimension set []) in a minute,
// at or above its threshold. They are made when the construct runs the
// keeper: a rule with scope global in the construct's rules on
// TableEventual (with rules from a table, unknown at synth, add your own
// on [RateLimiter.SharesMetric]).
type SharesAlarms struct {
	// Off makes none of them.
	Off bool
	// Stale is the threshold of SharesStale, decisions that found no
	// share entry valid and followed the rule's fail mode: 0 is
	// DefaultSharesAlarm (1), negative makes no alarm.
	Stale float64
	// Dropped is the threshold of SharesDropped, keys a full wants index
	// could not take (they get no more than their region's own share): 0
	// is DefaultSharesAlarm (1), negative makes no alarm.
	Dropped float64
	// TickErrors is the threshold of SharesTickErrors, agent ticks that
	// failed; RoleLost that of SharesRoleLost, agent roles found taken by
	// another container. 0 (the default) makes no alarm: the next tick
	// retries a failed one, and a container frozen mid-tick loses its
	// role, so some of either is normal; set a rate you would page on.
	TickErrors, RoleLost float64
}

// DefaultSharesAlarm is the default threshold of the SharesStale and
// SharesDropped alarms: one in a minute.
const DefaultSharesAlarm = 1

// buildAlarms adds the construct's alarms, unless Alarms.Off: the
// circuit breakers' (one per network backend, unless the breakers are
// off), the throttles' (the state table's and the authorizer's) and the
// regional shares' (with the keeper).
func (r *RateLimiter) buildAlarms() {
	if r.props.Alarms.Off {
		return
	}
	r.buildBreakerAlarms()
	r.buildThrottleAlarms()
	r.buildSharesAlarms()
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

// buildSharesAlarms adds the regional shares' alarms when the function
// runs the keeper (keeperOn: the construct knows of a global rule on an
// eventual table), unless Alarms.Shares.Off: SharesStale and
// SharesDropped at DefaultSharesAlarm unless set, SharesTickErrors and
// SharesRoleLost when their thresholds are set.
func (r *RateLimiter) buildSharesAlarms() {
	sa := r.props.Alarms.Shares
	if sa.Off || !r.keeperOn() {
		return
	}
	ns := r.props.Function.MetricsNamespace
	r.sharesAlarms = map[string]awscloudwatch.Alarm{}
	for _, a := range []struct {
		metric    string
		threshold float64
		def       float64
		what      string
	}{
		{config.MetricSharesStale, sa.Stale, DefaultSharesAlarm,
			"decisions of a global rule found no share entry valid at their stamp (the region's agent has not published for a second) and followed the rule's fail mode"},
		{config.MetricSharesDropped, sa.Dropped, DefaultSharesAlarm,
			"a key short of its share could not be listed in this region's full wants index: it gets no more than the region's own share"},
		{config.MetricSharesTickErrors, sa.TickErrors, 0,
			"agent ticks of the regional shares failed (a table request failed or timed out)"},
		{config.MetricSharesRoleLost, sa.RoleLost, 0,
			"agents of the regional shares found their role taken by another container (ticks outlast the role's life, or containers frozen mid-tick)"},
	} {
		threshold := a.threshold
		if threshold == 0 {
			threshold = a.def
		}
		if threshold <= 0 {
			continue
		}
		r.sharesAlarms[a.metric] = r.alarm(a.metric,
			fmt.Sprintf("Sluice: %s (%s %s >= %g in a minute, every limit; per limit with the dimension %s); see docs/authorizer.md, Metrics",
				a.what, ns, a.metric, threshold, config.DimensionLimit),
			r.SharesMetric(a.metric), threshold)
	}
}

// SharesMetric is the regional shares' metric name (config.MetricShares*)
// summed over every limit (the dimension set []) per minute; SharesWanted
// (a gauge) is its maximum.
func (r *RateLimiter) SharesMetric(name string) awscloudwatch.Metric {
	stat := "Sum"
	if name == config.MetricSharesWanted {
		stat = "Maximum"
	}
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:  jsii.String(r.props.Function.MetricsNamespace),
		MetricName: jsii.String(name),
		Statistic:  jsii.String(stat),
		Period:     awscdk.Duration_Minutes(jsii.Number(1)),
	})
}

// SharesAlarms are the regional shares' alarms by metric name
// (config.MetricSharesStale, MetricSharesDropped, and
// MetricSharesTickErrors and MetricSharesRoleLost when set); empty
// without the keeper, with Alarms.Off or Alarms.Shares.Off.
func (r *RateLimiter) SharesAlarms() map[string]awscloudwatch.Alarm { return r.sharesAlarms }
