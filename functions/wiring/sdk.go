package wiring

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/smithy-go/logging"

	"github.com/sluicehq/sluice/backends/dynamo"
)

// loadAWSConfig loads the SDK's configuration for the DynamoDB client: an
// HTTP transport bounded by the deadline ([dynamo.NewHTTPClient]: connect
// and TLS timeouts, at most dynamo.MaxConnsPerHost connections), and the
// SDK's own log lines in the structured log instead of plain text on
// stderr.
func loadAWSConfig(ctx context.Context, env Env, logger *slog.Logger) (aws.Config, error) {
	return awsconfig.LoadDefaultConfig(ctx,
		awsconfig.WithHTTPClient(dynamo.NewHTTPClient(env.Deadline)),
		awsconfig.WithLogger(sdkLogger(logger)),
		awsconfig.WithClientLogMode(0),
	)
}

// sdkLogger routes the AWS SDK's log lines (its warnings, such as a
// response without a supported checksum) into logger, as JSON lines with
// "source":"aws-sdk": SDK warnings at WARN, its debug lines at DEBUG.
// Request errors themselves reach the caller and are counted by the
// authorizer (BackendErrors), so the SDK's request/response logging
// (ClientLogMode) stays off.
func sdkLogger(logger *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
		level := slog.LevelWarn
		if c == logging.Debug {
			level = slog.LevelDebug
		}
		ctx := context.Background()
		if !logger.Enabled(ctx, level) {
			return
		}
		logger.Log(ctx, level, fmt.Sprintf(format, v...), "source", "aws-sdk")
	})
}
