package sluice_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2integrations"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/infra/sluice"
)

// TestPublisherDeployed: with Shedding.Publisher the construct deploys the
// utilization publisher: a function with the SLUICE_PUBLISH_* variables and
// the authorizer's utilization, max age and shed store, a one-minute
// schedule, and a role that reads metrics and writes only the gauge's item;
// the utilization's max age becomes 2.5 periods for both functions.
func TestPublisherDeployed(t *testing.T) {
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(filepath.Join(tmpRoot, "out-publisher"))})
	s := awscdk.NewStack(app, jsii.String("Published"), &awscdk.StackProps{Env: env})
	api := awsapigatewayv2.NewHttpApi(s, jsii.String("Api"), nil)
	api.AddRoutes(&awsapigatewayv2.AddRoutesOptions{Path: jsii.String("/items"),
		Integration: awsapigatewayv2integrations.NewHttpUrlIntegration(jsii.String("Items"), jsii.String("https://items.example.com"), nil)})
	rl := sluice.New(s, "RateLimit", &sluice.Props{
		HTTPAPI:      api,
		BootstrapDir: bootDir,
		Rules:        sluice.Rules{YAML: rulesYAML},
		Cache:        &sluice.Cache{Mode: sluice.CacheNone},
		Shedding: sluice.Shedding{Utilization: "orders", Publisher: &sluice.Publisher{
			Namespace: "AWS/Lambda", Metric: "ConcurrentExecutions", Dimensions: map[string]string{"FunctionName": "orders"},
			Divisor: 200, BootstrapDir: bootDir,
		}},
	})
	if errs := rl.Errors(); len(errs) > 0 {
		t.Fatalf("errors: %q", errs)
	}
	if rl.Publisher() == nil {
		t.Fatal("no publisher function")
	}
	tmpl := assertions.Template_FromStack(s, nil)
	b, _ := json.Marshal(tmpl.ToJSON())
	var doc struct{ Resources map[string]resource }
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	st := &stack{stack: s, template: tmpl, res: doc.Resources}
	fns := st.ofType("AWS::Lambda::Function")
	if len(fns) != 2 {
		t.Fatalf("%d functions, want the authorizer and the publisher", len(fns))
	}
	var pubID string
	envs := map[string]map[string]string{}
	for id, fn := range fns {
		e := map[string]string{}
		for k, v := range fn.Properties["Environment"].(map[string]any)["Variables"].(map[string]any) {
			e[k] = render(v)
		}
		envs[id] = e
		if _, ok := e[config.EnvPublishMetric]; ok {
			pubID = id
			if fn.Properties["ReservedConcurrentExecutions"] != 1.0 || fn.Properties["VpcConfig"] != nil {
				t.Errorf("publisher properties %v", fn.Properties)
			}
		}
	}
	if pubID == "" {
		t.Fatal("no function has the publisher's variables")
	}
	pe := envs[pubID]
	for k, want := range map[string]string{
		config.EnvPublishNamespace: "AWS/Lambda", config.EnvPublishMetric: "ConcurrentExecutions",
		config.EnvPublishDimensions: "FunctionName=orders", config.EnvPublishDivisor: "200", config.EnvPublishStatistic: "Maximum",
		config.EnvPublishPeriod: "1m0s", config.EnvShedUtilization: "orders", config.EnvShedUtilizationMaxAge: "2m30s",
		config.EnvShedBackend: config.BackendDynamo,
	} {
		if pe[k] != want {
			t.Errorf("publisher %s = %q, want %q", k, pe[k], want)
		}
	}
	if !strings.Contains(pe[config.EnvDynamoTable], "${Ref:") {
		t.Errorf("publisher table = %q", pe[config.EnvDynamoTable])
	}
	for id, e := range envs {
		if id != pubID && e[config.EnvShedUtilizationMaxAge] != "2m30s" {
			t.Errorf("authorizer max age = %q, want 2m30s (2.5 one-minute periods)", e[config.EnvShedUtilizationMaxAge])
		}
	}
	_, rule := st.one(t, "AWS::Events::Rule")
	if rule.Properties["ScheduleExpression"] != "rate(1 minute)" {
		t.Errorf("schedule %v", rule.Properties["ScheduleExpression"])
	}
	targets := asList(rule.Properties["Targets"])
	if len(targets) != 1 || refID(targets[0].(map[string]any)["Arn"]) != pubID {
		t.Errorf("targets %v, want the publisher %s", targets, pubID)
	}
	if len(st.ofType("AWS::Lambda::Permission")) == 0 {
		t.Error("EventBridge may not invoke the publisher")
	}
	// The role: GetMetricData (no resource-level permission), UpdateItem on
	// the gauge's item of the state table, its own logs; nothing else.
	found := map[string]string{}
	for _, pol := range st.ofType("AWS::IAM::Policy") {
		for _, stmt := range asList(pol.Properties["PolicyDocument"].(map[string]any)["Statement"]) {
			m := stmt.(map[string]any)
			sid, _ := m["Sid"].(string)
			found[sid] = render(m["Action"]) + " on " + render(m["Resource"]) + " if " + render(m["Condition"])
		}
	}
	if got := found["ReadMetric"]; !strings.HasPrefix(got, "cloudwatch:GetMetricData on *") {
		t.Errorf("ReadMetric: %q", got)
	}
	if got := found["WriteGauge"]; !strings.HasPrefix(got, "dynamodb:UpdateItem on ${") || !strings.Contains(got, `"dynamodb:LeadingKeys":["#G/gauge/orders"]`) {
		t.Errorf("WriteGauge: %q", got)
	}
}

