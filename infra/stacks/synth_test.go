package stacks

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/infra/sluice"
)

// Synthesis goes through jsii and node (tens of seconds per app), so each
// test binary synthesizes four apps once, and every test reads the shared
// templates:
//
//   - "regional": testdata/regional.json, three regions, default (MREC)
//     tables, serverless memcached, rules from a file, both load shedders
//     on memcached;
//   - "mrsc": testdata/mrsc.json with context overrides (account, regions,
//     primary region, consistency=mrsc), node-based memcached, a rules
//     table, authorizer-context headers, no HTTP API, the utilization
//     shedder on the state table;
//   - "global": testdata/global.json, the shipped example's defaults and
//     rules (infra/rules.yaml, with a rule of scope global) on three
//     regions' default (eventual) tables, an alarm topic in each region:
//     the construct runs the keeper and alarms on the regional shares;
//   - "global-mrsc": the same with -c consistency=mrsc, as docs/infra.md
//     prints it: the global rule is one limit, with no shares.

const (
	mrscAccount = "222222222222"
	mrscPrimary = "us-east-2"
)

var mrscRegions = []string{"us-east-1", "us-east-2", "us-west-2"}

// edgeSecret is the regional app's edge secret (context edgeSecret).
const edgeSecret = "test-edge-secret-0123456789abcdef"

type synthApp struct {
	name   string
	outdir string
	cfg    *Config
	stacks []*synthStack // primary first
	edge   *synthStack   // the edge front door's stack, if configured
	// missing is the cloud assembly's missing context: lookups the CLI
	// would make in the account. It must stay empty for offline synthesis.
	missing int
}

type synthStack struct {
	region   string
	stack    awscdk.Stack
	template assertions.Template
	res      map[string]resource // logical id -> resource
	messages []message           // annotations (cdk-nag findings among them)
}

type resource struct {
	Type       string         `json:"Type"`
	Properties map[string]any `json:"Properties"`
	DependsOn  any            `json:"DependsOn"`
}

type message struct {
	level, data, path string
}

var (
	synthOnce sync.Once
	synthErr  error
	synthed   map[string]*synthApp
	tmpRoot   string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if tmpRoot != "" {
		os.RemoveAll(tmpRoot)
	}
	jsii.Close()
	os.Exit(code)
}

// apps synthesizes both apps on first use.
func apps(t *testing.T) map[string]*synthApp {
	t.Helper()
	synthOnce.Do(func() { synthed, synthErr = synthesizeAll() })
	if synthErr != nil {
		t.Fatalf("synthesis: %v", synthErr)
	}
	return synthed
}

func synthesizeAll() (_ map[string]*synthApp, err error) {
	defer func() {
		if r := recover(); r != nil { // jsii reports errors as panics
			err = fmt.Errorf("%v", r)
		}
	}()
	tmpRoot, err = os.MkdirTemp("", "sluice-infra-test-")
	if err != nil {
		return nil, err
	}
	// A dummy authorizer: tests never depend on a real build.
	bootstrapDir := filepath.Join(tmpRoot, "authorizer")
	if err := os.MkdirAll(bootstrapDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bootstrapDir, "bootstrap"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		return nil, err
	}
	flags, err := cdkJSONContext("../cdk.json")
	if err != nil {
		return nil, err
	}

	out := map[string]*synthApp{}
	for _, spec := range []struct {
		name string
		ctx  map[string]any
	}{
		{"regional", map[string]any{CtxConfig: "testdata/regional.json", CtxEdgeSecret: edgeSecret}},
		{"mrsc", map[string]any{
			CtxConfig:        "testdata/mrsc.json",
			CtxAccount:       mrscAccount,
			CtxRegions:       " us-east-1,us-east-2 , us-west-2", // as `-c regions=...` gives it
			CtxPrimaryRegion: mrscPrimary,
			CtxConsistency:   ConsistencyMRSC,
		}},
		{"global", map[string]any{CtxConfig: "testdata/global.json"}},
		{"global-mrsc", map[string]any{CtxConfig: "testdata/global.json", CtxConsistency: ConsistencyMRSC}},
	} {
		ctx := map[string]any{CtxBootstrapDir: bootstrapDir}
		for k, v := range flags {
			ctx[k] = v
		}
		for k, v := range spec.ctx {
			ctx[k] = v
		}
		outdir := filepath.Join(tmpRoot, spec.name+".out")
		app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx, Outdir: jsii.String(outdir)})
		cfg, err := configFromContext(app)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", spec.name, err)
		}
		stacks, err := Build(app)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", spec.name, err)
		}
		sa := &synthApp{name: spec.name, outdir: outdir, cfg: cfg}
		for _, rs := range stacks {
			ss, err := readStack(rs.Stack) // synthesizes the app, once
			if err != nil {
				return nil, err
			}
			sa.stacks = append(sa.stacks, ss)
		}
		if cfg.Edge != nil {
			es := app.Node().FindChild(jsii.String(cfg.StackPrefix + "-edge")).(awscdk.Stack)
			ss, err := readStack(es)
			if err != nil {
				return nil, err
			}
			sa.edge = ss
		}
		// Annotations.fromStack would synthesize again (force: true), and
		// the nag aspect would run again: read the cached assembly instead.
		asm := app.Synth(nil)
		all := sa.stacks
		if sa.edge != nil {
			all = append(slices.Clone(all), sa.edge)
		}
		for _, ss := range all {
			for _, m := range *asm.GetStackArtifact(ss.stack.ArtifactId()).Messages() {
				data, _ := m.Entry.Data.(string)
				ss.messages = append(ss.messages, message{level: string(m.Level), data: data, path: *m.Id})
			}
		}
		if missing := asm.Manifest().Missing; missing != nil {
			sa.missing = len(*missing)
		}
		out[spec.name] = sa
	}
	return out, nil
}

// readStack reads a stack's template.
func readStack(s awscdk.Stack) (*synthStack, error) {
	tpl := assertions.Template_FromStack(s, nil)
	ss := &synthStack{region: *s.Region(), stack: s, template: tpl}
	b, err := json.Marshal(tpl.ToJSON())
	if err != nil {
		return nil, err
	}
	var doc struct{ Resources map[string]resource }
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	ss.res = doc.Resources
	return ss, nil
}

