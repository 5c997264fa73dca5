package policy

import "strings"

// Request is one request, described by the attributes rules match on and
// render keys from. The caller fills it from its event; the zero value is a
// request with no attributes.
type Request struct {
	// SourceIP is the client address as API Gateway saw it (the request
	// context's source IP), never a header.
	SourceIP string
	// Method is the HTTP method, upper case.
	Method string
	// Path is the request path (without query string).
	Path string
	// RouteKey is the route ("GET /pets/{id}", "$default"); for REST APIs
	// the method and resource template.
	RouteKey string
	// Stage is the API stage.
	Stage string
	// Headers holds the request headers; lookups ignore the case of names.
	Headers map[string]string
	// Query holds the query string parameters.
	Query map[string]string
	// APIKey is the API key API Gateway identified (REST APIs only).
	APIKey string
	// Token is the caller's credential: a TOKEN authorizer's token, else
	// the Authorization header. It only ever reaches a key hashed.
	Token string
	// Absent lists the attributes this kind of event cannot carry (a TOKEN
	// authorizer sees no source IP, headers or query). A rule whose key
	// uses an absent attribute does not apply to the request; an attribute
	// that could be present but is empty renders as empty.
	Absent Attrs
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

// Header returns the value of the header name, ignoring case, and whether it
// is present.
func (r *Request) Header(name string) (string, bool) {
	return lookupFold(r.Headers, name)
}

// QueryParam returns the query parameter name (case-sensitive, as API
// Gateway delivers it) and whether it is present.
func (r *Request) QueryParam(name string) (string, bool) {
	v, ok := r.Query[name]
	return v, ok
}

// lookupFold finds name in m: first exactly, then ignoring case.
func lookupFold(m map[string]string, name string) (string, bool) {
	if v, ok := m[name]; ok {
		return v, true
	}
	for k, v := range m {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}
