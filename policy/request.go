package policy

import (
	"slices"
	"strings"
)

// Request is one request, described by the attributes rules match on and
// render keys from. The caller fills it from its event; the zero value is a
// request with no attributes.
type Request struct {
	// SourceIP is the client address as API Gateway saw it (the request
	// context's source IP), never a header.
	SourceIP string
	// Method is the HTTP method, upper case.
	Method string
	// Path is the request path (without query string), as the event
	// carries it. Rules match it as it is and cleaned ([CleanPath]); the
	// {path} placeholder renders it cleaned.
	Path string
	// RouteKey is the route ("GET /pets/{id}", "$default"); for REST APIs
	// the method and resource template.
	RouteKey string
	// Stage is the API stage.
	Stage string
	// Headers holds the request headers; lookups should ignore the case of
	// names (a [Header] does). Nil means none.
	Headers Values
	// Query holds the query string parameters (a [Query]). Nil means none.
	Query Values
	// APIKey is the API key API Gateway identified (REST APIs only).
	APIKey string
	// Token is the caller's credential: a TOKEN authorizer's token, else
	// the Authorization header. It only ever reaches a key hashed, and is
	// read through [Credential] (a whitespace-only token is no token).
	Token string
	// Absent lists the attributes this kind of event cannot carry (a TOKEN
	// authorizer sees no source IP, headers or query). A rule whose key
	// uses an absent attribute does not apply to the request; an attribute
	// that could be present but is empty renders as empty.
	Absent Attrs
}

// Credential returns the credential of a token or an Authorization header
// value v: v without surrounding whitespace, or "" when nothing is left or
// only the Bearer scheme without a credential ("   ", "Bearer", "Bearer
// "), so that such a request has no token rather than one shared by
// everyone who sends it.
func Credential(v string) string {
	v = strings.TrimSpace(v)
	if len(v) == len("Bearer") && strings.EqualFold(v, "Bearer") {
		return ""
	}
	return v
}

// Attrs is a set of request attributes.
type Attrs uint16

// The attributes of a [Request].
const (
	AttrSourceIP Attrs = 1 << iota
	AttrMethod
	AttrPath
	AttrRouteKey
	AttrStage
	AttrHeaders
	AttrQuery
	AttrAPIKey
	AttrToken
)

// Header returns the value of the header name and whether it is present.
func (r *Request) Header(name string) (string, bool) {
	if r.Headers == nil {
		return "", false
	}
	return r.Headers.Get(name)
}

// QueryParam returns the query parameter name and whether it is present.
func (r *Request) QueryParam(name string) (string, bool) {
	if r.Query == nil {
		return "", false
	}
	return r.Query.Get(name)
}

// Values are named values: headers or query parameters. A caller that
// holds them in another form (the raw JSON of an event) implements it to
// avoid building a map per request.
type Values interface {
	// Get returns the value of name and whether it is present.
	Get(name string) (string, bool)
}

// Header is a map of headers whose lookups ignore case. Field names are
// case-insensitive (RFC 9110), so two spellings of one name in the map
// ("X-Plan" and "x-plan", as a REST API event can carry) are one header
// sent twice: Get returns their values joined with commas, in the byte
// order of the spellings, whatever the spelling asked for. That is how
// HTTP API payload 2.0 delivers a repeated header (its names are lower
// case, its values comma-joined), and it never depends on the map's order.
type Header map[string]string

// Get implements Values.
func (h Header) Get(name string) (string, bool) {
	var val string
	n := 0
	for k, v := range h {
		if strings.EqualFold(k, name) {
			val = v
			n++
		}
	}
	if n > 1 {
		return h.joined(name), true
	}
	return val, n == 1
}

// joined is the comma-joined value of every spelling of name, in the byte
// order of the spellings.
func (h Header) joined(name string) string {
	var keys []string
	for k := range h {
		if strings.EqualFold(k, name) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	vals := make([]string, len(keys))
	for i, k := range keys {
		vals[i] = h[k]
	}
	return strings.Join(vals, ",")
}

// spellings is how many spellings of name h holds.
func (h Header) spellings(name string) int {
	n := 0
	for k := range h {
		if strings.EqualFold(k, name) {
			n++
		}
	}
	return n
}

// Query is a map of query parameters (case-sensitive, as API Gateway
// delivers them).
type Query map[string]string

// Get implements Values.
func (q Query) Get(name string) (string, bool) {
	v, ok := q[name]
	return v, ok
}
