package sluice

import (
	"fmt"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscertificatemanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudfront"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudfrontorigins"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsroute53"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsroute53targets"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"

	"github.com/sluicehq/sluice/config"
)

// The edge front door, in two parts:
//
//	client -> api.example.com (CloudFront, the nearest edge location; Edge)
//	       -> origin.api.example.com (Route 53 latency records with health
//	          checks, resolved from the edge location: the nearest healthy
//	          region; one EdgeOrigin per region)
//	       -> that region's API Gateway custom domain "api.example.com"
//	          (the viewer's Host, forwarded) -> the REST API and its
//	          authorizer
//
// CloudFront forwards every viewer header (Host, Authorization, the headers
// rules key on) and adds CloudFront-Viewer-Address (the viewer's address
// and port) and the edge secret header. The authorizer takes {ip} from
// CloudFront-Viewer-Address only in a request that carries the secret
// (Props.EdgeSecret: SLUICE_CLIENT_IP=cloudfront-viewer-address and
// SLUICE_EDGE_SECRET): a client that reaches a region directly cannot
// choose its own address.

// EdgeOriginProps configure one region's origin of the edge front door.
type EdgeOriginProps struct {
	// RestAPI is the region's API; its deployment stage is mapped at the
	// root of the custom domain. Required.
	RestAPI awsapigateway.RestApi
	// DomainName is the public name clients use (the distribution's
	// alias). The region's custom domain has this name, because CloudFront
	// forwards the viewer's Host. Required.
	DomainName string
	// OriginName is the name CloudFront connects to, with one latency
	// record per region. Default "origin." + DomainName.
	OriginName string
	// Zone is the public hosted zone of both names. Required.
	Zone awsroute53.IHostedZone
	// Certificate of the custom domain, in this region. Default: a
	// DNS-validated certificate for DomainName and OriginName.
	Certificate awscertificatemanager.ICertificate
	// HealthCheckPath is probed by Route 53 on the region's execute-api
	// endpoint, under the stage: it must answer 2xx or 3xx through the
	// authorizer (give it a rule with priority critical, or a generous
	// limit: Route 53 probes from about 15 addresses every 30 s). Default
	// "/".
	HealthCheckPath string
}

// EdgeOrigin is one region's origin of the edge front door.
type EdgeOrigin struct {
	constructs.Construct
	Domain      awsapigateway.DomainName
	HealthCheck awsroute53.HealthCheck
	Record      awsroute53.ARecord
	origin      string
}

// OriginName is the latency-routed name this region answers.
func (o *EdgeOrigin) OriginName() string { return o.origin }

