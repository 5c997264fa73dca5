package sluice_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2integrations"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/infra/sluice"
	"github.com/sluicehq/sluice/policy"
)

// Synthesis goes through jsii and node, so the test binary builds one app
// once and every test reads its templates. Its stacks are a user's stacks:
//
//   - RestUser: a REST API (GET and POST /pets, CORS preflight, a method
//     added after New), the construct with its defaults (a VPC, a
//     serverless cache, a table), inline rules, the fleet shedder;
//   - Unprotected: the same REST API without the construct;
//   - HttpUser: an HTTP API with two routes, only one of them listed in
//     Routes, no cache (no VPC), the user's state table, rules from the
//     user's rules table;
//   - RestExplicit: a REST API with three methods, one listed in Methods,
//     one behind IAM; the user's VPC and memcached; a pre-warmed table
//     with a maximum throughput.
const (
	account = "111111111111"
	region  = "us-east-1"
)

var env = &awscdk.Environment{Account: jsii.String(account), Region: jsii.String(region)}

const rulesYAML = `rules:
  - name: per-ip
    key: "{ip}"
    limits:
      - name: per-minute
        algorithm: sliding_window
        limit: 600
        window: 1m
      - name: burst
        algorithm: token_bucket
        max_amount: 50
        refill_time: 100ms
`

type stack struct {
	stack    awscdk.Stack
	template assertions.Template
	res      map[string]resource
	limiter  *sluice.RateLimiter
}

type resource struct {
	Type       string         `json:"Type"`
	Properties map[string]any `json:"Properties"`
	DependsOn  any            `json:"DependsOn"`
}

var (
	synthOnce sync.Once
	synthErr  error
	stacks    map[string]*stack
	tmpRoot   string
	bootDir   string
)

