package authz

import (
	"strings"

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
		RouteKey   string `json:"routeKey"`
		Stage      string `json:"stage"`
		DomainName string `json:"domainName"`
		HTTP       struct {
			Method   string `json:"method"`
			Path     string `json:"path"`
			SourceIP string `json:"sourceIp"`
		} `json:"http"`
	} `json:"requestContext"`
}

// decodeHTTP2 decodes an HTTP API authorizer event of payload format 2.0.
// It carries no API key. On a named stage its paths carry the stage
// ("/prod/demo/hello"), which is removed as REST events do.
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
	req.Path = stripStage(req.Path, req.Stage, e.RequestContext.DomainName)
	req.Headers, req.Query = policy.Header(e.Headers), policy.Query(e.QueryStringParameters)
	req.Token = authorization(req)
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

// stripStage removes a named stage's prefix from an HTTP API path: on the
// API's execute-api endpoint, rawPath and requestContext.http.path start
// with "/STAGE" (except on $default), where a REST event's path does not.
// On a custom domain (domainName not an execute-api host) the path carries
// no stage and is kept as it is. An event without a domainName (a local
// or sample event) is taken to be on the execute-api endpoint.
func stripStage(path, stage, domain string) string {
	if stage == "" || stage == "$default" || len(path) <= len(stage) || path[0] != '/' || path[1:1+len(stage)] != stage {
		return path
	}
	if _, rest, _ := strings.Cut(domain, "."); domain != "" && !strings.HasPrefix(rest, "execute-api.") {
		return path
	}
	switch rest := path[1+len(stage):]; {
	case rest == "":
		return "/"
	case rest[0] == '/':
		return rest
	}
	return path
}

// authorization is the request's credential: its Authorization header,
// through policy.Credential.
func authorization(req *policy.Request) string {
	v, _ := req.Header("Authorization")
	return policy.Credential(v)
}
