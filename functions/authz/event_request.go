package authz

import (
	"github.com/aws/aws-lambda-go/events"

	"github.com/sluicehq/sluice/policy"
)

// requestFields are the fields of a REST API REQUEST event (and of an HTTP
// API payload 1.0 event) Sluice reads.
type requestFields struct {
	MethodArn             string               `json:"methodArn"`
	Resource              string               `json:"resource"`
	Path                  string               `json:"path"`
	HTTPMethod            string               `json:"httpMethod"`
	Headers               map[string]string    `json:"headers"`
	QueryStringParameters map[string]string    `json:"queryStringParameters"`
	RequestContext        requestContextFields `json:"requestContext"`
}

type requestContextFields struct {
	Path       string         `json:"path"`
	Stage      string         `json:"stage"`
	HTTPMethod string         `json:"httpMethod"`
	Identity   identityFields `json:"identity"`
}

type identityFields struct {
	APIKey   string `json:"apiKey"`
	SourceIP string `json:"sourceIp"`
}

// decodeRequest decodes a REST API REQUEST authorizer event.
func decodeRequest(raw []byte) (*Event, error) {
	var e events.APIGatewayCustomAuthorizerRequestTypeRequest
	if err := unmarshal(raw, &e, &requestFields{}); err != nil {
		return nil, err
	}
	c := &e.RequestContext
	return requestEvent(requestFields{
		MethodArn: e.MethodArn, Resource: e.Resource, Path: e.Path, HTTPMethod: e.HTTPMethod,
		Headers: e.Headers, QueryStringParameters: e.QueryStringParameters,
		RequestContext: requestContextFields{Path: c.Path, Stage: c.Stage, HTTPMethod: c.HTTPMethod,
			Identity: identityFields{APIKey: c.Identity.APIKey, SourceIP: c.Identity.SourceIP}},
	}, 0)
}

// requestEvent checks the fields of a REQUEST event (REST or HTTP API 1.0)
// and turns them into an Event; absent lists the attributes the source
// cannot carry.
func requestEvent(f requestFields, absent policy.Attrs) (*Event, error) {
	ev := &Event{Kind: KindRequest, ARN: f.MethodArn}
	req := &ev.Request
	req.SourceIP = f.RequestContext.Identity.SourceIP
	req.Method = f.HTTPMethod
	if req.Method == "" {
		req.Method = f.RequestContext.HTTPMethod
	}
	req.Path = f.Path
	if req.Path == "" {
		req.Path = f.RequestContext.Path
	}
	if f.Resource != "" {
		req.RouteKey = req.Method + " " + f.Resource
	}
	req.Stage = f.RequestContext.Stage
	req.Headers, req.Query = policy.Header(f.Headers), policy.Query(f.QueryStringParameters)
	req.APIKey = f.RequestContext.Identity.APIKey
	req.Token = authorization(req)
	req.Absent = absent
	if err := checkARN(KindRequest, "methodArn", ev.ARN); err != nil {
		return nil, err
	}
	switch {
	case req.Method == "":
		return nil, &EventError{Kind: KindRequest, Reason: "missing httpMethod"}
	case req.SourceIP == "":
		return nil, &EventError{Kind: KindRequest, Reason: "missing requestContext.identity.sourceIp"}
	}
	return ev, nil
}