// NewEdgeOrigin adds a region's custom domain, health check and latency
// record to scope (the region's stack).
func NewEdgeOrigin(scope constructs.Construct, id string, p *EdgeOriginProps) *EdgeOrigin {
	o := &EdgeOrigin{}
	constructs.NewConstruct_Override(o, scope, jsii.String(id))
	var errs []string
	if p.RestAPI == nil {
		errs = append(errs, "sluice: EdgeOriginProps.RestAPI: required")
	}
	if p.DomainName == "" || p.Zone == nil {
		errs = append(errs, "sluice: EdgeOriginProps.DomainName, Zone: required")
	}
	o.Node().AddValidation(&validation{check: func() []string { return errs }})
	if len(errs) > 0 {
		return o
	}
	origin := p.OriginName
	if origin == "" {
		origin = "origin." + p.DomainName
	}
	o.origin = origin
	stack := awscdk.Stack_Of(o)
	cert := p.Certificate
	if cert == nil {
		cert = awscertificatemanager.NewCertificate(o, jsii.String("Certificate"), &awscertificatemanager.CertificateProps{
			DomainName:              jsii.String(p.DomainName),
			SubjectAlternativeNames: jsii.Strings(origin),
			Validation:              awscertificatemanager.CertificateValidation_FromDns(p.Zone),
		})
	}
	o.Domain = awsapigateway.NewDomainName(o, jsii.String("Domain"), &awsapigateway.DomainNameProps{
		DomainName:     jsii.String(p.DomainName),
		Certificate:    cert,
		EndpointType:   awsapigateway.EndpointType_REGIONAL,
		SecurityPolicy: awsapigateway.SecurityPolicy_TLS_1_2,
	})
	o.Domain.AddBasePathMapping(p.RestAPI, &awsapigateway.BasePathMappingOptions{Stage: p.RestAPI.DeploymentStage()})

	path := p.HealthCheckPath
	if path == "" {
		path = "/"
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	o.HealthCheck = awsroute53.NewHealthCheck(o, jsii.String("Health"), &awsroute53.HealthCheckProps{
		Type: awsroute53.HealthCheckType_HTTPS,
		Fqdn: jsii.String(fmt.Sprintf("%s.execute-api.%s.%s",
			*p.RestAPI.RestApiId(), *stack.Region(), *stack.UrlSuffix())),
		Port:             jsii.Number(443),
		ResourcePath:     jsii.String("/" + *p.RestAPI.DeploymentStage().StageName() + path),
		EnableSNI:        jsii.Bool(true),
		FailureThreshold: jsii.Number(3),
	})
	o.Record = awsroute53.NewARecord(o, jsii.String("Latency"), &awsroute53.ARecordProps{
		Zone:          p.Zone,
		RecordName:    jsii.String(origin),
		Target:        awsroute53.RecordTarget_FromAlias(awsroute53targets.NewApiGatewayDomain(o.Domain)),
		Region:        stack.Region(),
		SetIdentifier: stack.Region(),
		HealthCheck:   o.HealthCheck,
	})
	return o
}

// EdgeProps configure the edge's CloudFront distribution.
type EdgeProps struct {
	// DomainName is the public name clients use. Required.
	DomainName string
	// OriginName is the latency-routed name of the regions' origins.
	// Default "origin." + DomainName.
	OriginName string
	// Zone is the public hosted zone of both names. Required.
	Zone awsroute53.IHostedZone
	// Certificate for DomainName in us-east-1 (CloudFront's region).
	// Default: a DNS-validated certificate; the stack must then be in
	// us-east-1.
	Certificate awscertificatemanager.ICertificate
	// Secret is sent to every origin in the config.EdgeSecretHeader
	// header; every region's construct gets the same value as
	// Props.EdgeSecret. Required.
	Secret string
	// PriceClass of the distribution. Default PriceClass_ALL (every edge
	// location: the nearest one for every client).
	PriceClass awscloudfront.PriceClass
}

// Edge is the edge front door's CloudFront distribution and its alias
// records.
type Edge struct {
	constructs.Construct
	Distribution        awscloudfront.Distribution
	OriginRequestPolicy awscloudfront.OriginRequestPolicy
	url                 string
}

// URL is the front door's address.
func (e *Edge) URL() string { return e.url }

// NewEdge adds the distribution to scope (a stack in us-east-1, unless
// given a certificate from there).
func NewEdge(scope constructs.Construct, id string, p *EdgeProps) *Edge {
	e := &Edge{}
	constructs.NewConstruct_Override(e, scope, jsii.String(id))
	var errs []string
	if p.DomainName == "" || p.Zone == nil {
		errs = append(errs, "sluice: EdgeProps.DomainName, Zone: required")
	}
	if _, err := config.Parse(func(k string) string {
		return map[string]string{config.EnvClientIP: config.ClientIPViewerAddress, config.EnvEdgeSecret: p.Secret}[k]
	}); err != nil {
		errs = append(errs, fmt.Sprintf("sluice: EdgeProps.Secret: %v", err))
	}
	e.Node().AddValidation(&validation{check: func() []string { return errs }})
	e.url = "https://" + p.DomainName + "/"
	if len(errs) > 0 {
		return e
	}
	origin := p.OriginName
	if origin == "" {
		origin = "origin." + p.DomainName
	}
	cert := p.Certificate
	if cert == nil {
		cert = awscertificatemanager.NewCertificate(e, jsii.String("Certificate"), &awscertificatemanager.CertificateProps{
			DomainName: jsii.String(p.DomainName),
			Validation: awscertificatemanager.CertificateValidation_FromDns(p.Zone),
		})
	}
	// Every viewer header, query string and cookie, and the viewer's
	// address: the rules key on them. The Host header goes too (the
	// regions' custom domains carry the public name). With caching
	// disabled, CloudFront forwards Authorization under an all-viewer
	// policy.
	e.OriginRequestPolicy = awscloudfront.NewOriginRequestPolicy(e, jsii.String("OriginRequest"), &awscloudfront.OriginRequestPolicyProps{
		Comment:             jsii.String("Sluice edge: every viewer header and the viewer's address"),
		HeaderBehavior:      awscloudfront.OriginRequestHeaderBehavior_All(jsii.String(config.ViewerAddressHeader)),
		QueryStringBehavior: awscloudfront.OriginRequestQueryStringBehavior_All(),
		CookieBehavior:      awscloudfront.OriginRequestCookieBehavior_All(),
	})
	priceClass := p.PriceClass
	if priceClass == "" {
		priceClass = awscloudfront.PriceClass_PRICE_CLASS_ALL
	}
	e.Distribution = awscloudfront.NewDistribution(e, jsii.String("Distribution"), &awscloudfront.DistributionProps{
		Comment:                jsii.String("Sluice edge front door: the nearest healthy region"),
		DomainNames:            jsii.Strings(p.DomainName),
		Certificate:            cert,
		MinimumProtocolVersion: awscloudfront.SecurityPolicyProtocol_TLS_V1_2_2021,
		HttpVersion:            awscloudfront.HttpVersion_HTTP2_AND_3,
		EnableIpv6:             jsii.Bool(true),
		PriceClass:             priceClass,
		DefaultBehavior: &awscloudfront.BehaviorOptions{
			Origin: awscloudfrontorigins.NewHttpOrigin(jsii.String(origin), &awscloudfrontorigins.HttpOriginProps{
				ProtocolPolicy:     awscloudfront.OriginProtocolPolicy_HTTPS_ONLY,
				OriginSslProtocols: &[]awscloudfront.OriginSslPolicy{awscloudfront.OriginSslPolicy_TLS_V1_2},
				CustomHeaders:      &map[string]*string{config.EdgeSecretHeader: jsii.String(p.Secret)},
			}),
			ViewerProtocolPolicy: awscloudfront.ViewerProtocolPolicy_HTTPS_ONLY,
			AllowedMethods:       awscloudfront.AllowedMethods_ALLOW_ALL(),
			// Every request must reach the authorizer.
			CachePolicy:         awscloudfront.CachePolicy_CACHING_DISABLED(),
			OriginRequestPolicy: e.OriginRequestPolicy,
		},
	})
	target := awsroute53.RecordTarget_FromAlias(awsroute53targets.NewCloudFrontTarget(e.Distribution))
	awsroute53.NewARecord(e, jsii.String("Alias"), &awsroute53.ARecordProps{Zone: p.Zone, RecordName: jsii.String(p.DomainName), Target: target})
	awsroute53.NewAaaaRecord(e, jsii.String("AliasIPv6"), &awsroute53.AaaaRecordProps{Zone: p.Zone, RecordName: jsii.String(p.DomainName), Target: target})
	cdknag.NagSuppressions_AddResourceSuppressions(e.Distribution, &[]*cdknag.NagPackSuppression{
		{Id: jsii.String("AwsSolutions-CFR1"), Reason: jsii.String("An API open to every country; geo restrictions are the API owner's choice, not the rate limiter's.")},
		{Id: jsii.String("AwsSolutions-CFR2"), Reason: jsii.String("A web ACL is optional and per deployment; rate limiting is what the Sluice authorizer behind the distribution does.")},
		{Id: jsii.String("AwsSolutions-CFR3"), Reason: jsii.String("Standard logs need an S3 bucket with ACLs; the regions' API access logs and the authorizer's logs record every request.")},
	}, nil)
	return e
}
