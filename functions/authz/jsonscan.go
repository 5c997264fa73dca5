package authz

import (
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// This file is a small, strict JSON reader for the authorizer events: one
// pass validates the whole document (as json.Valid does) and notes where
// the few fields Sluice reads are, without decoding anything else. Field
// names match as encoding/json matches struct fields (exactly, else ignoring
// case), repeated fields behave as encoding/json decodes them into
// rawEvent, and strings unquote as encoding/json unquotes them (invalid
// UTF-8 and lone surrogates become U+FFFD). FuzzDecodeEvent checks it
// against encoding/json. It allocates nothing but the strings that hold
// escapes.

// maxDepth is encoding/json's nesting limit.
const maxDepth = 10000

type jsonKind uint8

const (
	jNone jsonKind = iota // absent
	jNull
	jString
	jNumber
	jBool
	jObject
	jArray
)

func (k jsonKind) String() string {
	return [...]string{"nothing", "null", "string", "number", "bool", "object", "array"}[k]
}

// span locates a value in the source: for a string its contents without
// the quotes (plain means no escapes and valid UTF-8, so the source bytes
// are the value), for an object its braces included.
type span struct {
	kind       jsonKind
	start, end int
	plain      bool
}

// objects is the list of object spans a map field accumulated: a repeated
// object field adds its entries to the map, null empties it. While the
// spans are read, the value of one member (watch) is noted, so that the
// common lookup (the Authorization header) needs no second scan.
type objects struct {
	first span
	more  []span

	watch             string // member name noted, ignoring case
	exact, fold       span   // its last exact and last case-folded values
	hasExact, hasFold bool
}

func (o *objects) add(s span) {
	switch {
	case s.kind == jNull:
		*o = objects{watch: o.watch}
	case o.first.kind == jNone:
		o.first = s
	default:
		o.more = append(o.more, s)
	}
}

// eventFields are the spans of the fields rawEvent reads.
type eventFields struct {
	version, typ, authorizationToken, methodArn, resource, path, httpMethod span
	routeArn, routeKey, rawPath                                             span
	headers, query                                                          objects
	rcStage, rcPath, rcHTTPMethod, rcRouteKey                               span
	idAPIKey, idSourceIP                                                    span
	httpMethodV2, httpPath, httpSourceIP                                    span
}

// syntaxError is malformed JSON at byte Offset.
type syntaxError struct {
	msg    string
	Offset int
}

func (e *syntaxError) Error() string { return e.msg }

// typeError is a value of the wrong JSON type for the field.
type typeError struct {
	Field string
	Want  string
	Got   jsonKind
}

func (e *typeError) Error() string {
	return fmt.Sprintf("field %q: want %s, got JSON %s", e.Field, e.Want, e.Got)
}

type parser struct {
	s       string
	i       int
	depth   int
	typeErr *typeError
}

// parseEvent reads an event document into f. It returns a *syntaxError for
// malformed JSON and otherwise the first *typeError.
func parseEvent(s string, f *eventFields) error {
	p := &parser{s: s}
	p.ws()
	if p.i >= len(p.s) {
		return p.syntax("unexpected end of JSON input")
	}
	var err error
	switch p.s[p.i] {
	case '{':
		err = p.object(func(p *parser, key span) error { return p.topField(key, f) })
	case 'n':
		err = p.literal("null")
	default:
		var v span
		v, err = p.value()
		if err == nil {
			p.typeError("", "an object", v.kind)
		}
	}
	if err != nil {
		return err
	}
	p.ws()
	if p.i < len(p.s) {
		return p.syntax("invalid character after top-level value")
	}
	if p.typeErr != nil {
		return p.typeErr
	}
	return nil
}

var (
	topNames = [...]string{"version", "type", "authorizationToken", "methodArn", "resource", "path", "httpMethod",
		"routeArn", "routeKey", "rawPath", "headers", "queryStringParameters", "requestContext"}
	contextNames = [...]string{"stage", "path", "httpMethod", "routeKey", "identity", "http"}
)

func (p *parser) topField(key span, f *eventFields) error {
	i := p.match(key, topNames[:]...)
	switch i {
	case 0:
		return p.stringField(topNames[i], &f.version)
	case 1:
		return p.stringField(topNames[i], &f.typ)
	case 2:
		return p.stringField(topNames[i], &f.authorizationToken)
	case 3:
		return p.stringField(topNames[i], &f.methodArn)
	case 4:
		return p.stringField(topNames[i], &f.resource)
	case 5:
		return p.stringField(topNames[i], &f.path)
	case 6:
		return p.stringField(topNames[i], &f.httpMethod)
	case 7:
		return p.stringField(topNames[i], &f.routeArn)
	case 8:
		return p.stringField(topNames[i], &f.routeKey)
	case 9:
		return p.stringField(topNames[i], &f.rawPath)
	case 10:
		return p.stringMap(topNames[i], &f.headers)
	case 11:
		return p.stringMap(topNames[i], &f.query)
	case 12:
		return p.structField("requestContext", func(p *parser, key span) error { return p.contextField(key, f) })
	}
	_, err := p.value()
	return err
}

func (p *parser) contextField(key span, f *eventFields) error {
	switch p.match(key, contextNames[:]...) {
	case 0:
		return p.stringField("requestContext.stage", &f.rcStage)
	case 1:
		return p.stringField("requestContext.path", &f.rcPath)
	case 2:
		return p.stringField("requestContext.httpMethod", &f.rcHTTPMethod)
	case 3:
		return p.stringField("requestContext.routeKey", &f.rcRouteKey)
	case 4:
		return p.structField("requestContext.identity", func(p *parser, key span) error {
			switch p.match(key, "apiKey", "sourceIp") {
			case 0:
				return p.stringField("requestContext.identity.apiKey", &f.idAPIKey)
			case 1:
				return p.stringField("requestContext.identity.sourceIp", &f.idSourceIP)
			}
			_, err := p.value()
			return err
		})
	case 5:
		return p.structField("requestContext.http", func(p *parser, key span) error {
			switch p.match(key, "method", "path", "sourceIp") {
			case 0:
				return p.stringField("requestContext.http.method", &f.httpMethodV2)
			case 1:
				return p.stringField("requestContext.http.path", &f.httpPath)
			case 2:
				return p.stringField("requestContext.http.sourceIp", &f.httpSourceIP)
			}
			_, err := p.value()
			return err
		})
	}
	_, err := p.value()
	return err
}

// match returns the index of the name key matches, exactly or else
// ignoring case as encoding/json does, or -1.
func (p *parser) match(key span, names ...string) int {
	k := p.text(key)
	for i, n := range names {
		if k == n {
			return i
		}
	}
	for i, n := range names {
		if strings.EqualFold(k, n) {
			return i
		}
	}
	return -1
}

// text is the value of a string span.
func (p *parser) text(s span) string {
	if s.kind != jString {
		return ""
	}
	if s.plain {
		return p.s[s.start:s.end]
	}
	return unquote(p.s[s.start:s.end])
}

// stringField reads a string (or null, which leaves dst alone) into dst.
func (p *parser) stringField(name string, dst *span) error {
	v, err := p.value()
	switch {
	case err != nil:
		return err
	case v.kind == jString:
		*dst = v
	case v.kind != jNull:
		p.typeError(name, "string", v.kind)
	}
	return nil
}

// structField reads an object (null leaves it alone) member by member.
func (p *parser) structField(name string, member func(p *parser, key span) error) error {
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == '{' {
		return p.object(member)
	}
	v, err := p.value()
	if err == nil && v.kind != jNull {
		p.typeError(name, "object", v.kind)
	}
	return err
}

// stringMap reads an object of strings (a map[string]string).
func (p *parser) stringMap(name string, dst *objects) error {
	p.ws()
	start := p.i
	if p.i < len(p.s) && p.s[p.i] == '{' {
		err := p.object(func(p *parser, key span) error {
			v, err := p.value()
			if err == nil && v.kind != jString && v.kind != jNull {
				p.typeError(name, "string", v.kind)
			}
			if err == nil && dst.watch != "" && key.end-key.start >= len(dst.watch) {
				if k := p.text(key); k == dst.watch {
					dst.exact, dst.hasExact = v, true
				} else if strings.EqualFold(k, dst.watch) {
					dst.fold, dst.hasFold = v, true
				}
			}
			return err
		})
		if err == nil {
			dst.add(span{kind: jObject, start: start, end: p.i})
		}
		return err
	}
	v, err := p.value()
	switch {
	case err != nil:
		return err
	case v.kind == jNull:
		dst.add(v)
	default:
		p.typeError(name, "object", v.kind)
	}
	return nil
}

func (p *parser) typeError(field, want string, got jsonKind) {
	if p.typeErr == nil {
		p.typeErr = &typeError{Field: field, Want: want, Got: got}
	}
}

func (p *parser) syntax(msg string) error {
	return &syntaxError{msg: msg, Offset: p.i}
}

func (p *parser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// value reads any value and returns its span.
func (p *parser) value() (span, error) {
	p.ws()
	if p.i >= len(p.s) {
		return span{}, p.syntax("unexpected end of JSON input")
	}
	start := p.i
	switch c := p.s[p.i]; {
	case c == '"':
		return p.str()
	case c == '{':
		err := p.object(func(p *parser, _ span) error { _, err := p.value(); return err })
		return span{kind: jObject, start: start, end: p.i}, err
	case c == '[':
		err := p.array()
		return span{kind: jArray, start: start, end: p.i}, err
	case c == 't':
		return span{kind: jBool}, p.literal("true")
	case c == 'f':
		return span{kind: jBool}, p.literal("false")
	case c == 'n':
		return span{kind: jNull}, p.literal("null")
	case c == '-' || '0' <= c && c <= '9':
		return span{kind: jNumber}, p.number()
	}
	return span{}, p.syntax(fmt.Sprintf("invalid character %q looking for beginning of value", p.s[p.i]))
}

func (p *parser) literal(lit string) error {
	if !strings.HasPrefix(p.s[p.i:], lit) {
		if len(p.s)-p.i < len(lit) && strings.HasPrefix(lit, p.s[p.i:]) {
			p.i = len(p.s)
			return p.syntax("unexpected end of JSON input")
		}
		return p.syntax("invalid literal")
	}
	p.i += len(lit)
	return nil
}

// object reads {"key": value, ...}, calling member with the parser at each
// value; member must read it.
func (p *parser) object(member func(p *parser, key span) error) error {
	if p.depth++; p.depth > maxDepth {
		return p.syntax("exceeded max depth")
	}
	p.i++ // '{'
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		p.depth--
		return nil
	}
	for {
		p.ws()
		if p.i >= len(p.s) {
			return p.syntax("unexpected end of JSON input")
		}
		if p.s[p.i] != '"' {
			return p.syntax("invalid character looking for beginning of object key string")
		}
		key, err := p.str()
		if err != nil {
			return err
		}
		p.ws()
		if p.i >= len(p.s) {
			return p.syntax("unexpected end of JSON input")
		}
		if p.s[p.i] != ':' {
			return p.syntax("invalid character after object key")
		}
		p.i++
		if err := member(p, key); err != nil {
			return err
		}
		p.ws()
		if p.i >= len(p.s) {
			return p.syntax("unexpected end of JSON input")
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			p.depth--
			return nil
		default:
			return p.syntax("invalid character after object key:value pair")
		}
	}
}

func (p *parser) array() error {
	if p.depth++; p.depth > maxDepth {
		return p.syntax("exceeded max depth")
	}
	p.i++ // '['
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		p.depth--
		return nil
	}
	for {
		if _, err := p.value(); err != nil {
			return err
		}
		p.ws()
		if p.i >= len(p.s) {
			return p.syntax("unexpected end of JSON input")
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			p.depth--
			return nil
		default:
			return p.syntax("invalid character after array element")
		}
	}
}

