package authz

import (
	"strconv"
	"time"

	"github.com/sluicehq/sluice/lambdawrap"
	"github.com/sluicehq/sluice/policy"
)

// Decision values of Context.Decision.
const (
	DecisionAllow = "allow"
	DecisionDeny  = "deny"
	DecisionShed  = "shed"
)

// PrincipalID is the principalId of every IAM response.
const PrincipalID = "sluice"

// Context is the authorizer context of every response. API Gateway hands
// it to the integration and to gateway responses as
// $context.authorizer.<key> (strings and numbers only, as it requires).
type Context struct {
	// Limit is the capacity of the deciding limit.
	Limit int64 `json:"limit"`
	// Remaining is what is left of it after this request.
	Remaining int64 `json:"remaining"`
	// Reset is the number of seconds until it is full again, rounded up.
	Reset int64 `json:"reset"`
	// RetryAfter is the number of seconds to wait before retrying, rounded
	// up; zero unless denied.
	RetryAfter int64 `json:"retryAfter"`
	// Rule is the deciding rule; empty when no rule matched.
	Rule string `json:"rule"`
	// Decision is allow, deny or shed.
	Decision string `json:"decision"`
	// Reason says why (policy.Reason): limit, cache, deny_list,
	// allow_list, fail_open, fail_closed, shed or none.
	Reason string `json:"reason"`
	// RateLimitPolicy and RateLimit are the values of the RateLimit-Policy
	// and RateLimit header fields of draft-ietf-httpapi-ratelimit-headers-11
	// for the deciding limit (named by its limit name), ready for an
	// integration or a gateway response to send: "per-ip/0";q=600;w=60
	// and "per-ip/0";r=599;t=1 (RateLimitFields). Empty (and left out)
	// when no limit decided (no rule, the lists, shedding).
	RateLimitPolicy string `json:"rateLimitPolicy,omitempty"`
	RateLimit       string `json:"rateLimit,omitempty"`
	// Leases are the concurrency leases the request holds, for the
	// integration to release (lambdawrap.LeasesFromContext under
	// lambdawrap.LeaseContextKey); empty (and left out) when none.
	Leases string `json:"sluiceLease,omitempty"`
}

// Response is what Handle returns on success: an *IAMResponse or a
// *SimpleResponse.
type Response interface {
	// AppendJSON appends the response as JSON.
	AppendJSON(b []byte) []byte
	// Allowed reports whether the response lets the request through.
	Allowed() bool
	// AuthContext returns the response's context.
	AuthContext() Context
}

// IAMResponse is a REST authorizer response (and an HTTP API one when IAM
// responses are configured): it marshals as
// events.APIGatewayCustomAuthorizerResponse does.
type IAMResponse struct {
	PrincipalID    string         `json:"principalId"`
	PolicyDocument PolicyDocument `json:"policyDocument"`
	Context        Context        `json:"context"`
}

// PolicyDocument is an IAM policy of one statement.
type PolicyDocument struct {
	Version   string       `json:"Version"`
	Statement [1]Statement `json:"Statement"`
}

// Statement allows or denies execute-api:Invoke on one resource.
type Statement struct {
	Action   [1]string `json:"Action"`
	Effect   string    `json:"Effect"`
	Resource [1]string `json:"Resource"`
}

// Allowed reports whether the policy's effect is Allow.
func (r *IAMResponse) Allowed() bool { return r.PolicyDocument.Statement[0].Effect == "Allow" }

// AuthContext returns r.Context.
func (r *IAMResponse) AuthContext() Context { return r.Context }

// SimpleResponse is an HTTP API simple response: it marshals as
// events.APIGatewayV2CustomAuthorizerSimpleResponse does.
type SimpleResponse struct {
	IsAuthorized bool    `json:"isAuthorized"`
	Context      Context `json:"context"`
}

// Allowed returns r.IsAuthorized.
func (r *SimpleResponse) Allowed() bool { return r.IsAuthorized }

// AuthContext returns r.Context.
func (r *SimpleResponse) AuthContext() Context { return r.Context }

