// Command authorizer is Sluice's API Gateway Lambda authorizer. Build it as
// the bootstrap of a provided.al2023 function:
//
//	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -tags lambda.norpc -trimpath -ldflags="-s -w" -o build/authorizer/bootstrap ./functions/authorizer
//
// It reads its configuration from environment variables (docs/authorizer.md),
// builds its clients once (package wiring), and serves authorizer events with
// lambda.Start (the handler, package authz).
// A configuration error (an invalid rule) is reported to the Runtime API as
// an init error and exits non-zero.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/functions/wiring"
)

func main() {
	built, err := wiring.FromEnv(context.Background(), os.Getenv, wiring.Outputs{})
	if err != nil {
		fmt.Fprintf(os.Stderr, `{"level":"ERROR","msg":"init failed","error":%q,"errorType":%q}`+"\n", authz.InitMessage(err), authz.InitErrorType(err))
		authz.ReportInitError(err)
		os.Exit(1)
	}
	built.Logger.Info("sluice authorizer ready", "rules", built.Rules, "default_backend", built.Env.DefaultBackend, "deadline", built.Env.Deadline.String())
	lambda.Start(built.Handler) // a lambda.Handler: Invoke(ctx, payload []byte) ([]byte, error)
}
