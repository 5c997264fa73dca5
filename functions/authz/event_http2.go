package authz

import (
	"github.com/aws/aws-lambda-go/events"

	"github.com/sluicehq/sluice/policy"
)

// http2Fields are the fields of an HTTP API payload 2.0 event Sluice reads.
type http2Fields struct {
	RouteArn              string            `json:"routeArn"`
	RouteKey              string            `json:"routeKey"`
	RawPath               string            `json:"rawPath"`
	Headers               map[string]string `json:"headers"`
	QueryStringParameters map[string]string `json:"queryStringParameters"`
	RequestContext        struct {
		RouteKey string `json:"routeKey"`
		Stage    string `json:"stage"`
		HTTP     struct {
			Method   string `json:"method"`
			Path     string `json:"path"`
			SourceIP string `json:"sourceIp"`
		} `json:"http"`
	} `json:"requestContext"`
}

// decodeHTTP2 decodes an HTTP API authorizer event of payload format 2.0.
// It carries no API key.
func decodeHTTP2(raw []byte) (*Event, error) {
	var e events.APIGatewayV2CustomAuthorizerV2Request
	if err := unmarshal(raw, &e, &http2Fields{}); err != nil {
		return nil, err
	}
	ev := &Event{Kind: KindHTTP, ARN: e.RouteArn}
	req := &ev.Request
	http := &e.RequestContext.HTTP
	req.SourceIP = http.SourceIP
	req.Method = http.Method
	req.Path = http.Path
	if req.Path == "" {
		req.Path = e.RawPath
	}
	req.RouteKey = e.RouteKey
	if req.RouteKey == "" {
		req.RouteKey = e.RequestContext.RouteKey
	}
	req.Stage = e.RequestContext.Stage
	req.Headers, req.Query = policy.Header(e.Headers), policy.Query(e.QueryStringParameters)
	req.Token, _ = req.Header("Authorization")
	req.Absent = policy.AttrAPIKey
	if err := checkARN(KindHTTP, "routeArn", ev.ARN); err != nil {
		return nil, err
	}
	switch {
	case req.Method == "":
		return nil, &EventError{Kind: KindHTTP, Reason: "missing requestContext.http.method"}
	case req.SourceIP == "":
		return nil, &EventError{Kind: KindHTTP, Reason: "missing requestContext.http.sourceIp"}
	}
	return ev, nil
}
