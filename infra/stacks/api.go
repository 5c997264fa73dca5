package stacks

import (
	"strconv"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2authorizers"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2integrations"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awswafv2"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// IdentitySource is the REQUEST authorizer's identity source. With the
// result cache off, API Gateway uses identity sources only to check that
// they are present (a request missing one gets 401 without the authorizer
// being called), so the source must be something every request has: the
// caller's IP, which API Gateway always knows.
const (
	IdentitySource     = "context.identity.sourceIp"
	HTTPIdentitySource = "$context.identity.sourceIp"
)

// Authorizer context keys (strings or numbers) set by the authorizer.
var contextKeys = []string{"decision", "rule", "limit", "remaining", "reset", "retryAfter"}

// upstreamHeaders are the request headers an HTTP upstream receives, from
// the authorizer context of an allowed request.
var upstreamHeaders = map[string]string{
	"X-Sluice-Rule":      "rule",
	"X-Sluice-Limit":     "limit",
	"X-Sluice-Remaining": "remaining",
	"X-Sluice-Reset":     "reset",
}

// restAccessLogFormat is a JSON access log line with the authorizer's
// outcome. No caller IP: the authorizer logs hashed keys only, and the
// access log follows suit.
const restAccessLogFormat = `{"requestId":"$context.requestId","requestTime":"$context.requestTime",` +
	`"method":"$context.httpMethod","resourcePath":"$context.resourcePath","status":"$context.status",` +
	`"responseType":"$context.error.responseType","authorizerStatus":"$context.authorizer.status",` +
	`"authorizerLatency":"$context.authorizer.latency","decision":"$context.authorizer.decision",` +
	`"rule":"$context.authorizer.rule","integrationLatency":"$context.integrationLatency"}`

const httpAccessLogFormat = `{"requestId":"$context.requestId","requestTime":"$context.requestTime",` +
	`"method":"$context.httpMethod","routeKey":"$context.routeKey","status":"$context.status",` +
	`"authorizerStatus":"$context.authorizer.status","authorizerLatency":"$context.authorizer.latency",` +
	`"authorizerError":"$context.authorizer.error","decision":"$context.authorizer.decision",` +
	`"rule":"$context.authorizer.rule","integrationLatency":"$context.integrationLatency"}`

// newRestAPI builds the REST API: every method (the root and {proxy+}) is
// protected by the REQUEST authorizer with its result cache off, and the
// gateway responses turn the authorizer's answers into HTTP:
//
//	Allow                      -> the integration
//	Deny (rate limited)        -> ACCESS_DENIED      -> 429
//	error "Unauthorized"       -> UNAUTHORIZED       -> 401 (unchanged)
//	any other error (shedding) -> AUTHORIZER_FAILURE and
//	                              AUTHORIZER_CONFIGURATION_ERROR -> 503
func newRestAPI(s awscdk.Stack, c *Config, region string, fn awslambda.IFunction) awsapigateway.RestApi {
	accessLogs := awslogs.NewLogGroup(s, jsii.String("RestApiAccessLogs"), &awslogs.LogGroupProps{
		Retention:     retention(c.Authorizer.LogRetentionDays),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	authorizer := awsapigateway.NewRequestAuthorizer(s, jsii.String("RequestAuthorizer"), &awsapigateway.RequestAuthorizerProps{
		AuthorizerName:  jsii.String(c.StackPrefix + "RateLimiter"),
		Handler:         fn,
		IdentitySources: jsii.Strings(*awsapigateway.IdentitySource_Context(jsii.String("identity.sourceIp"))),
		// Off, explicitly: CDK's default of 300 s would let a cached Allow
		// skip the limiter for five minutes.
		ResultsCacheTtl: awscdk.Duration_Seconds(jsii.Number(0)),
	})
	api := awsapigateway.NewRestApi(s, jsii.String("RestApi"), &awsapigateway.RestApiProps{
		RestApiName:    jsii.String(c.StackPrefix + "-api"),
		Description:    jsii.String("API protected by the Sluice rate limiter"),
		EndpointTypes:  &[]awsapigateway.EndpointType{awsapigateway.EndpointType_REGIONAL},
		CloudWatchRole: c.API.CloudWatchRole,
		DeployOptions: &awsapigateway.StageOptions{
			StageName:            jsii.String(c.API.StageName),
			AccessLogDestination: awsapigateway.NewLogGroupLogDestination(accessLogs),
			AccessLogFormat:      awsapigateway.AccessLogFormat_Custom(jsii.String(restAccessLogFormat)),
			LoggingLevel:         awsapigateway.MethodLoggingLevel_ERROR,
			DataTraceEnabled:     jsii.Bool(false),
			MetricsEnabled:       jsii.Bool(true),
		},
	})
	validator := api.AddRequestValidator(jsii.String("Validator"), &awsapigateway.RequestValidatorOptions{
		ValidateRequestParameters: jsii.Bool(true),
		ValidateRequestBody:       jsii.Bool(true), // no models: validates nothing, but nag asks for both
	})

	rootIntegration, proxyIntegration := restIntegrations(c)
	methodOptions := func(proxy bool) *awsapigateway.MethodOptions {
		o := &awsapigateway.MethodOptions{
			AuthorizationType: awsapigateway.AuthorizationType_CUSTOM,
			Authorizer:        authorizer,
			RequestValidator:  validator,
		}
		if proxy && c.API.UpstreamURL != "" {
			o.RequestParameters = &map[string]*bool{"method.request.path.proxy": jsii.Bool(true)}
		}
		if c.API.UpstreamURL == "" {
			o.MethodResponses = &[]*awsapigateway.MethodResponse{{
				StatusCode: jsii.String("200"),
				ResponseParameters: &map[string]*bool{
					"method.response.header.RateLimit-Limit":     jsii.Bool(false),
					"method.response.header.RateLimit-Remaining": jsii.Bool(false),
					"method.response.header.RateLimit-Reset":     jsii.Bool(false),
				},
			}}
		}
		return o
	}
	api.Root().AddMethod(jsii.String("ANY"), rootIntegration, methodOptions(false))
	api.Root().AddResource(jsii.String("{proxy+}"), nil).AddMethod(jsii.String("ANY"), proxyIntegration, methodOptions(true))

	addGatewayResponses(api, c)

	if arn, ok := c.API.WebACLArns[region]; ok {
		awswafv2.NewCfnWebACLAssociation(s, jsii.String("RestApiWebAcl"), &awswafv2.CfnWebACLAssociationProps{
			ResourceArn: api.DeploymentStage().StageArn(),
			WebAclArn:   jsii.String(arn),
		})
	} else {
		cdknag.NagSuppressions_AddResourceSuppressions(api, &[]*cdknag.NagPackSuppression{{
			Id:     jsii.String("AwsSolutions-APIG3"),
			Reason: jsii.String("Rate limiting is what Sluice itself does; a WAFv2 web ACL is optional (api.webAclArns) and configured per deployment."),
		}}, jsii.Bool(true))
	}
	cdknag.NagSuppressions_AddResourceSuppressions(api, &[]*cdknag.NagPackSuppression{{
		Id:     jsii.String("AwsSolutions-COG4"),
		Reason: jsii.String("The methods are protected by the Sluice Lambda REQUEST authorizer by design; authentication, if any, is the authorizer's job, not a Cognito user pool's."),
	}}, jsii.Bool(true))
	if *c.API.CloudWatchRole {
		cdknag.NagSuppressions_AddResourceSuppressions(api, &[]*cdknag.NagPackSuppression{{
			Id:        jsii.String("AwsSolutions-IAM4"),
			Reason:    jsii.String("The account-level API Gateway logging role uses AmazonAPIGatewayPushToCloudWatchLogs, the policy API Gateway documents for it; it must write to log groups API Gateway names at run time."),
			AppliesTo: &[]any{jsii.String("Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs")},
		}}, jsii.Bool(true))
	}
	return api
}

// restIntegrations returns the integrations of the root and {proxy+}
// methods: an HTTP proxy to the upstream, or a mock answering 200 with the
// rate-limit headers (mapped from the authorizer context, which API Gateway
// allows in integration responses).
func restIntegrations(c *Config) (root, proxy awsapigateway.Integration) {
	if u := strings.TrimSuffix(c.API.UpstreamURL, "/"); u != "" {
		// The upstream learns the decision through request headers mapped
		// from the authorizer context (a documented mapping source for
		// integration requests), and may echo them to its clients.
		params := map[string]*string{}
		for header, key := range upstreamHeaders {
			params["integration.request.header."+header] = jsii.String("context.authorizer." + key)
		}
		root = awsapigateway.NewHttpIntegration(jsii.String(u+"/"), &awsapigateway.HttpIntegrationProps{
			HttpMethod: jsii.String("ANY"),
			Proxy:      jsii.Bool(true),
			Options:    &awsapigateway.IntegrationOptions{RequestParameters: &params},
		})
		proxyParams := map[string]*string{"integration.request.path.proxy": jsii.String("method.request.path.proxy")}
		for k, v := range params {
			proxyParams[k] = v
		}
		proxy = awsapigateway.NewHttpIntegration(jsii.String(u+"/{proxy}"), &awsapigateway.HttpIntegrationProps{
			HttpMethod: jsii.String("ANY"),
			Proxy:      jsii.Bool(true),
			Options:    &awsapigateway.IntegrationOptions{RequestParameters: &proxyParams},
		})
		return root, proxy
	}
	mock := awsapigateway.NewMockIntegration(&awsapigateway.IntegrationOptions{
		PassthroughBehavior: awsapigateway.PassthroughBehavior_WHEN_NO_TEMPLATES,
		RequestTemplates:    &map[string]*string{"application/json": jsii.String(`{"statusCode": 200}`)},
		IntegrationResponses: &[]*awsapigateway.IntegrationResponse{{
			StatusCode: jsii.String("200"),
			ResponseParameters: &map[string]*string{
				"method.response.header.RateLimit-Limit":     jsii.String("context.authorizer.limit"),
				"method.response.header.RateLimit-Remaining": jsii.String("context.authorizer.remaining"),
				"method.response.header.RateLimit-Reset":     jsii.String("context.authorizer.reset"),
			},
			ResponseTemplates: &map[string]*string{
				"application/json": jsii.String(`{"message": "ok", "rule": "$context.authorizer.rule", "remaining": "$context.authorizer.remaining"}`),
			},
		}},
	})
	return mock, mock
}

// addGatewayResponses maps the authorizer's outcomes to HTTP responses.
//
// A gateway response's header values may be request parameters
// (method.request.*) or static values in single quotes: that is what API
// Gateway documents. The authorizer's context is documented for the body
// template ($context.authorizer.<key>), so the 429 body always carries it;
// its headers carry it only with api.contextHeaders (see docs/infra.md).
func addGatewayResponses(api awsapigateway.RestApi, c *Config) {
	retryAfter := "'" + strconv.Itoa(c.API.RetryAfterSeconds) + "'"

	denied := map[string]*string{
		"Content-Type":  jsii.String("'application/json'"),
		"Cache-Control": jsii.String("'no-store'"),
		"Retry-After":   jsii.String(retryAfter),
	}
	if c.API.ContextHeaders {
		denied["Retry-After"] = jsii.String("context.authorizer.retryAfter")
		denied["RateLimit-Limit"] = jsii.String("context.authorizer.limit")
		denied["RateLimit-Remaining"] = jsii.String("context.authorizer.remaining")
		denied["RateLimit-Reset"] = jsii.String("context.authorizer.reset")
	}
	api.AddGatewayResponse(jsii.String("RateLimited"), &awsapigateway.GatewayResponseOptions{
		Type:            awsapigateway.ResponseType_ACCESS_DENIED(),
		StatusCode:      jsii.String("429"),
		ResponseHeaders: &denied,
		Templates:       &map[string]*string{"application/json": jsii.String(deniedBody())},
	})

	// Load shedding fails the authorizer's invocation (any error but
	// "Unauthorized"). API Gateway documents AUTHORIZER_FAILURE for an
	// authorizer that "failed to authenticate the caller", but users
	// report that a Lambda authorizer's error comes back as a 500 with
	// x-amzn-ErrorType: AuthorizerConfigurationException, that is
	// AUTHORIZER_CONFIGURATION_ERROR (documented as "failing to connect to
	// a custom authorizer"). Both answer 503: a shed request must never be
	// a 500. The cost: a broken authorizer (a crash, a timeout, an invalid
	// response) is a 503 too; the body's responseType and the access log
	// tell them apart, and Shed stays at zero in the metrics.
	for _, r := range []struct {
		id  string
		typ awsapigateway.ResponseType
	}{
		{"Shed", awsapigateway.ResponseType_AUTHORIZER_FAILURE()},
		{"ShedConfigurationError", awsapigateway.ResponseType_AUTHORIZER_CONFIGURATION_ERROR()},
	} {
		api.AddGatewayResponse(jsii.String(r.id), &awsapigateway.GatewayResponseOptions{
			Type:       r.typ,
			StatusCode: jsii.String("503"),
			ResponseHeaders: &map[string]*string{
				"Content-Type":  jsii.String("'application/json'"),
				"Cache-Control": jsii.String("'no-store'"),
				"Retry-After":   jsii.String(retryAfter),
			},
			Templates: &map[string]*string{"application/json": jsii.String(shedBody)},
		})
	}

	// API Gateway's own throttling (stage or account limits) is a 429 too;
	// give it the same Retry-After.
	api.AddGatewayResponse(jsii.String("Throttled"), &awsapigateway.GatewayResponseOptions{
		Type:       awsapigateway.ResponseType_THROTTLED(),
		StatusCode: jsii.String("429"),
		ResponseHeaders: &map[string]*string{
			"Content-Type": jsii.String("'application/json'"),
			"Retry-After":  jsii.String(retryAfter),
		},
		Templates: &map[string]*string{"application/json": jsii.String(
			`{"message": "Too Many Requests", "decision": "throttled", "requestId": "$context.requestId"}`)},
	})
}

// shedBody is the 503 body of both authorizer-error responses: static
// values and context variables only (a failed authorizer returns no
// context).
const shedBody = `{"message": "Service Unavailable", "decision": "shed", "responseType": "$context.error.responseType", "requestId": "$context.requestId"}`

// deniedBody is the 429 body: every context key, as strings (the template
// is substituted, not evaluated, so quoting keeps the JSON valid even if a
// key were missing).
func deniedBody() string {
	var b strings.Builder
	b.WriteString(`{"message": "Too Many Requests"`)
	for _, k := range contextKeys {
		b.WriteString(`, "` + k + `": "$context.authorizer.` + k + `"`)
	}
	b.WriteString(`, "requestId": "$context.requestId"}`)
	return b.String()
}

// newHTTPAPI builds the HTTP API variant: a $default route to the upstream,
// protected by the same function as a simple-response (payload 2.0)
// authorizer with its cache off. HTTP APIs have no gateway responses: a
// refusal ({"isAuthorized": false}) is always 403, without the authorizer's
// context or a Retry-After; an authorizer error is 500.
func newHTTPAPI(s awscdk.Stack, c *Config, fn awslambda.IFunction) awsapigatewayv2.HttpApi {
	upstream := c.API.UpstreamURL
	if upstream == "" {
		upstream = DefaultHTTPUpstream
	}
	authorizer := awsapigatewayv2authorizers.NewHttpLambdaAuthorizer(jsii.String("HttpAuthorizer"), fn, &awsapigatewayv2authorizers.HttpLambdaAuthorizerProps{
		AuthorizerName:  jsii.String(c.StackPrefix + "RateLimiterHttp"),
		ResponseTypes:   &[]awsapigatewayv2authorizers.HttpLambdaResponseType{awsapigatewayv2authorizers.HttpLambdaResponseType_SIMPLE},
		IdentitySource:  jsii.Strings(HTTPIdentitySource),
		ResultsCacheTtl: awscdk.Duration_Seconds(jsii.Number(0)),
	})
	api := awsapigatewayv2.NewHttpApi(s, jsii.String("HttpApi"), &awsapigatewayv2.HttpApiProps{
		ApiName:           jsii.String(c.StackPrefix + "-http-api"),
		Description:       jsii.String("HTTP API protected by the Sluice rate limiter (refusals are 403)"),
		DefaultAuthorizer: authorizer,
		DefaultIntegration: awsapigatewayv2integrations.NewHttpUrlIntegration(jsii.String("Upstream"), jsii.String(upstream),
			&awsapigatewayv2integrations.HttpUrlIntegrationProps{Method: awsapigatewayv2.HttpMethod_ANY}),
		CreateDefaultStage: jsii.Bool(true),
	})
	logs := awslogs.NewLogGroup(s, jsii.String("HttpApiAccessLogs"), &awslogs.LogGroupProps{
		Retention:     retention(c.Authorizer.LogRetentionDays),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	stage := api.DefaultStage().Node().DefaultChild().(awsapigatewayv2.CfnStage)
	stage.SetAccessLogSettings(&awsapigatewayv2.CfnStage_AccessLogSettingsProperty{
		DestinationArn: logs.LogGroupArn(),
		Format:         jsii.String(httpAccessLogFormat),
	})
	return api
}
