package policy

import (
	"path"
	"strings"
)

// CleanPath returns the path a server that decodes percent-escapes and
// resolves dot segments serves for p, which rules match besides p itself
// (docs/rules.md, "Paths"): every valid %XX escape decoded once ("%2f"
// becomes '/', "%2e" '.', "%252f" only "%2f"), runs of '/' collapsed, "."
// and ".." segments resolved (never above the root), a trailing '/' kept.
// A path that is already clean, or that does not start with '/', is
// returned as it is, without allocating.
func CleanPath(p string) string {
	if p == "" || p[0] != '/' || isClean(p) {
		return p
	}
	d := unescapePath(p)
	c := path.Clean(d)
	if c != "/" && strings.HasSuffix(d, "/") {
		c += "/"
	}
	return c
}

// isClean reports whether p (which starts with '/') has no percent-escape,
// no empty segment but a last one, and no "." or ".." segment.
func isClean(p string) bool {
	if strings.IndexByte(p, '%') >= 0 {
		return false
	}
	for i := 1; i <= len(p); {
		j := strings.IndexByte(p[i:], '/')
		if j < 0 {
			j = len(p) - i
		}
		switch seg := p[i : i+j]; {
		case seg == "." || seg == "..":
			return false
		case seg == "" && i+j < len(p): // "//"
			return false
		}
		i += j + 1
	}
	return true
}

// unescapePath decodes every valid %XX escape of p once; an invalid one
// ("%zz", a '%' near the end) stays as it is.
func unescapePath(p string) string {
	var b strings.Builder
	b.Grow(len(p))
	for i := 0; i < len(p); i++ {
		if p[i] == '%' && i+2 < len(p) && isHexDigit(p[i+1]) && isHexDigit(p[i+2]) {
			b.WriteByte(unhex(p[i+1])<<4 | unhex(p[i+2]))
			i += 2
			continue
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

func isHexDigit(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}
