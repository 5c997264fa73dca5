package authz

import (
	"github.com/aws/aws-lambda-go/events"

	"github.com/sluicehq/sluice/policy"
)

// decodeHTTP1 decodes an HTTP API authorizer event of payload format 1.0:
// a REST REQUEST event with "version": "1.0" and no API key (HTTP APIs
// have none).
func decodeHTTP1(raw []byte) (*Event, error) {
	var e events.APIGatewayV2CustomAuthorizerV1Request
	if err := unmarshal(raw, &e, &requestFields{}); err != nil {
		return nil, err
	}
	c := &e.RequestContext
	return requestEvent(requestFields{
		MethodArn: e.MethodArn, Resource: e.Resource, Path: e.Path, HTTPMethod: e.HTTPMethod,
		Headers: e.Headers, QueryStringParameters: e.QueryStringParameters,
		RequestContext: requestContextFields{Path: c.Path, Stage: c.Stage, HTTPMethod: c.HTTPMethod,
			Identity: identityFields{APIKey: c.Identity.APIKey, SourceIP: c.Identity.SourceIP}},
	}, policy.AttrAPIKey)
}
