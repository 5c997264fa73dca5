package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Defaults and bounds of the utilization publisher (functions/publisher).
const (
	// DefaultPublishStatistic is the statistic the publisher reads.
	DefaultPublishStatistic = "Maximum"
	// DefaultPublishPeriod is the metric period and the schedule: one
	// minute, CloudWatch's standard resolution.
	DefaultPublishPeriod = time.Minute
	// MinPublishPeriod and MaxPublishPeriod bound EnvPublishPeriod
	// (EventBridge schedules run at most once a minute).
	MinPublishPeriod = time.Minute
	MaxPublishPeriod = time.Hour
	// PublishMaxAgePeriods is how many periods old a published value may
	// be before the shedder ignores it, when the construct deploys the
	// publisher and sets SLUICE_SHED_UTILIZATION_MAX_AGE: a value published
	// every period lives through one late or failed run, not two.
	PublishMaxAgePeriods = 2.5
	// MaxPublishDimensions bounds EnvPublishDimensions (CloudWatch's limit).
	MaxPublishDimensions = 30
)

// Statistics the publisher reads (CloudWatch's names).
var PublishStatistics = []string{"Maximum", "Average", "Minimum", "Sum", "SampleCount", "p50", "p90", "p99"}

// Publish is the utilization publisher's configuration: which CloudWatch
// metric to read and how to turn it into a utilization. The gauge name is
// Shed.Utilization and the store Shed.Backend of the same Env.
type Publish struct {
	Namespace  string
	Metric     string
	Dimensions []Dimension
	Statistic  string
	Divisor    float64
	Period     time.Duration
}

// Dimension is one CloudWatch dimension.
type Dimension struct{ Name, Value string }

// ParsePublish reads the SLUICE_PUBLISH_* variables. Errors name the
// variable.
func ParsePublish(getenv func(string) string) (Publish, error) {
	p := Publish{
		Namespace: strings.TrimSpace(getenv(EnvPublishNamespace)),
		Metric:    strings.TrimSpace(getenv(EnvPublishMetric)),
		Statistic: DefaultPublishStatistic,
		Divisor:   1,
		Period:    DefaultPublishPeriod,
	}
	bad := func(name, format string, args ...any) error {
		return &Error{Name: name, Msg: fmt.Sprintf(format, args...)}
	}
	if p.Namespace == "" || len(p.Namespace) > 255 {
		return p, bad(EnvPublishNamespace, "required: the CloudWatch namespace of the utilization metric, e.g. AWS/Lambda (1 to 255 bytes)")
	}
	if p.Metric == "" || len(p.Metric) > 255 {
		return p, bad(EnvPublishMetric, "required: the metric's name, e.g. ConcurrentExecutions (1 to 255 bytes)")
	}
	if v := strings.TrimSpace(getenv(EnvPublishDimensions)); v != "" {
		for _, kv := range strings.Split(v, ",") {
			name, value, ok := strings.Cut(kv, "=")
			name, value = strings.TrimSpace(name), strings.TrimSpace(value)
			if !ok || name == "" || value == "" || len(name) > 255 || len(value) > 1024 {
				return p, bad(EnvPublishDimensions, "%q is not Name=Value", kv)
			}
			p.Dimensions = append(p.Dimensions, Dimension{Name: name, Value: value})
		}
		if len(p.Dimensions) > MaxPublishDimensions {
			return p, bad(EnvPublishDimensions, "%d dimensions; at most %d", len(p.Dimensions), MaxPublishDimensions)
		}
	}
	if v := strings.TrimSpace(getenv(EnvPublishStatistic)); v != "" {
		ok := false
		for _, s := range PublishStatistics {
			ok = ok || s == v
		}
		if !ok {
			return p, bad(EnvPublishStatistic, "%q is not one of %s", v, strings.Join(PublishStatistics, ", "))
		}
		p.Statistic = v
	}
	if v := strings.TrimSpace(getenv(EnvPublishDivisor)); v != "" {
		d, err := strconv.ParseFloat(v, 64)
		if err != nil || !(d > 0) || math.IsInf(d, 0) {
			return p, bad(EnvPublishDivisor, "%q is not a positive number (the metric's value at full utilization)", v)
		}
		p.Divisor = d
	}
	if v := strings.TrimSpace(getenv(EnvPublishPeriod)); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < MinPublishPeriod || d > MaxPublishPeriod || d%time.Minute != 0 {
			return p, bad(EnvPublishPeriod, "%q is not a whole number of minutes from %v to %v", v, MinPublishPeriod, MaxPublishPeriod)
		}
		p.Period = d
	}
	return p, nil
}

// Env returns p as environment variables (for the construct).
func (p Publish) Env() map[string]string {
	env := map[string]string{
		EnvPublishNamespace: p.Namespace,
		EnvPublishMetric:    p.Metric,
		EnvPublishStatistic: p.Statistic,
		EnvPublishDivisor:   strconv.FormatFloat(p.Divisor, 'g', -1, 64),
		EnvPublishPeriod:    p.Period.String(),
	}
	if len(p.Dimensions) > 0 {
		parts := make([]string, len(p.Dimensions))
		for i, d := range p.Dimensions {
			parts[i] = d.Name + "=" + d.Value
		}
		env[EnvPublishDimensions] = strings.Join(parts, ",")
	}
	return env
}
