package sluice

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// invokeURI is the URI by which API Gateway invokes the function.
func invokeURI(fn awslambda.IFunction) *string {
	s := awscdk.Stack_Of(fn)
	return jsii.String(fmt.Sprintf("arn:%s:apigateway:%s:lambda:path/2015-03-31/functions/%s/invocations",
		*s.Partition(), *s.Region(), *fn.FunctionArn()))
}

// allowInvoke lets one API's authorizer invoke the function.
func (r *RateLimiter) allowInvoke(id string, apiID, authorizerID *string) {
	s := awscdk.Stack_Of(r)
	r.function.AddPermission(jsii.String(id), &awslambda.Permission{
		Principal: awsiam.NewServicePrincipal(jsii.String("apigateway.amazonaws.com"), nil),
		SourceArn: s.FormatArn(&awscdk.ArnComponents{
			Service:      jsii.String("execute-api"),
			Resource:     apiID,
			ResourceName: jsii.String("authorizers/" + *authorizerID),
		}),
	})
}

// protectREST adds the REQUEST authorizer (result cache off) to the REST
// API, attaches it to the chosen methods, and adds the gateway responses:
//
//	Allow                      -> the integration
//	Deny (rate limited)        -> ACCESS_DENIED      -> 429
//	error "Unauthorized"       -> UNAUTHORIZED       -> 401 (unchanged)
//	any other error (shedding) -> AUTHORIZER_FAILURE and
//	                              AUTHORIZER_CONFIGURATION_ERROR -> 503
func (r *RateLimiter) protectREST() {
	p := &r.props
	api := p.RestAPI
	r.rest = awsapigateway.NewCfnAuthorizer(r, jsii.String("RestAuthorizer"), &awsapigateway.CfnAuthorizerProps{
		RestApiId:      api.RestApiId(),
		Name:           jsii.String(p.Function.AuthorizerName),
		Type:           jsii.String("REQUEST"),
		AuthorizerUri:  invokeURI(r.function),
		IdentitySource: jsii.String(IdentitySource),
		// Off, explicitly: CDK's default of 300 s would let a cached Allow
		// skip the limiter for five minutes.
		AuthorizerResultTtlInSeconds: jsii.Number(0),
	})
	r.allowInvoke("RestApiInvoke", api.RestApiId(), r.rest.Ref())

	if len(p.Methods) > 0 {
		for i, m := range p.Methods {
			cfn, ok := m.Node().DefaultChild().(awsapigateway.CfnMethod)
			if !ok {
				r.fail("Methods[%d]: not a method", i)
				continue
			}
			if *m.Api().Node().Path() != *api.Node().Path() {
				r.fail("Methods[%d] (%s %s): not a method of RestAPI", i, *m.HttpMethod(), *m.Resource().Path())
				continue
			}
			if msg := r.attachMethod(cfn); msg != "" {
				r.fail("Methods[%d] (%s %s): %s", i, *m.HttpMethod(), *m.Resource().Path(), msg)
			}
		}
	} else {
		awscdk.Aspects_Of(api).Add(&restAspect{r: r}, mutating())
	}

	if *p.GatewayResponses {
		r.addGatewayResponses(api)
		r.lazy = append(r.lazy, func() []string { return r.checkGatewayResponses(api) })
	}
}

// restAspect protects every method of the API, at synth.
type restAspect struct{ r *RateLimiter }

func (a *restAspect) Visit(node constructs.IConstruct) {
	cfn, ok := node.(awsapigateway.CfnMethod)
	if !ok {
		return
	}
	if m := cfn.HttpMethod(); m != nil && strings.EqualFold(*m, "OPTIONS") {
		return // CORS preflight stays open
	}
	if msg := a.r.attachMethod(cfn); msg != "" {
		// Aspects run before validation: the construct's validation
		// reports it, and synthesis fails.
		a.r.fail("RestAPI: %s", msg)
	}
}

// attachMethod puts a method behind the authorizer, unless it already has
// another authorization (a method has one); it returns the problem, if
// any.
func (r *RateLimiter) attachMethod(cfn awsapigateway.CfnMethod) string {
	if t := cfn.AuthorizationType(); t != nil && *t != "NONE" {
		if *t == "CUSTOM" && cfn.AuthorizerId() != nil && *cfn.AuthorizerId() == *r.rest.Ref() {
			return ""
		}
		return fmt.Sprintf("method %s already uses %s authorization; a method has one authorizer (list the methods to protect in Methods)", *cfn.Node().Path(), *t)
	}
	cfn.SetAuthorizationType(jsii.String("CUSTOM"))
	cfn.SetAuthorizerId(r.rest.Ref())
	// The API's deployment is named by a hash of its methods, computed
	// when they were created: without this, a deployed stage would keep
	// serving the unprotected snapshot.
	if d := r.props.RestAPI.LatestDeployment(); d != nil {
		d.AddToLogicalId(map[string]any{"sluiceAuthorizer": map[string]any{"method": *cfn.Node().Path(), "authorizer": r.rest.Ref()}})
	}
	cdknag.NagSuppressions_AddResourceSuppressions(cfn, &[]*cdknag.NagPackSuppression{{
		Id:     jsii.String("AwsSolutions-COG4"),
		Reason: jsii.String("The method is protected by the Sluice Lambda REQUEST authorizer (rate limiting); authentication, if any, is the authorizer's job, not a Cognito user pool's."),
	}}, nil)
	return ""
}