// str reads a string; the span is its contents.
func (p *parser) str() (span, error) {
	p.i++ // '"'
	start := p.i
	plain := true
	s := p.s
	for {
		// Skip eight plain bytes at a time.
		for p.i+8 <= len(s) && !special(load64(s, p.i)) {
			p.i += 8
		}
		if p.i >= len(s) {
			break
		}
		c := s[p.i]
		if plainByte[c] {
			p.i++
			continue
		}
		switch {
		case c == '"':
			sp := span{kind: jString, start: start, end: p.i, plain: plain}
			p.i++
			return sp, nil
		case c == '\\':
			plain = false
			if p.i+1 >= len(s) {
				p.i = len(s)
				return span{}, p.syntax("unexpected end of JSON input")
			}
			switch s[p.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i += 2
			case 'u':
				for j := 2; j < 6; j++ {
					if p.i+j >= len(s) {
						p.i = len(s)
						return span{}, p.syntax("unexpected end of JSON input")
					}
					if !isHex(s[p.i+j]) {
						p.i += j
						return span{}, p.syntax("invalid character in \\u hexadecimal character escape")
					}
				}
				p.i += 6
			default:
				p.i++
				return span{}, p.syntax("invalid character in string escape code")
			}
		case c < 0x20:
			return span{}, p.syntax("invalid character in string literal")
		default: // c >= utf8.RuneSelf
			r, size := utf8.DecodeRuneInString(s[p.i:])
			if r == utf8.RuneError && size == 1 {
				plain = false // invalid UTF-8: unquote replaces it
			}
			p.i += size
		}
	}
	return span{}, p.syntax("unexpected end of JSON input")
}

