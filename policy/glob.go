package policy

import (
	"fmt"
	"path"
	"strings"
)

// maxGlobLen bounds a path glob in a rule.
const maxGlobLen = 512

// glob is a compiled path pattern: segments separated by '/'. A segment "**"
// matches any number of whole segments (zero included); any other segment is
// a [path.Match] pattern for exactly one segment ('*' and '?' never cross a
// '/').
type glob struct {
	src  string
	segs []string
	fold bool // match ignoring case: segs are lower case, paths are lowered
}

// compileGlob compiles the pattern p; fold makes it match paths ignoring
// case (the default for rules: a rule's match.case_sensitive turns it off).
func compileGlob(p string, fold bool) (glob, error) {
	switch {
	case p == "":
		return glob{}, fmt.Errorf("empty pattern")
	case len(p) > maxGlobLen:
		return glob{}, fmt.Errorf("pattern longer than %d bytes", maxGlobLen)
	case p[0] != '/':
		return glob{}, fmt.Errorf("%q does not start with '/'", p)
	}
	for i := 0; i < len(p); i++ {
		if p[i] < 0x20 || p[i] == 0x7f {
			return glob{}, fmt.Errorf("%q contains a control byte", p)
		}
	}
	pat := p
	if fold {
		pat = strings.ToLower(p)
	}
	segs := strings.Split(pat[1:], "/")
	for _, s := range segs {
		if s == "**" {
			continue
		}
		if strings.Contains(s, "**") {
			return glob{}, fmt.Errorf("%q: '**' must be a whole segment", p)
		}
		if _, err := path.Match(s, ""); err != nil {
			return glob{}, fmt.Errorf("%q: bad segment %q: %v", p, s, err)
		}
	}
	return glob{src: p, segs: segs, fold: fold}, nil
}

// match reports whether the path p matches, as it is or cleaned
// ([CleanPath]): "//demo/x" and "/a/..%2fdemo/x" match "/demo/**", which
// a server that cleans paths would serve them as. A folding glob compares
// both lower-cased ("/DEMO/x" and "/%44emo/x" match "/demo/**"), as a
// server that routes ignoring case would serve them.
func (g glob) match(p string) bool {
	if g.matchRaw(g.lower(p)) {
		return true
	}
	c := CleanPath(p)
	return c != p && g.matchRaw(g.lower(c))
}

// lower is p lower-cased when the glob folds case; strings.ToLower
// returns p itself (no allocation) when it has no upper-case letter.
func (g glob) lower(p string) string {
	if !g.fold {
		return p
	}
	return strings.ToLower(p)
}

// matchRaw reports whether the path p matches as it is. It runs in
// O(segments * pattern segments) steps whatever the input: one
// backtracking point (the last "**"), as in classic wildcard matching. The
// path "/a/" has the segments "a" and "".
func (g glob) matchRaw(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	end := len(p) + 1 // position meaning "no segments left"
	pos, pi := 1, 0
	star, starPos := -1, 0
	for {
		if pos == end && pi == len(g.segs) {
			return true
		}
		if pi < len(g.segs) && g.segs[pi] == "**" {
			pi++
			star, starPos = pi, pos
			continue
		}
		if pos != end && pi < len(g.segs) {
			seg, next := segAt(p, pos)
			if segMatch(g.segs[pi], seg) {
				pi, pos = pi+1, next
				continue
			}
		}
		if star >= 0 && starPos != end {
			// Let the last "**" swallow one more segment.
			_, starPos = segAt(p, starPos)
			pos, pi = starPos, star
			continue
		}
		return false
	}
}

// segAt returns the segment of p starting at pos and where the next one
// starts (len(p)+1 when none is left).
func segAt(p string, pos int) (seg string, next int) {
	i := strings.IndexByte(p[pos:], '/')
	if i < 0 {
		return p[pos:], len(p) + 1
	}
	return p[pos : pos+i], pos + i + 1
}

func segMatch(pattern, seg string) bool {
	if pattern == seg {
		return true
	}
	ok, err := path.Match(pattern, seg)
	return ok && err == nil
}