// Gateway-response headers and bodies.
const (
	// ShedBody is the 503 body of both authorizer-error responses: static
	// values and context variables only (a failed authorizer returns no
	// context).
	ShedBody = `{"message": "Service Unavailable", "decision": "shed", "responseType": "$context.error.responseType", "requestId": "$context.requestId"}`
	// ThrottledBody is API Gateway's own throttling response.
	ThrottledBody = `{"message": "Too Many Requests", "decision": "throttled", "requestId": "$context.requestId"}`
)

// DeniedBody is the 429 body: every context key, as strings (the template
// is substituted, not evaluated, so quoting keeps the JSON valid even if a
// key were missing).
func DeniedBody() string {
	var b strings.Builder
	b.WriteString(`{"message": "Too Many Requests"`)
	for _, k := range ContextKeys {
		b.WriteString(`, "` + k + `": "$context.authorizer.` + k + `"`)
	}
	b.WriteString(`, "requestId": "$context.requestId"}`)
	return b.String()
}

// gatewayResponseTypes are the response types the construct sets.
var gatewayResponseTypes = []string{"ACCESS_DENIED", "AUTHORIZER_FAILURE", "AUTHORIZER_CONFIGURATION_ERROR", "THROTTLED"}

// addGatewayResponses maps the authorizer's outcomes to HTTP responses.
//
// A gateway response's header values may be request parameters
// (method.request.*) or static values in single quotes: that is what API
// Gateway documents. The authorizer's context is documented for the body
// template ($context.authorizer.<key>), so the 429 body always carries it,
// and its Retry-After is static: Props.RetryAfter, else derived from the
// rules; the 503's is Props.ShedRetryAfter (docs/infra.md).
func (r *RateLimiter) addGatewayResponses(api awsapigateway.RestApi) {
	retryAfter := "'" + strconv.Itoa(int(r.retryAfter.Seconds())) + "'"
	shedRetryAfter := "'" + strconv.Itoa(int(r.shedRetryAfter.Seconds())) + "'"
	denied := map[string]*string{
		"Content-Type":  jsii.String("'application/json'"),
		"Cache-Control": jsii.String("'no-store'"),
		"Retry-After":   jsii.String(retryAfter),
	}
	if r.props.ContextHeaders {
		denied["Retry-After"] = jsii.String("context.authorizer.retryAfter")
		for h, key := range RateLimitHeaders(r.props.LegacyRateLimitHeaders) {
			denied[h] = jsii.String("context.authorizer." + key)
		}
	}
	api.AddGatewayResponse(jsii.String("SluiceRateLimited"), &awsapigateway.GatewayResponseOptions{
		Type:            awsapigateway.ResponseType_ACCESS_DENIED(),
		StatusCode:      jsii.String("429"),
		ResponseHeaders: &denied,
		Templates:       &map[string]*string{"application/json": jsii.String(DeniedBody())},
	})

	// Load shedding fails the authorizer's invocation (any error but
	// "Unauthorized"). API Gateway documents AUTHORIZER_FAILURE for an
	// authorizer that "failed to authenticate the caller", but users
	// report that a Lambda authorizer's error comes back as a 500 with
	// x-amzn-ErrorType: AuthorizerConfigurationException, that is
	// AUTHORIZER_CONFIGURATION_ERROR. Both answer 503: a shed request must
	// never be a 500. The cost: a broken authorizer (a crash, a timeout,
	// an invalid response) is a 503 too; the body's responseType and the
	// access log tell them apart.
	for _, rt := range []struct {
		id  string
		typ awsapigateway.ResponseType
	}{
		{"SluiceShed", awsapigateway.ResponseType_AUTHORIZER_FAILURE()},
		{"SluiceShedConfigurationError", awsapigateway.ResponseType_AUTHORIZER_CONFIGURATION_ERROR()},
	} {
		api.AddGatewayResponse(jsii.String(rt.id), &awsapigateway.GatewayResponseOptions{
			Type:       rt.typ,
			StatusCode: jsii.String("503"),
			ResponseHeaders: &map[string]*string{
				"Content-Type":  jsii.String("'application/json'"),
				"Cache-Control": jsii.String("'no-store'"),
				"Retry-After":   jsii.String(shedRetryAfter),
			},
			Templates: &map[string]*string{"application/json": jsii.String(ShedBody)},
		})
	}

	// API Gateway's own throttling (stage or account limits, a rate per
	// second with a burst) is a 429 too.
	api.AddGatewayResponse(jsii.String("SluiceThrottled"), &awsapigateway.GatewayResponseOptions{
		Type:       awsapigateway.ResponseType_THROTTLED(),
		StatusCode: jsii.String("429"),
		ResponseHeaders: &map[string]*string{
			"Content-Type": jsii.String("'application/json'"),
			"Retry-After":  jsii.String("'1'"),
		},
		Templates: &map[string]*string{"application/json": jsii.String(ThrottledBody)},
	})
}