// load64 reads eight bytes of s at i, little-endian.
func load64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// special reports whether any byte of w is not plain: below 0x20, 0x80 or
// above, '"' or '\\'. (SWAR: "has a byte less than n" and "has a zero
// byte" never miss; a false alarm only sends the bytes to the slow path.)
func special(w uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	less := (w - 0x20*ones) & ^w
	q := w ^ ('"' * ones)
	b := w ^ ('\\' * ones)
	return (less|(q-ones)&^q|(b-ones)&^b|w)&highs != 0
}

func (p *parser) number() error {
	s, i := p.s, p.i
	if s[i] == '-' {
		i++
	}
	switch {
	case i >= len(s):
		p.i = i
		return p.syntax("unexpected end of JSON input")
	case s[i] == '0':
		i++
	case '1' <= s[i] && s[i] <= '9':
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	default:
		p.i = i
		return p.syntax("invalid character in numeric literal")
	}
	if i < len(s) && s[i] == '.' {
		i++
		if i >= len(s) {
			p.i = i
			return p.syntax("unexpected end of JSON input")
		}
		if !isDigit(s[i]) {
			p.i = i
			return p.syntax("invalid character after decimal point in numeric literal")
		}
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i >= len(s) {
			p.i = i
			return p.syntax("unexpected end of JSON input")
		}
		if !isDigit(s[i]) {
			p.i = i
			return p.syntax("invalid character in exponent of numeric literal")
		}
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	p.i = i
	return nil
}

// plainByte marks the bytes a string holds as they are: printable ASCII
// other than '"' and '\\'.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// unquote decodes the contents of a valid JSON string as encoding/json
// does.
func unquote(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\\':
			switch s[i+1] {
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'u':
				r := hex4(s[i+2 : i+6])
				i += 6
				if utf16.IsSurrogate(r) {
					if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
						if dec := utf16.DecodeRune(r, hex4(s[i+2:i+6])); dec != utf8.RuneError {
							b.WriteRune(dec)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				b.WriteRune(r)
				continue
			default: // '"', '\\', '/'
				b.WriteByte(s[i+1])
			}
			i += 2
		case c < utf8.RuneSelf:
			b.WriteByte(c)
			i++
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b.WriteRune(utf8.RuneError)
			} else {
				b.WriteString(s[i : i+size])
			}
			i += size
		}
	}
	return b.String()
}

