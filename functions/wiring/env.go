package wiring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/config"
)

// DefaultRulesTTL is how long rules read from a table are cached.
const DefaultRulesTTL = config.DefaultRulesTTL

// Env is the authorizer's configuration, read from environment variables
// by [ParseEnv]: package config holds the contract (names, defaults,
// bounds) that the CDK construct reads too. docs/authorizer.md lists the
// variables.
type Env = config.Env

// ParseEnv reads the configuration through getenv (os.Getenv) with
// [config.Parse]. Errors name the variable.
func ParseEnv(getenv func(string) string) (Env, error) { return config.Parse(getenv) }

// Backend names, as rules and SLUICE_DEFAULT_BACKEND spell them.
const (
	BackendMemory    = config.BackendMemory
	BackendMemcached = config.BackendMemcached
	BackendDynamo    = config.BackendDynamo
)

// CheckAWS checks, before anything is built, what can be checked of the
// AWS configuration a DynamoDB table (state or rules) needs, and answers
// in one line: a region, and credentials the SDK's default chain can
// find within timeout (environment, shared files, SSO, an instance or
// container role). It is for tools run by hand (the local API without
// -dynamo-endpoint), where a missing credential would otherwise surface
// as a fail-open warning on every request; a Lambda always has both.
func CheckAWS(ctx context.Context, env Env, timeout time.Duration) error {
	if env.DynamoTable == "" && env.RulesTable == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cfg, err := loadAWSConfig(ctx, env, slog.New(slog.DiscardHandler))
	if err != nil {
		return fmt.Errorf("AWS configuration: %v", err)
	}
	if cfg.Region == "" {
		return errors.New("no AWS region: set AWS_REGION (or a profile's region)")
	}
	if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
		return fmt.Errorf("no AWS credentials found in %v (environment, shared config and credentials files, SSO, instance or container role)", timeout)
	}
	return nil
}