func TestMain(m *testing.M) {
	var err error
	tmpRoot, err = os.MkdirTemp("", "sluice-construct-test-")
	if err != nil {
		panic(err)
	}
	// A dummy authorizer: tests never depend on a real build.
	bootDir = filepath.Join(tmpRoot, "authorizer")
	if err := os.MkdirAll(bootDir, 0o755); err != nil {
		panic(err)
	}
	if err := os.WriteFile(filepath.Join(bootDir, "bootstrap"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(tmpRoot)
	jsii.Close()
	os.Exit(code)
}

func synth(t *testing.T) map[string]*stack {
	t.Helper()
	synthOnce.Do(func() { stacks, synthErr = synthesize() })
	if synthErr != nil {
		t.Fatalf("synthesis: %v", synthErr)
	}
	return stacks
}

// petsAPI is a user's REST API.
func petsAPI(s awscdk.Stack) awsapigateway.RestApi {
	api := awsapigateway.NewRestApi(s, jsii.String("PetsApi"), nil)
	pets := api.Root().AddResource(jsii.String("pets"), &awsapigateway.ResourceOptions{
		DefaultCorsPreflightOptions: &awsapigateway.CorsOptions{AllowOrigins: awsapigateway.Cors_ALL_ORIGINS()},
	})
	pets.AddMethod(jsii.String("GET"), nil, nil)
	pets.AddMethod(jsii.String("POST"), nil, nil)
	return api
}

func synthesize() (_ map[string]*stack, err error) {
	defer func() {
		if r := recover(); r != nil { // jsii reports errors as panics
			err = fmt.Errorf("%v", r)
		}
	}()
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(filepath.Join(tmpRoot, "out"))})
	out := map[string]*stack{}

	// RestUser.
	s := awscdk.NewStack(app, jsii.String("RestUser"), &awscdk.StackProps{Env: env})
	api := petsAPI(s)
	reserve := 0.1
	rl := sluice.New(s, "RateLimit", &sluice.Props{
		RestAPI:      api,
		BootstrapDir: bootDir,
		Rules:        sluice.Rules{YAML: rulesYAML},
		VPCZones:     []string{"us-east-1a", "us-east-1b"},
		Shedding:     sluice.Shedding{FleetCapacity: 50, FleetReserve: &reserve, LeaseTTL: 2500 * time.Millisecond},
	})
	// A method added after the construct is protected too.
	api.Root().AddResource(jsii.String("late"), nil).AddMethod(jsii.String("PUT"), nil, nil)
	out["RestUser"] = &stack{stack: s, limiter: rl}

	// Unprotected.
	s = awscdk.NewStack(app, jsii.String("Unprotected"), &awscdk.StackProps{Env: env})
	petsAPI(s).Root().AddResource(jsii.String("late"), nil).AddMethod(jsii.String("PUT"), nil, nil)
	out["Unprotected"] = &stack{stack: s}

	// HttpUser.
	s = awscdk.NewStack(app, jsii.String("HttpUser"), &awscdk.StackProps{Env: env})
	httpAPI := awsapigatewayv2.NewHttpApi(s, jsii.String("ItemsApi"), nil)
	integration := awsapigatewayv2integrations.NewHttpUrlIntegration(jsii.String("Items"), jsii.String("https://items.example.com"), nil)
	items := httpAPI.AddRoutes(&awsapigatewayv2.AddRoutesOptions{Path: jsii.String("/items"), Integration: integration,
		Methods: &[]awsapigatewayv2.HttpMethod{awsapigatewayv2.HttpMethod_GET}})
	httpAPI.AddRoutes(&awsapigatewayv2.AddRoutesOptions{Path: jsii.String("/health"), Integration: integration,
		Methods: &[]awsapigatewayv2.HttpMethod{awsapigatewayv2.HttpMethod_GET}})
	state := awsdynamodb.NewTableV2(s, jsii.String("MyState"), &awsdynamodb.TablePropsV2{
		PartitionKey: &awsdynamodb.Attribute{Name: jsii.String(sluice.StatePartitionKey), Type: awsdynamodb.AttributeType_STRING},
	})
	rulesTable := awsdynamodb.NewTableV2(s, jsii.String("MyRules"), &awsdynamodb.TablePropsV2{
		PartitionKey: &awsdynamodb.Attribute{Name: jsii.String(sluice.RulesPartitionKey), Type: awsdynamodb.AttributeType_STRING},
	})
	rl = sluice.New(s, "RateLimit", &sluice.Props{
		HTTPAPI:      httpAPI,
		Routes:       *items,
		BootstrapDir: bootDir,
		Rules:        sluice.Rules{Table: rulesTable, TableTTL: 5 * time.Minute},
		Cache:        &sluice.Cache{Mode: sluice.CacheNone},
		Table:        state,
		Shedding:     sluice.Shedding{Utilization: "orders"},
	})
	out["HttpUser"] = &stack{stack: s, limiter: rl}

	// RestExplicit.
	s = awscdk.NewStack(app, jsii.String("RestExplicit"), &awscdk.StackProps{Env: env})
	api = awsapigateway.NewRestApi(s, jsii.String("Api"), nil)
	a := api.Root().AddResource(jsii.String("a"), nil).AddMethod(jsii.String("GET"), nil, nil)
	api.Root().AddResource(jsii.String("b"), nil).AddMethod(jsii.String("GET"), nil, nil)
	api.Root().AddResource(jsii.String("admin"), nil).AddMethod(jsii.String("GET"), nil,
		&awsapigateway.MethodOptions{AuthorizationType: awsapigateway.AuthorizationType_IAM})
	vpc := awsec2.NewVpc(s, jsii.String("MyVpc"), &awsec2.VpcProps{
		AvailabilityZones: jsii.Strings("us-east-1a", "us-east-1b"),
		NatGateways:       jsii.Number(1),
	})
	cacheSG := awsec2.NewSecurityGroup(s, jsii.String("MyCacheSG"), &awsec2.SecurityGroupProps{Vpc: vpc, AllowAllOutbound: jsii.Bool(false)})
	rl = sluice.New(s, "RateLimit", &sluice.Props{
		RestAPI:      api,
		Methods:      []awsapigateway.Method{a},
		BootstrapDir: bootDir,
		Rules:        sluice.Rules{YAML: rulesYAML},
		VPC:          vpc,
		Cache:        &sluice.Cache{Mode: sluice.CacheExisting, Addrs: "mc1.internal:11211,mc2.internal:11211", SecurityGroup: cacheSG, TLS: jsii.Bool(false)},
		RetryAfter:   5 * time.Second,
		Function:     sluice.Function{Deadline: 400 * time.Millisecond, MetricsNamespace: "Pets", LogicalID: "PetsLimiter"},
		Alarms:       sluice.Alarms{Topic: awssns.NewTopic(s, jsii.String("Ops"), nil)},
		TableThroughput: sluice.TableThroughput{
			WarmReadUnitsPerSecond: 24000, WarmWriteUnitsPerSecond: 8000,
			MaxReadRequestUnits: 30000, MaxWriteRequestUnits: 10000,
		},
	})
	out["RestExplicit"] = &stack{stack: s, limiter: rl}

	for _, st := range out {
		st.template = assertions.Template_FromStack(st.stack, nil)
		b, err := json.Marshal(st.template.ToJSON())
		if err != nil {
			return nil, err
		}
		var doc struct{ Resources map[string]resource }
		if err := json.Unmarshal(b, &doc); err != nil {
			return nil, err
		}
		st.res = doc.Resources
	}
	return out, nil
}

func (s *stack) ofType(typ string) map[string]resource {
	out := map[string]resource{}
	for id, r := range s.res {
		if r.Type == typ {
			out[id] = r
		}
	}
	return out
}

func (s *stack) one(t *testing.T, typ string) (string, resource) {
	t.Helper()
	rs := s.ofType(typ)
	if len(rs) != 1 {
		t.Fatalf("%d resources of type %s, want 1", len(rs), typ)
	}
	for id, r := range rs {
		return id, r
	}
	panic("unreachable")
}

// assertMatches runs a CDK assertion, turning its panic into a test error.
func assertMatches(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%v", r)
		}
	}()
	f()
}

// render flattens CloudFormation intrinsics into a readable string.
func render(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return ""
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = render(e)
		}
		return "[" + strings.Join(parts, " ") + "]"
	case map[string]any:
		if j, ok := v["Fn::Join"].([]any); ok && len(j) == 2 {
			sep, _ := j[0].(string)
			items, _ := j[1].([]any)
			parts := make([]string, len(items))
			for i, e := range items {
				parts[i] = render(e)
			}
			return strings.Join(parts, sep)
		}
		if r, ok := v["Ref"].(string); ok {
			if strings.HasPrefix(r, "AWS::") {
				return "${" + r + "}"
			}
			return "${Ref:" + r + "}"
		}
		if g, ok := v["Fn::GetAtt"].([]any); ok && len(g) == 2 {
			return "${" + render(g[0]) + "." + render(g[1]) + "}"
		}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func refID(v any) string {
	m, ok := v.(map[string]any)
	if !ok {
		return ""
	}
	if r, ok := m["Ref"].(string); ok {
		return r
	}
	if g, ok := m["Fn::GetAtt"].([]any); ok && len(g) == 2 {
		id, _ := g[0].(string)
		return id
	}
	return ""
}

