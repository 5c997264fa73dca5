// Command publisher is the utilization publisher of the worker-utilization
// load shedder: a scheduled Lambda (the infra/sluice construct deploys it,
// on an EventBridge schedule, when Shedding.Publisher is set) that reads
// the CloudWatch metric named by the SLUICE_PUBLISH_* variables and
// publishes it, as the utilization SLUICE_SHED_UTILIZATION, to the store of
// SLUICE_SHED_BACKEND (DynamoDB's SLUICE_DYNAMO_TABLE, or memcached's
// SLUICE_MEMCACHED_ADDRS). The handler is package functions/publish, the
// clients are built by functions/wiring (BuildPublisher); see
// docs/shedding.md. `make build` builds it as build/publisher/bootstrap.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/sluicehq/sluice/functions/wiring"
)

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	p, err := wiring.BuildPublisher(context.Background(), os.Getenv, logger, os.Stdout)
	if err != nil {
		logger.Error("init failed", "error", err.Error())
		os.Exit(1)
	}
	lambda.Start(func(ctx context.Context) error {
		_, err := p.Run(ctx)
		return err
	})
}
