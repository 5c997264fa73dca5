package policy

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// Bounds on rendered keys.
const (
	// MaxValueLen is the longest attribute value that goes into a key
	// escaped; longer values go in as a hash.
	MaxValueLen = 64
	// MaxKeyLen is the longest rendered key; a longer one is replaced by
	// the rule name and a hash of the whole key.
	MaxKeyLen = 256
	// maxPlaceholders bounds the placeholders in one key template.
	maxPlaceholders = 8
	// maxLiteral bounds the constant text of one key template.
	maxLiteral = 64
	// hashLen is the length of a rendered hash: '#' and 22 base64url
	// characters (128 bits of SHA-256).
	hashLen = 1 + 22
)

type attrKind uint8

const (
	kindLiteral attrKind = iota
	kindIP
	kindMethod
	kindPath
	kindRoute
	kindStage
	kindAPIKey
	kindToken
	kindHeader
	kindQuery
)

var placeholderKinds = map[string]struct {
	kind attrKind
	attr Attrs
}{
	"ip":      {kindIP, AttrSourceIP},
	"method":  {kindMethod, AttrMethod},
	"path":    {kindPath, AttrPath},
	"route":   {kindRoute, AttrRouteKey},
	"stage":   {kindStage, AttrStage},
	"api_key": {kindAPIKey, AttrAPIKey},
	"token":   {kindToken, AttrToken},
}

