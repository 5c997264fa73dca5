package stacks

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/config"
)

// The regional app has the edge front door: a CloudFront distribution in
// its own stack, and a custom domain, health check and latency record in
// every region.

func TestEdgeDistribution(t *testing.T) {
	a := apps(t)["regional"]
	e := a.edge
	if e == nil {
		t.Fatal("no edge stack")
	}
	if e.region != EdgeRegion {
		t.Errorf("edge stack in %s, want %s (CloudFront's certificates)", e.region, EdgeRegion)
	}
	var deps []string
	for _, d := range *e.stack.Dependencies() {
		deps = append(deps, *d.StackName())
	}
	slices.Sort(deps)
	want := []string{}
	for _, r := range a.cfg.Regions {
		want = append(want, a.cfg.StackName(r))
	}
	slices.Sort(want)
	if !slices.Equal(deps, want) {
		t.Errorf("edge stack depends on %v, want every region's %v", deps, want)
	}

	_, dist := e.one(t, "AWS::CloudFront::Distribution")
	dc := dist.Properties["DistributionConfig"].(map[string]any)
	if got := render(dc["Aliases"]); got != "[api.example.com]" {
		t.Errorf("aliases %s", got)
	}
	origins := asList(dc["Origins"])
	if len(origins) != 1 {
		t.Fatalf("%d origins, want 1 (latency-routed)", len(origins))
	}
	o := origins[0].(map[string]any)
	co := o["CustomOriginConfig"].(map[string]any)
	if o["DomainName"] != "origin.api.example.com" || co["OriginProtocolPolicy"] != "https-only" || render(co["OriginSSLProtocols"]) != "[TLSv1.2]" {
		t.Errorf("origin %v %v", o["DomainName"], co)
	}
	if got := render(o["OriginCustomHeaders"]); got != fmt.Sprintf(`[{"HeaderName":%q,"HeaderValue":%q}]`, config.EdgeSecretHeader, edgeSecret) {
		t.Errorf("origin custom headers %s, want the edge secret", got)
	}
	b := dc["DefaultCacheBehavior"].(map[string]any)
	// Every request reaches the origin (and so the authorizer): the
	// managed CachingDisabled policy.
	if b["CachePolicyId"] != "4135ea2d-6df8-44a3-9df3-4b5a84be39ad" || b["ViewerProtocolPolicy"] != "https-only" || len(asList(b["AllowedMethods"])) != 7 {
		t.Errorf("default behavior %v", b)
	}
	orpID := refID(b["OriginRequestPolicyId"])
	orp, ok := e.res[orpID]
	if !ok || orp.Type != "AWS::CloudFront::OriginRequestPolicy" {
		t.Fatalf("origin request policy %v is not this stack's", b["OriginRequestPolicyId"])
	}
	// Every viewer header (Host, Authorization, the ones rules key on),
	// and CloudFront-Viewer-Address, the client's address.
	c := orp.Properties["OriginRequestPolicyConfig"].(map[string]any)
	if got := render(c["HeadersConfig"]); got != `{"HeaderBehavior":"allViewerAndWhitelistCloudFront","Headers":["CloudFront-Viewer-Address"]}` {
		t.Errorf("headers %s", got)
	}
	if render(c["QueryStringsConfig"]) != `{"QueryStringBehavior":"all"}` || render(c["CookiesConfig"]) != `{"CookieBehavior":"all"}` {
		t.Errorf("query strings %s cookies %s", render(c["QueryStringsConfig"]), render(c["CookiesConfig"]))
	}
	assertMatches(t, func() {
		e.template.HasResourceProperties(jsii.String("AWS::CloudFront::OriginRequestPolicy"), map[string]any{
			"OriginRequestPolicyConfig": map[string]any{"HeadersConfig": map[string]any{
				"HeaderBehavior": "allViewerAndWhitelistCloudFront", "Headers": []any{"CloudFront-Viewer-Address"},
			}},
		})
	})
	records := map[string]string{}
	for _, r := range e.ofType("AWS::Route53::RecordSet") {
		records[render(r.Properties["Type"])] = render(r.Properties["Name"]) + " -> " + render(r.Properties["AliasTarget"])
	}
	for _, typ := range []string{"A", "AAAA"} {
		if !strings.HasPrefix(records[typ], "api.example.com. -> ") || !strings.Contains(records[typ], `"Fn::GetAtt":["EdgeDistribution`) || !strings.Contains(records[typ], `"DomainName"]`) {
			t.Errorf("%s record %q, want api.example.com aliased to the distribution", typ, records[typ])
		}
	}
	checkNag(t, a, e, 5)
}

