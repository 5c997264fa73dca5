package publish

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
)

// Point is one data point of the metric.
type Point struct {
	At    time.Time
	Value float64
}

// MetricReader reads the data points of the metric m between start and
// end, in any order: wiring.CloudWatchReader (GetMetricData), or a fake in
// tests. This package imports no AWS SDK (functions/wiring builds it).
type MetricReader interface {
	ReadMetric(ctx context.Context, m config.Publish, start, end time.Time) ([]Point, error)
}

// ReaderFunc adapts a function to MetricReader.
type ReaderFunc func(ctx context.Context, m config.Publish, start, end time.Time) ([]Point, error)

// ReadMetric returns f(ctx, m, start, end).
func (f ReaderFunc) ReadMetric(ctx context.Context, m config.Publish, start, end time.Time) ([]Point, error) {
	return f(ctx, m, start, end)
}

// Errors of a run that published nothing.
var (
	ErrNoData    = errors.New("publish: no data point")
	ErrStaleData = errors.New("publish: the newest data point is too old")
	ErrBadValue  = errors.New("publish: the metric's value is not a number")
)

// Config configures a [Publisher].
type Config struct {
	// Metric says which metric to read and how to scale it.
	Metric config.Publish
	// Gauge is where the utilization goes: Name is the utilization's name
	// (SLUICE_SHED_UTILIZATION), Store the shed store.
	Gauge *limiter.PublishedUtilization
	// CloudWatch reads the metric (wiring.CloudWatchReader).
	CloudWatch MetricReader
	// MaxDataAge is how old the newest data point may be (CloudWatch
	// delivers a minute's data a minute or two late). Zero means five
	// periods.
	MaxDataAge time.Duration
	// Clock is the time of a run; nil means limiter.SystemClock.
	Clock limiter.Clock
	// Logger gets one line per run; nil means none.
	Logger *slog.Logger
	// Metrics, when not nil, gets one EMF line per run (Published,
	// PublishErrors, Utilization) in the namespace MetricsNamespace.
	Metrics          io.Writer
	MetricsNamespace string
}

// Publisher reads the metric and publishes the utilization. Safe for
// concurrent use.
type Publisher struct {
	cfg Config
	mu  sync.Mutex
}

// New returns a Publisher, or an error for an incomplete Config.
func New(cfg Config) (*Publisher, error) {
	switch {
	case cfg.Gauge == nil || cfg.Gauge.Store == nil || cfg.Gauge.Name == "":
		return nil, errors.New("publish: Config.Gauge with a Store and a Name is required")
	case cfg.CloudWatch == nil:
		return nil, errors.New("publish: Config.CloudWatch is required")
	case cfg.Metric.Namespace == "" || cfg.Metric.Metric == "" || !(cfg.Metric.Divisor > 0) || cfg.Metric.Period < time.Second:
		return nil, errors.New("publish: Config.Metric needs a namespace, a metric, a positive divisor and a period (config.ParsePublish)")
	}
	if cfg.MaxDataAge <= 0 {
		cfg.MaxDataAge = 5 * cfg.Metric.Period
	}
	if cfg.Clock == nil {
		cfg.Clock = limiter.SystemClock
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.MetricsNamespace == "" {
		cfg.MetricsNamespace = config.DefaultMetricsNamespace
	}
	return &Publisher{cfg: cfg}, nil
}

// Result is what one run did.
type Result struct {
	// Utilization is the published value (the metric over the divisor,
	// clamped to [0, 1]); Raw the metric's value; At its timestamp.
	Utilization, Raw float64
	At               time.Time
}

// Run reads the newest data point of the metric within MaxDataAge and
// publishes it as the utilization at the run's time. It publishes nothing
// when anything fails, and says why in the error.
func (p *Publisher) Run(ctx context.Context) (Result, error) {
	now := p.cfg.Clock.Now()
	res, err := p.run(ctx, now)
	p.record(ctx, now, res, err)
	return res, err
}

func (p *Publisher) run(ctx context.Context, now time.Time) (Result, error) {
	m := p.cfg.Metric
	points, err := p.cfg.CloudWatch.ReadMetric(ctx, m, now.Add(-p.cfg.MaxDataAge), now)
	if err != nil {
		return Result{}, fmt.Errorf("publish: reading %s %s: %w", m.Namespace, m.Metric, err)
	}
	if len(points) == 0 {
		return Result{}, fmt.Errorf("%w: %s %s has no data point in the last %v", ErrNoData, m.Namespace, m.Metric, p.cfg.MaxDataAge)
	}
	// The newest point, whatever order the answer is in.
	best := 0
	for i := range points {
		if points[i].At.After(points[best].At) {
			best = i
		}
	}
	res := Result{Raw: points[best].Value, At: points[best].At}
	if age := now.Sub(res.At); age > p.cfg.MaxDataAge {
		return res, fmt.Errorf("%w: %v old (at most %v)", ErrStaleData, age.Round(time.Second), p.cfg.MaxDataAge)
	}
	if math.IsNaN(res.Raw) || math.IsInf(res.Raw, 0) {
		return res, fmt.Errorf("%w: %v", ErrBadValue, res.Raw)
	}
	res.Utilization = min(max(res.Raw/m.Divisor, 0), 1)
	if err := p.cfg.Gauge.Publish(ctx, res.Utilization, now); err != nil {
		return res, err
	}
	return res, nil
}

// record logs the run and writes its metric line.
func (p *Publisher) record(ctx context.Context, now time.Time, res Result, err error) {
	if err != nil {
		p.cfg.Logger.LogAttrs(ctx, slog.LevelError, "utilization not published",
			slog.String("utilization", p.cfg.Gauge.Name), slog.String("error", err.Error()))
	} else {
		p.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "utilization published",
			slog.String("utilization", p.cfg.Gauge.Name), slog.Float64("value", res.Utilization),
			slog.Float64("raw", res.Raw), slog.Time("data_at", res.At))
	}
	if p.cfg.Metrics == nil {
		return
	}
	published, failed := 1, 0
	if err != nil {
		published, failed = 0, 1
	}
	b := []byte(`{"_aws":{"Timestamp":`)
	b = strconv.AppendInt(b, now.UnixMilli(), 10)
	b = append(b, `,"CloudWatchMetrics":[{"Namespace":`...)
	b = strconv.AppendQuote(b, p.cfg.MetricsNamespace)
	b = append(b, `,"Dimensions":[["Utilization"]],"Metrics":[{"Name":"Published","Unit":"Count"},{"Name":"PublishErrors","Unit":"Count"}`...)
	if err == nil {
		b = append(b, `,{"Name":"UtilizationValue","Unit":"None"}`...)
	}
	b = append(b, `]}]},"Utilization":`...)
	b = strconv.AppendQuote(b, p.cfg.Gauge.Name)
	b = append(b, `,"Published":`...)
	b = strconv.AppendInt(b, int64(published), 10)
	b = append(b, `,"PublishErrors":`...)
	b = strconv.AppendInt(b, int64(failed), 10)
	if err == nil {
		b = append(b, `,"UtilizationValue":`...)
		b = strconv.AppendFloat(b, res.Utilization, 'f', -1, 64)
	}
	b = append(b, "}\n"...)
	p.mu.Lock()
	p.cfg.Metrics.Write(b) //nolint:errcheck // metrics never fail a run
	p.mu.Unlock()
}
