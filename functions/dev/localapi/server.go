package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/lambdawrap"
)

// Event kinds the local API can emulate.
const (
	kindREST  = "rest"  // a REST API with a REQUEST authorizer
	kindHTTP  = "http"  // an HTTP API with a payload 2.0 simple-response authorizer
	kindToken = "token" // a REST API with a TOKEN authorizer (Authorization header)
)

// server is the local API: every request becomes an authorizer event for
// the same handler the Lambda runs, and the answer becomes what API
// Gateway (with the infra's gateway responses) would send:
//
//	allow          -> the upstream (X-Sluice-* headers added), RateLimit-Policy and RateLimit on the response
//	deny, REST     -> 429, Retry-After, RateLimit-Policy and RateLimit
//	deny, HTTP API -> 403 {"message":"Forbidden"} (HTTP APIs cannot do better)
//	"Unauthorized" -> 401
//	load shed      -> 503 with Retry-After (HTTP API: 500, it has no gateway responses)
//	other errors   -> 500
//
// An allowed request is the integration's: it runs wrapped with
// lambdawrap.ReleaseLeases, as a backend Lambda would be, so the
// concurrency leases the authorizer passed in its context are released
// when the upstream has answered (or failed, or panicked), not at their
// TTL.
type server struct {
	h        *authz.Handler
	kind     string
	stage    string
	upstream http.Handler
	seq      atomic.Int64
	// releaser releases the authorizer's leases at the request's end; nil
	// leaves them to their TTL.
	releaser *lambdawrap.StoreReleaser
	// onReleaseError is told of a failed release.
	onReleaseError func(context.Context, error)
	// legacyHeaders adds the earlier drafts' RateLimit-Limit,
	// -Remaining and -Reset to the current fields.
	legacyHeaders bool
}

func newServer(h *authz.Handler, kind, stage string, upstream *url.URL) *server {
	s := &server{h: h, kind: kind, stage: stage, upstream: http.HandlerFunc(echo)}
	if upstream != nil {
		s.upstream = httputil.NewSingleHostReverseProxy(upstream)
	}
	return s
}

// authorizerKey carries the authorizer context to the echo upstream.
type authorizerKey struct{}