func TestEdgeOrigins(t *testing.T) {
	a := apps(t)["regional"]
	for _, s := range a.stacks {
		t.Run(s.region, func(t *testing.T) {
			domainID, domain := s.one(t, "AWS::ApiGateway::DomainName")
			if domain.Properties["DomainName"] != "api.example.com" || render(domain.Properties["EndpointConfiguration"]) != `{"Types":["REGIONAL"]}` {
				t.Errorf("custom domain %v", domain.Properties)
			}
			_, mapping := s.one(t, "AWS::ApiGateway::BasePathMapping")
			if refID(mapping.Properties["DomainName"]) != domainID || !strings.HasPrefix(refID(mapping.Properties["RestApiId"]), "RestApi") {
				t.Errorf("base path mapping %v", mapping.Properties)
			}
			hcID, hc := s.one(t, "AWS::Route53::HealthCheck")
			cfg := hc.Properties["HealthCheckConfig"].(map[string]any)
			if cfg["Type"] != "HTTPS" || render(cfg["FullyQualifiedDomainName"]) != "${Ref:RestApi0C43BF4B}.execute-api."+s.region+".${Ref:AWS::URLSuffix}" ||
				render(cfg["ResourcePath"]) != "/${Ref:RestApiDeploymentStageprod3855DE66}/health" {
				t.Errorf("health check %s %s %s", cfg["Type"], render(cfg["FullyQualifiedDomainName"]), render(cfg["ResourcePath"]))
			}
			_, rec := s.one(t, "AWS::Route53::RecordSet")
			p := rec.Properties
			if p["Name"] != "origin.api.example.com." || p["Type"] != "A" || p["Region"] != s.region || p["SetIdentifier"] != s.region ||
				refID(p["HealthCheckId"]) != hcID || render(p["AliasTarget"]) != fmt.Sprintf(`{"DNSName":{"Fn::GetAtt":[%q,"RegionalDomainName"]},"HostedZoneId":{"Fn::GetAtt":[%[1]q,"RegionalHostedZoneId"]}}`, domainID) {
				t.Errorf("latency record %v", p)
			}
			// The authorizer trusts CloudFront-Viewer-Address with the
			// distribution's secret only.
			env := s.res[AuthorizerLogicalID].Properties["Environment"].(map[string]any)["Variables"].(map[string]any)
			if env[config.EnvClientIP] != config.ClientIPViewerAddress || env[config.EnvEdgeSecret] != edgeSecret {
				t.Errorf("authorizer %s=%v %s=%v", config.EnvClientIP, env[config.EnvClientIP], config.EnvEdgeSecret, env[config.EnvEdgeSecret])
			}
		})
	}
	// The MRSC app has no edge: the authorizer keys on the source IP.
	for _, s := range apps(t)["mrsc"].stacks {
		env := s.res[AuthorizerLogicalID].Properties["Environment"].(map[string]any)["Variables"].(map[string]any)
		if _, set := env[config.EnvClientIP]; set || len(s.ofType("AWS::CloudFront::Distribution")) != 0 || len(s.ofType("AWS::ApiGateway::DomainName")) != 0 {
			t.Errorf("%s: edge resources or variables without edge", s.region)
		}
	}
}
