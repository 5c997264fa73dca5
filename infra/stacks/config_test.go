package stacks

import (
	"fmt"
	"github.com/sluicehq/sluice/infra/sluice"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
)

// validConfig is a defaulted config that passes Validate; each case below
// breaks one thing.
func validConfig() *Config {
	c := &Config{Regions: []string{"us-east-1", "eu-west-1"}, Rules: RulesConfig{Inline: "rules: []"}}
	c.ApplyDefaults()
	return c
}

func TestShippedConfigIsValid(t *testing.T) {
	c, err := LoadConfig("../sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	c.ApplyDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("sluice.json: %v", err)
	}
	if c.PrimaryRegion != "us-east-1" || len(c.Regions) != 3 || c.Consistency != ConsistencyDefault {
		t.Errorf("sluice.json: primary %s regions %v consistency %s", c.PrimaryRegion, c.Regions, c.Consistency)
	}
}

func TestDefaults(t *testing.T) {
	c := &Config{Regions: []string{"eu-west-1", "us-east-1"}, Rules: RulesConfig{Table: true}, API: APIConfig{RetryAfterSeconds: 60}}
	c.ApplyDefaults()
	checks := []struct {
		name      string
		got, want any
	}{
		{"account", c.Account, DummyAccount},
		{"primary", c.PrimaryRegion, "eu-west-1"},
		{"consistency", c.Consistency, ConsistencyDefault},
		{"table", c.TableName, "sluice-state"},
		{"rules table", c.RulesTableName(), "sluice-rules"},
		{"memcached", c.Memcached.Mode, MemcachedServerless},
		{"tls", *c.Memcached.TLS, true},
		{"deadline", c.Authorizer.Deadline, "250ms"},
		{"namespace", c.Authorizer.MetricsNamespace, "Sluice"},
		{"http api", *c.API.HTTPAPI, true},
		{"retain", *c.RetainTables, true},
		{"stack", c.StackName("us-east-1"), "Sluice-us-east-1"},
		{"replicas", strings.Join(c.ReplicaRegions(), ","), "us-east-1"},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s = %v, want %v", ck.name, ck.got, ck.want)
		}
	}
	if err := c.Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
}