func asList(v any) []any {
	switch v := v.(type) {
	case []any:
		return v
	case nil:
		return nil
	}
	return []any{v}
}

// methods maps "VERB /path" (from the logical id's resource) to the
// method's properties.
func (s *stack) methods() map[string]map[string]any {
	paths := map[string]string{}
	for id, r := range s.ofType("AWS::ApiGateway::Resource") {
		paths[id] = render(r.Properties["PathPart"])
	}
	out := map[string]map[string]any{}
	for _, m := range s.ofType("AWS::ApiGateway::Method") {
		path := "/" + paths[refID(m.Properties["ResourceId"])]
		out[render(m.Properties["HttpMethod"])+" "+path] = m.Properties
	}
	return out
}

func functionEnv(t *testing.T, s *stack) map[string]string {
	t.Helper()
	_, fn := s.one(t, "AWS::Lambda::Function")
	env := map[string]string{}
	if e, ok := fn.Properties["Environment"].(map[string]any); ok {
		for k, v := range e["Variables"].(map[string]any) {
			env[k] = render(v)
		}
	}
	return env
}

// --- the construct on a REST API ----------------------------------------

func TestRESTAuthorizerAttached(t *testing.T) {
	s := synth(t)["RestUser"]
	authID, auth := s.one(t, "AWS::ApiGateway::Authorizer")
	p := auth.Properties
	if ttl, ok := p["AuthorizerResultTtlInSeconds"]; !ok || ttl != float64(0) {
		t.Errorf("AuthorizerResultTtlInSeconds = %v (set: %v), want an explicit 0", ttl, ok)
	}
	if p["Type"] != "REQUEST" || p["IdentitySource"] != sluice.IdentitySource {
		t.Errorf("authorizer %v %v, want REQUEST on %s", p["Type"], p["IdentitySource"], sluice.IdentitySource)
	}
	fnID, _ := s.one(t, "AWS::Lambda::Function")
	if uri := render(p["AuthorizerUri"]); !strings.Contains(uri, "${"+fnID+".Arn}") || !strings.HasSuffix(uri, "/invocations") {
		t.Errorf("authorizer invokes %s, want the function %s", uri, fnID)
	}
	assertMatches(t, func() {
		s.template.HasResourceProperties(jsii.String("AWS::ApiGateway::Authorizer"), map[string]any{
			"AuthorizerResultTtlInSeconds": 0, "Type": "REQUEST",
		})
	})

	// Every method but CORS preflight, including the one added after New.
	got := map[string]string{}
	for name, m := range s.methods() {
		got[name] = render(m["AuthorizationType"]) + " " + refID(m["AuthorizerId"])
	}
	custom := "CUSTOM " + authID
	want := map[string]string{"GET /pets": custom, "POST /pets": custom, "PUT /late": custom, "OPTIONS /pets": "NONE "}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("methods:\n got %v\nwant %v", got, want)
	}

	// API Gateway may invoke the function for this authorizer only.
	_, perm := s.one(t, "AWS::Lambda::Permission")
	if src := render(perm.Properties["SourceArn"]); perm.Properties["Principal"] != "apigateway.amazonaws.com" ||
		!strings.HasSuffix(src, "/authorizers/${Ref:"+authID+"}") || !strings.Contains(src, ":execute-api:") {
		t.Errorf("permission %v from %s", perm.Properties["Principal"], src)
	}
}

// A deployed stage keeps serving its deployment until a new one: the
// deployment's logical id must change when methods are put behind the
// authorizer.
func TestRESTDeploymentChanges(t *testing.T) {
	ids := map[string]string{}
	for _, name := range []string{"RestUser", "Unprotected"} {
		id, _ := synth(t)[name].one(t, "AWS::ApiGateway::Deployment")
		ids[name] = id
	}
	if ids["RestUser"] == ids["Unprotected"] {
		t.Errorf("deployment %s is the same with and without the authorizer", ids["RestUser"])
	}
}

func TestRESTGatewayResponses(t *testing.T) {
	s := synth(t)["RestUser"]
	byType := map[string]map[string]any{}
	for _, r := range s.ofType("AWS::ApiGateway::GatewayResponse") {
		byType[render(r.Properties["ResponseType"])] = r.Properties
	}
	headers := func(p map[string]any) map[string]string {
		out := map[string]string{}
		for k, v := range p["ResponseParameters"].(map[string]any) {
			out[strings.TrimPrefix(k, "gatewayresponse.header.")] = render(v)
		}
		return out
	}
	// Derived from the rules: the one-minute window, never one second.
	for typ, want := range map[string]struct {
		status, retryAfter string
	}{
		"ACCESS_DENIED":                  {"429", "'60'"},
		"AUTHORIZER_FAILURE":             {"503", "'3'"}, // the 2.5 s lease, rounded up
		"AUTHORIZER_CONFIGURATION_ERROR": {"503", "'3'"},
		"THROTTLED":                      {"429", "'1'"},
	} {
		p, ok := byType[typ]
		if !ok {
			t.Errorf("no %s gateway response", typ)
			continue
		}
		if p["StatusCode"] != want.status || headers(p)["Retry-After"] != want.retryAfter {
			t.Errorf("%s: %v Retry-After %s, want %s %s", typ, p["StatusCode"], headers(p)["Retry-After"], want.status, want.retryAfter)
		}
	}
	if len(byType) != 4 {
		t.Errorf("%d gateway responses, want 4 (UNAUTHORIZED stays 401)", len(byType))
	}
	var body map[string]string
	if err := json.Unmarshal([]byte(render(byType["ACCESS_DENIED"]["ResponseTemplates"].(map[string]any)["application/json"])), &body); err != nil {
		t.Fatalf("429 body: %v", err)
	}
	for _, k := range sluice.ContextKeys {
		if body[k] != "$context.authorizer."+k {
			t.Errorf("429 body %s = %q", k, body[k])
		}
	}
	if h := headers(byType["ACCESS_DENIED"]); h["RateLimit-Limit"] != "" {
		t.Errorf("429 has RateLimit-Limit %q without ContextHeaders", h["RateLimit-Limit"])
	}
	if d, src := s.limiter.RetryAfter(); d != time.Minute || !strings.Contains(src, `"per-minute"`) {
		t.Errorf("RetryAfter() = %v from %s", d, src)
	}
}

