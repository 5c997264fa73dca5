package wiring

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// buildEnv builds a handler from environment variables (plus the frozen
// golden clock unless vars sets one), capturing metrics.
func buildEnv(t *testing.T, vars map[string]string) (*Built, *bytes.Buffer) {
	t.Helper()
	env, err := ParseEnv(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	var metrics bytes.Buffer
	b, err := Build(t.Context(), env, Outputs{Stdout: &metrics, Stderr: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b, &metrics
}

func requestTo(path string) []byte {
	return fmt.Appendf(nil, `{"type":"REQUEST","methodArn":"arn:aws:execute-api:us-east-1:1:api/prod/GET%s","httpMethod":"GET","path":%q,
		"requestContext":{"stage":"prod","identity":{"sourceIp":"192.0.2.10"}}}`, path, path)
}

const failModeRules = `
rules:
  - name: open
    match: {paths: ["/open"]}
    key: "{ip}"
    fail: open
    limits: [{algorithm: sliding_window, limit: 100, window: 1m, backend: memcached}]
  - name: closed
    match: {paths: ["/closed"]}
    key: "{ip}"
    fail: closed
    limits: [{algorithm: token_bucket, max_amount: 100, refill_time: 1s, backend: memcached}]
`

type emfLine struct {
	Rule                                                       string
	Allowed, Denied, Shed, FailOpen, FailClosed, BackendErrors int
}

func lastMetric(t *testing.T, metrics *bytes.Buffer) emfLine {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(metrics.String()), "\n")
	var m emfLine
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil {
		t.Fatalf("metric line %q: %v", lines[len(lines)-1], err)
	}
	return m
}

// checkFailModes asserts that with the memcached backend failing, the
// fail-open rule allows and the fail-closed rule denies, and the metric
// lines say so. wantErr, when not nil, is what the backend error must wrap.
func checkFailModes(t *testing.T, b *Built, metrics *bytes.Buffer, wantErr error) {
	t.Helper()
	ctx := context.Background()
	for _, tt := range []struct {
		path     string
		allowed  bool
		decision string
		metric   emfLine
	}{
		{"/open", true, authz.DecisionAllow, emfLine{Rule: "open", Allowed: 1, FailOpen: 1, BackendErrors: 1}},
		{"/closed", false, authz.DecisionDeny, emfLine{Rule: "closed", Denied: 1, FailClosed: 1, BackendErrors: 1}},
	} {
		start := time.Now()
		resp, res, err := b.Handler.Decide(ctx, requestTo(tt.path))
		elapsed := time.Since(start)
		if err != nil {
			t.Fatalf("%s: %v", tt.path, err)
		}
		t.Logf("%s: %s in %v (deadline %v)", tt.path, resp.AuthContext().Decision, elapsed, b.Env.Deadline)
		if resp.Allowed() != tt.allowed || resp.AuthContext().Decision != tt.decision {
			t.Errorf("%s: allowed=%v %+v", tt.path, resp.Allowed(), resp.AuthContext())
		}
		if len(res.Evals) != 1 || !res.Evals[0].Failed {
			t.Fatalf("%s: evals %+v; want one failed rule", tt.path, res.Evals)
		}
		if wantErr != nil && !errors.Is(res.Evals[0].Err, wantErr) {
			t.Errorf("%s: backend error %v does not wrap %v", tt.path, res.Evals[0].Err, wantErr)
		}
		if got := lastMetric(t, metrics); got != tt.metric {
			t.Errorf("%s: metric line %+v, want %+v", tt.path, got, tt.metric)
		}
	}
}

// TestFailModesMemcachedStopped stops a private memcached under a running
// authorizer.
func TestFailModesMemcachedStopped(t *testing.T) {
	srv := testserver.StartMemcached(t)
	b, metrics := buildEnv(t, map[string]string{
		"SLUICE_MEMCACHED_ADDRS": srv.Addr(),
		"SLUICE_RULES_YAML":      failModeRules,
		"SLUICE_DEADLINE":        "250ms",
	})
	// Up: both allow, no failure.
	for _, path := range []string{"/open", "/closed"} {
		resp, res, err := b.Handler.Decide(t.Context(), requestTo(path))
		if err != nil || !resp.Allowed() || res.Evals[0].Failed {
			t.Fatalf("%s with memcached up: %+v %+v %v", path, resp, res.Evals, err)
		}
	}
	srv.Stop()
	checkFailModes(t, b, metrics, nil)
	// Back up: the same process recovers. On a loaded machine the first
	// decision may still spend its deadline reconnecting, so allow a few.
	srv.Restart()
	for attempt := 1; ; attempt++ {
		resp, res, err := b.Handler.Decide(t.Context(), requestTo("/closed"))
		if err == nil && resp.Allowed() && !res.Evals[0].Failed {
			break
		}
		if attempt == 20 {
			t.Fatalf("after restart, %d decisions failed; last: %+v %+v %v", attempt, resp, res.Evals, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFailModesHungBackend points the authorizer at a server that accepts
// connections and never answers: the deadline, not the backend, ends the
// decision.
func TestFailModesHungBackend(t *testing.T) {
	b, metrics := buildEnv(t, map[string]string{
		"SLUICE_MEMCACHED_ADDRS": testserver.Hung(t),
		"SLUICE_RULES_YAML":      failModeRules,
		"SLUICE_DEADLINE":        "100ms",
	})
	checkFailModes(t, b, metrics, context.DeadlineExceeded)
}

// TestFailModesUnreachable uses an address where nothing listens.
func TestFailModesUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	b, metrics := buildEnv(t, map[string]string{
		"SLUICE_MEMCACHED_ADDRS": addr,
		"SLUICE_RULES_YAML":      failModeRules,
	})
	checkFailModes(t, b, metrics, nil)
}

// TestMemcachedBackend runs N+1 requests against a rule of N on the shared
// memcached, through the default backend.
func TestMemcachedBackend(t *testing.T) {
	addr := testserver.Memcached(t)
	rules := fmt.Sprintf(`rules: [{name: mc-%d, key: "{ip}", limits: [{algorithm: sliding_window, limit: 3, window: 1m}, {algorithm: token_bucket, max_amount: 5, refill_time: 1m}]}]`, time.Now().UnixNano())
	b, _ := buildEnv(t, map[string]string{"SLUICE_MEMCACHED_ADDRS": addr, "SLUICE_RULES_YAML": rules})
	if b.Env.DefaultBackend != BackendMemcached {
		t.Fatalf("default backend %q", b.Env.DefaultBackend)
	}
	checkNPlusOne(t, b, 3)
}

// checkNPlusOne sends n+1 requests: n pass, the last is denied, and nothing
// fails.
func checkNPlusOne(t *testing.T, b *Built, n int) {
	t.Helper()
	for i := 0; i <= n; i++ {
		resp, res, err := b.Handler.Decide(t.Context(), requestTo("/x"))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range res.Evals {
			if e.Err != nil {
				t.Fatalf("request %d: backend error %v", i+1, e.Err)
			}
		}
		if want := i < n; resp.Allowed() != want {
			t.Fatalf("request %d: allowed=%v, want %v (%+v)", i+1, resp.Allowed(), want, resp.AuthContext())
		}
	}
}

// dynamoEnv points the AWS SDK at the shared DynamoDB Local.
func dynamoEnv(t *testing.T) *dynamodb.Client {
	t.Helper()
	sdkEnv(t, testserver.DynamoDB(t))
	cfg, err := config.LoadDefaultConfig(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return dynamodb.NewFromConfig(cfg)
}

// sdkEnv points the AWS SDK, as the authorizer loads it, at the DynamoDB
// Local at endpoint, with dummy credentials and no shared config files.
func sdkEnv(t *testing.T, endpoint string) {
	t.Helper()
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", endpoint)
	t.Setenv("AWS_ACCESS_KEY_ID", "local")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "local")
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
}

func TestDynamoBackend(t *testing.T) {
	client := dynamoEnv(t)
	table := fmt.Sprintf("sluice-wiring-state-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, client, table); err != nil {
		t.Fatal(err)
	}
	rules := `rules: [{name: ddb, key: "{ip}", limits: [{algorithm: token_bucket, max_amount: 4, refill_time: 1m}, {algorithm: sliding_window, limit: 10, window: 1m}]}]`
	b, _ := buildEnv(t, map[string]string{"SLUICE_DYNAMO_TABLE": table, "SLUICE_RULES_YAML": rules, "SLUICE_DEADLINE": "2s"})
	if b.Env.DefaultBackend != BackendDynamo {
		t.Fatalf("default backend %q", b.Env.DefaultBackend)
	}
	checkNPlusOne(t, b, 4)
}

func createRulesTable(t *testing.T, client *dynamodb.Client) string {
	t.Helper()
	table := fmt.Sprintf("sluice-wiring-rules-%d", time.Now().UnixNano())
	_, err := client.CreateTable(t.Context(), &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("name"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("name"), KeyType: types.KeyTypeHash}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return table
}

func putRule(t *testing.T, client *dynamodb.Client, table, name, body string, order int) {
	t.Helper()
	item := map[string]types.AttributeValue{
		"name": &types.AttributeValueMemberS{Value: name},
		"rule": &types.AttributeValueMemberS{Value: body},
	}
	if order >= 0 {
		item["order"] = &types.AttributeValueMemberN{Value: fmt.Sprint(order)}
	}
	if _, err := client.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String(table), Item: item}); err != nil {
		t.Fatal(err)
	}
}

// TestRulesTable loads rules from a DynamoDB table, through the
// environment, and reloads them in the background once the TTL passed.
func TestRulesTable(t *testing.T) {
	client := dynamoEnv(t)
	table := createRulesTable(t, client)
	putRule(t, client, table, "zeta", `{key: "{ip}", limits: [{algorithm: fixed_window, limit: 2, window: 1m}]}`, 1)
	putRule(t, client, table, "alpha", "key: \"{ip}\"\nlimits:\n  - {algorithm: fixed_window, limit: 5, window: 1m}\n", 2)
	putRule(t, client, table, "unordered", `{"key": "all", "limits": [{"algorithm": "token_bucket", "max_amount": 9, "refill_time": "1s"}]}`, -1)

	rules, err := LoadRulesTable(t.Context(), client, table)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rules {
		names = append(names, r.Name)
	}
	if got := strings.Join(names, ","); got != "zeta,alpha,unordered" {
		t.Errorf("rules %q, want ordered by the order attribute, unordered last", got)
	}

	// Through the environment: SLUICE_RULES_TABLE.
	b, _ := buildEnv(t, map[string]string{"SLUICE_RULES_TABLE": table})
	if b.Rules != "table "+table {
		t.Errorf("rules source %q", b.Rules)
	}
	checkNPlusOne(t, b, 2) // zeta: 2 a minute

	// The cache reloads after its TTL (on a fake clock) and a failed load
	// keeps the previous rules.
	now := time.Unix(1e9, 0)
	var mu sync.Mutex
	clock := limiter.ClockFunc(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	stores := map[string]storage.Store{"memory": b.Stores["memory"]}
	var loadErrs []error
	cache, err := policy.NewCache(t.Context(), func(ctx context.Context) (*policy.Policy, error) {
		rules, err := LoadRulesTable(ctx, client, table)
		if err != nil {
			return nil, err
		}
		return policy.New(rules, policy.Options{Stores: stores})
	}, policy.CacheConfig{TTL: time.Minute, Clock: clock, OnError: func(err error) { loadErrs = append(loadErrs, err) }})
	if err != nil {
		t.Fatal(err)
	}
	putRule(t, client, table, "beta", `{key: "{ip}", limits: [{algorithm: fixed_window, limit: 1, window: 1m}]}`, 0)
	if got := strings.Join(cache.Policy().Rules(), ","); got != "zeta,alpha,unordered" {
		t.Errorf("before the TTL: %q", got)
	}
	cache.Wait()
	advance(time.Minute)
	cache.Policy() // starts the reload
	cache.Wait()
	if got := strings.Join(cache.Policy().Rules(), ","); got != "beta,zeta,alpha,unordered" {
		t.Errorf("after the TTL: %q", got)
	}
	putRule(t, client, table, "broken", `{key: "{ip}", limits: [{algorithm: fixed_window, limit: -1, window: 1m}]}`, 5)
	advance(time.Minute)
	cache.Policy()
	cache.Wait()
	if got := strings.Join(cache.Policy().Rules(), ","); got != "beta,zeta,alpha,unordered" {
		t.Errorf("after a failed reload: %q", got)
	}
	if len(loadErrs) != 1 || !strings.Contains(loadErrs[0].Error(), `item "broken"`) || !strings.Contains(loadErrs[0].Error(), "limit: -1") {
		t.Errorf("load errors %v", loadErrs)
	}
	if st := cache.Stats(); st.Loads != 2 || st.Failures != 1 {
		t.Errorf("stats %+v", st)
	}

	// At start-up, an invalid item fails the build with its name.
	env, _ := ParseEnv(func(k string) string { return map[string]string{"SLUICE_RULES_TABLE": table}[k] })
	if _, err := Build(t.Context(), env, Outputs{Stdout: io.Discard, Stderr: io.Discard}); err == nil ||
		!strings.Contains(err.Error(), `item "broken"`) {
		t.Errorf("build with a broken rule: %v", err)
	}
}