var (
	headerNameRE = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_|~-]{1,64}$`) // RFC 9110 token
	queryNameRE  = regexp.MustCompile(`^[^\x00-\x20\x7f{}]{1,64}$`)
)

// keyPart is a literal or a placeholder of a key template.
type keyPart struct {
	kind attrKind
	attr Attrs
	text string // the literal, or the header/query name
}

// keyTemplate is a compiled key template.
type keyTemplate struct {
	parts []keyPart
	attrs Attrs // the attributes the template reads
}

// compileKey parses a key template: literal text with placeholders in
// braces, e.g. "tenant:{header:X-Tenant}:{ip}".
func compileKey(src string) (keyTemplate, error) {
	var t keyTemplate
	literal, holders := 0, 0
	for rest := src; rest != ""; {
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			open = len(rest)
		}
		if open > 0 {
			lit := rest[:open]
			for i := 0; i < len(lit); i++ {
				if lit[i] < 0x21 || lit[i] >= 0x7f {
					return t, fmt.Errorf("%q: constant text must be printable ASCII without spaces", src)
				}
			}
			literal += len(lit)
			t.parts = append(t.parts, keyPart{kind: kindLiteral, text: lit})
			rest = rest[open:]
			continue
		}
		if rest[0] == '}' {
			return t, fmt.Errorf("%q: unmatched '}'", src)
		}
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return t, fmt.Errorf("%q: unclosed '{'", src)
		}
		p, err := parsePlaceholder(rest[1:end])
		if err != nil {
			return t, fmt.Errorf("%q: %v", src, err)
		}
		holders++
		t.parts = append(t.parts, p)
		t.attrs |= p.attr
		rest = rest[end+1:]
	}
	switch {
	case literal > maxLiteral:
		return t, fmt.Errorf("%q: more than %d bytes of constant text", src, maxLiteral)
	case holders > maxPlaceholders:
		return t, fmt.Errorf("%q: more than %d placeholders", src, maxPlaceholders)
	}
	return t, nil
}

// parsePlaceholder parses the inside of {...}: ip, method, path, route,
// stage, api_key, token, header:NAME or query:NAME.
func parsePlaceholder(s string) (keyPart, error) {
	if k, ok := placeholderKinds[s]; ok {
		return keyPart{kind: k.kind, attr: k.attr}, nil
	}
	if name, ok := strings.CutPrefix(s, "header:"); ok {
		if !headerNameRE.MatchString(name) {
			return keyPart{}, fmt.Errorf("{%s}: %q is not a header name", s, name)
		}
		return keyPart{kind: kindHeader, attr: AttrHeaders, text: name}, nil
	}
	if name, ok := strings.CutPrefix(s, "query:"); ok {
		if !queryNameRE.MatchString(name) {
			return keyPart{}, fmt.Errorf("{%s}: %q is not a query parameter name", s, name)
		}
		return keyPart{kind: kindQuery, attr: AttrQuery, text: name}, nil
	}
	return keyPart{}, fmt.Errorf("{%s} is not an attribute (ip, method, path, route, stage, api_key, token, header:NAME, query:NAME)", s)
}

// value returns the attribute p of req, and whether the request carries it
// (an empty header is present; a missing one is not).
func (c *compiledRule) value(p keyPart, req *Request) (string, bool) {
	switch p.kind {
	case kindIP:
		return c.clientIP(req), req.SourceIP != ""
	case kindMethod:
		return req.Method, req.Method != ""
	case kindPath:
		if c.Match.CaseSensitive {
			return CleanPath(req.Path), req.Path != ""
		}
		return strings.ToLower(CleanPath(req.Path)), req.Path != ""
	case kindRoute:
		return req.RouteKey, req.RouteKey != ""
	case kindStage:
		return req.Stage, req.Stage != ""
	case kindAPIKey:
		return req.APIKey, req.APIKey != ""
	case kindToken:
		t := Credential(req.Token)
		return t, t != ""
	case kindHeader:
		return req.Header(p.text)
	case kindQuery:
		return req.QueryParam(p.text)
	}
	return p.text, true
}

// renderKey appends the rule's key for req to dst: the rule name, ':', and
// the template with every value escaped (or hashed).
func (c *compiledRule) renderKey(dst []byte, req *Request) []byte {
	start := len(dst)
	dst = append(dst, c.Name...)
	dst = append(dst, ':')
	for _, p := range c.key.parts {
		if p.kind == kindLiteral {
			dst = append(dst, p.text...)
			continue
		}
		v, _ := c.value(p, req)
		switch {
		case v == "":
		case p.kind == kindToken || p.kind == kindAPIKey:
			dst = appendHash(dst, v)
		case p.kind == kindIP:
			dst = appendIP(dst, v, c.ClientIP.IPv6Prefix)
		default:
			dst = appendValue(dst, v)
		}
	}
	if len(dst)-start > MaxKeyLen {
		sum := sha256.Sum256(dst[start:])
		dst = append(dst[:start], c.Name...)
		dst = append(dst, ':', '#')
		dst = base64.RawURLEncoding.AppendEncode(dst, sum[:16])
	}
	return dst
}

// clientIP is the {ip} of req under the rule's client_ip settings.
func (c *compiledRule) clientIP(req *Request) string {
	if c.ClientIP.From == FromXForwardedFor {
		if h, ok := req.Headers.(Header); ok && h.spellings("X-Forwarded-For") > 1 {
			// Two spellings: which one the trusted proxy appended to is
			// unknown, so no hop can be trusted.
			return req.SourceIP
		}
		if xff, ok := req.Header("X-Forwarded-For"); ok {
			if ip, ok := forwardedFor(xff, c.ClientIP.Hops); ok {
				return ip
			}
		}
	}
	return req.SourceIP
}

// forwardedFor returns the hops-th address from the right of an
// X-Forwarded-For value, if it is a valid IP address.
func forwardedFor(xff string, hops int) (string, bool) {
	rest := xff
	for i := 1; ; i++ {
		j := strings.LastIndexByte(rest, ',')
		entry := strings.TrimSpace(rest[j+1:])
		if i == hops {
			if _, err := netip.ParseAddr(entry); err != nil {
				return "", false
			}
			return entry, true
		}
		if j < 0 {
			return "", false
		}
		rest = rest[:j]
	}
}

// appendIP appends an IP address in canonical form, IPv6 cut to its
// prefix; anything else is appended as a plain value.
func appendIP(dst []byte, v string, prefix int) []byte {
	a, err := netip.ParseAddr(v)
	if err != nil {
		return appendValue(dst, v)
	}
	a = a.Unmap().WithZone("")
	var buf [64]byte
	if a.Is6() && prefix < 128 {
		if p, err := a.Prefix(prefix); err == nil {
			return appendValue(dst, p.AppendTo(buf[:0]))
		}
	}
	return appendValue(dst, a.AppendTo(buf[:0]))
}

// appendValue appends v percent-escaped (every byte outside
// [A-Za-z0-9._~-]), or '#' and a hash of v when v is longer than
// MaxValueLen. The escaping makes keys unambiguous: a value can never
// produce a template's separator characters or another value's hash.
func appendValue[T string | []byte](dst []byte, v T) []byte {
	if len(v) > MaxValueLen {
		return appendHash(dst, string(v))
	}
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		b := v[i]
		if 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '.' || b == '_' || b == '~' || b == '-' {
			dst = append(dst, b)
			continue
		}
		dst = append(dst, '%', hex[b>>4], hex[b&15])
	}
	return dst
}

// appendHash appends '#' and 128 bits of SHA-256 of v, base64url-encoded.
func appendHash(dst []byte, v string) []byte {
	sum := sha256.Sum256([]byte(v))
	dst = append(dst, '#')
	return base64.RawURLEncoding.AppendEncode(dst, sum[:16])
}