func TestRESTGrantsLeastPrivilege(t *testing.T) {
	s := synth(t)["RestUser"]
	tableID, table := s.one(t, "AWS::DynamoDB::GlobalTable")
	if render(table.Properties["KeySchema"]) != `[{"AttributeName":"pk","KeyType":"HASH"}]` ||
		render(table.Properties["TimeToLiveSpecification"]) != `{"AttributeName":"ttl","Enabled":true}` ||
		table.Properties["BillingMode"] != "PAY_PER_REQUEST" {
		t.Errorf("created table %v", table.Properties)
	}
	statements := grants(t, s)
	want := []string{
		"[dynamodb:GetItem dynamodb:UpdateItem] on [${" + tableID + ".Arn}]",
		"[ec2:AssignPrivateIpAddresses ec2:CreateNetworkInterface ec2:DeleteNetworkInterface ec2:DescribeNetworkInterfaces ec2:DescribeSubnets ec2:UnassignPrivateIpAddresses] on [*]",
		"[logs:CreateLogStream logs:PutLogEvents] on [${" + logGroup(t, s) + ".Arn}]",
	}
	if !slices.Equal(statements, want) {
		t.Errorf("grants:\n%s\nwant:\n%s", strings.Join(statements, "\n"), strings.Join(want, "\n"))
	}
	// The created VPC's gateway endpoint allows the same on DynamoDB.
	_, ep := s.one(t, "AWS::EC2::VPCEndpoint")
	var epGrants []string
	for _, st := range asList(ep.Properties["PolicyDocument"].(map[string]any)["Statement"]) {
		m := st.(map[string]any)
		epGrants = append(epGrants, render(sorted(m["Action"]))+" on "+render(sorted(m["Resource"])))
	}
	if want := []string{"[dynamodb:GetItem dynamodb:UpdateItem] on [${" + tableID + ".Arn}]"}; !slices.Equal(epGrants, want) {
		t.Errorf("endpoint policy %v, want %v", epGrants, want)
	}
	// The cache: reachable from the function's security group only.
	_, cache := s.one(t, "AWS::ElastiCache::ServerlessCache")
	cacheSG := refID(asList(cache.Properties["SecurityGroupIds"])[0])
	_, fn := s.one(t, "AWS::Lambda::Function")
	fnSG := refID(asList(fn.Properties["VpcConfig"].(map[string]any)["SecurityGroupIds"])[0])
	var ingress []string
	for _, r := range s.ofType("AWS::EC2::SecurityGroupIngress") {
		ingress = append(ingress, refID(r.Properties["GroupId"])+" from "+refID(r.Properties["SourceSecurityGroupId"])+fmt.Sprintf(" %v", r.Properties["FromPort"]))
	}
	if want := []string{cacheSG + " from " + fnSG + " 11211"}; !slices.Equal(ingress, want) {
		t.Errorf("ingress %v, want %v", ingress, want)
	}
}

// grants lists the statements of the function role's policies, sorted.
func grants(t *testing.T, s *stack) []string {
	t.Helper()
	_, fn := s.one(t, "AWS::Lambda::Function")
	role := refID(fn.Properties["Role"])
	var out []string
	for _, r := range s.ofType("AWS::IAM::Policy") {
		if !slices.ContainsFunc(asList(r.Properties["Roles"]), func(v any) bool { return refID(v) == role }) {
			continue
		}
		for _, st := range asList(r.Properties["PolicyDocument"].(map[string]any)["Statement"]) {
			m := st.(map[string]any)
			if m["Effect"] != "Allow" || m["NotAction"] != nil || m["NotResource"] != nil {
				t.Errorf("statement %v", m)
			}
			out = append(out, render(sorted(m["Action"]))+" on "+render(sorted(m["Resource"])))
		}
	}
	sort.Strings(out)
	return out
}

func sorted(v any) []any {
	l := slices.Clone(asList(v))
	sort.Slice(l, func(i, j int) bool { return render(l[i]) < render(l[j]) })
	return l
}

func logGroup(t *testing.T, s *stack) string {
	t.Helper()
	_, fn := s.one(t, "AWS::Lambda::Function")
	return refID(fn.Properties["LoggingConfig"].(map[string]any)["LogGroup"])
}