// contextOf turns a policy result into the response context.
func contextOf(res *policy.Result) Context {
	c := Context{
		Limit:     res.Decision.Limit,
		Remaining: res.Decision.Remaining,
		Reset:     seconds(res.Decision.ResetAfter),
		Rule:      res.Rule,
		Decision:  DecisionAllow,
		Reason:    string(res.Reason),
	}
	if res.Rule != "" && res.Decision.Name != "" && res.Outcome != policy.Shed {
		c.RateLimitPolicy, c.RateLimit = RateLimitFields(res.Decision.Name, c.Limit, c.Remaining, res.Window, c.Reset)
	}
	if len(res.Leases) > 0 && res.Outcome == policy.Allow {
		named := make([]lambdawrap.NamedLease, len(res.Leases))
		for i, l := range res.Leases {
			named[i] = lambdawrap.NamedLease{Limit: l.Limit, Lease: l.Lease}
		}
		c.Leases = lambdawrap.FormatLeases(named)
	}
	switch res.Outcome {
	case policy.Deny:
		c.Decision = DecisionDeny
		c.RetryAfter = max(seconds(res.Decision.RetryAfter), 1)
	case policy.Shed:
		c.Decision = DecisionShed
		c.RetryAfter = max(seconds(res.Decision.RetryAfter), 1)
	}
	return c
}

// seconds rounds d up to whole seconds.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func iamResponse(arn string, allow bool, c Context) *IAMResponse {
	effect := "Deny"
	if allow {
		effect = "Allow"
	}
	return &IAMResponse{
		PrincipalID: PrincipalID,
		PolicyDocument: PolicyDocument{
			Version: "2012-10-17",
			Statement: [1]Statement{{
				Action:   [1]string{"execute-api:Invoke"},
				Effect:   effect,
				Resource: [1]string{arn},
			}},
		},
		Context: c,
	}
}

// AppendJSON appends r as JSON, as encoding/json would marshal it (without
// its HTML escaping), without reflection.
func (r *IAMResponse) AppendJSON(b []byte) []byte {
	st := &r.PolicyDocument.Statement[0]
	b = append(b, `{"principalId":`...)
	b = appendJSONString(b, r.PrincipalID)
	b = append(b, `,"policyDocument":{"Version":`...)
	b = appendJSONString(b, r.PolicyDocument.Version)
	b = append(b, `,"Statement":[{"Action":[`...)
	b = appendJSONString(b, st.Action[0])
	b = append(b, `],"Effect":`...)
	b = appendJSONString(b, st.Effect)
	b = append(b, `,"Resource":[`...)
	b = appendJSONString(b, st.Resource[0])
	b = append(b, `]}]},"context":`...)
	b = r.Context.appendJSON(b)
	return append(b, '}')
}

// MarshalJSON implements json.Marshaler with AppendJSON.
func (r *IAMResponse) MarshalJSON() ([]byte, error) { return r.AppendJSON(nil), nil }

// AppendJSON appends r as JSON, as encoding/json would marshal it.
func (r *SimpleResponse) AppendJSON(b []byte) []byte {
	b = append(b, `{"isAuthorized":`...)
	b = strconv.AppendBool(b, r.IsAuthorized)
	b = append(b, `,"context":`...)
	b = r.Context.appendJSON(b)
	return append(b, '}')
}

// MarshalJSON implements json.Marshaler with AppendJSON.
func (r *SimpleResponse) MarshalJSON() ([]byte, error) { return r.AppendJSON(nil), nil }

func (c *Context) appendJSON(b []byte) []byte {
	b = append(b, `{"limit":`...)
	b = strconv.AppendInt(b, c.Limit, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, c.Remaining, 10)
	b = append(b, `,"reset":`...)
	b = strconv.AppendInt(b, c.Reset, 10)
	b = append(b, `,"retryAfter":`...)
	b = strconv.AppendInt(b, c.RetryAfter, 10)
	b = append(b, `,"rule":`...)
	b = appendJSONString(b, c.Rule)
	b = append(b, `,"decision":`...)
	b = appendJSONString(b, c.Decision)
	b = append(b, `,"reason":`...)
	b = appendJSONString(b, c.Reason)
	if c.RateLimitPolicy != "" {
		b = append(b, `,"rateLimitPolicy":`...)
		b = appendJSONString(b, c.RateLimitPolicy)
	}
	if c.RateLimit != "" {
		b = append(b, `,"rateLimit":`...)
		b = appendJSONString(b, c.RateLimit)
	}
	if c.Leases != "" {
		b = append(b, `,"`+lambdawrap.LeaseContextKey+`":`...)
		b = appendJSONString(b, c.Leases)
	}
	return append(b, '}')
}