func TestValidateRejects(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		want   string // in the error
	}{
		{"no regions", func(c *Config) { c.Regions = nil }, "regions: at least one"},
		{"bad region", func(c *Config) { c.Regions = append(c.Regions, "mars-1") }, `"mars-1" is not a region`},
		{"duplicate region", func(c *Config) { c.Regions = append(c.Regions, "us-east-1") }, "listed twice"},
		{"primary elsewhere", func(c *Config) { c.PrimaryRegion = "us-west-2" }, "primaryRegion"},
		{"bad consistency", func(c *Config) { c.Consistency = "strong" }, `"strong" is neither`},
		{"mrsc two regions", func(c *Config) { c.Consistency = ConsistencyMRSC }, "exactly three regions, got 2"},
		{"mrsc across sets", func(c *Config) {
			c.Consistency = ConsistencyMRSC
			c.Regions = []string{"us-east-1", "us-east-2", "eu-west-1"}
		}, "one region set"},
		{"mrsc four regions", func(c *Config) {
			c.Consistency = ConsistencyMRSC
			c.Regions = []string{"eu-west-1", "eu-west-2", "eu-west-3", "eu-central-1"}
		}, "exactly three regions, got 4"},
		{"bad account", func(c *Config) { c.Account = "1234" }, "account"},
		{"long prefix", func(c *Config) { c.StackPrefix = strings.Repeat("S", 31) }, "up to 30"},
		{"prefix hyphen", func(c *Config) { c.StackPrefix = "Sluice-" }, "must not end with '-'"},
		{"two rule sources", func(c *Config) { c.Rules.Inline = "rules: []"; c.Rules.Table = true }, "exactly one"},
		{"no rule source", func(c *Config) { c.Rules = RulesConfig{} }, "exactly one"},
		{"table without retry-after", func(c *Config) { c.Rules = RulesConfig{Table: true} }, "api.retryAfterSeconds: required with rules.table"},
		{"absolute bundle path", func(c *Config) { c.Rules.BundlePath = "/etc/rules.yaml" }, "rules.bundlePath"},
		{"memcached mode", func(c *Config) { c.Memcached.Mode = "redis" }, "memcached.mode"},
		{"too many nodes", func(c *Config) { c.Memcached.Mode = MemcachedNodes; c.Memcached.Nodes = 41 }, "memcached.nodes"},
		{"deadline too long", func(c *Config) { c.Authorizer.Deadline = "3s" }, "shorter than the function timeout"},
		{"deadline garbage", func(c *Config) { c.Authorizer.Deadline = "soon" }, "authorizer.deadline"},
		{"AWS namespace", func(c *Config) { c.Authorizer.MetricsNamespace = "AWS/Lambda" }, "metricsNamespace"},
		{"retention", func(c *Config) { c.Authorizer.LogRetentionDays = 10 }, "logRetentionDays"},
		{"stage name", func(c *Config) { c.API.StageName = "v1/prod" }, "api.stageName"},
		{"upstream", func(c *Config) { c.API.UpstreamURL = "ftp://x" }, "api.upstreamUrl"},
		{"waf region", func(c *Config) { c.API.WebACLArns = map[string]string{"us-west-2": "arn"} }, "api.webAclArns"},
		{"warm write below a new table's", func(c *Config) { c.TableThroughput.WarmWriteUnitsPerSecond = 3999 },
			"config: tableThroughput.warmWriteUnitsPerSecond: 3999 is below 4000, the write units a second a new on-demand table serves at once"},
		{"warm read below a new table's", func(c *Config) { c.TableThroughput.WarmReadUnitsPerSecond = 1000 },
			"config: tableThroughput.warmReadUnitsPerSecond: 1000 is below 12000"},
		{"negative max", func(c *Config) { c.TableThroughput.MaxWriteRequestUnits = -5 }, "config: tableThroughput.maxWriteRequestUnits: -5 is negative"},
		{"warm above max", func(c *Config) {
			c.TableThroughput = TableThroughputConfig{WarmReadUnitsPerSecond: 20000, MaxReadRequestUnits: 15000}
		}, "config: tableThroughput.warmReadUnitsPerSecond: 20000 is above MaxReadRequestUnits (15000)"},
		{"denied ratio", func(c *Config) { c.Alarms.DeniedRatio = 1.5 }, "alarms.deniedRatio"},
		{"topic region", func(c *Config) { c.Alarms.TopicArns = map[string]string{"sa-east-1": "arn"} }, "alarms.topicArns"},
		{"one zone", func(c *Config) { c.VPC.AvailabilityZones = map[string][]string{"us-east-1": {"us-east-1a"}} }, "at least 2 zones"},
		{"edge without a secret", func(c *Config) {
			c.Edge = &EdgeConfig{DomainName: "api.example.com", HostedZoneID: "Z0123", ZoneName: "example.com"}
		}, "edge: the secret shared by CloudFront and the authorizers is missing"},
		{"edge outside its zone", func(c *Config) {
			c.Edge = &EdgeConfig{DomainName: "api.example.org", HostedZoneID: "Z0123", ZoneName: "example.com", Secret: "s"}
		}, "edge.domainName"},
		{"edge zone id", func(c *Config) {
			c.Edge = &EdgeConfig{DomainName: "api.example.com", HostedZoneID: "example.com", ZoneName: "example.com", Secret: "s"}
		}, "edge.hostedZoneId"},
		{"foreign zone", func(c *Config) {
			c.VPC.AvailabilityZones = map[string][]string{"us-east-1": {"us-east-1a", "us-east-2b"}}
		}, `"us-east-2b" is not a zone of us-east-1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.modify(c)
			err := c.Validate()
			if err == nil {
				t.Fatalf("Validate() = nil, want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestValidateAcceptsMRSCRegionSets(t *testing.T) {
	for _, set := range mrscRegionSets {
		for _, regions := range [][]string{set[:3], {set[2], set[0], set[1]}} {
			c := validConfig()
			c.Regions, c.PrimaryRegion, c.Consistency = regions, regions[1], ConsistencyMRSC
			if err := c.Validate(); err != nil {
				t.Errorf("%v: %v", regions, err)
			}
		}
	}
}

func TestLoadConfigRejectsUnknownFields(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.json")
	if err := os.WriteFile(path, []byte(`{"regions": ["us-east-1"], "consistancy": "mrsc"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), "consistancy") {
		t.Errorf("LoadConfig = %v, want an unknown-field error naming consistancy", err)
	}
}