func TestRESTEnvironment(t *testing.T) {
	s := synth(t)["RestUser"]
	env := functionEnv(t, s)
	cacheID, _ := s.one(t, "AWS::ElastiCache::ServerlessCache")
	tableID, _ := s.one(t, "AWS::DynamoDB::GlobalTable")
	want := map[string]string{
		config.EnvRulesYAML:         rulesYAML,
		config.EnvDynamoTable:       "${Ref:" + tableID + "}",
		config.EnvDeadline:          config.DefaultDeadline.String(),
		config.EnvMetricsNamespace:  config.DefaultMetricsNamespace,
		config.EnvMemcachedAddrs:    "${" + cacheID + ".Endpoint.Address}:${" + cacheID + ".Endpoint.Port}",
		config.EnvMemcachedTLS:      "true",
		config.EnvMemcachedProxy:    "true",
		config.EnvShedBackend:       "memcached",
		config.EnvShedFleetCapacity: "50",
		config.EnvShedFleetReserve:  "0.1",
		config.EnvShedFleetName:     config.DefaultShedFleetName,
		config.EnvShedLeaseTTL:      "2.5s",
	}
	if fmt.Sprint(env) != fmt.Sprint(want) {
		t.Errorf("environment:\n got %v\nwant %v", env, want)
	}
	// What the authorizer will read: the same parser.
	if _, err := config.Parse(func(k string) string { return env[k] }); err != nil {
		t.Errorf("the authorizer would refuse its environment: %v", err)
	}
	_, fn := s.one(t, "AWS::Lambda::Function")
	if fn.Properties["Runtime"] != "provided.al2023" || render(fn.Properties["Architectures"]) != "[arm64]" || fn.Properties["Handler"] != "bootstrap" {
		t.Errorf("function %v %v %v", fn.Properties["Runtime"], fn.Properties["Architectures"], fn.Properties["Handler"])
	}
}

// --- the construct on an HTTP API ---------------------------------------

func TestHTTPAuthorizerAttached(t *testing.T) {
	s := synth(t)["HttpUser"]
	authID, auth := s.one(t, "AWS::ApiGatewayV2::Authorizer")
	p := auth.Properties
	if ttl, ok := p["AuthorizerResultTtlInSeconds"]; !ok || ttl != float64(0) {
		t.Errorf("AuthorizerResultTtlInSeconds = %v (set: %v), want an explicit 0", ttl, ok)
	}
	if p["AuthorizerType"] != "REQUEST" || p["EnableSimpleResponses"] != true || p["AuthorizerPayloadFormatVersion"] != "2.0" ||
		render(p["IdentitySource"]) != "["+sluice.HTTPIdentitySource+"]" {
		t.Errorf("authorizer %v", p)
	}
	assertMatches(t, func() {
		s.template.HasResourceProperties(jsii.String("AWS::ApiGatewayV2::Authorizer"), map[string]any{
			"AuthorizerResultTtlInSeconds": 0, "EnableSimpleResponses": true,
		})
	})
	// Only the listed route.
	got := map[string]string{}
	for _, r := range s.ofType("AWS::ApiGatewayV2::Route") {
		got[render(r.Properties["RouteKey"])] = render(r.Properties["AuthorizationType"]) + " " + refID(r.Properties["AuthorizerId"])
	}
	want := map[string]string{"GET /items": "CUSTOM " + authID, "GET /health": "NONE "}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("routes:\n got %v\nwant %v", got, want)
	}
	if n := len(s.ofType("AWS::ApiGateway::GatewayResponse")); n != 0 {
		t.Errorf("%d gateway responses on an HTTP API stack", n)
	}
}

