package stacks

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// Context keys read by Build. Values given with `cdk synth -c key=value`
// are strings; the same keys may be set in cdk.json.
const (
	// CtxConfig is the config file path (default DefaultConfigPath).
	CtxConfig = "config"
	// CtxBootstrapDir is the directory holding the authorizer's `bootstrap`
	// (default DefaultBootstrapDir).
	CtxBootstrapDir = "bootstrapDir"
	// CtxAccount overrides Config.Account.
	CtxAccount = "account"
	// CtxRegions overrides Config.Regions (comma-separated).
	CtxRegions = "regions"
	// CtxPrimaryRegion overrides Config.PrimaryRegion.
	CtxPrimaryRegion = "primaryRegion"
	// CtxConsistency overrides Config.Consistency.
	CtxConsistency = "consistency"
	// CtxEdgeSecret is the edge front door's shared secret (Config.Edge).
	CtxEdgeSecret = "edgeSecret"
)

// Defaults of the context keys, relative to the directory `cdk` runs in
// (infra/).
const (
	DefaultConfigPath   = "sluice.json"
	DefaultBootstrapDir = "../build/authorizer"
)

// Build reads the configuration (file and context), validates it, and adds
// one stack per region to app, with the cdk-nag AwsSolutions checks as an
// aspect. It returns the stacks, primary first.
func Build(app awscdk.App) ([]*RegionStack, error) {
	cfg, err := configFromContext(app)
	if err != nil {
		return nil, err
	}
	dir := contextString(app, CtxBootstrapDir, DefaultBootstrapDir)
	if err := checkBootstrap(dir); err != nil {
		return nil, err
	}

	for _, region := range cfg.Regions {
		// Stacks with an explicit environment look their availability zones
		// up in the account, which needs credentials (and the CDK's Vpc
		// asks even when given its zones). Answer from the configuration,
		// as cdk.context.json would; a value already in the context (a
		// real lookup) wins, and the Vpc then checks ours against it.
		key := fmt.Sprintf("availability-zones:account=%s:region=%s", cfg.Account, region)
		if app.Node().TryGetContext(jsii.String(key)) == nil {
			app.Node().SetContext(jsii.String(key), cfg.VPC.Zones(region))
		}
	}

	awscdk.Tags_Of(app).Add(jsii.String("project"), jsii.String("sluice"), nil)
	var stacks []*RegionStack
	regions := append([]string{cfg.PrimaryRegion}, cfg.ReplicaRegions()...)
	for _, region := range regions {
		s := NewRegionStack(app, RegionStackProps{
			Config:       cfg,
			Region:       region,
			BootstrapDir: dir,
		})
		if len(stacks) > 0 {
			// The primary stack creates the replicas this stack uses.
			s.AddStackDependency(stacks[0].Stack, jsii.String("the primary region's stack creates the global table replicas"))
		}
		stacks = append(stacks, s)
	}
	if cfg.Edge != nil {
		edge := NewEdgeStack(app, cfg)
		for _, s := range stacks {
			// The origins (custom domains, latency records) first.
			edge.AddStackDependency(s.Stack, jsii.String("the regions' origins exist before the distribution points at them"))
		}
	}
	awscdk.Aspects_Of(app).Add(cdknag.NewAwsSolutionsChecks(&cdknag.NagPackProps{Verbose: jsii.Bool(true)}), nil)
	return stacks, nil
}

// configFromContext loads the config file named by the context and applies
// the context overrides and the defaults.
func configFromContext(app awscdk.App) (*Config, error) {
	cfg, err := LoadConfig(contextString(app, CtxConfig, DefaultConfigPath))
	if err != nil {
		return nil, err
	}
	if v := contextString(app, CtxAccount, ""); v != "" {
		cfg.Account = v
	}
	if rs := contextList(app, CtxRegions); len(rs) > 0 {
		cfg.Regions = rs
		if !slices.Contains(rs, cfg.PrimaryRegion) {
			cfg.PrimaryRegion = "" // defaults to the first of the new list
		}
	}
	if v := contextString(app, CtxPrimaryRegion, ""); v != "" {
		cfg.PrimaryRegion = v
	}
	if v := contextString(app, CtxConsistency, ""); v != "" {
		cfg.Consistency = v
	}
	if cfg.Edge != nil {
		cfg.Edge.Secret = contextString(app, CtxEdgeSecret, "")
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// checkBootstrap fails early, with a hint, when the authorizer has not been
// built: CDK would otherwise fail deep inside asset staging.
func checkBootstrap(dir string) error {
	fi, err := os.Stat(filepath.Join(dir, "bootstrap"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("no authorizer binary at %s: run `make build` first, or pass -c %s=<dir holding bootstrap>", filepath.Join(dir, "bootstrap"), CtxBootstrapDir)
	case err != nil:
		return fmt.Errorf("authorizer binary: %w", err)
	case fi.IsDir():
		return fmt.Errorf("%s is a directory, not the authorizer binary", filepath.Join(dir, "bootstrap"))
	}
	return nil
}

func contextString(app awscdk.App, key, def string) string {
	v := app.Node().TryGetContext(jsii.String(key))
	if s, ok := v.(string); ok && s != "" {
		return s
	}
	return def
}

// contextList accepts "a,b,c" (from -c) or a JSON list (from cdk.json).
func contextList(app awscdk.App, key string) []string {
	var out []string
	switch v := app.Node().TryGetContext(jsii.String(key)).(type) {
	case string:
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	case []any:
		for _, e := range v {
			if s, ok := e.(string); ok && s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}
