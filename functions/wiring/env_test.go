package wiring

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/functions/authz"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseEnvDefaults(t *testing.T) {
	e, err := ParseEnv(envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if e.Deadline != 250*time.Millisecond || e.RulesTTL != time.Minute || e.DefaultBackend != BackendMemory ||
		e.HTTPResponses != authz.HTTPSimple || e.LogLevel != slog.LevelInfo || !e.TestClock.IsZero() {
		t.Errorf("defaults %+v", e)
	}
	e, err = ParseEnv(envOf(map[string]string{
		"SLUICE_MEMCACHED_ADDRS": " a:1, b:2 ,", "SLUICE_MEMCACHED_TLS": "true", "SLUICE_MEMCACHED_PROXY": "true", "SLUICE_DYNAMO_TABLE": "t",
		"SLUICE_DEADLINE": "100ms", "SLUICE_RULES_TTL": "5m", "AWS_LAMBDA_LOG_LEVEL": "debug", "SLUICE_HTTP_RESPONSES": "iam",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(e.MemcachedAddrs, ",") != "a:1,b:2" || !e.MemcachedTLS || !e.MemcachedProxy || e.DefaultBackend != BackendMemcached ||
		e.Deadline != 100*time.Millisecond || e.RulesTTL != 5*time.Minute || e.LogLevel != slog.LevelDebug || e.HTTPResponses != authz.HTTPIAM {
		t.Errorf("parsed %+v", e)
	}
	if e, _ := ParseEnv(envOf(map[string]string{"SLUICE_DYNAMO_TABLE": "t"})); e.DefaultBackend != BackendDynamo {
		t.Errorf("default backend with only a table: %q", e.DefaultBackend)
	}
}

func TestParseEnvErrors(t *testing.T) {
	for _, tt := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SLUICE_RULES_FILE": "a", "SLUICE_RULES_TABLE": "b"}, "at most one rules source"},
		{map[string]string{"SLUICE_DEADLINE": "fast"}, "SLUICE_DEADLINE"},
		{map[string]string{"SLUICE_DEADLINE": "-1s"}, "SLUICE_DEADLINE"},
		{map[string]string{"SLUICE_DEADLINE": "1m"}, "SLUICE_DEADLINE"},
		{map[string]string{"SLUICE_RULES_TTL": "0s"}, "SLUICE_RULES_TTL"},
		{map[string]string{"SLUICE_MEMCACHED_TLS": "maybe"}, "SLUICE_MEMCACHED_TLS"},
		{map[string]string{"SLUICE_MEMCACHED_PROXY": "maybe"}, "SLUICE_MEMCACHED_PROXY"},
		{map[string]string{"SLUICE_DEFAULT_BACKEND": "redis"}, "SLUICE_DEFAULT_BACKEND"},
		{map[string]string{"SLUICE_HTTP_RESPONSES": "xml"}, "SLUICE_HTTP_RESPONSES"},
		{map[string]string{"SLUICE_LOG_LEVEL": "loud"}, "SLUICE_LOG_LEVEL"},
		{map[string]string{"AWS_LAMBDA_LOG_LEVEL": "loud"}, "AWS_LAMBDA_LOG_LEVEL"},
		{map[string]string{"SLUICE_TEST_CLOCK": "yesterday"}, "SLUICE_TEST_CLOCK"},
	} {
		if _, err := ParseEnv(envOf(tt.env)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want %q", tt.env, err, tt.want)
		}
	}
}

func TestBuildErrors(t *testing.T) {
	for _, tt := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SLUICE_RULES_FILE": "/does/not/exist"}, "SLUICE_RULES_FILE"},
		{map[string]string{"SLUICE_RULES_YAML": "rules: [{name: x}]"}, `rule "x" (rules[0]): limits: required`},
		{map[string]string{"SLUICE_RULES_YAML": `rules: [{name: x, key: k, limits: [{algorithm: fixed_window, limit: 1, window: 1s, backend: memcached}]}]`}, `"memcached" is not configured`},
		{map[string]string{"SLUICE_DEFAULT_BACKEND": "dynamo"}, "SLUICE_DYNAMO_TABLE"},
	} {
		env, err := ParseEnv(envOf(tt.env))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Build(t.Context(), env, Outputs{}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want %q", tt.env, err, tt.want)
		}
	}
}

// TestCheckAWS: a DynamoDB table without a region or credentials is said
// in one line before anything is built; with both it passes; without a
// table nothing is asked.
func TestCheckAWS(t *testing.T) {
	noAWS(t)
	env := Env{DynamoTable: "sluice-state", Deadline: time.Second}
	if err := CheckAWS(t.Context(), Env{}, time.Second); err != nil {
		t.Errorf("no table: %v", err)
	}
	err := CheckAWS(t.Context(), env, time.Second)
	if err == nil || !strings.Contains(err.Error(), "no AWS region") || strings.Contains(err.Error(), "\n") {
		t.Errorf("no region: %v", err)
	}
	t.Setenv("AWS_REGION", "us-east-1")
	err = CheckAWS(t.Context(), env, time.Second)
	if err == nil || !strings.Contains(err.Error(), "no AWS credentials found") || strings.Contains(err.Error(), "\n") {
		t.Errorf("no credentials: %v", err)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "example")
	if err := CheckAWS(t.Context(), env, time.Second); err != nil {
		t.Errorf("with a region and keys: %v", err)
	}
}

// noAWS clears the AWS configuration the SDK would find: variables,
// shared files (HOME) and the instance metadata service.
func noAWS(t *testing.T) {
	t.Helper()
	for _, k := range []string{"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
		"AWS_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"} {
		t.Setenv(k, "")
	}
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/config")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/credentials")
}
