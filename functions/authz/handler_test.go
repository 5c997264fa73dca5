package authz

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/functions/dev/golden"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// testHandler builds a handler on the memory store with the given rules, a
// frozen clock, and metrics and logs captured.
type testHandler struct {
	*Handler
	metrics, logs bytes.Buffer
}

func newTestHandler(t testing.TB, rules string, mutate func(*Config)) *testHandler {
	t.Helper()
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load([]byte(rules), policy.Options{Stores: map[string]storage.Store{"memory": mem}})
	if err != nil {
		t.Fatal(err)
	}
	th := &testHandler{}
	now := golden.Clock
	cfg := Config{
		Policy:  p,
		Clock:   limiter.ClockFunc(func() time.Time { return now }),
		Metrics: NewMetrics(&th.metrics, "Test"),
		Logger:  slog.New(slog.NewJSONHandler(&th.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	th.Handler, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return th
}

func readEvent(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("../../events/" + name + ".json")
	if err != nil {
		t.Fatalf("loading fixture: %v", err)
	}
	return b
}

const oneRule = `
rules:
  - name: per-ip
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 2, window: 1m}]
  - name: per-token
    key: "{token}"
    skip_if_missing: true
    limits: [{algorithm: fixed_window, limit: 2, window: 1m}]
`

// TestResponsesRoundTrip checks that each response unmarshals into the
// aws-lambda-go response type of its event, with the same content.
func TestResponsesRoundTrip(t *testing.T) {
	h := newTestHandler(t, strings.ReplaceAll(oneRule, "limit: 2", "limit: 100"), nil)
	for _, name := range []string{"rest-request", "rest-token", "http-request-v1"} {
		resp, err := h.Handle(t.Context(), readEvent(t, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, _ := json.Marshal(resp)
		var got events.APIGatewayCustomAuthorizerResponse
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		st := got.PolicyDocument.Statement
		if got.PrincipalID != PrincipalID || got.PolicyDocument.Version != "2012-10-17" || len(st) != 1 ||
			st[0].Effect != "Allow" || st[0].Action[0] != "execute-api:Invoke" || !strings.HasPrefix(st[0].Resource[0], "arn:aws:execute-api:") {
			t.Errorf("%s: %+v", name, got)
		}
		for _, k := range []string{"limit", "remaining", "reset", "retryAfter", "rule", "decision"} {
			if _, ok := got.Context[k]; !ok {
				t.Errorf("%s: context lacks %q: %v", name, k, got.Context)
			}
		}
		if got.Context["decision"] != "allow" {
			t.Errorf("%s: decision %v", name, got.Context["decision"])
		}
	}
	resp, err := h.Handle(t.Context(), readEvent(t, "http-request"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(resp)
	var simple events.APIGatewayV2CustomAuthorizerSimpleResponse
	if err := json.Unmarshal(b, &simple); err != nil || !simple.IsAuthorized || simple.Context["rule"] == nil {
		t.Fatalf("simple response %s: %+v, %v", b, simple, err)
	}
}

// TestAWSEventsDecode marshals aws-lambda-go's own event types and feeds
// them to the handler: the sniffing sees the shapes they produce.
func TestAWSEventsDecode(t *testing.T) {
	h := newTestHandler(t, oneRule, nil)
	evs := map[string]any{
		"TOKEN": events.APIGatewayCustomAuthorizerRequest{Type: "TOKEN", AuthorizationToken: "t", MethodArn: "arn:aws:execute-api:eu-west-1:1:api/stage/GET/x"},
		"REQUEST": events.APIGatewayCustomAuthorizerRequestTypeRequest{
			Type: "REQUEST", MethodArn: "arn:aws:execute-api:eu-west-1:1:api/stage/GET/x", HTTPMethod: "GET", Path: "/x", Resource: "/x",
			RequestContext: events.APIGatewayCustomAuthorizerRequestTypeRequestContext{Stage: "stage",
				Identity: events.APIGatewayCustomAuthorizerRequestTypeRequestIdentity{SourceIP: "192.0.2.1", APIKey: "k"}},
		},
		"HTTP 2.0": events.APIGatewayV2CustomAuthorizerV2Request{
			Version: "2.0", Type: "REQUEST", RouteArn: "arn:aws:execute-api:eu-west-1:1:api/$default/GET/x", RouteKey: "GET /x",
			Headers: map[string]string{"authorization": "t"},
			RequestContext: events.APIGatewayV2HTTPRequestContext{Stage: "$default",
				HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "GET", Path: "/x", SourceIP: "192.0.2.1"}},
		},
	}
	for kind, e := range evs {
		raw, _ := json.Marshal(e)
		ev, err := DecodeEvent(raw)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if ev.Kind.String() != kind {
			t.Errorf("sniffed %v, want %s", ev.Kind, kind)
		}
		if _, err := h.Handle(t.Context(), raw); err != nil {
			t.Errorf("%s: %v", kind, err)
		}
	}
}

func TestDecodeEventAttributes(t *testing.T) {
	ev, err := DecodeEvent(readEvent(t, "rest-request"))
	if err != nil {
		t.Fatal(err)
	}
	r := ev.Request
	if r.SourceIP != "198.51.100.7" || r.Method != "GET" || r.Path != "/pets/42" || r.RouteKey != "GET /pets/{id}" || r.Stage != "prod" ||
		!strings.HasPrefix(r.Token, "Bearer ") || r.Absent != 0 {
		t.Errorf("REST request: %+v", r)
	}
	if v, ok := r.Header("user-agent"); !ok || v != "curl/8.5.0" {
		t.Errorf("header lookup ignoring case: %q %v", v, ok)
	}
	if v, ok := r.QueryParam("verbose"); !ok || v != "true" {
		t.Errorf("query: %q %v", v, ok)
	}
	ev, err = DecodeEvent(readEvent(t, "http-request"))
	if err != nil {
		t.Fatal(err)
	}
	r = ev.Request
	if ev.Kind != KindHTTP || r.SourceIP != "198.51.100.7" || r.Path != "/pets/42" || r.RouteKey != "GET /pets/{id}" || r.Stage != "$default" || r.Absent != policy.AttrAPIKey {
		t.Errorf("HTTP request: %+v", r)
	}
	ev, err = DecodeEvent(readEvent(t, "rest-token"))
	if err != nil {
		t.Fatal(err)
	}
	r = ev.Request
	if ev.Kind != KindToken || r.Stage != "prod" || r.Method != "GET" || r.Path != "/pets/42" || r.SourceIP != "" || r.Absent&policy.AttrSourceIP == 0 {
		t.Errorf("TOKEN: %+v", r)
	}
}

// TestBadInput: malformed JSON, missing fields, wrong types, unknown types,
// hostile values: a clear error (or a decision), never a panic.
func TestBadInput(t *testing.T) {
	h := newTestHandler(t, oneRule, nil)
	big := strings.Repeat("\x00\x01\x7f\xff", 2600) // 10 KB of control and invalid bytes
	bigJSON, _ := json.Marshal(big)
	tests := []struct {
		name  string
		event string
		want  string // error substring; "" means a response
	}{
		{"empty", ``, "malformed JSON"},
		{"whitespace", "  \n", "malformed JSON"},
		{"truncated", `{"type":"TOKEN"`, "malformed JSON"},
		{"trailing garbage", `{"type":"TOKEN"} x`, "malformed JSON"},
		{"not an object", `[1,2]`, "sluice: bad event: the event is a JSON array, want an object"},
		{"a string", `"TOKEN"`, "sluice: bad event: the event is a JSON string, want an object"},
		{"a number", `12`, "the event is a JSON number, want an object"},
		{"null", `null`, "unknown event type"},
		{"empty object", `{}`, "unknown event type"},
		{"proxy event", `{"httpMethod":"GET","path":"/"}`, "unknown event type"},
		{"websocket", `{"requestContext":{"eventType":"CONNECT"}}`, "unknown event type"},
		{"bad version", `{"version":"3.0","type":"REQUEST"}`, "unknown event type"},
		{"type number", `{"type":1}`, `field "type": want string`},
		{"headers array", `{"type":"REQUEST","headers":["a"]}`, `field "headers": want object`},
		{"header number", `{"type":"REQUEST","headers":{"a":1}}`, `field "headers": want string`},
		{"context string", `{"type":"REQUEST","requestContext":"x"}`, `want object`},
		{"deep nesting", strings.Repeat("[", 20000), "malformed JSON"},
		{"bad escape", `{"type":"\q"}`, "malformed JSON"},
		{"raw control byte", "{\"type\":\"TO\x01KEN\"}", "malformed JSON"},
		{"token without arn", `{"type":"TOKEN","authorizationToken":"t"}`, "missing methodArn"},
		{"token bad arn", `{"type":"TOKEN","authorizationToken":"t","methodArn":"nope"}`, "not an execute-api method ARN"},
		{"token empty", `{"type":"TOKEN","authorizationToken":"","methodArn":"arn:aws:execute-api:r:1:a/s/GET/x"}`, "Unauthorized"},
		{"request without arn", `{"type":"REQUEST","httpMethod":"GET","requestContext":{"identity":{"sourceIp":"1.2.3.4"}}}`, "missing methodArn"},
		{"request without ip", `{"type":"REQUEST","methodArn":"arn:aws:execute-api:r:1:a/s/GET/x","httpMethod":"GET"}`, "missing requestContext.identity.sourceIp"},
		{"request without method", `{"type":"REQUEST","methodArn":"arn:aws:execute-api:r:1:a/s/GET/x","requestContext":{"identity":{"sourceIp":"1.2.3.4"}}}`, "missing httpMethod"},
		{"http without arn", `{"version":"2.0","type":"REQUEST","requestContext":{"http":{"method":"GET","sourceIp":"1.2.3.4"}}}`, "missing routeArn"},
		{"http without ip", `{"version":"2.0","type":"REQUEST","routeArn":"arn:aws:execute-api:r:1:a/s/GET/x","requestContext":{"http":{"method":"GET"}}}`, "missing requestContext.http.sourceIp"},
		{"identity string", `{"type":"REQUEST","requestContext":{"identity":"x"}}`, `field "requestContext.identity": want object, got JSON string`},
		{"source ip number", `{"type":"REQUEST","methodArn":"arn:aws:execute-api:r:1:a/s/GET/x","httpMethod":"GET","requestContext":{"identity":{"sourceIp":1}}}`, `field "requestContext.identity.sourceIp": want string, got JSON number`},
		{"http method bool", `{"version":"2.0","type":"REQUEST","routeArn":"arn:aws:execute-api:r:1:a/s/GET/x","requestContext":{"http":{"method":true,"sourceIp":"1.2.3.4"}}}`, `field "requestContext.http.method": want string, got JSON bool`},
		{"token number", `{"type":"TOKEN","authorizationToken":7,"methodArn":"arn:aws:execute-api:r:1:a/s/GET/x"}`, `field "authorizationToken": want string, got JSON number`},
		// A field Sluice does not read may have any type; one it reads
		// must have its own, even after an unread one that is wrong.
		{"unread fields of the wrong type", `{"type":"REQUEST","methodArn":"arn:aws:execute-api:r:1:a/s/GET/x","httpMethod":"GET","multiValueHeaders":{"a":[1]},"pathParameters":7,"requestContext":{"requestId":[],"identity":{"sourceIp":"1.2.3.4","clientCert":"x"}}}`, ""},
		{"unread then read field of the wrong type", `{"type":"REQUEST","methodArn":"arn:aws:execute-api:r:1:a/s/GET/x","httpMethod":"GET","multiValueHeaders":1,"headers":{"a":1},"requestContext":{"identity":{"sourceIp":"1.2.3.4"}}}`, `field "headers": want string, got JSON number`},
		{"token with headers of the wrong type", `{"type":"TOKEN","authorizationToken":"t","methodArn":"arn:aws:execute-api:r:1:a/s/GET/x","headers":1}`, ""},
		{"http 2.0 unread fields of the wrong type", `{"version":"2.0","type":"REQUEST","routeArn":"arn:aws:execute-api:r:1:a/s/GET/x","identitySource":"t","cookies":{},"requestContext":{"timeEpoch":"x","http":{"method":"GET","sourceIp":"1.2.3.4","protocol":1}}}`, ""},
		{"10 KB control bytes in headers", `{"type":"REQUEST","methodArn":"arn:aws:execute-api:r:1:a/s/GET/x","httpMethod":"GET","requestContext":{"identity":{"sourceIp":"1.2.3.4"}},"headers":{"Authorization":` + string(bigJSON) + `,"X":` + string(bigJSON) + `}}`, ""},
		{"10 KB token", `{"type":"TOKEN","authorizationToken":` + string(bigJSON) + `,"methodArn":"arn:aws:execute-api:r:1:a/s/GET/x"}`, ""},
		{"garbage source ip", `{"type":"REQUEST","methodArn":"arn:aws:execute-api:r:1:a/s/GET/x","httpMethod":"GET","requestContext":{"identity":{"sourceIp":` + string(bigJSON) + `}}}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := h.Handle(t.Context(), json.RawMessage(tt.event))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("error %v, want a response", err)
				}
				b, err := json.Marshal(resp)
				if err != nil || !json.Valid(b) {
					t.Fatalf("response does not marshal: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("got a response %+v, want an error containing %q", resp, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), `field ""`) {
				t.Errorf("error %q names no field", err)
			}
			var ee *EventError
			if !errors.As(err, &ee) && !errors.Is(err, ErrUnauthorized) {
				t.Errorf("error %T is neither an EventError nor ErrUnauthorized", err)
			}
		})
	}
	if bytes.Contains(h.logs.Bytes(), []byte("1.2.3.4")) || bytes.Contains(h.logs.Bytes(), []byte("Bearer")) {
		t.Errorf("logs show a raw address or token:\n%s", h.logs.String())
	}
}

// TestARNs: every kind of event refuses an ARN that is not an execute-api
// method ARN, with the same error, so that no IAM response names it.
func TestARNs(t *testing.T) {
	h := newTestHandler(t, oneRule, nil)
	events := map[string]string{ // %s is the ARN
		"TOKEN":    `{"type":"TOKEN","authorizationToken":"t","methodArn":%s}`,
		"REQUEST":  `{"type":"REQUEST","methodArn":%s,"httpMethod":"GET","requestContext":{"identity":{"sourceIp":"1.2.3.4"}}}`,
		"HTTP 1.0": `{"version":"1.0","type":"REQUEST","methodArn":%s,"httpMethod":"GET","requestContext":{"identity":{"sourceIp":"1.2.3.4"}}}`,
		"HTTP 2.0": `{"version":"2.0","type":"REQUEST","routeArn":%s,"requestContext":{"http":{"method":"GET","sourceIp":"1.2.3.4"}}}`,
	}
	field := map[string]string{"TOKEN": "methodArn", "REQUEST": "methodArn", "HTTP 1.0": "methodArn", "HTTP 2.0": "routeArn"}
	kind := map[string]string{"TOKEN": "TOKEN", "REQUEST": "REQUEST", "HTTP 1.0": "REQUEST", "HTTP 2.0": "HTTP 2.0"}
	for name, format := range events {
		for _, arn := range []string{
			"nope",
			"arn:aws:s3:::my-bucket/key",
			"arn:aws:lambda:us-east-1:123456789012:function:f",
			"arn:aws:execute-api:us-east-1:123456789012:api",       // no stage, no method
			"arn:aws:execute-api:us-east-1:123456789012:api/prod",  // no method
			"arn:aws:execute-api:us-east-1:123456789012:/prod/GET", // no API
			"xarn:aws:execute-api:us-east-1:123456789012:api/prod/GET/x",
		} {
			q, _ := json.Marshal(arn)
			_, err := h.Handle(t.Context(), []byte(fmt.Sprintf(format, q)))
			want := "sluice: bad " + kind[name] + " event: " + field[name] + " is not an execute-api method ARN"
			if err == nil || err.Error() != want {
				t.Errorf("%s, %s: err = %v, want %q", name, arn, err, want)
			}
		}
		for _, arn := range []string{
			"arn:aws:execute-api:us-east-1:123456789012:api/prod/GET/pets/1",
			"arn:aws-cn:execute-api:cn-north-1:123456789012:api/$default/POST",
			"arn:aws:execute-api:us-east-1:123456789012:api/$default/$default",
		} {
			q, _ := json.Marshal(arn)
			resp, err := h.Handle(t.Context(), []byte(fmt.Sprintf(format, q)))
			if err != nil {
				t.Errorf("%s, %s: %v", name, arn, err)
				continue
			}
			if iam, ok := resp.(*IAMResponse); ok && iam.PolicyDocument.Statement[0].Resource[0] != arn {
				t.Errorf("%s: the policy names %q, want %q", name, iam.PolicyDocument.Statement[0].Resource[0], arn)
			}
		}
	}
}

// TestDemoPathSpellings: the embedded /demo/** rule (3 a minute) counts
// every spelling of a /demo/ path that a server cleaning paths would serve
// as one, from REST and HTTP API events alike (docs/rules.md, Paths).
func TestDemoPathSpellings(t *testing.T) {
	h := newTestHandler(t, string(DefaultRules), nil)
	rest := `{"type":"REQUEST","methodArn":"arn:aws:execute-api:r:1:a/prod/GET/x","httpMethod":"GET","path":%q,"requestContext":{"identity":{"sourceIp":"192.0.2.1"}}}`
	http := `{"version":"2.0","type":"REQUEST","routeArn":"arn:aws:execute-api:r:1:a/$default/GET/x","requestContext":{"http":{"method":"GET","path":%q,"sourceIp":"192.0.2.1"}}}`
	for i, ev := range []string{
		fmt.Sprintf(rest, "//demo/hello"),
		fmt.Sprintf(http, "/pets/..%2fdemo/hello"),
		fmt.Sprintf(rest, "/pets/%2e%2e/demo/./hello"),
		fmt.Sprintf(http, "/demo/hello"),
	} {
		resp, _, err := h.Decide(t.Context(), []byte(ev))
		if err != nil {
			t.Fatal(err)
		}
		c := resp.AuthContext()
		if c.Rule != "demo" || resp.Allowed() != (i < 3) {
			t.Errorf("request %d: allowed %v, %+v; want the demo rule to allow 3", i+1, resp.Allowed(), c)
		}
	}
}

func TestDenyAndContext(t *testing.T) {
	h := newTestHandler(t, oneRule, nil)
	ev := readEvent(t, "rest-request")
	var resp Response
	for range 3 {
		r, _, err := h.Decide(t.Context(), ev)
		if err != nil {
			t.Fatal(err)
		}
		resp = r
	}
	c := resp.AuthContext()
	if resp.Allowed() || c.Decision != DecisionDeny || c.Limit != 2 || c.Remaining != 0 || c.RetryAfter != 55 || c.Reset != 55 || c.Rule != "per-ip" {
		t.Fatalf("third request: allowed=%v %+v", resp.Allowed(), c)
	}
	iam := resp.(*IAMResponse)
	if iam.PolicyDocument.Statement[0].Effect != "Deny" {
		t.Errorf("effect %q", iam.PolicyDocument.Statement[0].Effect)
	}
	// The logs hash the key: no raw address.
	if strings.Contains(h.logs.String(), "198.51.100.7") {
		t.Errorf("logs show the client address:\n%s", h.logs.String())
	}
	if !strings.Contains(h.logs.String(), `"decision":"deny"`) {
		t.Errorf("no denial logged:\n%s", h.logs.String())
	}
}

func TestHTTPIAMResponses(t *testing.T) {
	h := newTestHandler(t, oneRule, func(c *Config) { c.HTTPResponses = HTTPIAM })
	resp, err := h.Handle(t.Context(), readEvent(t, "http-request"))
	if err != nil {
		t.Fatal(err)
	}
	iam, ok := resp.(*IAMResponse)
	if !ok {
		t.Fatalf("response %T, want an IAM policy", resp)
	}
	if got := iam.PolicyDocument.Statement[0].Resource[0]; got != "arn:aws:execute-api:us-east-1:123456789012:abcdef123/$default/GET/pets/42" {
		t.Errorf("resource %q, want the routeArn", got)
	}
}

func TestAuthenticateHook(t *testing.T) {
	h := newTestHandler(t, oneRule, func(c *Config) {
		c.Authenticate = func(_ context.Context, ev *Event) error {
			if ev.Request.Token != "Bearer good" {
				return errors.New("bad token " + ev.Request.Token)
			}
			return nil
		}
	})
	_, err := h.Handle(t.Context(), readEvent(t, "rest-token"))
	if !errors.Is(err, ErrUnauthorized) || err.Error() != "Unauthorized" {
		t.Fatalf("err = %v, want Unauthorized", err)
	}
	if strings.Contains(h.logs.String(), "eyJhbGci") {
		t.Errorf("the token reached the logs:\n%s", h.logs.String())
	}
}

func TestRequireGivesUnauthorized(t *testing.T) {
	h := newTestHandler(t, `rules: [{name: keyed, key: "{api_key}", require: [api_key], limits: [{algorithm: fixed_window, limit: 5, window: 1m}]}]`, nil)
	_, err := h.Handle(t.Context(), readEvent(t, "rest-request")) // apiKey is ""
	if err == nil || err.Error() != "Unauthorized" {
		t.Fatalf("err = %v", err)
	}
}

type shedAll struct{}

func (shedAll) Check(context.Context, limiter.Priority, time.Time) (limiter.Decision, error) {
	return limiter.Decision{RetryAfter: 3 * time.Second}, nil
}

// TestShedFailsTheInvocation checks the load-shedding hook: a shed request
// fails the invocation (API Gateway's authorizer failure, 503), with a
// metric line saying so.
func TestShedFailsTheInvocation(t *testing.T) {
	mem, _ := memory.New(memory.Config{})
	p, err := policy.Load([]byte(oneRule), policy.Options{Stores: map[string]storage.Store{"memory": mem}, Shedder: shedAll{}})
	if err != nil {
		t.Fatal(err)
	}
	var metrics bytes.Buffer
	h, err := New(Config{Policy: p, Metrics: NewMetrics(&metrics, "")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.Handle(t.Context(), readEvent(t, "rest-request"))
	var se *ShedError
	if !errors.As(err, &se) || se.RetryAfter != 3*time.Second {
		t.Fatalf("err = %v, want a ShedError", err)
	}
	if ErrorType(err) != "ShedError" {
		t.Errorf("error type %q", ErrorType(err))
	}
	if !strings.Contains(metrics.String(), `"Shed":1`) {
		t.Errorf("no Shed metric:\n%s", metrics.String())
	}
}

func TestMetricLines(t *testing.T) {
	h := newTestHandler(t, oneRule, nil)
	for range 3 {
		h.Handle(t.Context(), readEvent(t, "rest-request"))
	}
	h.Handle(t.Context(), []byte(`{"type":"TOKEN","authorizationToken":"x","methodArn":"arn:aws:execute-api:r:1:a/s/GET/x"}`)) // per-token only
	lines := strings.Split(strings.TrimSpace(h.metrics.String()), "\n")
	// Request 1 and 2: per-ip and per-token allow; request 3: both rules
	// are at their limit of 2 and, decided in one batch, both deny;
	// request 4: per-token (another token).
	if len(lines) != 7 {
		t.Fatalf("%d metric lines, want 7:\n%s", len(lines), h.metrics.String())
	}
	type emf struct {
		AWS struct {
			Timestamp         int64
			CloudWatchMetrics []struct {
				Namespace  string
				Dimensions [][]string
				Metrics    []struct{ Name, Unit string }
			}
		} `json:"_aws"`
		Rule                                                       string
		Allowed, Denied, Shed, FailOpen, FailClosed, BackendErrors int
		BackendLatency                                             float64
	}
	var denied int
	for _, l := range lines {
		var m emf
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %s: %v", l, err)
		}
		d := m.AWS.CloudWatchMetrics[0]
		if m.AWS.Timestamp != golden.Clock.UnixMilli() || d.Namespace != "Test" || len(d.Dimensions) != 2 || d.Dimensions[0][0] != "Rule" || len(d.Dimensions[1]) != 0 || len(d.Metrics) != 21 {
			t.Errorf("bad EMF metadata: %s", l)
		}
		if m.Allowed+m.Denied+m.Shed != 1 {
			t.Errorf("line %s: want exactly one outcome", l)
		}
		denied += m.Denied
	}
	if denied != 2 {
		t.Errorf("%d denials counted, want 2", denied)
	}
}

func TestMetricNoRule(t *testing.T) {
	h := newTestHandler(t, `rules: []`, nil)
	h.Handle(t.Context(), readEvent(t, "rest-request"))
	if !strings.Contains(h.metrics.String(), `"Rule":"(none)","Allowed":1`) {
		t.Errorf("metrics: %s", h.metrics.String())
	}
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"plain", `q"uote\`, "\x00\x1f\x7f", "\xff\xfe", "héllo ☃", "\u2028"} {
		b := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Errorf("%q -> %s: %v", s, b, err)
		}
	}
}

func TestNewConfigErrors(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("no policy accepted")
	}
	mem, _ := memory.New(memory.Config{})
	p, _ := policy.Load([]byte(oneRule), policy.Options{Stores: map[string]storage.Store{"memory": mem}})
	if _, err := New(Config{Policy: p, HTTPResponses: "xml"}); err == nil {
		t.Error("bad HTTPResponses accepted")
	}
	if _, err := New(Config{Policy: p, Deadline: -1}); err == nil {
		t.Error("negative deadline accepted")
	}
}

// FuzzDecodeEvent checks DecodeEvent against encoding/json decoding into
// the equivalent struct: the same errors (malformed or not) and the same
// attributes, and never a panic.
func FuzzDecodeEvent(f *testing.F) {
	for _, name := range []string{"rest-request", "http-request", "rest-token", "http-request-v1", "wrong-types", "rest-request-hostile", "malformed"} {
		b, err := os.ReadFile("../../events/" + name + ".json")
		if err != nil {
			f.Fatalf("loading fixture: %v", err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"Type":"TOKEN","type":"REQUEST","TYPE":"TOKEN","authorizationToken":"a\u00e9\ud83d\ude00\ud800","methodArn":"arn:aws:execute-api:r:1:a/s/GET/x"}`))
	f.Add([]byte(`{"type":"REQUEST","headers":{"A":"1"},"headers":{"a":"2"},"headers":null,"headers":{"b":null}}`))
	f.Add([]byte(`{"requestContext":{"identity":{"sourceIp":"1"}},"requestContext":{"stage":"s"},"requestContext":null}`))
	h := newTestHandler(f, oneRule, nil)
	f.Fuzz(func(t *testing.T, raw []byte) {
		ev, err := DecodeEvent(raw)
		ref, refErr := decodeReference(raw)
		if (err == nil) != (refErr == nil) {
			// encoding/json and DecodeEvent must agree on what is valid.
			if !(errors.Is(err, ErrUnauthorized) && errors.Is(refErr, ErrUnauthorized)) {
				t.Fatalf("DecodeEvent: %v; encoding/json reference: %v", err, refErr)
			}
		}
		if err == nil {
			if ev.Kind != ref.Kind || ev.ARN != ref.ARN || ev.Request.SourceIP != ref.Request.SourceIP || ev.Request.Method != ref.Request.Method ||
				ev.Request.Path != ref.Request.Path || ev.Request.RouteKey != ref.Request.RouteKey || ev.Request.Stage != ref.Request.Stage ||
				ev.Request.APIKey != ref.Request.APIKey || ev.Request.Token != ref.Request.Token || ev.Request.Absent != ref.Request.Absent {
				t.Fatalf("DecodeEvent: %+v\nreference:   %+v", ev.Request, ref.Request)
			}
			for _, name := range []string{"Authorization", "authorization", "X-Forwarded-For", "a", "A", "b"} {
				v1, ok1 := ev.Request.Header(name)
				v2, ok2 := ref.Request.Header(name)
				if ok1 != ok2 || v1 != v2 {
					// A map with two keys differing only in case answers a
					// folded lookup at random; compare exact hits only.
					if _, exact := refHeaders(raw)[name]; exact {
						t.Fatalf("header %q: %q %v, reference %q %v", name, v1, ok1, v2, ok2)
					}
				}
				q1, ok1 := ev.Request.QueryParam(name)
				q2, ok2 := ref.Request.QueryParam(name)
				if ok1 != ok2 || q1 != q2 {
					t.Fatalf("query %q: %q %v, reference %q %v", name, q1, ok1, q2, ok2)
				}
			}
		}
		resp, herr := h.Handle(context.Background(), raw)
		if herr == nil {
			if _, err := json.Marshal(resp); err != nil {
				t.Fatalf("response does not marshal: %v", err)
			}
		}
	})
}

// The reference decoding: encoding/json into a struct of only the fields
// DecodeEvent reads from each kind of event (a type error elsewhere is no
// error), then the attribute mapping of docs/authorizer.md.
type (
	refKind struct {
		Version string `json:"version"`
		Type    string `json:"type"`
	}
	refToken struct {
		AuthorizationToken string `json:"authorizationToken"`
		MethodArn          string `json:"methodArn"`
	}
	refRequest struct {
		MethodArn             string            `json:"methodArn"`
		Resource              string            `json:"resource"`
		Path                  string            `json:"path"`
		HTTPMethod            string            `json:"httpMethod"`
		Headers               map[string]string `json:"headers"`
		QueryStringParameters map[string]string `json:"queryStringParameters"`
		RequestContext        struct {
			Stage      string `json:"stage"`
			Path       string `json:"path"`
			HTTPMethod string `json:"httpMethod"`
			Identity   struct {
				APIKey   string `json:"apiKey"`
				SourceIP string `json:"sourceIp"`
			} `json:"identity"`
		} `json:"requestContext"`
	}
	refHTTP2 struct {
		RouteArn              string            `json:"routeArn"`
		RouteKey              string            `json:"routeKey"`
		RawPath               string            `json:"rawPath"`
		Headers               map[string]string `json:"headers"`
		QueryStringParameters map[string]string `json:"queryStringParameters"`
		RequestContext        struct {
			Stage      string `json:"stage"`
			RouteKey   string `json:"routeKey"`
			DomainName string `json:"domainName"`
			HTTP       struct {
				Method   string `json:"method"`
				Path     string `json:"path"`
				SourceIP string `json:"sourceIp"`
			} `json:"http"`
		} `json:"requestContext"`
	}
)

func refHeaders(raw []byte) map[string]string {
	var r struct {
		Headers map[string]string `json:"headers"`
	}
	json.Unmarshal(raw, &r)
	return r.Headers
}

func decodeReference(raw []byte) (*Event, error) {
	var k refKind
	if err := json.Unmarshal(raw, &k); err != nil {
		return nil, err
	}
	ev := &Event{}
	req := &ev.Request
	switch {
	case k.Version == "2.0" && k.Type == "REQUEST":
		var r refHTTP2
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, err
		}
		ev.Kind, ev.ARN = KindHTTP, r.RouteArn
		req.SourceIP, req.Method, req.Path = r.RequestContext.HTTP.SourceIP, r.RequestContext.HTTP.Method, r.RequestContext.HTTP.Path
		if req.Path == "" {
			req.Path = r.RawPath
		}
		req.RouteKey = r.RouteKey
		if req.RouteKey == "" {
			req.RouteKey = r.RequestContext.RouteKey
		}
		req.Stage = r.RequestContext.Stage
		if labels := strings.SplitN(r.RequestContext.DomainName, ".", 3); req.Stage != "$default" && req.Stage != "" &&
			(r.RequestContext.DomainName == "" || len(labels) == 3 && labels[1] == "execute-api") {
			if rest, ok := strings.CutPrefix(req.Path, "/"+req.Stage); ok && rest == "" {
				req.Path = "/"
			} else if ok && rest[0] == '/' {
				req.Path = rest
			}
		}
		req.Headers, req.Query = policy.Header(r.Headers), policy.Query(r.QueryStringParameters)
		req.Token, _ = req.Header("Authorization")
		req.Token = policy.Credential(req.Token)
		req.Absent = policy.AttrAPIKey
		if _, _, _, ok := parseMethodARN(ev.ARN); !ok || req.Method == "" || req.SourceIP == "" {
			return nil, errors.New("missing or bad")
		}
	case (k.Version == "" || k.Version == "1.0") && k.Type == "REQUEST":
		var r refRequest
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, err
		}
		ev.Kind, ev.ARN = KindRequest, r.MethodArn
		req.SourceIP, req.Method, req.Path = r.RequestContext.Identity.SourceIP, r.HTTPMethod, r.Path
		if req.Method == "" {
			req.Method = r.RequestContext.HTTPMethod
		}
		if req.Path == "" {
			req.Path = r.RequestContext.Path
		}
		if r.Resource != "" {
			req.RouteKey = req.Method + " " + r.Resource
		}
		req.Stage = r.RequestContext.Stage
		req.Headers, req.Query = policy.Header(r.Headers), policy.Query(r.QueryStringParameters)
		req.APIKey = r.RequestContext.Identity.APIKey
		req.Token, _ = req.Header("Authorization")
		req.Token = policy.Credential(req.Token)
		if k.Version == "1.0" {
			req.Absent = policy.AttrAPIKey
		}
		if _, _, _, ok := parseMethodARN(ev.ARN); !ok || req.Method == "" || req.SourceIP == "" {
			return nil, errors.New("missing or bad")
		}
	case k.Version == "" && k.Type == "TOKEN":
		var r refToken
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, err
		}
		ev.Kind, ev.ARN = KindToken, r.MethodArn
		req.Token = policy.Credential(r.AuthorizationToken)
		req.Absent = policy.AttrSourceIP | policy.AttrHeaders | policy.AttrQuery | policy.AttrAPIKey | policy.AttrRouteKey
		var ok bool
		if req.Stage, req.Method, req.Path, ok = parseMethodARN(ev.ARN); !ok {
			return nil, errors.New("bad arn")
		}
		if req.Token == "" {
			return nil, ErrUnauthorized
		}
	default:
		return nil, errors.New("unknown")
	}
	return ev, nil
}

var _ lambdaHandler = (*Handler)(nil)

// lambdaHandler is aws-lambda-go's lambda.Handler.
type lambdaHandler interface {
	Invoke(ctx context.Context, payload []byte) ([]byte, error)
}

// TestAppendJSONMatchesEncodingJSON checks the hand-written encoders
// against encoding/json on mirror types (without the MarshalJSON methods).
func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	type ctxMirror Context
	type iamMirror struct {
		PrincipalID    string         `json:"principalId"`
		PolicyDocument PolicyDocument `json:"policyDocument"`
		Context        ctxMirror      `json:"context"`
	}
	type simpleMirror struct {
		IsAuthorized bool      `json:"isAuthorized"`
		Context      ctxMirror `json:"context"`
	}
	for _, c := range []Context{
		{Limit: 5, Remaining: 4, Reset: 60, Rule: "per-ip", Decision: DecisionAllow},
		{Limit: 1 << 40, RetryAfter: 17, Rule: "r\"\\\x00\u2028é", Decision: DecisionDeny},
		{Limit: 3, Rule: "demo", Decision: DecisionDeny, RateLimitPolicy: `"demo/0";q=3;w=60`, RateLimit: `"demo/0";r=0;t=61`},
	} {
		iam := iamResponse("arn:aws:execute-api:r:1:a/$default/GET/x\"y", c.Decision == DecisionAllow, c)
		want, _ := json.Marshal(iamMirror{iam.PrincipalID, iam.PolicyDocument, ctxMirror(c)})
		if got := iam.AppendJSON(nil); !jsonEqual(got, want) {
			t.Errorf("IAM:\n got %s\nwant %s", got, want)
		}
		simple := &SimpleResponse{IsAuthorized: true, Context: c}
		want, _ = json.Marshal(simpleMirror{true, ctxMirror(c)})
		if got := simple.AppendJSON(nil); !jsonEqual(got, want) {
			t.Errorf("simple:\n got %s\nwant %s", got, want)
		}
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// TestMetricCacheDenied checks the CacheDenied metric: after the store
// denies a key, the next denials of it come from the deny cache and say so.
func TestMetricCacheDenied(t *testing.T) {
	h := newTestHandler(t, oneRule, nil)
	for range 5 {
		h.Handle(t.Context(), readEvent(t, "rest-request"))
	}
	// Requests 1-2 allowed, 3 denied by the store (both rules), 4-5 denied
	// from the cache (one line each: the other rule is skipped).
	got := strings.Count(h.metrics.String(), `"CacheDenied":1`)
	if got != 2 {
		t.Errorf("%d CacheDenied lines, want 2:\n%s", got, h.metrics.String())
	}
}
