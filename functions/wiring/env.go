package wiring

import (
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