// integrate serves an allowed request as the integration: the upstream
// runs inside a handler wrapped with lambdawrap.ReleaseLeases, whose event
// carries the authorizer context as API Gateway's Lambda proxy integration
// gets it (requestContext.authorizer).
func (s *server) integrate(w http.ResponseWriter, r *http.Request, c authz.Context) {
	auth := map[string]any{
		"rule": c.Rule, "decision": c.Decision, "reason": c.Reason,
		"limit": strconv.FormatInt(c.Limit, 10), "remaining": strconv.FormatInt(c.Remaining, 10),
	}
	if c.Leases != "" {
		auth[lambdawrap.LeaseContextKey] = c.Leases
	}
	backend := func(ctx context.Context, _ events.APIGatewayProxyRequest) (struct{}, error) {
		s.upstream.ServeHTTP(w, r.WithContext(context.WithValue(ctx, authorizerKey{}, auth)))
		return struct{}{}, nil
	}
	if s.releaser != nil {
		backend = lambdawrap.ReleaseLeases(backend, s.releaser,
			func(ev events.APIGatewayProxyRequest) map[string]any { return ev.RequestContext.Authorizer },
			lambdawrap.ReleaseConfig{OnError: s.onReleaseError})
	}
	ev := events.APIGatewayProxyRequest{HTTPMethod: r.Method, Path: r.URL.Path}
	ev.RequestContext.Authorizer = auth
	backend(r.Context(), ev) //nolint:errcheck // the upstream wrote the response
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	requestID := "local-" + strconv.FormatInt(s.seq.Add(1), 10)
	event, ok := s.event(r, requestID)
	if !ok {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"message": "Unauthorized"})
		return
	}
	resp, _, err := s.h.Decide(r.Context(), event)
	var shed *authz.ShedError
	switch {
	case errors.Is(err, authz.ErrUnauthorized):
		writeJSON(w, http.StatusUnauthorized, map[string]any{"message": "Unauthorized"})
		return
	case errors.As(err, &shed) && s.kind == kindHTTP:
		// An HTTP API answers any authorizer error with a bare 500.
		writeJSON(w, http.StatusInternalServerError, map[string]any{"message": "Internal Server Error"})
		return
	case errors.As(err, &shed):
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Retry-After", strconv.FormatInt(max(int64((shed.RetryAfter+999_999_999)/1e9), 1), 10))
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"message": "Service Unavailable", "decision": "shed", "requestId": requestID})
		return
	case err != nil:
		// API Gateway answers an authorizer error with a bare 500.
		writeJSON(w, http.StatusInternalServerError, map[string]any{"message": nil, "error": err.Error()})
		return
	}
	c := resp.AuthContext()
	if !resp.Allowed() {
		if s.kind == kindHTTP {
			writeJSON(w, http.StatusForbidden, map[string]any{"message": "Forbidden"})
			return
		}
		h := w.Header()
		h.Set("Cache-Control", "no-store")
		h.Set("Retry-After", strconv.FormatInt(c.RetryAfter, 10))
		s.setRateLimit(h, c)
		writeJSON(w, http.StatusTooManyRequests, map[string]any{
			"message": "Too Many Requests", "decision": c.Decision, "rule": c.Rule, "reason": c.Reason,
			"limit": strconv.FormatInt(c.Limit, 10), "remaining": strconv.FormatInt(c.Remaining, 10),
			"reset": strconv.FormatInt(c.Reset, 10), "retryAfter": strconv.FormatInt(c.RetryAfter, 10),
			"requestId": requestID,
		})
		return
	}
	// Allowed: what the upstream sees, as the infra passes it on.
	r.Header.Set("X-Sluice-Rule", c.Rule)
	r.Header.Set("X-Sluice-Limit", strconv.FormatInt(c.Limit, 10))
	r.Header.Set("X-Sluice-Remaining", strconv.FormatInt(c.Remaining, 10))
	r.Header.Set("X-Sluice-Reset", strconv.FormatInt(c.Reset, 10))
	r.Header.Set("X-Sluice-Reason", c.Reason)
	if c.Rule != "" {
		s.setRateLimit(w.Header(), c)
	}
	s.integrate(w, r, c)
}

// setRateLimit sets the RateLimit-Policy and RateLimit header fields of
// draft-ietf-httpapi-ratelimit-headers-11 from the authorizer's context
// (which carries them ready to send), and with legacyHeaders the earlier
// drafts' RateLimit-Limit, -Remaining and -Reset (seconds) too, for
// clients that read those.
func (s *server) setRateLimit(h http.Header, c authz.Context) {
	if c.RateLimitPolicy != "" {
		h.Set(authz.HeaderRateLimitPolicy, c.RateLimitPolicy)
		h.Set(authz.HeaderRateLimit, c.RateLimit)
	}
	if s.legacyHeaders {
		h.Set(authz.LegacyRateLimitHeaders[0], strconv.FormatInt(c.Limit, 10))
		h.Set(authz.LegacyRateLimitHeaders[1], strconv.FormatInt(c.Remaining, 10))
		h.Set(authz.LegacyRateLimitHeaders[2], strconv.FormatInt(c.Reset, 10))
	}
}

const localARN = "arn:aws:execute-api:local:000000000000:localapi"