func hex4(s string) rune {
	var r rune
	for i := 0; i < 4; i++ {
		c := s[i]
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		default:
			c = c - 'A' + 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// rawValues looks up the members of the object spans of a map field, as a
// map decoded by encoding/json would answer: the last occurrence wins.
// Headers look up ignoring case (an exact match first).
type rawValues struct {
	src  string
	objs objects
	fold bool
}

// Get implements policy.Values.
func (v *rawValues) Get(name string) (string, bool) {
	if name == v.objs.watch {
		return v.watched()
	}
	val, found := v.find(name, false)
	if !found && v.fold {
		val, found = v.find(name, true)
	}
	if !found {
		return "", false
	}
	if val.kind != jString {
		return "", true // null: present and empty
	}
	p := parser{s: v.src}
	return p.text(val), true
}

// watched answers Get for the member noted while parsing.
func (v *rawValues) watched() (string, bool) {
	o := &v.objs
	var val span
	switch {
	case o.hasExact:
		val = o.exact
	case o.hasFold && v.fold:
		val = o.fold
	default:
		return "", false
	}
	if val.kind != jString {
		return "", true
	}
	p := parser{s: v.src}
	return p.text(val), true
}

func (v *rawValues) find(name string, fold bool) (val span, found bool) {
	try := func(obj span) {
		p := &parser{s: v.src[:obj.end], i: obj.start}
		p.object(func(p *parser, key span) error {
			k := key
			x, err := p.value()
			if err != nil {
				return err
			}
			kt := p.s[k.start:k.end]
			if !k.plain {
				kt = unquote(kt)
			}
			if kt == name || fold && strings.EqualFold(kt, name) {
				val, found = x, true
			}
			return nil
		})
	}
	if v.objs.first.kind == jObject {
		try(v.objs.first)
	}
	for _, o := range v.objs.more {
		try(o)
	}
	return val, found
}
