package wiring

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"

	"github.com/sluicehq/sluice/config"
)

type getMetricDataFunc func(*cloudwatch.GetMetricDataInput) (*cloudwatch.GetMetricDataOutput, error)

func (f getMetricDataFunc) GetMetricData(_ context.Context, in *cloudwatch.GetMetricDataInput, _ ...func(*cloudwatch.Options)) (*cloudwatch.GetMetricDataOutput, error) {
	return f(in)
}

// TestCloudWatchReader: one GetMetricData for the named metric, its period
// and statistic, over the window asked; the points come back as they are.
func TestCloudWatchReader(t *testing.T) {
	end := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var asked *cloudwatch.GetMetricDataInput
	r := CloudWatchReader{Client: getMetricDataFunc(func(in *cloudwatch.GetMetricDataInput) (*cloudwatch.GetMetricDataOutput, error) {
		asked = in
		return &cloudwatch.GetMetricDataOutput{MetricDataResults: []types.MetricDataResult{{
			Timestamps: []time.Time{end.Add(-time.Minute), end.Add(-2 * time.Minute)}, Values: []float64{150, 20},
		}}}, nil
	})}
	m := config.Publish{Namespace: "AWS/Lambda", Metric: "ConcurrentExecutions", Dimensions: []config.Dimension{{Name: "FunctionName", Value: "orders"}},
		Statistic: "Maximum", Divisor: 200, Period: time.Minute}
	pts, err := r.ReadMetric(t.Context(), m, end.Add(-5*time.Minute), end)
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != 2 || pts[0].Value != 150 || !pts[0].At.Equal(end.Add(-time.Minute)) {
		t.Errorf("points %+v", pts)
	}
	q := asked.MetricDataQueries[0].MetricStat
	if *q.Metric.Namespace != "AWS/Lambda" || *q.Metric.MetricName != "ConcurrentExecutions" || *q.Metric.Dimensions[0].Name != "FunctionName" ||
		*q.Metric.Dimensions[0].Value != "orders" || *q.Stat != "Maximum" || *q.Period != 60 || !asked.StartTime.Equal(end.Add(-5*time.Minute)) || !asked.EndTime.Equal(end) {
		t.Errorf("query %+v %+v", asked, q)
	}
	down := errors.New("throttled")
	r.Client = getMetricDataFunc(func(*cloudwatch.GetMetricDataInput) (*cloudwatch.GetMetricDataOutput, error) { return nil, down })
	if _, err := r.ReadMetric(t.Context(), m, end.Add(-time.Minute), end); !errors.Is(err, down) {
		t.Errorf("err = %v", err)
	}
	r.Client = getMetricDataFunc(func(*cloudwatch.GetMetricDataInput) (*cloudwatch.GetMetricDataOutput, error) {
		return &cloudwatch.GetMetricDataOutput{MetricDataResults: []types.MetricDataResult{{Timestamps: []time.Time{end}}}}, nil
	})
	if _, err := r.ReadMetric(t.Context(), m, end.Add(-time.Minute), end); err == nil {
		t.Error("a malformed answer was accepted")
	}
}

// TestBuildPublisherErrors: a missing setting stops the start with the
// variable's name.
func TestBuildPublisherErrors(t *testing.T) {
	t.Setenv("AWS_REGION", "us-east-1")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	base := map[string]string{config.EnvShedUtilization: "orders", config.EnvDynamoTable: "state",
		config.EnvPublishNamespace: "AWS/Lambda", config.EnvPublishMetric: "ConcurrentExecutions"}
	for _, drop := range []string{config.EnvShedUtilization, config.EnvDynamoTable, config.EnvPublishMetric} {
		env := map[string]string{}
		for k, v := range base {
			if k != drop {
				env[k] = v
			}
		}
		_, err := BuildPublisher(t.Context(), func(k string) string { return env[k] }, log, io.Discard)
		want := drop
		if drop == config.EnvDynamoTable {
			want = config.EnvShedBackend
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("without %s: err = %v, want one naming %s", drop, err, want)
		}
	}
	if _, err := BuildPublisher(t.Context(), func(k string) string { return base[k] }, log, io.Discard); err != nil {
		t.Errorf("complete configuration: %v", err)
	}
}
