package authz

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sluicehq/sluice/policy"
)

// Kind is the type of an authorizer event.
type Kind uint8

const (
	// KindToken is a REST API TOKEN authorizer event
	// (events.APIGatewayCustomAuthorizerRequest, event_token.go).
	KindToken Kind = iota + 1
	// KindRequest is a REST API REQUEST authorizer event
	// (events.APIGatewayCustomAuthorizerRequestTypeRequest,
	// event_request.go), or an HTTP API payload 1.0 event
	// (events.APIGatewayV2CustomAuthorizerV1Request, event_http1.go),
	// which has the same shape.
	KindRequest
	// KindHTTP is an HTTP API payload 2.0 authorizer event
	// (events.APIGatewayV2CustomAuthorizerV2Request, event_http2.go).
	KindHTTP
	// KindScheduled is an EventBridge scheduled event
	// (events.CloudWatchEvent, event_scheduled.go): not an authorizer
	// event, but the keeper's invocation.
	KindScheduled
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
	case KindScheduled:
		return "scheduled"
	}
	return "unknown"
}

// EventError is the error for an event that is not a valid authorizer
// event: malformed JSON, an unknown type, a missing required field, a field
// of the wrong JSON type, an ARN that is not an execute-api ARN.
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
	// ARN is the methodArn (REST, HTTP API 1.0) or routeArn (HTTP API 2.0)
	// that an IAM policy response names: always an execute-api ARN.
	ARN string
	// Request holds the attributes the rules see.
	Request policy.Request
	// Scheduled is a scheduled event (KindScheduled; nil otherwise).
	Scheduled *events.CloudWatchEvent
}

// DecodeEvent tells the event's type from its "version" and "type" fields
// (a scheduled event from its "source" and "detail-type") and decodes it into aws-lambda-go's type for that source (one file per
// source: event_token.go, event_request.go, event_http1.go,
// event_http2.go). It returns an *EventError for malformed JSON, an
// unknown type, a missing required field, a field Sluice reads that has the
// wrong JSON type, or an ARN that is not an execute-api ARN; and
// ErrUnauthorized for a TOKEN event without a token.
//
// JSON has encoding/json's semantics: field names match exactly or else
// ignoring case, a later duplicate wins, invalid UTF-8 becomes U+FFFD, the
// nesting depth is bounded.
func DecodeEvent(raw []byte) (*Event, error) {
	var probe struct {
		Version string `json:"version"`
		Type    string `json:"type"`
		// Raw: a scheduled event's fields, which an API Gateway event may
		// carry with any JSON type (not read there: no type error).
		Source     json.RawMessage `json:"source"`
		DetailType json.RawMessage `json:"detail-type"`
	}
	// This pass validates the whole document, so the decoders below see
	// only type errors.
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, jsonError(0, err)
	}
	switch v, t := probe.Version, probe.Type; {
	case v == "2.0" && t == "REQUEST":
		return decodeHTTP2(raw)
	case v == "1.0" && t == "REQUEST":
		return decodeHTTP1(raw)
	case v == "" && t == "REQUEST":
		return decodeRequest(raw)
	case v == "" && t == "TOKEN":
		return decodeToken(raw)
	case jsonString(probe.Source) == ScheduledSource && jsonString(probe.DetailType) == ScheduledDetailType:
		return decodeScheduled(raw)
	default:
		return nil, &EventError{Reason: fmt.Sprintf("unknown event type %q (version %q): want a TOKEN or REQUEST authorizer event", clip(t), clip(v))}
	}
}

// jsonString is raw as a JSON string ("" when it is not one).
func jsonString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// unmarshal decodes raw, a valid JSON document, into ev, a pointer to an
// aws-lambda-go event type. Only the fields Sluice reads must have the
// right JSON type: read points to a struct of those fields alone, and a
// type error elsewhere in the event is ignored, so that a field AWS (or
// aws-lambda-go) types differently one day cannot fail every request.
// encoding/json reports only the first type error and decodes the rest, so
// on a type error raw is decoded again into read, which tells whether a
// field Sluice reads is wrong. The error does not name the kind
// ("sluice: bad event: field ...").
func unmarshal(raw []byte, ev, read any) error {
	err := json.Unmarshal(raw, ev)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		err = json.Unmarshal(raw, read)
	}
	return jsonError(0, err)
}

// jsonError turns an encoding/json error into an *EventError that names
// the byte (malformed JSON) or the field (wrong type).
func jsonError(kind Kind, err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se):
		return &EventError{Kind: kind, Reason: fmt.Sprintf("malformed JSON at byte %d: %s", se.Offset, se.Error())}
	case errors.As(err, &te) && te.Field == "":
		return &EventError{Kind: kind, Reason: fmt.Sprintf("the event is a JSON %s, want an object", jsonValue(te.Value))}
	case errors.As(err, &te):
		return &EventError{Kind: kind, Reason: fmt.Sprintf("field %q: want %s, got JSON %s", te.Field, jsonType(te.Type), jsonValue(te.Value))}
	}
	return &EventError{Kind: kind, Reason: err.Error()}
}

// jsonType names the JSON type that decodes into t.
func jsonType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Map, reflect.Struct:
		return "object"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		return "number"
	}
	return t.String()
}

// jsonValue is the JSON type of an UnmarshalTypeError's Value ("number",
// or "number 1e400" for a number that overflows).
func jsonValue(v string) string {
	kind, _, _ := strings.Cut(v, " ")
	return kind
}

// checkARN checks that arn, the event's field name, is an execute-api ARN
// of an API, a stage and a method, so that an IAM response never names
// anything else.
func checkARN(kind Kind, name, arn string) error {
	if arn == "" {
		return &EventError{Kind: kind, Reason: "missing " + name}
	}
	if _, _, _, ok := parseMethodARN(arn); !ok {
		return &EventError{Kind: kind, Reason: name + " is not an execute-api method ARN"}
	}
	return nil
}

// parseMethodARN splits
// arn:PARTITION:execute-api:REGION:ACCOUNT:API/STAGE/METHOD/PATH into its
// stage, method and path ("/PATH").
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
