package authz

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/policy"
)

// Kind is the type of an authorizer event.
type Kind uint8

const (
	// KindToken is a REST API TOKEN authorizer event
	// (events.APIGatewayCustomAuthorizerRequest).
	KindToken Kind = iota + 1
	// KindRequest is a REST API REQUEST authorizer event
	// (events.APIGatewayCustomAuthorizerRequestTypeRequest), or an HTTP API
	// payload 1.0 event, which has the same shape.
	KindRequest
	// KindHTTP is an HTTP API payload 2.0 authorizer event
	// (events.APIGatewayV2CustomAuthorizerV2Request).
	KindHTTP
)

// String returns "TOKEN", "REQUEST" or "HTTP 2.0".
func (k Kind) String() string {
	switch k {
	case KindToken:
		return "TOKEN"
	case KindRequest:
		return "REQUEST"
	case KindHTTP:
		return "HTTP 2.0"
	}
	return "unknown"
}

// EventError is the error for an event that is not a valid authorizer
// event: malformed JSON, an unknown type, a missing required field.
type EventError struct {
	Kind   Kind // zero when the type could not be told
	Reason string
}

func (e *EventError) Error() string {
	if e.Kind == 0 {
		return "sluice: bad event: " + e.Reason
	}
	return "sluice: bad " + e.Kind.String() + " event: " + e.Reason
}

// ErrUnauthorized is the authentication failure. Its message is the one
// API Gateway turns into 401.
var ErrUnauthorized = errors.New("Unauthorized")

// Event is a decoded authorizer event.
type Event struct {
	Kind Kind
	// ARN is the methodArn (REST) or routeArn (HTTP API) that an IAM
	// policy response names.
	ARN string
	// Request holds the attributes the rules see.
	Request policy.Request

	src            string // the event, which Request's strings point into
	headers, query rawValues
}

// DecodeEvent tells the event's type from its JSON and decodes it. It
// returns an *EventError for malformed JSON, an unknown type or a missing
// required field, and ErrUnauthorized for a TOKEN event without a token.
//
// It reads only the fields Sluice uses, with encoding/json's semantics
// (see jsonscan.go), and leaves headers and query parameters in the JSON
// until a rule asks for one.
func DecodeEvent(raw []byte) (*Event, error) {
	ev := &Event{src: string(raw)}
	var f eventFields
	f.headers.watch = "Authorization"
	if err := parseEvent(ev.src, &f); err != nil {
		var se *syntaxError
		if errors.As(err, &se) {
			return nil, &EventError{Reason: fmt.Sprintf("malformed JSON at byte %d: %s", se.Offset, se.msg)}
		}
		return nil, &EventError{Reason: err.Error()}
	}
	p := parser{s: ev.src}
	str := p.text
	ev.headers = rawValues{src: ev.src, objs: f.headers, fold: true}
	ev.query = rawValues{src: ev.src, objs: f.query}
	req := &ev.Request
	version, typ := str(f.version), str(f.typ)
	switch {
	case version == "2.0" && typ == "REQUEST":
		ev.Kind = KindHTTP
		ev.ARN = str(f.routeArn)
		req.SourceIP = str(f.httpSourceIP)
		req.Method = str(f.httpMethodV2)
		req.Path = str(f.httpPath)
		if req.Path == "" {
			req.Path = str(f.rawPath)
		}
		req.RouteKey = str(f.routeKey)
		if req.RouteKey == "" {
			req.RouteKey = str(f.rcRouteKey)
		}
		req.Stage = str(f.rcStage)
		req.Headers, req.Query = &ev.headers, &ev.query
		req.Token, _ = req.Header("Authorization")
		req.Absent = policy.AttrAPIKey // HTTP APIs have no API keys
		switch {
		case ev.ARN == "":
			return nil, &EventError{Kind: ev.Kind, Reason: "missing routeArn"}
		case req.Method == "":
			return nil, &EventError{Kind: ev.Kind, Reason: "missing requestContext.http.method"}
		case req.SourceIP == "":
			return nil, &EventError{Kind: ev.Kind, Reason: "missing requestContext.http.sourceIp"}
		}
	case (version == "" || version == "1.0") && typ == "REQUEST":
		ev.Kind = KindRequest
		ev.ARN = str(f.methodArn)
		req.SourceIP = str(f.idSourceIP)
		req.Method = str(f.httpMethod)
		if req.Method == "" {
			req.Method = str(f.rcHTTPMethod)
		}
		req.Path = str(f.path)
		if req.Path == "" {
			req.Path = str(f.rcPath)
		}
		if resource := str(f.resource); resource != "" {
			req.RouteKey = req.Method + " " + resource
		}
		req.Stage = str(f.rcStage)
		req.Headers, req.Query = &ev.headers, &ev.query
		req.APIKey = str(f.idAPIKey)
		req.Token, _ = req.Header("Authorization")
		if version == "1.0" {
			req.Absent = policy.AttrAPIKey
		}
		switch {
		case ev.ARN == "":
			return nil, &EventError{Kind: ev.Kind, Reason: "missing methodArn"}
		case req.Method == "":
			return nil, &EventError{Kind: ev.Kind, Reason: "missing httpMethod"}
		case req.SourceIP == "":
			return nil, &EventError{Kind: ev.Kind, Reason: "missing requestContext.identity.sourceIp"}
		}
	case version == "" && typ == "TOKEN":
		ev.Kind = KindToken
		ev.ARN = str(f.methodArn)
		req.Token = str(f.authorizationToken)
		req.Absent = policy.AttrSourceIP | policy.AttrHeaders | policy.AttrQuery | policy.AttrAPIKey | policy.AttrRouteKey
		if ev.ARN == "" {
			return nil, &EventError{Kind: ev.Kind, Reason: "missing methodArn"}
		}
		var ok bool
		if req.Stage, req.Method, req.Path, ok = parseMethodARN(ev.ARN); !ok {
			return nil, &EventError{Kind: ev.Kind, Reason: "methodArn is not an execute-api method ARN"}
		}
		if req.Token == "" {
			return nil, ErrUnauthorized
		}
	default:
		return nil, &EventError{Reason: fmt.Sprintf("unknown event type %q (version %q): want a TOKEN or REQUEST authorizer event", clip(typ), clip(version))}
	}
	return ev, nil
}

// parseMethodARN splits
// arn:aws:execute-api:REGION:ACCOUNT:API/STAGE/METHOD/PATH into its stage,
// method and path ("/PATH").
func parseMethodARN(arn string) (stage, method, path string, ok bool) {
	rest := arn
	for range 5 {
		i := strings.IndexByte(rest, ':')
		if i < 0 {
			return "", "", "", false
		}
		rest = rest[i+1:]
	}
	if !strings.HasPrefix(arn, "arn:") || !strings.Contains(arn[:len(arn)-len(rest)], ":execute-api:") {
		return "", "", "", false
	}
	parts := strings.SplitN(rest, "/", 4) // API, STAGE, METHOD, PATH
	if len(parts) < 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", "", false
	}
	path = "/"
	if len(parts) == 4 {
		path += parts[3]
	}
	return parts[1], parts[2], path, true
}

// clip bounds a client-supplied string quoted in an error.
func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}
