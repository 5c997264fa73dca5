package authz

import (
	"strconv"
	"time"
)

// The header fields of draft-ietf-httpapi-ratelimit-headers-11 that the
// context carries ready to send (Context.RateLimitPolicy and
// Context.RateLimit), and the older separate fields of its earlier drafts,
// which the local API sends only when asked (LegacyRateLimitHeaders).
const (
	HeaderRateLimitPolicy = "RateLimit-Policy"
	HeaderRateLimit       = "RateLimit"
)

// LegacyRateLimitHeaders are the fields of the draft's earlier revisions
// (up to -06), one number each: Context.Limit, Context.Remaining and
// Context.Reset.
var LegacyRateLimitHeaders = [3]string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}

// RateLimitFields returns the values of the RateLimit-Policy and RateLimit
// fields of draft -11 for one quota policy: a List of one Item, a String
// naming the policy, with its Parameters (RFC 9651 serialization):
//
//	RateLimit-Policy: "name";q=<quota>;w=<window in seconds>
//	RateLimit: "name";r=<available quota>;t=<effective window in seconds>
//
// w is left out unless window is a whole number of seconds, at least one
// (the draft allows no sub-second windows; w is optional). Negative
// numbers are sent as 0 (the draft's Integers are non-negative). The
// structured-field serialization is written here: two Items of Integers
// and one String do not call for a library.
func RateLimitFields(name string, quota, available int64, window time.Duration, reset int64) (policy, current string) {
	p := appendSFString(make([]byte, 0, len(name)+32), name)
	c := append(make([]byte, 0, len(p)+24), p...)
	p = append(p, ";q="...)
	p = strconv.AppendInt(p, max(quota, 0), 10)
	if window >= time.Second && window%time.Second == 0 {
		p = append(p, ";w="...)
		p = strconv.AppendInt(p, int64(window/time.Second), 10)
	}
	c = append(c, ";r="...)
	c = strconv.AppendInt(c, max(available, 0), 10)
	c = append(c, ";t="...)
	c = strconv.AppendInt(c, max(reset, 0), 10)
	return string(p), string(c)
}

// appendSFString appends s as an RFC 9651 String: quoted, with '"' and
// '\' escaped; bytes outside printable ASCII (which a String cannot hold,
// and rule and limit names never contain) become '?'.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