// checkGatewayResponses finds, at synth, another gateway response of a
// type the construct sets: CloudFormation would fail on the second one.
func (r *RateLimiter) checkGatewayResponses(api awsapigateway.RestApi) []string {
	count := map[string]int{}
	for _, c := range *api.Node().FindAll(constructs.ConstructOrder_PREORDER) {
		if g, ok := c.(awsapigateway.CfnGatewayResponse); ok && g.ResponseType() != nil {
			count[*g.ResponseType()]++
		}
	}
	var errs []string
	for _, t := range gatewayResponseTypes {
		if count[t] > 1 {
			errs = append(errs, fmt.Sprintf("sluice: RestAPI: another gateway response of type %s; set GatewayResponses to false to keep yours", t))
		}
	}
	return errs
}

// protectHTTP adds the Lambda authorizer (payload 2.0, simple responses,
// result cache off) to the HTTP API and attaches it to the chosen routes.
// HTTP APIs have no gateway responses: a refusal ({"isAuthorized":
// false}) is always 403, an authorizer error 500.
func (r *RateLimiter) protectHTTP() {
	p := &r.props
	api := p.HTTPAPI
	r.http = awsapigatewayv2.NewHttpAuthorizer(r, jsii.String("HttpAuthorizer"), &awsapigatewayv2.HttpAuthorizerProps{
		HttpApi:               api,
		AuthorizerName:        jsii.String(p.Function.AuthorizerName),
		Type:                  awsapigatewayv2.HttpAuthorizerType_LAMBDA,
		AuthorizerUri:         invokeURI(r.function),
		IdentitySource:        jsii.Strings(HTTPIdentitySource),
		EnableSimpleResponses: jsii.Bool(true),
		PayloadFormatVersion:  awsapigatewayv2.AuthorizerPayloadVersion_VERSION_2_0,
		ResultsCacheTtl:       awscdk.Duration_Seconds(jsii.Number(0)),
	})
	r.allowInvoke("HttpApiInvoke", api.ApiId(), r.http.AuthorizerId())
	if len(p.Routes) > 0 {
		for i, rt := range p.Routes {
			cfn, ok := rt.Node().DefaultChild().(awsapigatewayv2.CfnRoute)
			if !ok {
				r.fail("Routes[%d]: not a route", i)
				continue
			}
			if msg := r.attachRoute(cfn); msg != "" {
				r.fail("Routes[%d] (%s): %s", i, *rt.RouteId(), msg)
			}
		}
		return
	}
	awscdk.Aspects_Of(api).Add(&httpAspect{r: r}, mutating())
}

type httpAspect struct{ r *RateLimiter }

func (a *httpAspect) Visit(node constructs.IConstruct) {
	if cfn, ok := node.(awsapigatewayv2.CfnRoute); ok {
		if msg := a.r.attachRoute(cfn); msg != "" {
			a.r.fail("HTTPAPI: %s", msg)
		}
	}
}

func (r *RateLimiter) attachRoute(cfn awsapigatewayv2.CfnRoute) string {
	id := r.http.AuthorizerId()
	if t := cfn.AuthorizationType(); t != nil && *t != "NONE" {
		if *t == "CUSTOM" && cfn.AuthorizerId() != nil && *cfn.AuthorizerId() == *id {
			return ""
		}
		return fmt.Sprintf("route %s already uses %s authorization; a route has one authorizer (list the routes to protect in Routes)", *cfn.Node().Path(), *t)
	}
	cfn.SetAuthorizationType(jsii.String("CUSTOM"))
	cfn.SetAuthorizerId(id)
	return ""
}

// mutating runs an aspect before the read-only ones (cdk-nag among them),
// so that they see the protected methods.
func mutating() *awscdk.AspectOptions {
	return &awscdk.AspectOptions{Priority: awscdk.AspectPriority_MUTATING()}
}

// RateLimitHeaders returns the response headers that carry a decision, by
// the authorizer context key each is mapped from: RateLimit-Policy and
// RateLimit, the structured fields of draft-ietf-httpapi-ratelimit-headers-11
// (the authorizer's rateLimitPolicy and rateLimit), and with legacy the
// older RateLimit-Limit, -Remaining and -Reset trio.
func RateLimitHeaders(legacy bool) map[string]string {
	h := map[string]string{"RateLimit-Policy": "rateLimitPolicy", "RateLimit": "rateLimit"}
	if legacy {
		h["RateLimit-Limit"], h["RateLimit-Remaining"], h["RateLimit-Reset"] = "limit", "remaining", "reset"
	}
	return h
}
