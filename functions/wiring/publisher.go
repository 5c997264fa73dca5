package wiring

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/functions/publish"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// GetMetricDataAPI is the part of the CloudWatch API CloudWatchReader uses.
type GetMetricDataAPI interface {
	GetMetricData(ctx context.Context, in *cloudwatch.GetMetricDataInput, optFns ...func(*cloudwatch.Options)) (*cloudwatch.GetMetricDataOutput, error)
}

var _ GetMetricDataAPI = (*cloudwatch.Client)(nil)

// CloudWatchReader reads the utilization publisher's metric with one
// GetMetricData call (newest first, the metric's period and statistic).
type CloudWatchReader struct{ Client GetMetricDataAPI }

var _ publish.MetricReader = CloudWatchReader{}

// ReadMetric implements publish.MetricReader.
func (r CloudWatchReader) ReadMetric(ctx context.Context, m config.Publish, start, end time.Time) ([]publish.Point, error) {
	dims := make([]types.Dimension, len(m.Dimensions))
	for i, d := range m.Dimensions {
		dims[i] = types.Dimension{Name: aws.String(d.Name), Value: aws.String(d.Value)}
	}
	out, err := r.Client.GetMetricData(ctx, &cloudwatch.GetMetricDataInput{
		StartTime:     aws.Time(start),
		EndTime:       aws.Time(end),
		ScanBy:        types.ScanByTimestampDescending,
		MaxDatapoints: aws.Int32(int32(min(end.Sub(start)/m.Period+2, 100800))),
		MetricDataQueries: []types.MetricDataQuery{{
			Id: aws.String("u"),
			MetricStat: &types.MetricStat{
				Metric: &types.Metric{Namespace: aws.String(m.Namespace), MetricName: aws.String(m.Metric), Dimensions: dims},
				Period: aws.Int32(int32(m.Period / time.Second)),
				Stat:   aws.String(m.Statistic),
			},
			ReturnData: aws.Bool(true),
		}},
	})
	if err != nil {
		return nil, err
	}
	var pts []publish.Point
	for _, res := range out.MetricDataResults {
		if len(res.Values) != len(res.Timestamps) {
			return nil, fmt.Errorf("GetMetricData: %d values for %d timestamps", len(res.Values), len(res.Timestamps))
		}
		for i := range res.Values {
			pts = append(pts, publish.Point{At: res.Timestamps[i], Value: res.Values[i]})
		}
	}
	return pts, nil
}

// BuildPublisher builds the utilization publisher (functions/publisher)
// from its environment: the SLUICE_PUBLISH_* metric, the utilization's
// name (SLUICE_SHED_UTILIZATION) and max age, and the shed store
// (SLUICE_SHED_BACKEND: DynamoDB's SLUICE_DYNAMO_TABLE or memcached's
// SLUICE_MEMCACHED_ADDRS). Errors name the variable.
func BuildPublisher(ctx context.Context, getenv func(string) string, logger *slog.Logger, metrics io.Writer) (*publish.Publisher, error) {
	env, err := config.Parse(getenv)
	if err != nil {
		return nil, err
	}
	if env.Shed.Utilization == "" {
		return nil, fmt.Errorf("%s: required: the name of the utilization to publish", config.EnvShedUtilization)
	}
	metric, err := config.ParsePublish(getenv)
	if err != nil {
		return nil, err
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("AWS configuration: %w", err)
	}
	var store storage.GaugeStore
	switch env.Shed.Backend {
	case BackendDynamo:
		store, err = dynamo.NewLeases(dynamodb.NewFromConfig(awsCfg), dynamo.Config{Table: env.DynamoTable})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvDynamoTable, err)
		}
	case BackendMemcached:
		mc, err := memcached.New(memcached.Config{Addrs: env.MemcachedAddrs, Timeout: env.Deadline, Proxy: env.MemcachedProxy})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvMemcachedAddrs, err)
		}
		if store, err = memcached.NewLeases(mc.Client(), memcached.Config{Timeout: env.Deadline}); err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvMemcachedAddrs, err)
		}
	default:
		return nil, fmt.Errorf("%s: the publisher needs the shed store: set %s or %s", config.EnvShedBackend, config.EnvDynamoTable, config.EnvMemcachedAddrs)
	}
	return publish.New(publish.Config{
		Metric:           metric,
		Gauge:            &limiter.PublishedUtilization{Store: store, Name: env.Shed.Utilization, MaxAge: env.Shed.UtilizationMaxAge},
		CloudWatch:       CloudWatchReader{Client: cloudwatch.NewFromConfig(awsCfg)},
		Logger:           logger,
		Metrics:          metrics,
		MetricsNamespace: env.MetricsNamespace,
	})
}
