// Command publisher is the utilization publisher of the worker-utilization
// load shedder: a scheduled Lambda (the infra/sluice construct deploys it,
// on an EventBridge schedule, when the shedder is on) that reads the
// CloudWatch metric named by the SLUICE_PUBLISH_* variables and publishes
// it, as the utilization SLUICE_SHED_UTILIZATION, to the store of
// SLUICE_SHED_BACKEND (DynamoDB's SLUICE_DYNAMO_TABLE, or memcached's
// SLUICE_MEMCACHED_ADDRS). See package publish and docs/shedding.md. Build
// it as the authorizer is built:
//
//	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -tags lambda.norpc -trimpath -ldflags="-s -w" -o build/publisher/bootstrap ./functions/publisher
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/functions/publish"
	"github.com/sluicehq/sluice/limiter"
)

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	p, err := build(context.Background(), os.Getenv, logger)
	if err != nil {
		logger.Error("init failed", "error", err.Error())
		os.Exit(1)
	}
	lambda.Start(func(ctx context.Context) error {
		_, err := p.Run(ctx)
		return err
	})
}

// build reads the configuration and makes the clients, once.
func build(ctx context.Context, getenv func(string) string, logger *slog.Logger) (*publish.Publisher, error) {
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
	aws, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("AWS configuration: %w", err)
	}
	var store limiter.GaugeStore
	switch env.Shed.Backend {
	case config.BackendDynamo:
		store, err = dynamo.NewLeases(dynamodb.NewFromConfig(aws), dynamo.Config{Table: env.DynamoTable})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvDynamoTable, err)
		}
	case config.BackendMemcached:
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
		CloudWatch:       cloudwatch.NewFromConfig(aws),
		Logger:           logger,
		Metrics:          os.Stdout,
		MetricsNamespace: env.MetricsNamespace,
	})
}