func TestHTTPGrantsAndEnvironment(t *testing.T) {
	s := synth(t)["HttpUser"]
	var stateID, rulesID string
	for id := range s.ofType("AWS::DynamoDB::GlobalTable") {
		if strings.HasPrefix(id, "MyState") {
			stateID = id
		} else {
			rulesID = id
		}
	}
	// No cache: no VPC, no network-interface grant.
	want := []string{
		"[dynamodb:GetItem dynamodb:UpdateItem] on [${" + stateID + ".Arn}]",
		"[dynamodb:Scan] on [${" + rulesID + ".Arn}]",
		"[logs:CreateLogStream logs:PutLogEvents] on [${" + logGroup(t, s) + ".Arn}]",
	}
	if got := grants(t, s); !slices.Equal(got, want) {
		t.Errorf("grants:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, typ := range []string{"AWS::EC2::VPC", "AWS::EC2::SecurityGroup", "AWS::ElastiCache::ServerlessCache"} {
		if n := len(s.ofType(typ)); n != 0 {
			t.Errorf("%d %s without a cache", n, typ)
		}
	}
	env := functionEnv(t, s)
	wantEnv := map[string]string{
		config.EnvRulesTable:            "${Ref:" + rulesID + "}",
		config.EnvRulesTTL:              "5m0s",
		config.EnvDynamoTable:           "${Ref:" + stateID + "}",
		config.EnvDeadline:              config.DefaultDeadline.String(),
		config.EnvMetricsNamespace:      config.DefaultMetricsNamespace,
		config.EnvShedBackend:           "dynamo",
		config.EnvShedUtilization:       "orders",
		config.EnvShedUtilizationMaxAge: config.DefaultShedUtilizationMaxAge.String(),
	}
	if fmt.Sprint(env) != fmt.Sprint(wantEnv) {
		t.Errorf("environment:\n got %v\nwant %v", env, wantEnv)
	}
}

// --- the listed methods, the user's VPC and memcached -------------------

func TestExplicitMethodsAndExistingCache(t *testing.T) {
	s := synth(t)["RestExplicit"]
	authID, _ := s.one(t, "AWS::ApiGateway::Authorizer")
	got := map[string]string{}
	for name, m := range s.methods() {
		got[name] = render(m["AuthorizationType"]) + " " + refID(m["AuthorizerId"])
	}
	want := map[string]string{"GET /a": "CUSTOM " + authID, "GET /b": "NONE ", "GET /admin": "AWS_IAM "}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("methods:\n got %v\nwant %v", got, want)
	}
	if _, ok := s.res["PetsLimiter"]; !ok {
		t.Errorf("no function with the logical id PetsLimiter")
	}
	env := functionEnv(t, s)
	for k, v := range map[string]string{
		config.EnvMemcachedAddrs: "mc1.internal:11211,mc2.internal:11211", config.EnvMemcachedTLS: "false",
		config.EnvMemcachedProxy: "false", config.EnvDeadline: "400ms", config.EnvMetricsNamespace: "Pets",
	} {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	// The user's cache security group now admits the function, on 11211.
	var ingress []string
	for _, r := range s.ofType("AWS::EC2::SecurityGroupIngress") {
		ingress = append(ingress, refID(r.Properties["GroupId"])+" "+fmt.Sprint(r.Properties["FromPort"]))
	}
	if len(ingress) != 1 || !strings.HasPrefix(ingress[0], "MyCacheSG") || !strings.HasSuffix(ingress[0], " 11211") {
		t.Errorf("ingress %v, want one into MyCacheSG on 11211", ingress)
	}
	for _, typ := range []string{"AWS::ElastiCache::ServerlessCache", "AWS::EC2::VPCEndpoint"} {
		if n := len(s.ofType(typ)); n != 0 {
			t.Errorf("%d %s with the user's VPC and cache", n, typ)
		}
	}
	// The user's subnets: the private ones.
	_, fn := s.one(t, "AWS::Lambda::Function")
	for _, sn := range asList(fn.Properties["VpcConfig"].(map[string]any)["SubnetIds"]) {
		if id := refID(sn); !strings.Contains(id, "Private") {
			t.Errorf("function in subnet %s, want the private ones", id)
		}
	}
	var headers map[string]any
	for _, r := range s.ofType("AWS::ApiGateway::GatewayResponse") {
		if r.Properties["ResponseType"] == "ACCESS_DENIED" {
			headers = r.Properties["ResponseParameters"].(map[string]any)
		}
	}
	if headers["gatewayresponse.header.Retry-After"] != "'5'" {
		t.Errorf("429 Retry-After %v, want the prop's '5'", headers["gatewayresponse.header.Retry-After"])
	}
}

// --- errors at synth -----------------------------------------------------

// failedSynth builds a stack with build and synthesizes it, returning the
// error synthesis reports.
func failedSynth(t *testing.T, build func(s awscdk.Stack)) string {
	t.Helper()
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(filepath.Join(tmpRoot, strings.ReplaceAll(t.Name(), "/", "_")))})
	s := awscdk.NewStack(app, jsii.String("User"), &awscdk.StackProps{Env: env})
	build(s)
	var msg string
	func() {
		defer func() {
			if r := recover(); r != nil {
				msg = fmt.Sprint(r)
			}
		}()
		app.Synth(nil)
	}()
	if msg == "" {
		t.Fatalf("synthesis succeeded")
	}
	return msg
}

// A bad rule fails `cdk synth` with the message the authorizer would print
// at every cold start: the rule's name and the field.
func TestBadRuleFailsSynth(t *testing.T) {
	bad := "rules:\n  - name: checkout\n    key: \"{ip}\"\n    limits:\n      - algorithm: sliding_window\n        limit: 10\n        window: 1x\n"
	_, wantErr := policy.Parse([]byte(bad))
	if wantErr == nil {
		t.Fatal("the bad rule parses")
	}
	msg := failedSynth(t, func(s awscdk.Stack) {
		sluice.New(s, "RateLimit", &sluice.Props{RestAPI: petsAPI(s), BootstrapDir: bootDir, Rules: sluice.Rules{YAML: bad}})
	})
	for _, want := range []string{"User/RateLimit", "sluice: Rules.YAML: " + wantErr.Error(), `rule "checkout"`, "limits[0].window"} {
		if !strings.Contains(msg, want) {
			t.Errorf("synthesis error does not hold %q:\n%s", want, msg)
		}
	}
}

func TestMethodWithAnotherAuthorizerFailsSynth(t *testing.T) {
	msg := failedSynth(t, func(s awscdk.Stack) {
		api := petsAPI(s)
		api.Root().AddResource(jsii.String("admin"), nil).AddMethod(jsii.String("GET"), nil,
			&awsapigateway.MethodOptions{AuthorizationType: awsapigateway.AuthorizationType_IAM})
		sluice.New(s, "RateLimit", &sluice.Props{RestAPI: api, BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, Cache: &sluice.Cache{Mode: sluice.CacheNone}})
	})
	if !strings.Contains(msg, "sluice: RestAPI: method User/PetsApi/Default/admin/GET/Resource already uses AWS_IAM authorization") {
		t.Errorf("synthesis error:\n%s", msg)
	}
}

