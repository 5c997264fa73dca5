package publish

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// points answers with the given (age in minutes, value) data points.
func points(now *time.Time, pts ...float64) ReaderFunc {
	return func(context.Context, config.Publish, time.Time, time.Time) ([]Point, error) {
		var out []Point
		for i := 0; i+1 < len(pts); i += 2 {
			out = append(out, Point{At: now.Add(-time.Duration(pts[i]) * time.Minute), Value: pts[i+1]})
		}
		return out, nil
	}
}

func failing(err error) ReaderFunc {
	return func(context.Context, config.Publish, time.Time, time.Time) ([]Point, error) { return nil, err }
}

type gaugeStore struct {
	storage.GaugeStore
	err error
}

func (g gaugeStore) PutGauge(ctx context.Context, k storage.Key, v storage.Gauge, ttl time.Duration) error {
	if g.err != nil {
		return g.err
	}
	return g.GaugeStore.PutGauge(ctx, k, v, ttl)
}

type fixture struct {
	now     time.Time
	store   *memory.Leases
	gauge   *limiter.PublishedUtilization
	metrics bytes.Buffer
	logs    bytes.Buffer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{now: t0}
	s, err := memory.NewLeases(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f.store = s
	clock := limiter.ClockFunc(func() time.Time { return f.now })
	f.gauge = &limiter.PublishedUtilization{Store: s, Name: "orders-fleet", MaxAge: 150 * time.Second, Clock: clock}
	return f
}

func (f *fixture) publisher(t *testing.T, cw MetricReader, store storage.GaugeStore) *Publisher {
	t.Helper()
	m, err := config.ParsePublish(func(k string) string {
		return map[string]string{config.EnvPublishNamespace: "AWS/Lambda", config.EnvPublishMetric: "ConcurrentExecutions",
			config.EnvPublishDimensions: "FunctionName=orders", config.EnvPublishDivisor: "200"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	g := *f.gauge
	if store != nil {
		g.Store = store
	}
	p, err := New(Config{Metric: m, Gauge: &g, CloudWatch: cw, Clock: limiter.ClockFunc(func() time.Time { return f.now }),
		Metrics: &f.metrics, Logger: slogJSON(&f.logs)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPublish(t *testing.T) {
	f := newFixture(t)
	var asked config.Publish
	var from, to time.Time
	cw := ReaderFunc(func(ctx context.Context, m config.Publish, start, end time.Time) ([]Point, error) {
		asked, from, to = m, start, end
		return points(&f.now, 3, 20, 2, 150, 4, 10)(ctx, m, start, end) // the newest (2 min old): 150 of 200
	})
	p := f.publisher(t, cw, nil)
	res, err := p.Run(context.Background())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Utilization != 0.75 || res.Raw != 150 {
		t.Errorf("result %+v, want utilization 0.75 (150/200)", res)
	}
	if asked.Namespace != "AWS/Lambda" || asked.Metric != "ConcurrentExecutions" || asked.Dimensions[0].Value != "orders" || asked.Statistic != "Maximum" ||
		!to.Equal(f.now) || to.Sub(from) != 5*time.Minute {
		t.Errorf("asked for %+v from %v to %v (want the last 5 periods)", asked, from, to)
	}
	if got, err := f.gauge.Utilization(context.Background()); err != nil || got != 0.75 {
		t.Errorf("published %v, %v; want 0.75", got, err)
	}
	var line map[string]any
	if err := json.Unmarshal(f.metrics.Bytes(), &line); err != nil || line["Published"] != 1.0 || line["UtilizationValue"] != 0.75 || line["Utilization"] != "orders-fleet" {
		t.Errorf("metric line %s (%v)", f.metrics.String(), err)
	}
	// Above the divisor: clamped to 1.
	cw = points(&f.now, 1, 900)
	if res, err := f.publisher(t, cw, nil).Run(context.Background()); err != nil || res.Utilization != 1 {
		t.Errorf("clamp: %+v, %v", res, err)
	}
}

// TestPublishFailures: every failure publishes nothing and says why.
func TestPublishFailures(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	down := errors.New("cloudwatch: throttled")
	tests := []struct {
		name  string
		cw    MetricReader
		store storage.GaugeStore
		want  error
		msg   string
	}{
		{name: "cloudwatch error", cw: failing(down), want: down},
		{name: "no data point", cw: points(&f.now), want: ErrNoData},
		{name: "stale data point", cw: points(&f.now, 6, 100), want: ErrStaleData, msg: "6m0s old"},
		{name: "NaN", cw: points(&f.now, 1, math.NaN()), want: ErrBadValue},
		{name: "store down", cw: points(&f.now, 1, 100), store: gaugeStore{f.store, storage.ErrUnavailable}, want: storage.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.metrics.Reset()
			_, err := f.publisher(t, tt.cw, tt.store).Run(ctx)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Run: %v, want %v", err, tt.want)
			}
			if _, err := f.gauge.Utilization(ctx); !errors.Is(err, limiter.ErrStaleUtilization) {
				t.Errorf("something was published: %v", err)
			}
			if !strings.Contains(f.metrics.String(), `"PublishErrors":1`) {
				t.Errorf("metric line %s", f.metrics.String())
			}
		})
	}
	if !strings.Contains(f.logs.String(), "utilization not published") {
		t.Errorf("no error log line: %s", f.logs.String())
	}
}

// TestStaleGaugeRecedes: a publisher that stops (its runs fail) leaves a
// gauge that goes stale after MaxAge; the authorizer's shedder then gets
// ErrNoUtilization and recedes as configured, rather than shedding on the
// last value forever.
func TestStaleGaugeRecedes(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	shedder, err := limiter.NewUtilizationShedder(limiter.UtilizationShedderConfig{Utilization: f.gauge})
	if err != nil {
		t.Fatal(err)
	}
	saturated := f.publisher(t, points(&f.now, 1, 200), nil)
	// Saturated for 4 minutes, published every minute: shedding ramps up.
	for range 240 {
		if f.now.Sub(t0)%time.Minute == 0 {
			if _, err := saturated.Run(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := shedder.Check(ctx, limiter.PriorityNormal, f.now); err != nil {
			t.Fatalf("check at %v: %v", f.now.Sub(t0), err)
		}
		f.now = f.now.Add(time.Second)
	}
	high := shedder.State()
	if !(high.Amount > 0.9) {
		t.Fatalf("after 4 saturated minutes the shed amount is %v", high.Amount)
	}
	// CloudWatch fails from now on: nothing is published.
	broken := f.publisher(t, failing(errors.New("AccessDenied")), nil)
	var stale bool
	for i := range 300 {
		if f.now.Sub(t0)%time.Minute == 0 {
			if _, err := broken.Run(ctx); err == nil {
				t.Fatal("a broken run succeeded")
			}
		}
		_, err := shedder.Check(ctx, limiter.PriorityNormal, f.now)
		// The last publish was at 180 s (the loop above ended at 240 s):
		// the gauge is stale from 330 s on, 90 s into this loop.
		if i <= 90 && err != nil {
			t.Fatalf("the gauge went stale %d s into the outage (the last value is 150 s old at 90 s): %v", i, err)
		}
		if i > 91 && err == nil {
			t.Fatalf("the gauge is still fresh %d s into the outage", i)
		}
		if err != nil {
			if !errors.Is(err, limiter.ErrNoUtilization) || !errors.Is(err, limiter.ErrStaleUtilization) {
				t.Fatalf("err = %v", err)
			}
			stale = true
		}
		f.now = f.now.Add(time.Second)
	}
	if !stale {
		t.Fatal("the gauge never went stale")
	}
	if low := shedder.State(); !(low.Amount < high.Amount-1) {
		t.Errorf("the shed amount went from %v to %v in 208 s of stale signal; it should recede (1/120 per second)", high.Amount, low.Amount)
	}
}

func TestNewErrors(t *testing.T) {
	f := newFixture(t)
	if _, err := New(Config{}); err == nil {
		t.Error("empty config accepted")
	}
	if _, err := New(Config{Gauge: f.gauge, CloudWatch: points(&f.now)}); err == nil {
		t.Error("config without a metric accepted")
	}
}