func TestPublisherPropErrors(t *testing.T) {
	app := awscdk.NewApp(nil)
	pub := func(p sluice.Publisher) *sluice.Publisher {
		if p.BootstrapDir == "" {
			p.BootstrapDir = bootDir
		}
		return &p
	}
	ok := sluice.Publisher{Namespace: "AWS/Lambda", Metric: "ConcurrentExecutions"}
	for i, tt := range []struct {
		shed sluice.Shedding
		want string
	}{
		{sluice.Shedding{Publisher: pub(ok)}, "sluice: Shedding: settings without FleetCapacity or Utilization"},
		{sluice.Shedding{FleetCapacity: 10, Publisher: pub(ok)}, "sluice: Shedding.Publisher: set Shedding.Utilization"},
		{sluice.Shedding{Utilization: "u", Publisher: pub(sluice.Publisher{Metric: "M"})}, "sluice: Shedding.Publisher.Namespace: config: SLUICE_PUBLISH_NAMESPACE: required"},
		{sluice.Shedding{Utilization: "u", Publisher: pub(sluice.Publisher{Namespace: "N", Metric: "M", Divisor: -1})}, "sluice: Shedding.Publisher.Divisor:"},
		{sluice.Shedding{Utilization: "u", Publisher: pub(sluice.Publisher{Namespace: "N", Metric: "M", Period: 30 * time.Second})}, "sluice: Shedding.Publisher.Period:"},
		{sluice.Shedding{Utilization: "u", UtilizationMaxAge: 30 * time.Second, Publisher: pub(ok)}, "sluice: Shedding.UtilizationMaxAge: 30s is shorter than Shedding.Publisher.Period (1m0s)"},
		{sluice.Shedding{Utilization: "u", Publisher: pub(sluice.Publisher{Namespace: "N", Metric: "M", BootstrapDir: "/nonexistent"})}, "sluice: Shedding.Publisher.BootstrapDir: no authorizer binary"},
	} {
		s := awscdk.NewStack(app, jsii.String(fmt.Sprintf("P%d", i)), &awscdk.StackProps{Env: env})
		api := awsapigatewayv2.NewHttpApi(s, jsii.String("Api"), nil)
		errs := sluice.New(s, "RateLimit", &sluice.Props{HTTPAPI: api, BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML},
			Cache: &sluice.Cache{Mode: sluice.CacheNone}, Shedding: tt.shed}).Errors()
		if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, tt.want) }) {
			t.Errorf("%d: errors %q, want one holding %q", i, errs, tt.want)
		}
	}
}

// TestShadowProp: Function.Shadow sets SLUICE_SHADOW=true on the authorizer.
func TestShadowProp(t *testing.T) {
	app := awscdk.NewApp(nil)
	s := awscdk.NewStack(app, jsii.String("Shadow"), &awscdk.StackProps{Env: env})
	api := awsapigatewayv2.NewHttpApi(s, jsii.String("Api"), nil)
	rl := sluice.New(s, "RateLimit", &sluice.Props{HTTPAPI: api, BootstrapDir: bootDir, Rules: sluice.Rules{YAML: rulesYAML},
		Cache: &sluice.Cache{Mode: sluice.CacheNone}, Function: sluice.Function{Shadow: true}})
	if errs := rl.Errors(); len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := rl.Environment()[config.EnvShadow]; got != "true" {
		t.Errorf("%s = %q, want true", config.EnvShadow, got)
	}
	s2 := awscdk.NewStack(app, jsii.String("NoShadow"), &awscdk.StackProps{Env: env})
	rl = sluice.New(s2, "RateLimit", &sluice.Props{HTTPAPI: awsapigatewayv2.NewHttpApi(s2, jsii.String("Api"), nil), BootstrapDir: bootDir,
		Rules: sluice.Rules{YAML: rulesYAML}, Cache: &sluice.Cache{Mode: sluice.CacheNone}})
	if _, ok := rl.Environment()[config.EnvShadow]; ok {
		t.Errorf("%s set without Function.Shadow", config.EnvShadow)
	}
}