// Props errors name the prop (and, for the contract's variables, the
// variable and the authorizer's message). They need no synthesis: New
// records them, synthesis reports them.
func TestPropErrors(t *testing.T) {
	app := awscdk.NewApp(nil)
	one := 1.0
	for i, tt := range []struct {
		props sluice.Props
		want  string
	}{
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}}, "sluice: RestAPI, HTTPAPI: set at least one API"},
		{sluice.Props{BootstrapDir: "/nonexistent"}, "sluice: BootstrapDir: no authorizer binary"},
		{sluice.Props{BootstrapDir: bootDir}, "sluice: Rules: required"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML, File: "x"}}, "sluice: Rules: set exactly one of YAML, File, BundlePath, Table (got Rules.YAML, Rules.File)"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, Shedding: sluice.Shedding{FleetCapacity: 10, FleetReserve: &one}},
			"sluice: Shedding.FleetReserve: config: SLUICE_SHED_FLEET_RESERVE: \"1\" is not a share in [0, 1)"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, Shedding: sluice.Shedding{FleetCapacity: 10, FleetName: strings.Repeat("f", config.MaxStoreName+1)}},
			"sluice: Shedding.FleetName: config: SLUICE_SHED_FLEET_NAME:"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, Shedding: sluice.Shedding{Backend: "dynamo"}}, "sluice: Shedding: settings without FleetCapacity or Utilization"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, Function: sluice.Function{Deadline: -time.Millisecond}},
			"sluice: Function.Deadline: config: SLUICE_DEADLINE: \"-1ms\" is not a Go duration between 0 and 30s"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, Function: sluice.Function{Deadline: 3 * time.Second}}, "sluice: Function.Deadline: 3s must be shorter than Function.Timeout (3s)"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, Function: sluice.Function{BreakerFailures: config.MaxBreakerFailures + 1}},
			"sluice: Function.BreakerFailures: config: SLUICE_BREAKER_FAILURES: \"1001\" is not a number of failures"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, Function: sluice.Function{BreakerOpenFor: -time.Second}},
			"sluice: Function.BreakerOpenFor: config: SLUICE_BREAKER_OPEN_FOR: \"-1s\" is not a Go duration"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, Cache: &sluice.Cache{Mode: "redis"}}, "sluice: Cache.Mode:"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, EdgeSecret: "short"}, "sluice: EdgeSecret: config: SLUICE_EDGE_SECRET: is not 16 to 256"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: strings.Repeat("#", sluice.MaxInlineRules) + "\nrules: []\n"}}, "bytes of rules exceed 3072 to pass inline"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, TableThroughput: sluice.TableThroughput{WarmWriteUnitsPerSecond: 100}},
			"sluice: TableThroughput.WarmWriteUnitsPerSecond: 100 is below 4000, the write units a second a new on-demand table serves at once"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, TableThroughput: sluice.TableThroughput{WarmReadUnitsPerSecond: 11999}},
			"sluice: TableThroughput.WarmReadUnitsPerSecond: 11999 is below 12000"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, TableThroughput: sluice.TableThroughput{MaxReadRequestUnits: -1}},
			"sluice: TableThroughput.MaxReadRequestUnits: -1 is negative"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, TableThroughput: sluice.TableThroughput{WarmWriteUnitsPerSecond: 5000, MaxWriteRequestUnits: 4500}},
			"sluice: TableThroughput.WarmWriteUnitsPerSecond: 5000 is above MaxWriteRequestUnits (4500), which would throttle it"},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: globalRule}},
			`sluice: rule "global": scope global needs TableMode "eventual" (regional shares) or "mrsc" (one limit); a regional table keeps a limit per region`},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: globalRule}, TableMode: sluice.TableEventual},
			`sluice: TableRegions: []: TableMode "eventual" needs the deployment's regions, two or more`},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: globalRule}, TableMode: sluice.TableEventual, TableRegions: []string{region}},
			`sluice: TableRegions: [` + region + `]: TableMode "eventual" needs the deployment's regions, two or more`},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: globalRule}, TableMode: sluice.TableEventual, TableRegions: []string{"eu-west-1", "ap-northeast-1"}},
			`sluice: TableRegions: [eu-west-1 ap-northeast-1] does not hold the stack's region ` + region},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, TableMode: sluice.TableMRSC, TableRegions: []string{region, "eu-west-1"}},
			`sluice: TableRegions: only with TableMode "eventual"`},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: strings.Replace(globalRule, "sliding_window", "fixed_window", 1)}, TableMode: sluice.TableEventual,
			TableRegions: []string{region, "eu-west-1"}},
			`sluice: rule "global": scope global on TableMode "eventual": global/0 is a fixed_window: regional shares (scope global on an eventual table) serve a token_bucket (not strict) or a bounded sliding_window of sub-window counters`},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: strings.Replace(globalRule, "limit: 1000, window: 1m", "limit: 1000, window: 1m, estimator: interpolated", 1)},
			TableMode: sluice.TableEventual, TableRegions: []string{region, "eu-west-1"}},
			`sluice: rule "global": scope global on TableMode "eventual": global/0 has estimator interpolated`},
		{sluice.Props{BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML}, TableMode: "strong"}, `sluice: TableMode: "strong" is not`},
	} {
		s := awscdk.NewStack(app, jsii.String(fmt.Sprintf("S%d", i)), &awscdk.StackProps{Env: env})
		p := tt.props
		if p.RestAPI == nil && !strings.Contains(tt.want, "set at least one API") {
			p.RestAPI = awsapigateway.NewRestApi(s, jsii.String("Api"), nil)
			p.RestAPI.Root().AddMethod(jsii.String("GET"), nil, nil)
		}
		errs := sluice.New(s, "RateLimit", &p).Errors()
		if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, tt.want) }) {
			t.Errorf("%d: errors %q, want one holding %q", i, errs, tt.want)
		}
	}
	// Rules from a table are not known at synth: a REST API's 429 needs
	// an explicit Retry-After.
	s := awscdk.NewStack(app, jsii.String("Table"), &awscdk.StackProps{Env: env})
	rules := awsdynamodb.Table_FromTableName(s, jsii.String("Rules"), jsii.String("rules"))
	api := awsapigateway.NewRestApi(s, jsii.String("Api"), nil)
	api.Root().AddMethod(jsii.String("GET"), nil, nil)
	errs := sluice.New(s, "RateLimit", &sluice.Props{RestAPI: api, BootstrapDir: bootDir, Rules: sluice.Rules{Table: rules}}).Errors()
	if !slices.Contains(errs, "sluice: RetryAfter: required with rules from a table (the rules are not known at synth)") {
		t.Errorf("errors %q", errs)
	}
	// TableThroughput sizes the table New creates, not the user's.
	s = awscdk.NewStack(app, jsii.String("UserTable"), &awscdk.StackProps{Env: env})
	api = awsapigateway.NewRestApi(s, jsii.String("Api"), nil)
	api.Root().AddMethod(jsii.String("GET"), nil, nil)
	errs = sluice.New(s, "RateLimit", &sluice.Props{RestAPI: api, BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML},
		Table: awsdynamodb.Table_FromTableName(s, jsii.String("State"), jsii.String("state")), TableThroughput: sluice.TableThroughput{MaxWriteRequestUnits: 100}}).Errors()
	if !slices.ContainsFunc(errs, func(e string) bool { return strings.HasPrefix(e, "sluice: TableThroughput: sizes a table New creates") }) {
		t.Errorf("errors %q", errs)
	}
}