// event builds the authorizer event API Gateway would send for r. ok is
// false when API Gateway would refuse before calling the authorizer (a
// TOKEN authorizer's identity source missing).
func (s *server) event(r *http.Request, requestID string) ([]byte, bool) {
	ip := r.RemoteAddr
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		ip = host
	}
	path := r.URL.Path
	arn := localARN + "/" + s.stage + "/" + r.Method + path
	headers, multi := map[string]string{}, map[string][]string{}
	for k, v := range r.Header {
		headers[k] = strings.Join(v, ",")
		multi[k] = v
	}
	if r.Host != "" {
		headers["Host"] = r.Host
	}
	query, multiQuery := map[string]string{}, map[string][]string{}
	for k, v := range r.URL.Query() {
		query[k] = v[len(v)-1]
		multiQuery[k] = v
	}
	var ev any
	switch s.kind {
	case kindToken:
		token := r.Header.Get("Authorization")
		if token == "" {
			return nil, false
		}
		ev = events.APIGatewayCustomAuthorizerRequest{Type: "TOKEN", AuthorizationToken: token, MethodArn: arn}
	case kindHTTP:
		lower := map[string]string{}
		for k, v := range headers {
			lower[strings.ToLower(k)] = v
		}
		ev = events.APIGatewayV2CustomAuthorizerV2Request{
			Version:               "2.0",
			Type:                  "REQUEST",
			RouteArn:              localARN + "/$default/" + r.Method + path,
			RouteKey:              "$default",
			RawPath:               path,
			RawQueryString:        r.URL.RawQuery,
			Headers:               lower,
			QueryStringParameters: query,
			RequestContext: events.APIGatewayV2HTTPRequestContext{
				RouteKey: "$default", AccountID: "000000000000", Stage: "$default", RequestID: requestID, APIID: "localapi",
				DomainName: r.Host,
				HTTP:       events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: r.Method, Path: path, Protocol: r.Proto, SourceIP: ip, UserAgent: r.UserAgent()},
			},
		}
	default:
		ev = events.APIGatewayCustomAuthorizerRequestTypeRequest{
			Type:                            "REQUEST",
			MethodArn:                       arn,
			Resource:                        "/{proxy+}",
			Path:                            path,
			HTTPMethod:                      r.Method,
			Headers:                         headers,
			MultiValueHeaders:               multi,
			QueryStringParameters:           query,
			MultiValueQueryStringParameters: multiQuery,
			PathParameters:                  map[string]string{"proxy": strings.TrimPrefix(path, "/")},
			RequestContext: events.APIGatewayCustomAuthorizerRequestTypeRequestContext{
				Path: "/" + s.stage + path, AccountID: "000000000000", Stage: s.stage, RequestID: requestID,
				ResourcePath: "/{proxy+}", HTTPMethod: r.Method, APIID: "localapi",
				// An API key from the x-api-key header, as API Gateway's
				// HEADER API key source would identify it.
				Identity: events.APIGatewayCustomAuthorizerRequestTypeRequestIdentity{SourceIP: ip, APIKey: r.Header.Get("X-Api-Key")},
			},
		}
	}
	b, err := json.Marshal(ev)
	return b, err == nil
}

// echo is the default upstream: it answers with what it received.
func echo(w http.ResponseWriter, r *http.Request) {
	echoAfter(0)(w, r)
}

// echoAfter is echo answering after delay (a slow backend: -echo-delay),
// or when the client is gone.
func echoAfter(delay time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
			}
		}
		echoNow(w, r)
	}
}

func echoNow(w http.ResponseWriter, r *http.Request) {
	h := map[string]string{}
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "Authorization" || k == "X-Api-Key" || k == "Cookie" {
			h[k] = "[redacted]"
			continue
		}
		h[k] = r.Header.Get(k)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"message": "ok: the echo upstream received your request",
		"method":  r.Method,
		"path":    r.URL.Path,
		"query":   r.URL.RawQuery,
		"headers": h,
		// What a Lambda proxy integration finds in
		// requestContext.authorizer (the lease, for lambdawrap).
		"authorizer": r.Context().Value(authorizerKey{}),
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n')) //nolint:errcheck // the client may be gone
}