func TestRulesFileRelativeToConfig(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "sluice.json")
	if err := os.WriteFile(cfgPath, []byte(`{"regions": ["us-east-1"], "rules": {"file": "rules.yaml"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	// A relative rules.file is relative to the config file, not the cwd.
	if got := c.rules(nil); got.File != filepath.Join(dir, "rules.yaml") || got.YAML != "" || got.Table != nil {
		t.Errorf("rules() = %+v, want File %s", got, filepath.Join(dir, "rules.yaml"))
	}
}

func TestZones(t *testing.T) {
	tests := []struct {
		region string
		maxAZs int
		set    map[string][]string
		want   []string
	}{
		{"us-east-1", 2, nil, []string{"us-east-1a", "us-east-1b"}},
		{"eu-west-1", 3, nil, []string{"eu-west-1a", "eu-west-1b", "eu-west-1c"}},
		{"ap-northeast-1", 2, nil, []string{"ap-northeast-1a", "ap-northeast-1c"}},
		{"us-west-1", 3, nil, []string{"us-west-1b", "us-west-1c"}},
		{"us-west-2", 2, map[string][]string{"us-west-2": {"us-west-2c", "us-west-2d"}}, []string{"us-west-2c", "us-west-2d"}},
	}
	for _, tt := range tests {
		v := VPCConfig{MaxAZs: tt.maxAZs, AvailabilityZones: tt.set}
		if got := v.Zones(tt.region); !slices.Equal(got, tt.want) {
			t.Errorf("Zones(%s, max %d) = %v, want %v", tt.region, tt.maxAZs, got, tt.want)
		}
	}
}

// shedEnv is the SLUICE_SHED_* environment of a region's authorizer.
func shedEnv(c *Config, region string) map[string]string {
	env, err := c.Shedding.construct(region).Env(c.Memcached.Mode != MemcachedNone)
	if err != nil {
		panic(err)
	}
	return env
}

func TestShedding(t *testing.T) {
	// Off by default: no variable.
	c := validConfig()
	if c.Shedding.Enabled() || len(shedEnv(c, "us-east-1")) != 0 {
		t.Errorf("shedding on by default: %+v %v", c.Shedding, shedEnv(c, "us-east-1"))
	}

	// Defaults once on: the cache when there is one, else the state table.
	c = &Config{Regions: []string{"us-east-1"}, Rules: RulesConfig{Inline: "rules: []"}, Shedding: SheddingConfig{FleetCapacity: 100}}
	c.ApplyDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		config.EnvShedBackend: "memcached", config.EnvShedFleetCapacity: "100", config.EnvShedFleetReserve: "0.2",
		config.EnvShedFleetName: "fleet-eu-west-1", config.EnvShedLeaseTTL: "1s",
	}
	if got := shedEnv(c, "eu-west-1"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("shedEnv:\n got %v\nwant %v", got, want)
	}
	c = &Config{Regions: []string{"us-east-1"}, Memcached: MemcachedConfig{Mode: MemcachedNone}, Shedding: SheddingConfig{Utilization: "u"}}
	c.ApplyDefaults()
	want = map[string]string{config.EnvShedBackend: "dynamo", config.EnvShedUtilization: "u", config.EnvShedUtilizationMaxAge: "30s"}
	if got := shedEnv(c, "us-east-1"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("shedEnv without a cache:\n got %v\nwant %v", got, want)
	}

	zero := 0.0
	for _, tt := range []struct {
		name string
		sh   SheddingConfig
		mode string
		want string
	}{
		{"capacity", SheddingConfig{FleetCapacity: 1001}, "", "shedding.fleetCapacity"},
		{"negative capacity", SheddingConfig{FleetCapacity: -1, Utilization: "u"}, "", "shedding.fleetCapacity"},
		{"reserve", SheddingConfig{FleetCapacity: 10, FleetReserve: ptr(1.0)}, "", "shedding.fleetReserve"},
		{"share above the reserve", SheddingConfig{FleetCapacity: 10, FleetShares: map[string]float64{"high": 0.9}}, "", "shedding.fleetShares"},
		{"decreasing shares", SheddingConfig{FleetCapacity: 10, FleetReserve: &zero, FleetShares: map[string]float64{"low": 0.6, "normal": 0.5}}, "", "shedding.fleetShares"},
		{"critical share", SheddingConfig{FleetCapacity: 10, FleetShares: map[string]float64{"critical": 0.5}}, "", "critical traffic is never shed"},
		{"fleet name", SheddingConfig{FleetCapacity: 10, FleetName: "my fleet"}, "", "shedding.fleetName"},
		{"lease ttl", SheddingConfig{FleetCapacity: 10, LeaseTTL: "1h"}, "", "shedding.leaseTtl"},
		{"utilization name", SheddingConfig{Utilization: "a b"}, "", "shedding.utilization"},
		{"max age", SheddingConfig{Utilization: "u", UtilizationMaxAge: "old"}, "", "shedding.utilizationMaxAge"},
		{"memory", SheddingConfig{FleetCapacity: 10, Backend: "memory"}, "", "memory counts per Lambda container"},
		{"redis", SheddingConfig{FleetCapacity: 10, Backend: "redis"}, "", "shedding.backend"},
		{"memcached without a cache", SheddingConfig{FleetCapacity: 10, Backend: "memcached"}, MemcachedNone, "shedding.backend: config: SLUICE_SHED_BACKEND: memcached is not configured"},
		{"settings while off", SheddingConfig{Backend: "dynamo"}, "", "turn nothing on"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &Config{Regions: []string{"us-east-1"}, Rules: RulesConfig{Inline: "rules: []"}, Shedding: tt.sh, Memcached: MemcachedConfig{Mode: tt.mode}}
			c.ApplyDefaults()
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want %q", err, tt.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// The table's mode across regions, which decides whether a rule may be
// global: mrsc only.
func TestTableMode(t *testing.T) {
	for _, c := range []struct {
		regions     []string
		consistency string
		want        string
	}{
		{[]string{"us-east-1"}, ConsistencyDefault, sluice.TableRegional},
		{[]string{"us-east-1", "eu-west-1"}, ConsistencyDefault, sluice.TableEventual},
		{[]string{"us-east-1", "us-east-2", "us-west-2"}, ConsistencyMRSC, sluice.TableMRSC},
	} {
		cfg := Config{Regions: c.regions, Consistency: c.consistency}
		if got := cfg.tableMode(); got != c.want {
			t.Errorf("%v %s: %q, want %q", c.regions, c.consistency, got, c.want)
		}
	}
}