// cdkJSONContext returns the context of cdk.json (the feature flags), so
// that the tests synthesize what `cdk synth` does.
func cdkJSONContext(path string) (map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Context map[string]any `json:"context"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return doc.Context, nil
}

// appNames are the synthesized apps, in the order tests run them.
var appNames = []string{"regional", "mrsc", "global", "global-mrsc"}

// eachStack runs f as a subtest for every stack of every app.
func eachStack(t *testing.T, f func(t *testing.T, a *synthApp, s *synthStack)) {
	t.Helper()
	for _, name := range appNames {
		a := apps(t)[name]
		for _, s := range a.stacks {
			t.Run(name+"/"+s.region, func(t *testing.T) { f(t, a, s) })
		}
	}
}

func (s *synthStack) ofType(typ string) map[string]resource {
	out := map[string]resource{}
	for id, r := range s.res {
		if r.Type == typ {
			out[id] = r
		}
	}
	return out
}

// one returns the only resource of a type, failing otherwise.
func (s *synthStack) one(t *testing.T, typ string) (string, resource) {
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

// render flattens CloudFormation intrinsics into a readable string:
// AWS::Partition becomes "aws", other references ${Ref:X} / ${X.Attr}.
func render(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case float64:
		return fmt.Sprint(v)
	case bool:
		return fmt.Sprint(v)
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
			if r == "AWS::Partition" {
				return "aws"
			}
			return "${Ref:" + r + "}"
		}
		if g, ok := v["Fn::GetAtt"].([]any); ok && len(g) == 2 {
			return "${" + render(g[0]) + "." + render(g[1]) + "}"
		}
		if sel, ok := v["Fn::Select"].([]any); ok && len(sel) == 2 {
			return "select(" + render(sel[0]) + " " + render(sel[1]) + ")"
		}
		if sp, ok := v["Fn::Split"].([]any); ok && len(sp) == 2 {
			return "split(" + render(sp[0]) + " " + render(sp[1]) + ")"
		}
		b, _ := json.Marshal(v)
		return string(b)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// refID returns the logical id a {"Ref": id} or {"Fn::GetAtt": [id, _]}
// points at, or "".
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
	default:
		return []any{v}
	}
}

func sortedStrings(vs []any) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = render(v)
	}
	sort.Strings(out)
	return out
}

// --- the assertions ------------------------------------------------------

func TestAppsSynthesizeOffline(t *testing.T) {
	for name, a := range apps(t) {
		if a.missing != 0 {
			t.Errorf("%s: %d context lookups left for the CLI (needs credentials); want none", name, a.missing)
		}
		var got []string
		for _, s := range a.stacks {
			got = append(got, s.region)
		}
		want := append([]string{a.cfg.PrimaryRegion}, a.cfg.ReplicaRegions()...)
		if !slices.Equal(got, want) {
			t.Errorf("%s: stacks for %v, want %v (primary first)", name, got, want)
		}
	}
	m := apps(t)["mrsc"]
	if m.cfg.Account != mrscAccount || m.cfg.PrimaryRegion != mrscPrimary || m.cfg.Consistency != ConsistencyMRSC {
		t.Errorf("mrsc: context overrides not applied: account %s primary %s consistency %s", m.cfg.Account, m.cfg.PrimaryRegion, m.cfg.Consistency)
	}
	for _, s := range m.stacks {
		if got := *s.stack.Account(); got != mrscAccount {
			t.Errorf("mrsc/%s: account %s, want %s", s.region, got, mrscAccount)
		}
	}
}

func TestReplicaStacksDependOnPrimary(t *testing.T) {
	eachStack(t, func(t *testing.T, a *synthApp, s *synthStack) {
		var deps []string
		for _, d := range *s.stack.Dependencies() {
			deps = append(deps, *d.StackName())
		}
		want := []string{}
		if s.region != a.cfg.PrimaryRegion {
			want = []string{a.cfg.StackName(a.cfg.PrimaryRegion)}
		}
		if !slices.Equal(append([]string{}, deps...), want) {
			t.Errorf("depends on %v, want %v", deps, want)
		}
	})
}

func TestAuthorizerResultCacheOff(t *testing.T) {
	eachStack(t, func(t *testing.T, a *synthApp, s *synthStack) {
		_, auth := s.one(t, "AWS::ApiGateway::Authorizer")
		ttl, ok := auth.Properties["AuthorizerResultTtlInSeconds"]
		if !ok || ttl != float64(0) {
			t.Errorf("REST authorizer AuthorizerResultTtlInSeconds = %v (set: %v), want an explicit 0", ttl, ok)
		}
		if auth.Properties["Type"] != "REQUEST" {
			t.Errorf("REST authorizer type %v, want REQUEST", auth.Properties["Type"])
		}
		if got := auth.Properties["IdentitySource"]; got != sluice.IdentitySource {
			t.Errorf("REST identity source %v, want %s", got, sluice.IdentitySource)
		}
		if uri := render(auth.Properties["AuthorizerUri"]); !strings.Contains(uri, "${"+AuthorizerLogicalID+".Arn}") {
			t.Errorf("REST authorizer invokes %s, want the %s function", uri, AuthorizerLogicalID)
		}
		// Every method is behind the authorizer.
		for id, m := range s.ofType("AWS::ApiGateway::Method") {
			if m.Properties["AuthorizationType"] != "CUSTOM" || refID(m.Properties["AuthorizerId"]) == "" {
				t.Errorf("method %s: AuthorizationType %v AuthorizerId %v, want CUSTOM with the authorizer", id, m.Properties["AuthorizationType"], m.Properties["AuthorizerId"])
			}
		}

		httpAuths := s.ofType("AWS::ApiGatewayV2::Authorizer")
		if want := *a.cfg.API.HTTPAPI; want != (len(httpAuths) == 1) {
			t.Fatalf("%d HTTP API authorizers with api.httpApi=%v", len(httpAuths), want)
		}
		for _, h := range httpAuths {
			p := h.Properties
			if ttl, ok := p["AuthorizerResultTtlInSeconds"]; !ok || ttl != float64(0) {
				t.Errorf("HTTP authorizer AuthorizerResultTtlInSeconds = %v (set: %v), want an explicit 0", ttl, ok)
			}
			if p["EnableSimpleResponses"] != true || p["AuthorizerPayloadFormatVersion"] != "2.0" {
				t.Errorf("HTTP authorizer simple responses %v payload %v, want true and 2.0", p["EnableSimpleResponses"], p["AuthorizerPayloadFormatVersion"])
			}
			if got := sortedStrings(asList(p["IdentitySource"])); !slices.Equal(got, []string{sluice.HTTPIdentitySource}) {
				t.Errorf("HTTP identity source %v, want [%s]", got, sluice.HTTPIdentitySource)
			}
		}
		// The CDK assertion API agrees (and shows a mismatch in its own words).
		assertMatches(t, func() {
			s.template.HasResourceProperties(jsii.String("AWS::ApiGateway::Authorizer"), map[string]any{
				"AuthorizerResultTtlInSeconds": 0,
				"Type":                         "REQUEST",
			})
		})
	})
}

func TestGatewayResponses(t *testing.T) {
	eachStack(t, func(t *testing.T, a *synthApp, s *synthStack) {
		byType := map[string]resource{}
		for _, r := range s.ofType("AWS::ApiGateway::GatewayResponse") {
			byType[r.Properties["ResponseType"].(string)] = r
		}
		if _, ok := byType["UNAUTHORIZED"]; ok {
			t.Errorf("UNAUTHORIZED is customized; it must stay 401")
		}
		headers := func(r resource) map[string]string {
			out := map[string]string{}
			for k, v := range r.Properties["ResponseParameters"].(map[string]any) {
				out[strings.TrimPrefix(k, "gatewayresponse.header.")] = render(v)
			}
			return out
		}
		retry := a.cfg.API.RetryAfterSeconds
		if retry == 0 {
			retry = 60 // derived from the rules: infra/rules.yaml's one-minute windows
		}
		retryAfter := fmt.Sprintf("'%d'", retry)

		denied, ok := byType["ACCESS_DENIED"]
		if !ok {
			t.Fatalf("no ACCESS_DENIED gateway response")
		}
		if denied.Properties["StatusCode"] != "429" {
			t.Errorf("ACCESS_DENIED status %v, want 429", denied.Properties["StatusCode"])
		}
		h := headers(denied)
		wantHeaders := map[string]string{
			"Content-Type":  "'application/json'",
			"Cache-Control": "'no-store'",
			"Retry-After":   retryAfter,
		}
		if a.cfg.API.ContextHeaders {
			wantHeaders["Retry-After"] = "context.authorizer.retryAfter"
			wantHeaders["RateLimit-Policy"] = "context.authorizer.rateLimitPolicy"
			wantHeaders["RateLimit"] = "context.authorizer.rateLimit"
			if a.cfg.API.LegacyRateLimitHeaders {
				wantHeaders["RateLimit-Limit"] = "context.authorizer.limit"
				wantHeaders["RateLimit-Remaining"] = "context.authorizer.remaining"
				wantHeaders["RateLimit-Reset"] = "context.authorizer.reset"
			}
		}
		if fmt.Sprint(h) != fmt.Sprint(wantHeaders) {
			t.Errorf("429 headers:\n got %v\nwant %v", h, wantHeaders)
		}
		body := render(denied.Properties["ResponseTemplates"].(map[string]any)["application/json"])
		var parsed map[string]string
		if err := json.Unmarshal([]byte(body), &parsed); err != nil {
			t.Errorf("429 body template is not JSON: %v\n%s", err, body)
		}
		for _, k := range sluice.ContextKeys {
			if parsed[k] != "$context.authorizer."+k {
				t.Errorf("429 body %q = %q, want $context.authorizer.%s", k, parsed[k], k)
			}
		}

		// A shed request fails the authorizer. API Gateway documents
		// AUTHORIZER_FAILURE for it, users see AUTHORIZER_CONFIGURATION_ERROR
		// (AuthorizerConfigurationException): both must answer 503 JSON.
		for _, typ := range []string{"AUTHORIZER_FAILURE", "AUTHORIZER_CONFIGURATION_ERROR"} {
			shed, ok := byType[typ]
			if !ok {
				t.Errorf("no %s gateway response", typ)
				continue
			}
			if shed.Properties["StatusCode"] != "503" {
				t.Errorf("%s status %v, want 503", typ, shed.Properties["StatusCode"])
			}
			// A shed request waits for a fleet slot: the lease TTL (1s).
			want := map[string]string{"Content-Type": "'application/json'", "Cache-Control": "'no-store'", "Retry-After": "'1'"}
			if h := headers(shed); fmt.Sprint(h) != fmt.Sprint(want) {
				t.Errorf("%s headers:\n got %v\nwant %v", typ, h, want)
			}
			tpl, _ := shed.Properties["ResponseTemplates"].(map[string]any)
			if len(tpl) != 1 {
				t.Errorf("%s templates %v, want application/json only", typ, tpl)
			}
			body := render(tpl["application/json"])
			var parsed map[string]string
			if err := json.Unmarshal([]byte(body), &parsed); err != nil {
				t.Errorf("%s body template is not JSON: %v\n%s", typ, err, body)
			}
			if parsed["message"] != "Service Unavailable" || parsed["decision"] != "shed" ||
				parsed["responseType"] != "$context.error.responseType" || parsed["requestId"] != "$context.requestId" {
				t.Errorf("%s body %v", typ, parsed)
			}
		}
		// The CDK assertion API agrees.
		for _, typ := range []string{"AUTHORIZER_FAILURE", "AUTHORIZER_CONFIGURATION_ERROR"} {
			assertMatches(t, func() {
				s.template.HasResourceProperties(jsii.String("AWS::ApiGateway::GatewayResponse"), map[string]any{
					"ResponseType": typ,
					"StatusCode":   "503",
				})
			})
		}
		if n := len(byType); n != 4 {
			t.Errorf("%d gateway responses (%v), want ACCESS_DENIED, the two authorizer errors and THROTTLED", n, slices.Collect(mapKeys(byType)))
		}
		if th, ok := byType["THROTTLED"]; !ok || th.Properties["StatusCode"] != "429" || headers(th)["Retry-After"] != "'1'" {
			t.Errorf("THROTTLED response %v, want 429 with Retry-After 1 (API Gateway throttles per second)", th.Properties)
		}
	})
}

func TestGlobalTables(t *testing.T) {
	eachStack(t, func(t *testing.T, a *synthApp, s *synthStack) {
		tables := s.ofType("AWS::DynamoDB::GlobalTable")
		if s.region != a.cfg.PrimaryRegion {
			if len(tables) != 0 {
				t.Errorf("%d global tables in a replica region's stack, want 0 (the primary defines them)", len(tables))
			}
			for _, typ := range []string{"AWS::DynamoDB::Table", "AWS::CloudFormation::CustomResource", "AWS::SSM::Parameter"} {
				if n := len(s.ofType(typ)); n != 0 {
					t.Errorf("%d resources of type %s in a replica region's stack", n, typ)
				}
			}
			return
		}
		byName := map[string]resource{}
		for _, r := range tables {
			byName[render(r.Properties["TableName"])] = r
		}
		wantRegions := slices.Clone(a.cfg.Regions)
		sort.Strings(wantRegions)
		wantMode := map[string]string{ConsistencyDefault: "EVENTUAL", ConsistencyMRSC: "STRONG"}[a.cfg.Consistency]

		check := func(name, key string, ttl bool, mode string) {
			r, ok := byName[name]
			if !ok {
				t.Errorf("no global table %q (have %v)", name, slices.Collect(mapKeys(byName)))
				return
			}
			p := r.Properties
			if got := render(p["KeySchema"]); got != fmt.Sprintf(`[{"AttributeName":%q,"KeyType":"HASH"}]`, key) {
				t.Errorf("%s key schema %s, want %s HASH only", name, got, key)
			}
			if got := render(p["AttributeDefinitions"]); got != fmt.Sprintf(`[{"AttributeName":%q,"AttributeType":"S"}]`, key) {
				t.Errorf("%s attributes %s, want %s String", name, got, key)
			}
			if p["BillingMode"] != "PAY_PER_REQUEST" {
				t.Errorf("%s billing %v, want PAY_PER_REQUEST", name, p["BillingMode"])
			}
			if got := render(p["TimeToLiveSpecification"]); ttl && got != `{"AttributeName":"ttl","Enabled":true}` {
				t.Errorf("%s TTL %s, want ttl enabled", name, got)
			} else if !ttl && p["TimeToLiveSpecification"] != nil {
				t.Errorf("%s has a TTL %s", name, got)
			}
			if p["MultiRegionConsistency"] != mode {
				t.Errorf("%s consistency %v, want %s", name, p["MultiRegionConsistency"], mode)
			}
			var regions []string
			for _, rep := range asList(p["Replicas"]) {
				rm := rep.(map[string]any)
				regions = append(regions, rm["Region"].(string))
				if got := render(rm["PointInTimeRecoverySpecification"]); got != `{"PointInTimeRecoveryEnabled":true}` {
					t.Errorf("%s replica %v: PITR %s, want enabled", name, rm["Region"], got)
				}
			}
			sort.Strings(regions)
			if !slices.Equal(regions, wantRegions) {
				t.Errorf("%s replicas in %v, want %v", name, regions, wantRegions)
			}
		}
		check(a.cfg.TableName, sluice.StatePartitionKey, true, wantMode)
		checkThroughput(t, byName[a.cfg.TableName], a.cfg.TableThroughput)
		if a.cfg.Rules.Table {
			checkThroughput(t, byName[a.cfg.RulesTableName()], TableThroughputConfig{}) // never sized
		}
		wantTables := 1
		if a.cfg.Rules.Table {
			check(a.cfg.RulesTableName(), sluice.RulesPartitionKey, false, "EVENTUAL") // even with MRSC state
			wantTables = 2
		}
		if len(tables) != wantTables {
			t.Errorf("%d global tables, want %d", len(tables), wantTables)
		}
	})
}

// checkThroughput: the table's warm throughput and maximum are the
// configured ones (WarmThroughput, WriteOnDemandThroughputSettings on the
// table, ReadOnDemandThroughputSettings on every replica), absent where
// unset.
func checkThroughput(t *testing.T, r resource, want TableThroughputConfig) {
	t.Helper()
	p := r.Properties
	obj := func(kv ...any) string {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			if n := kv[i+1].(int); n != 0 {
				m[kv[i].(string)] = n
			}
		}
		if len(m) == 0 {
			return ""
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	orEmpty := func(v any) string {
		if v == nil {
			return ""
		}
		return render(v)
	}
	name := render(p["TableName"])
	if got, w := orEmpty(p["WarmThroughput"]), obj("ReadUnitsPerSecond", want.WarmReadUnitsPerSecond, "WriteUnitsPerSecond", want.WarmWriteUnitsPerSecond); got != w {
		t.Errorf("%s: WarmThroughput %s, want %q", name, got, w)
	}
	if got, w := orEmpty(p["WriteOnDemandThroughputSettings"]), obj("MaxWriteRequestUnits", want.MaxWriteRequestUnits); got != w {
		t.Errorf("%s: WriteOnDemandThroughputSettings %s, want %q", name, got, w)
	}
	for _, rep := range asList(p["Replicas"]) {
		rm := rep.(map[string]any)
		if got, w := orEmpty(rm["ReadOnDemandThroughputSettings"]), obj("MaxReadRequestUnits", want.MaxReadRequestUnits); got != w {
			t.Errorf("%s replica %v: ReadOnDemandThroughputSettings %s, want %q", name, rm["Region"], got, w)
		}
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestAuthorizerFunction(t *testing.T) {
	eachStack(t, func(t *testing.T, a *synthApp, s *synthStack) {
		fn, ok := s.res[AuthorizerLogicalID]
		if !ok || fn.Type != "AWS::Lambda::Function" {
			t.Fatalf("no AWS::Lambda::Function with logical id %s", AuthorizerLogicalID)
		}
		if n := len(s.ofType("AWS::Lambda::Function")); n != 1 {
			t.Errorf("%d functions, want only the authorizer (no custom-resource Lambdas)", n)
		}
		p := fn.Properties
		if got := render(p["Architectures"]); got != "[arm64]" {
			t.Errorf("architectures %s, want [arm64]", got)
		}
		if p["Runtime"] != "provided.al2023" || p["Handler"] != "bootstrap" {
			t.Errorf("runtime %v handler %v, want provided.al2023 bootstrap", p["Runtime"], p["Handler"])
		}

		// In the VPC's isolated subnets, with the authorizer security group.
		vpcCfg, _ := p["VpcConfig"].(map[string]any)
		subnets := asList(vpcCfg["SubnetIds"])
		if len(subnets) != len(a.cfg.VPC.Zones(s.region)) {
			t.Errorf("function in %d subnets, want one per zone %v", len(subnets), a.cfg.VPC.Zones(s.region))
		}
		for _, sn := range subnets {
			id := refID(sn)
			r, ok := s.res[id]
			if !ok || r.Type != "AWS::EC2::Subnet" {
				t.Errorf("subnet %v is not a subnet of this stack", sn)
				continue
			}
			if r.Properties["MapPublicIpOnLaunch"] != false {
				t.Errorf("subnet %s maps public IPs", id)
			}
			if tag := tagValue(r.Properties["Tags"], "aws-cdk:subnet-type"); tag != "Isolated" {
				t.Errorf("subnet %s type %q, want Isolated", id, tag)
			}
			if !slices.Contains(a.cfg.VPC.Zones(s.region), render(r.Properties["AvailabilityZone"])) {
				t.Errorf("subnet %s in zone %v, want one of %v", id, r.Properties["AvailabilityZone"], a.cfg.VPC.Zones(s.region))
			}
		}
		for _, typ := range []string{"AWS::EC2::InternetGateway", "AWS::EC2::NatGateway", "AWS::EC2::EIP"} {
			if n := len(s.ofType(typ)); n != 0 {
				t.Errorf("%d %s: the VPC must have no route out", n, typ)
			}
		}
		for id, r := range s.ofType("AWS::EC2::Route") {
			t.Errorf("route %s (%v): isolated subnets route only through the DynamoDB gateway endpoint", id, r.Properties)
		}
		_, ep := s.one(t, "AWS::EC2::VPCEndpoint")
		if ep.Properties["VpcEndpointType"] != "Gateway" || !strings.HasSuffix(render(ep.Properties["ServiceName"]), ".dynamodb") {
			t.Errorf("VPC endpoint %v %v, want the DynamoDB gateway endpoint", ep.Properties["VpcEndpointType"], render(ep.Properties["ServiceName"]))
		}

		// Environment: the contract with the authorizer.
		env := map[string]string{}
		if e, ok := p["Environment"].(map[string]any); ok {
			for k, v := range e["Variables"].(map[string]any) {
				env[k] = render(v)
			}
		}
		want := map[string]string{
			config.EnvDynamoTable:      a.cfg.TableName,
			config.EnvDeadline:         a.cfg.Authorizer.Deadline,
			config.EnvMetricsNamespace: a.cfg.Authorizer.MetricsNamespace,
			config.EnvMemcachedTLS:     "true",
			// Serverless shards sit behind a proxy that may reorder a
			// pipeline: the backend must wait for the incr before reading.
			config.EnvMemcachedProxy: strconv.FormatBool(a.cfg.Memcached.Mode == MemcachedServerless),
		}
		// The table's mode, and for an eventual table the regions in
		// sluice.json's order (a global rule's shares).
		if mode := a.cfg.tableMode(); mode != sluice.TableRegional {
			want[config.EnvTableMode] = mode
		} else if env[config.EnvTableMode] != "" {
			t.Errorf("env %s = %q on a regional table", config.EnvTableMode, env[config.EnvTableMode])
		}
		if a.cfg.tableMode() == sluice.TableEventual {
			want[config.EnvRegions] = strings.Join(a.cfg.Regions, ",")
		}
		switch {
		case a.cfg.Rules.File != "":
			b, err := os.ReadFile(a.cfg.Rules.File)
			if err != nil {
				t.Fatal(err)
			}
			want[config.EnvRulesYAML] = string(b)
		case a.cfg.Rules.Table:
			want[config.EnvRulesTable] = a.cfg.RulesTableName()
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("env %s = %q, want %q", k, env[k], v)
			}
		}
		for _, k := range []string{config.EnvRulesYAML, config.EnvRulesFile, config.EnvRulesTable} {
			if _, set := want[k]; !set && env[k] != "" {
				t.Errorf("env %s = %q, want unset", k, env[k])
			}
		}
		// Load shedding: what each test app's shedding section asks for,
		// and no SLUICE_SHED_* variable beyond it.
		wantShed := map[string]string{}
		switch a.name {
		case "regional": // fleet and utilization, on the serverless cache by default
			wantShed = map[string]string{
				config.EnvShedBackend:           "memcached",
				config.EnvShedFleetCapacity:     "200",
				config.EnvShedFleetReserve:      "0.2",
				config.EnvShedFleetShares:       "low=0.5",
				config.EnvShedFleetName:         "fleet-" + s.region,
				config.EnvShedLeaseTTL:          "1s",
				config.EnvShedUtilization:       "orders-fleet",
				config.EnvShedUtilizationMaxAge: "30s",
			}
		case "mrsc": // utilization only, on the state table
			wantShed = map[string]string{
				config.EnvShedBackend:           "dynamo",
				config.EnvShedUtilization:       "orders",
				config.EnvShedUtilizationMaxAge: "2m0s",
			}
		}
		for k, v := range env {
			if strings.HasPrefix(k, "SLUICE_SHED_") && wantShed[k] != v {
				t.Errorf("env %s = %q, want %q", k, v, wantShed[k])
			}
		}
		for k, v := range wantShed {
			if env[k] != v {
				t.Errorf("env %s = %q, want %q", k, env[k], v)
			}
		}
		if _, set := env["SLUICE_REGION"]; set {
			t.Errorf("SLUICE_REGION is set; AWS_REGION is enough")
		}
		addrs := strings.Split(env[config.EnvMemcachedAddrs], ",")
		switch a.cfg.Memcached.Mode {
		case MemcachedServerless:
			id, _ := s.one(t, "AWS::ElastiCache::ServerlessCache")
			if len(addrs) != 1 || addrs[0] != "${"+id+".Endpoint.Address}:${"+id+".Endpoint.Port}" {
				t.Errorf("memcached addrs %v, want the serverless endpoint", addrs)
			}
		case MemcachedNodes:
			if len(addrs) != a.cfg.Memcached.Nodes {
				t.Fatalf("memcached addrs %v, want %d nodes", addrs, a.cfg.Memcached.Nodes)
			}
			for i, ad := range addrs {
				// <name>.<id>.cfg.<rest> -> <name>.<id>.000N.<rest>:<port>
				id, _ := s.one(t, "AWS::ElastiCache::CacheCluster")
				want := fmt.Sprintf("select(0 split(.cfg. ${%[3]s.ConfigurationEndpoint.Address})).%04[1]d.select(1 split(.cfg. ${%[3]s.ConfigurationEndpoint.Address})):%[2]d", i+1, a.cfg.Memcached.Port, id)
				if ad != want {
					t.Errorf("node %d address\n got %s\nwant %s", i+1, ad, want)
				}
			}
		}
	})
}

func tagValue(tags any, key string) string {
	for _, tg := range asList(tags) {
		if m, ok := tg.(map[string]any); ok && m["Key"] == key {
			return render(m["Value"])
		}
	}
	return ""
}

func TestMemcachedReachableOnlyFromAuthorizer(t *testing.T) {
	eachStack(t, func(t *testing.T, a *synthApp, s *synthStack) {
		fnSGs := asList(s.res[AuthorizerLogicalID].Properties["VpcConfig"].(map[string]any)["SecurityGroupIds"])
		if len(fnSGs) != 1 {
			t.Fatalf("authorizer in %d security groups, want 1", len(fnSGs))
		}
		authSG := refID(fnSGs[0])

		var cacheSGs []any
		port := float64(11211)
		switch a.cfg.Memcached.Mode {
		case MemcachedServerless:
			_, c := s.one(t, "AWS::ElastiCache::ServerlessCache")
			cacheSGs = asList(c.Properties["SecurityGroupIds"])
			if c.Properties["Engine"] != "memcached" {
				t.Errorf("serverless cache engine %v", c.Properties["Engine"])
			}
			if got := render(c.Properties["CacheUsageLimits"]); !strings.Contains(got, fmt.Sprintf(`"Maximum":%d`, a.cfg.Memcached.MaxDataStorageGB)) ||
				!strings.Contains(got, fmt.Sprintf(`"Maximum":%d`, a.cfg.Memcached.MaxECPUPerSecond)) {
				t.Errorf("serverless cache limits %s, want %d GB and %d ECPU/s", got, a.cfg.Memcached.MaxDataStorageGB, a.cfg.Memcached.MaxECPUPerSecond)
			}
			checkIsolated(t, s, asList(c.Properties["SubnetIds"]))
		case MemcachedNodes:
			_, c := s.one(t, "AWS::ElastiCache::CacheCluster")
			cacheSGs = asList(c.Properties["VpcSecurityGroupIds"])
			port = float64(a.cfg.Memcached.Port)
			p := c.Properties
			if p["Engine"] != "memcached" || p["NumCacheNodes"] != float64(a.cfg.Memcached.Nodes) || p["Port"] != port ||
				p["TransitEncryptionEnabled"] != *a.cfg.Memcached.TLS || p["AZMode"] != "cross-az" {
				t.Errorf("cache cluster %v, want memcached, %d nodes, port %v, TLS %v, cross-az", p, a.cfg.Memcached.Nodes, port, *a.cfg.Memcached.TLS)
			}
			_, group := s.one(t, "AWS::ElastiCache::SubnetGroup")
			checkIsolated(t, s, asList(group.Properties["SubnetIds"]))
		}
		if len(cacheSGs) != 1 {
			t.Fatalf("cache in %d security groups, want 1", len(cacheSGs))
		}
		cacheSG := refID(cacheSGs[0])
		if cacheSG == authSG || cacheSG == "" {
			t.Fatalf("cache security group %q, authorizer's %q", cacheSG, authSG)
		}

		// Every ingress rule of the cache's group, inline or standalone.
		type rule struct{ src, cidr string }
		var rules []rule
		for _, in := range asList(s.res[cacheSG].Properties["SecurityGroupIngress"]) {
			m := in.(map[string]any)
			rules = append(rules, rule{src: refID(m["SourceSecurityGroupId"]), cidr: render(m["CidrIp"]) + render(m["CidrIpv6"]) + render(m["SourcePrefixListId"])})
		}
		for id, r := range s.ofType("AWS::EC2::SecurityGroupIngress") {
			p := r.Properties
			if refID(p["GroupId"]) == authSG {
				t.Errorf("ingress rule %s opens the authorizer's security group", id)
			}
			if refID(p["GroupId"]) != cacheSG {
				continue
			}
			if p["IpProtocol"] != "tcp" || p["FromPort"] != port || p["ToPort"] != port {
				t.Errorf("cache ingress %s: %v %v-%v, want tcp %v only", id, p["IpProtocol"], p["FromPort"], p["ToPort"], port)
			}
			rules = append(rules, rule{src: refID(p["SourceSecurityGroupId"]), cidr: render(p["CidrIp"]) + render(p["CidrIpv6"]) + render(p["SourcePrefixListId"])})
		}
		if len(rules) != 1 || rules[0].src != authSG || rules[0].cidr != "nullnullnull" {
			t.Errorf("cache ingress rules %+v, want exactly one, from the authorizer's group %s", rules, authSG)
		}
		if in := s.res[authSG].Properties["SecurityGroupIngress"]; in != nil {
			t.Errorf("the authorizer's security group has ingress %v", in)
		}
	})
}

func checkIsolated(t *testing.T, s *synthStack, subnets []any) {
	t.Helper()
	if len(subnets) < 2 {
		t.Errorf("cache in %d subnets, want at least 2", len(subnets))
	}
	for _, sn := range subnets {
		if r := s.res[refID(sn)]; tagValue(r.Properties["Tags"], "aws-cdk:subnet-type") != "Isolated" {
			t.Errorf("cache subnet %v is not isolated", sn)
		}
	}
}

func TestIAMLeastPrivilege(t *testing.T) {
	allowed := map[string]bool{}
	for _, a := range append(slices.Clone(sluice.StateTableActions), sluice.RulesTableActions...) {
		allowed[a] = true
	}
	eachStack(t, func(t *testing.T, a *synthApp, s *synthStack) {
		arn := func(name string) string {
			return fmt.Sprintf("arn:aws:dynamodb:%s:%s:table/%s", s.region, a.cfg.Account, name)
		}
		type grant struct{ actions, resources []string }
		var dynamo []grant
		for id, r := range s.res {
			var docs []any
			switch r.Type {
			case "AWS::IAM::Policy", "AWS::IAM::ManagedPolicy":
				docs = append(docs, r.Properties["PolicyDocument"])
			case "AWS::IAM::Role":
				for _, p := range asList(r.Properties["Policies"]) {
					docs = append(docs, p.(map[string]any)["PolicyDocument"])
				}
			}
			for _, d := range docs {
				for _, st := range asList(d.(map[string]any)["Statement"]) {
					m := st.(map[string]any)
					actions := sortedStrings(asList(m["Action"]))
					resources := sortedStrings(asList(m["Resource"]))
					if m["NotAction"] != nil || m["NotResource"] != nil {
						t.Errorf("%s: NotAction/NotResource statement %v", id, m)
					}
					touchesDynamo := false
					for _, act := range actions {
						if act == "*" || strings.HasPrefix(act, "dynamodb:") {
							touchesDynamo = true
						}
						if act == "*" || strings.HasSuffix(act, ":*") {
							t.Errorf("%s: wildcard action %q", id, act)
						}
					}
					if !touchesDynamo {
						continue
					}
					for _, act := range actions {
						if !allowed[act] {
							t.Errorf("%s: DynamoDB action %q is not one the authorizer uses", id, act)
						}
					}
					for _, res := range resources {
						if strings.Contains(res, "*") {
							t.Errorf("%s: DynamoDB actions %v on wildcard resource %q", id, actions, res)
						}
					}
					dynamo = append(dynamo, grant{actions, resources})
				}
			}
		}
		want := []grant{{sortedStrings(anySlice(sluice.StateTableActions)), []string{arn(a.cfg.TableName)}}}
		if a.cfg.Rules.Table {
			want = append(want, grant{sortedStrings(anySlice(sluice.RulesTableActions)), []string{arn(a.cfg.RulesTableName())}})
		}
		sortGrants := func(gs []grant) string {
			var ss []string
			for _, g := range gs {
				ss = append(ss, fmt.Sprint(g.actions, " on ", g.resources))
			}
			sort.Strings(ss)
			return strings.Join(ss, "\n")
		}
		if got, w := sortGrants(dynamo), sortGrants(want); got != w {
			t.Errorf("DynamoDB grants:\n%s\nwant:\n%s", got, w)
		}

		// The gateway endpoint's policy allows the same, and only that.
		_, ep := s.one(t, "AWS::EC2::VPCEndpoint")
		var epGrants []grant
		for _, st := range asList(ep.Properties["PolicyDocument"].(map[string]any)["Statement"]) {
			m := st.(map[string]any)
			epGrants = append(epGrants, grant{sortedStrings(asList(m["Action"])), sortedStrings(asList(m["Resource"]))})
		}
		if got, w := sortGrants(epGrants), sortGrants(want); got != w {
			t.Errorf("DynamoDB endpoint policy:\n%s\nwant:\n%s", got, w)
		}
	})
}

func anySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func TestAlarms(t *testing.T) {
	eachStack(t, func(t *testing.T, a *synthApp, s *synthStack) {
		alarms := s.ofType("AWS::CloudWatch::Alarm")
		found := map[string]bool{}
		topic := a.cfg.Alarms.TopicArns[s.region]
		for id, al := range alarms {
			p := al.Properties
			desc := render(p["AlarmDescription"])
			if topic != "" {
				if got := sortedStrings(asList(p["AlarmActions"])); !slices.Equal(got, []string{topic}) {
					t.Errorf("%s: actions %v, want [%s]", id, got, topic)
				}
			} else if p["AlarmActions"] != nil {
				t.Errorf("%s: actions %v without a configured topic", id, p["AlarmActions"])
			}
			metrics := render(p["Metrics"])
			switch {
			case p["MetricName"] == sluice.MetricFailOpen:
				found["failopen"] = true
				if p["Namespace"] != a.cfg.Authorizer.MetricsNamespace || p["Statistic"] != "Sum" || p["Threshold"] != float64(0) ||
					p["ComparisonOperator"] != "GreaterThanThreshold" || p["Dimensions"] != nil {
					t.Errorf("FailOpen alarm %v, want Sum > 0 in %s without dimensions", p, a.cfg.Authorizer.MetricsNamespace)
				}
			case p["MetricName"] == sluice.MetricBackendLatency:
				found["latency"] = true
				if p["ExtendedStatistic"] != "p99" || p["Threshold"] != a.cfg.Alarms.BackendLatencyP99Ms || p["ComparisonOperator"] != "GreaterThanThreshold" {
					t.Errorf("latency alarm %v, want p99 > %g", p, a.cfg.Alarms.BackendLatencyP99Ms)
				}
			case p["MetricName"] == sluice.MetricBreakerOpened:
				found["breaker"] = true
				if p["Namespace"] != a.cfg.Authorizer.MetricsNamespace || p["Statistic"] != "Sum" || p["Threshold"] != float64(1) ||
					p["ComparisonOperator"] != "GreaterThanOrEqualToThreshold" || !strings.Contains(render(p["Dimensions"]), sluice.DimensionBackend) {
					t.Errorf("breaker alarm %v, want Sum >= 1 per Backend in %s", p, a.cfg.Authorizer.MetricsNamespace)
				}
			case p["MetricName"] == sluice.MetricThrottled:
				found["throttled"] = true
				if p["Namespace"] != a.cfg.Authorizer.MetricsNamespace || p["Statistic"] != "Sum" || p["Threshold"] != float64(1) ||
					p["ComparisonOperator"] != "GreaterThanOrEqualToThreshold" || p["Dimensions"] != nil {
					t.Errorf("Throttled alarm %v, want Sum >= 1 in %s without dimensions", p, a.cfg.Authorizer.MetricsNamespace)
				}
			case strings.Contains(metrics, `"MetricName":"`+sluice.MetricTableThrottledRequests+`","Namespace":"AWS/DynamoDB"`):
				found["table"] = true
				// The region's replica, by the table's name, for each
				// operation the authorizer performs.
				for _, op := range []string{"GetItem", "UpdateItem"} {
					if !strings.Contains(metrics, `{"Name":"Operation","Value":"`+op+`"},{"Name":"TableName","Value":"`+a.cfg.TableName+`"}`) {
						t.Errorf("table throttle alarm %s, want ThrottledRequests of %s for %s", metrics, a.cfg.TableName, op)
					}
				}
				if p["Threshold"] != float64(1) || p["ComparisonOperator"] != "GreaterThanOrEqualToThreshold" {
					t.Errorf("table throttle alarm %v, want >= 1", p)
				}
			case strings.HasPrefix(render(p["MetricName"]), "Shares"):
				// The regional shares': TestSharesAlarms.
			case strings.Contains(metrics, "denied / (allowed + denied)"):
				found["denied"] = true
				if p["Threshold"] != a.cfg.Alarms.DeniedRatio ||
					!strings.Contains(metrics, `"MetricName":"Denied","Namespace":"`+a.cfg.Authorizer.MetricsNamespace+`"`) ||
					!strings.Contains(metrics, `"MetricName":"Allowed","Namespace":"`+a.cfg.Authorizer.MetricsNamespace+`"`) {
					t.Errorf("denied-rate alarm %v %s, want Denied/(Allowed+Denied) > %g", p["Threshold"], metrics, a.cfg.Alarms.DeniedRatio)
				}
			default:
				t.Errorf("unexpected alarm %s: %s", id, desc)
			}
		}
		for _, k := range []string{"failopen", "latency", "denied", "breaker", "throttled", "table"} {
			if !found[k] {
				t.Errorf("no %s alarm", k)
			}
		}
		_, dash := s.one(t, "AWS::CloudWatch::Dashboard")
		body := render(dash.Properties["DashboardBody"])
		for _, m := range []string{sluice.MetricAllowed, sluice.MetricDenied, sluice.MetricShed, sluice.MetricFailOpen, sluice.MetricFailClosed, sluice.MetricBackendErrors, sluice.MetricShedErrors, sluice.MetricBackendLatency, sluice.MetricThrottled, sluice.MetricTableThrottledRequests,
			sluice.MetricConcurrencyUnknown, sluice.MetricConcurrencyCleanups, sluice.MetricConcurrencyCleanupErrors, sluice.MetricConcurrencyCleanupsSkipped} {
			if !strings.Contains(body, `"`+m+`"`) {
				t.Errorf("dashboard does not show %s", m)
			}
		}
	})
}

func TestNoUnsuppressedNagFindings(t *testing.T) {
	eachStack(t, func(t *testing.T, a *synthApp, s *synthStack) { checkNag(t, a, s, 20) })
}

// checkNag fails on any unsuppressed cdk-nag finding in a stack, and
// unless at least minChecks rules reported on it.
func checkNag(t *testing.T, a *synthApp, s *synthStack, minChecks int) {
	t.Helper()
	{
		// Findings are annotations: errors fail synthesis, warnings are
		// printed; neither may remain unsuppressed. (Any other error, such
		// as a failed lookup, fails too.)
		for _, m := range s.messages {
			if m.level == "error" || (m.level == "warning" && strings.HasPrefix(m.data, "AwsSolutions-")) {
				t.Errorf("%s at %s: %s", m.level, m.path, firstLine(m.data))
			}
		}
		// The pack's report proves that the checks ran, and every
		// suppression it lists must carry a reason.
		f, err := os.Open(filepath.Join(a.outdir, "AwsSolutions-"+*s.stack.StackName()+"-NagReport.csv"))
		if err != nil {
			t.Fatalf("cdk-nag report: %v", err)
		}
		defer f.Close()
		rows, err := csv.NewReader(f).ReadAll()
		if err != nil || len(rows) < 2 {
			t.Fatalf("cdk-nag report: %d rows, %v", len(rows), err)
		}
		counts := map[string]int{}
		for _, r := range rows[1:] { // Rule ID, Resource ID, Compliance, Exception Reason, Rule Level, Rule Info
			counts[r[2]]++
			switch r[2] {
			case "Non-Compliant":
				t.Errorf("non-compliant: %s on %s (%s)", r[0], r[1], r[4])
			case "Suppressed":
				if len(strings.TrimSpace(r[3])) < 40 {
					t.Errorf("suppression of %s on %s without a real reason: %q", r[0], r[1], r[3])
				}
			}
		}
		if counts["Compliant"]+counts["Suppressed"] < minChecks {
			t.Errorf("report counts %v: the AwsSolutions rules do not seem to have run", counts)
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func TestRestIntegrations(t *testing.T) {
	eachStack(t, func(t *testing.T, a *synthApp, s *synthStack) {
		methods := s.ofType("AWS::ApiGateway::Method")
		if len(methods) != 2 {
			t.Errorf("%d REST methods, want ANY on / and on /{proxy+}", len(methods))
		}
		for id, m := range methods {
			integ := m.Properties["Integration"].(map[string]any)
			params, _ := integ["RequestParameters"].(map[string]any)
			if a.cfg.API.UpstreamURL == "" {
				if integ["Type"] != "MOCK" {
					t.Errorf("%s: integration %v, want MOCK without an upstream", id, integ["Type"])
				}
				resp := render(integ["IntegrationResponses"])
				for _, k := range []string{"rateLimitPolicy", "rateLimit\"", "remaining"} { // remaining: the body template
					if !strings.Contains(resp, "context.authorizer."+k) {
						t.Errorf("%s: mock response does not map context.authorizer.%s: %s", id, k, resp)
					}
				}
				continue
			}
			if integ["Type"] != "HTTP_PROXY" || !strings.HasPrefix(render(integ["Uri"]), a.cfg.API.UpstreamURL+"/") {
				t.Errorf("%s: integration %v %v, want HTTP_PROXY to %s", id, integ["Type"], integ["Uri"], a.cfg.API.UpstreamURL)
			}
			for header, key := range upstreamHeaders {
				if got := params["integration.request.header."+header]; got != "context.authorizer."+key {
					t.Errorf("%s: upstream header %s = %v, want context.authorizer.%s", id, header, got, key)
				}
			}
		}
	})
}

// Without an upstream, the example API's mock answers an allowed request
// with the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-11, mapped from the authorizer
// context (integration response parameters), and no legacy trio unless
// asked.
func TestMockRateLimitHeaders(t *testing.T) {
	a := apps(t)["regional"]
	s := a.stacks[0]
	found := 0
	for _, r := range s.ofType("AWS::ApiGateway::Method") {
		integ, _ := r.Properties["Integration"].(map[string]any)
		if integ == nil || integ["Type"] != "MOCK" {
			continue
		}
		found++
		resps, _ := integ["IntegrationResponses"].([]any)
		if len(resps) != 1 {
			t.Fatalf("mock integration responses: %v", integ["IntegrationResponses"])
		}
		params, _ := resps[0].(map[string]any)["ResponseParameters"].(map[string]any)
		got := map[string]string{}
		for k, v := range params {
			got[k] = render(v)
		}
		want := map[string]string{
			"method.response.header.RateLimit-Policy": "context.authorizer.rateLimitPolicy",
			"method.response.header.RateLimit":        "context.authorizer.rateLimit",
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("mock 200 headers:\n got %v\nwant %v", got, want)
		}
	}
	if found == 0 {
		t.Fatal("no mock integration in the regional app")
	}
}