// globalRule is one limit across regions, on DynamoDB.
const globalRule = "rules:\n  - name: global\n    key: all\n    scope: global\n    limits:\n      - {algorithm: sliding_window, limit: 1000, window: 1m, backend: dynamo}\n"

// A rule with scope global is served on a table with multi-Region strong
// consistency (one limit) and on an eventual global table given its
// regions (regional shares): New accepts it there and tells the function
// the mode and the regions (TestPropErrors has the refusals). The shares
// need nothing on the table beyond the authorizer's GetItem and
// UpdateItem (regions.TableClient), on its items.
func TestGlobalRuleOnMRSC(t *testing.T) {
	app := awscdk.NewApp(nil)
	for _, tt := range []struct {
		name    string
		props   sluice.Props
		wantEnv map[string]string
	}{
		{"MRSC", sluice.Props{TableMode: sluice.TableMRSC}, map[string]string{config.EnvTableMode: "mrsc"}},
		{"Eventual", sluice.Props{TableMode: sluice.TableEventual, TableRegions: []string{"eu-west-1", region}},
			map[string]string{config.EnvTableMode: "eventual", config.EnvRegions: "eu-west-1," + region}},
	} {
		s := awscdk.NewStack(app, jsii.String("Global"+tt.name), &awscdk.StackProps{Env: env})
		p := tt.props
		p.RestAPI, p.BootstrapDir, p.Rules = petsAPI(s), bootDir, sluice.Rules{YAML: globalRule}
		r := sluice.New(s, "RateLimit", &p)
		if errs := r.Errors(); len(errs) != 0 {
			t.Errorf("%s: errors %q", tt.name, errs)
			continue
		}
		for k, v := range tt.wantEnv {
			if got := r.Environment()[k]; got != v {
				t.Errorf("%s: %s=%q, want %q", tt.name, k, got, v)
			}
		}
		if !slices.Equal(sluice.StateTableActions, []string{"dynamodb:GetItem", "dynamodb:UpdateItem"}) {
			t.Errorf("state table actions %v: the shares' regions.TableClient needs GetItem and UpdateItem", sluice.StateTableActions)
		}
	}
}

func TestDeriveRetryAfter(t *testing.T) {
	parse := func(y string) []policy.Rule {
		t.Helper()
		r, err := policy.Parse([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, tt := range []struct {
		rules  string
		want   time.Duration
		source string
	}{
		{"rules: []", time.Second, "no limit"},
		// The longest wait: the minute window, not the 100 ms bucket.
		{rulesYAML, time.Minute, `rule "per-ip" limit "per-minute" (sliding_window, window 1m0s)`},
		// A bucket refilling 1 token every 10 s, 3 tokens a request: 30 s.
		{"rules: [{name: b, key: k, cost: 3, limits: [{algorithm: token_bucket, max_amount: 10, refill_time: 10s}]}]", 30 * time.Second, "token_bucket, 3 x refill_time 10s"},
		// 5 tokens per refill: one refill brings back the cost of 3.
		{"rules: [{name: b, key: k, cost: 3, limits: [{algorithm: token_bucket, max_amount: 10, refill_time: 10s, refill_amount: 5}]}]", 10 * time.Second, "1 x refill_time"},
		// Rounded up to a second.
		{"rules: [{name: f, key: k, limits: [{algorithm: fixed_window, limit: 5, window: 1500ms}]}]", 2 * time.Second, "fixed_window"},
		{"rules: [{name: a, key: k, limits: [{algorithm: sliding_log, limit: 5, window: 10s}]}, {name: d, key: k, limits: [{algorithm: sliding_window, limit: 5, window: 24h}]}]", 24 * time.Hour, `rule "d"`},
	} {
		got, src := sluice.DeriveRetryAfter(parse(tt.rules))
		if got != tt.want || !strings.Contains(src, tt.source) {
			t.Errorf("%s: %v from %s, want %v from %s", tt.rules, got, src, tt.want, tt.source)
		}
	}
}
