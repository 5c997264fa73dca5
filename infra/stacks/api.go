package stacks

import (
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2integrations"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awswafv2"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"

	"github.com/sluicehq/sluice/infra/sluice"
)

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

// APIs are a region's APIs: what a user of the construct already has.
type APIs struct {
	Rest awsapigateway.RestApi
	HTTP awsapigatewayv2.HttpApi // nil without api.httpApi
}

func newAPIs(s awscdk.Stack, c *Config, region string) *APIs {
	a := &APIs{Rest: newRestAPI(s, c, region)}
	if *c.API.HTTPAPI {
		a.HTTP = newHTTPAPI(s, c)
	}
	return a
}

// newRestAPI builds the REST API: ANY on the root and on {proxy+}, to the
// upstream or a mock. The sluice construct puts every method behind its
// authorizer and adds the gateway responses.
func newRestAPI(s awscdk.Stack, c *Config, region string) awsapigateway.RestApi {
	accessLogs := awslogs.NewLogGroup(s, jsii.String("RestApiAccessLogs"), &awslogs.LogGroupProps{
		Retention:     retention(c.Authorizer.LogRetentionDays),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
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
		o := &awsapigateway.MethodOptions{RequestValidator: validator}
		if proxy && c.API.UpstreamURL != "" {
			o.RequestParameters = &map[string]*bool{"method.request.path.proxy": jsii.Bool(true)}
		}
		if c.API.UpstreamURL == "" {
			params := map[string]*bool{}
			for h := range sluice.RateLimitHeaders(c.API.LegacyRateLimitHeaders) {
				params["method.response.header."+h] = jsii.Bool(false)
			}
			o.MethodResponses = &[]*awsapigateway.MethodResponse{{StatusCode: jsii.String("200"), ResponseParameters: &params}}
		}
		return o
	}
	api.Root().AddMethod(jsii.String("ANY"), rootIntegration, methodOptions(false))
	api.Root().AddResource(jsii.String("{proxy+}"), nil).AddMethod(jsii.String("ANY"), proxyIntegration, methodOptions(true))

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
			StatusCode:         jsii.String("200"),
			ResponseParameters: mockHeaders(c.API.LegacyRateLimitHeaders),
			ResponseTemplates: &map[string]*string{
				"application/json": jsii.String(`{"message": "ok", "rule": "$context.authorizer.rule", "remaining": "$context.authorizer.remaining"}`),
			},
		}},
	})
	return mock, mock
}

// newHTTPAPI builds the HTTP API variant: a $default route to the
// upstream. The sluice construct puts it behind its authorizer (payload
// 2.0, simple responses). HTTP APIs have no gateway responses: a refusal
// is always 403, without the authorizer's context or a Retry-After; an
// authorizer error is 500.
func newHTTPAPI(s awscdk.Stack, c *Config) awsapigatewayv2.HttpApi {
	upstream := c.API.UpstreamURL
	if upstream == "" {
		upstream = DefaultHTTPUpstream
	}
	api := awsapigatewayv2.NewHttpApi(s, jsii.String("HttpApi"), &awsapigatewayv2.HttpApiProps{
		ApiName:     jsii.String(c.StackPrefix + "-http-api"),
		Description: jsii.String("HTTP API protected by the Sluice rate limiter (refusals are 403)"),
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

// mockHeaders maps the authorizer context into the mock's 200: the
// RateLimit fields (and the legacy trio when asked), as integration
// response parameters, the one documented route for context into headers.
func mockHeaders(legacy bool) *map[string]*string {
	m := map[string]*string{}
	for h, key := range sluice.RateLimitHeaders(legacy) {
		m["method.response.header."+h] = jsii.String("context.authorizer." + key)
	}
	return &m
}
