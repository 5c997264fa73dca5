package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// MaxDocumentSize is the largest rules document Parse reads.
const MaxDocumentSize = 1 << 20

// Parse parses a rules document: YAML (or JSON, which YAML reads too) with a
// top-level "rules" list, and validates every rule. Errors wrap
// [ErrInvalidRule] and name the rule and the field, e.g.
//
//	policy: invalid rules: rule "per-ip" (rules[0]): limits[1].window: "1x" is not a duration (line 12)
//
// Anchors and aliases are refused, unknown fields are errors, and a field
// of another algorithm than the limit's is an error.
//
// Parse returns the rules only; [ParseDocument] returns the allow and deny
// lists too.
func Parse(data []byte) ([]Rule, error) {
	doc, err := ParseDocument(data)
	return doc.Rules, err
}

// Document is a parsed rules document.
type Document struct {
	// Rules are the rules, in order.
	Rules []Rule
	// Lists are the document's allow and deny lists.
	Lists Lists
}

// ParseDocument parses and validates a rules document, as [Parse] does,
// with its top-level allow and deny lists:
//
//	deny:
//	  cidrs: ["203.0.113.0/24"]
//	  keys: {api_key: [leaked-key]}
//	allow:
//	  cidrs: ["10.0.0.0/8"]
func ParseDocument(data []byte) (Document, error) {
	var out Document
	root, err := parseYAML(data)
	if err != nil {
		return out, err
	}
	doc, err := asMapping(root, "document", -1, "")
	if err != nil {
		return out, err
	}
	if err := doc.only("version", "rules", "allow", "deny"); err != nil {
		return out, err
	}
	if v, ok, err := doc.integer("version"); err != nil {
		return out, err
	} else if ok && v != 1 {
		return out, fmt.Errorf("%w: version: %d is not a supported version (1)", ErrInvalidRule, v)
	}
	if out.Lists.Allow, err = decodeList(doc, "allow"); err != nil {
		return out, err
	}
	if out.Lists.Deny, err = decodeList(doc, "deny"); err != nil {
		return out, err
	}
	if _, _, err := compileLists(&out.Lists); err != nil {
		return out, err
	}
	list, ok := doc.fields["rules"]
	if !ok {
		return out, fmt.Errorf("%w: document: a top-level \"rules\" list is required", ErrInvalidRule)
	}
	if list.Kind != yaml.SequenceNode {
		if list.Tag == "!!null" {
			return out, nil
		}
		return out, fmt.Errorf("%w: rules: want a list of rules, got %s (line %d)", ErrInvalidRule, kindName(list), list.Line)
	}
	if len(list.Content) > MaxRules {
		return out, fmt.Errorf("%w: rules: %d rules; at most %d", ErrInvalidRule, len(list.Content), MaxRules)
	}
	rules := make([]Rule, 0, len(list.Content))
	seen, global := make(map[string]int, len(list.Content)), globalNames{}
	for i, n := range list.Content {
		r, err := decodeRule(n, i)
		if err != nil {
			return out, err
		}
		c, err := compile(r, i)
		if err != nil {
			return out, atLine(err, n)
		}
		if j, dup := seen[r.Name]; dup {
			return out, atLine(ruleError(r.Name, i, "name", "already used by rules[%d]", j), n)
		}
		seen[r.Name] = i
		if err := global.check(c, i); err != nil {
			return out, atLine(err, n)
		}
		rules = append(rules, r)
	}
	out.Rules = rules
	return out, nil
}

// ParseLists parses a mapping with "allow" and/or "deny" lists (as at the
// top of a rules document), as stored in a rules table's lists item.
func ParseLists(data []byte) (Lists, error) {
	var l Lists
	root, err := parseYAML(data)
	if err != nil {
		return l, err
	}
	m, err := asMapping(root, "lists", -1, "")
	if err != nil {
		return l, err
	}
	if err := m.only("allow", "deny"); err != nil {
		return l, err
	}
	if l.Allow, err = decodeList(m, "allow"); err != nil {
		return l, err
	}
	if l.Deny, err = decodeList(m, "deny"); err != nil {
		return l, err
	}
	_, _, err = compileLists(&l)
	return l, err
}

// decodeList decodes the list named name of the document mapping doc.
func decodeList(doc *mapping, name string) (List, error) {
	var l List
	m, ok, err := doc.mapping(name)
	if err != nil || !ok {
		return l, err
	}
	if err := m.only("cidrs", "keys"); err != nil {
		return l, err
	}
	if l.CIDRs, _, err = m.strsMax("cidrs", MaxListEntries); err != nil {
		return l, err
	}
	km, ok, err := m.mapping("keys")
	if err != nil || !ok {
		return l, err
	}
	attrs := make([]string, 0, len(km.fields))
	for k := range km.fields {
		attrs = append(attrs, k)
	}
	slices.Sort(attrs)
	for _, a := range attrs {
		vals, _, err := km.strsMax(a, MaxListEntries)
		if err != nil {
			return l, err
		}
		l.Keys = append(l.Keys, ListKey{Attribute: a, Values: vals})
	}
	return l, nil
}

// ParseRule parses and validates one rule (a YAML or JSON mapping with the
// fields of a rules-list item), as stored in one item of a rules table.
// name, when not empty, is the rule's name if the document has none, and
// must equal it otherwise.
func ParseRule(data []byte, name string) (Rule, error) {
	root, err := parseYAML(data)
	if err != nil {
		return Rule{}, err
	}
	if name != "" && root.Kind == yaml.MappingNode {
		if _, ok := mappingValue(root, "name"); !ok {
			root.Content = append(root.Content,
				&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "name"},
				&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: name})
		}
	}
	r, err := decodeRule(root, 0)
	if err != nil {
		return Rule{}, err
	}
	if name != "" && r.Name != name {
		return Rule{}, ruleError(r.Name, 0, "name", "does not match the item's name %q", name)
	}
	if _, err := compile(r, 0); err != nil {
		return Rule{}, atLine(err, root)
	}
	return r, nil
}

func parseYAML(data []byte) (*yaml.Node, error) {
	if len(data) > MaxDocumentSize {
		return nil, fmt.Errorf("%w: document of %d bytes; at most %d", ErrInvalidRule, len(data), MaxDocumentSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty document (want a mapping with a \"rules\" list)", ErrInvalidRule)
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalidRule, yamlLine(err, data))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: more than one YAML document", ErrInvalidRule)
	}
	if len(doc.Content) != 1 {
		return nil, fmt.Errorf("%w: empty document", ErrInvalidRule)
	}
	if err := noAliases(doc.Content[0], 0); err != nil {
		return nil, err
	}
	return doc.Content[0], nil
}

// noAliases refuses anchors, aliases and merge keys, and deep nesting.
func noAliases(n *yaml.Node, depth int) error {
	if depth > 16 {
		return fmt.Errorf("%w: nested too deeply (line %d)", ErrInvalidRule, n.Line)
	}
	if n.Kind == yaml.AliasNode || n.Anchor != "" || n.Tag == "!!merge" {
		return fmt.Errorf("%w: YAML anchors, aliases and merge keys are not supported (line %d)", ErrInvalidRule, n.Line)
	}
	for _, c := range n.Content {
		if err := noAliases(c, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// decodeRule decodes rules[index] by the schema (schema.go).
func decodeRule(n *yaml.Node, index int) (Rule, error) {
	var r Rule
	if n.Kind == yaml.MappingNode { // the name first, so that every message names the rule
		if v, ok := mappingValue(n, "name"); ok && v.Kind == yaml.ScalarNode && len(v.Value) <= 64 {
			r.Name = v.Value
		}
	}
	m, err := asMapping(n, "", index, r.Name)
	if err != nil {
		return r, err
	}
	return r, m.decode(&r)
}

// mapping is a YAML mapping being decoded, with where it is for messages.
type mapping struct {
	path   string // field path within the rule, e.g. "limits[1]"; "" for the rule
	index  int    // the rule's index, -1 outside rules
	rule   string // the rule's name if known
	fields map[string]*yaml.Node
}

func asMapping(n *yaml.Node, path string, index int, rule string) (*mapping, error) {
	m := &mapping{path: path, index: index, rule: rule}
	if n.Kind != yaml.MappingNode {
		what := path
		if what == "" {
			what = "rule"
		}
		return nil, m.errorf("", "want a mapping for %s, got %s (line %d)", what, kindName(n), n.Line)
	}
	m.fields = make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if k.Kind != yaml.ScalarNode {
			return nil, m.errorf("", "a field name must be a string (line %d)", k.Line)
		}
		if _, dup := m.fields[k.Value]; dup {
			return nil, m.errorf(k.Value, "given twice (line %d)", k.Line)
		}
		m.fields[k.Value] = n.Content[i+1]
	}
	return m, nil
}

func mappingValue(n *yaml.Node, key string) (*yaml.Node, bool) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Kind == yaml.ScalarNode && n.Content[i].Value == key {
			return n.Content[i+1], true
		}
	}
	return nil, false
}

// errorf is an error about field (relative to the mapping).
func (m *mapping) errorf(field, format string, args ...any) error {
	f := field
	if m.path != "" {
		f = m.path
		if field != "" {
			f += "." + field
		}
	}
	if m.index < 0 {
		if f == "" {
			return fmt.Errorf("%w: %s", ErrInvalidRule, fmt.Sprintf(format, args...))
		}
		return fmt.Errorf("%w: %s: %s", ErrInvalidRule, f, fmt.Sprintf(format, args...))
	}
	return ruleError(m.rule, m.index, f, format, args...)
}

// only refuses fields not in allowed.
func (m *mapping) only(allowed ...string) error {
	var unknown []string
	for k := range m.fields {
		if !slices.Contains(allowed, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	return m.errorf(unknown[0], "unknown field (line %d); known fields: %s", m.fields[unknown[0]].Line, strings.Join(allowed, ", "))
}

func (m *mapping) scalar(name string) (*yaml.Node, bool, error) {
	n, ok := m.fields[name]
	if !ok || n.Tag == "!!null" {
		return nil, false, nil
	}
	if n.Kind != yaml.ScalarNode {
		hint := ""
		if name == "key" && n.Kind == yaml.MappingNode {
			hint = `; quote the template, e.g. key: "{ip}"`
		}
		return nil, false, m.errorf(name, "want a single value, got %s (line %d)%s", kindName(n), n.Line, hint)
	}
	return n, true, nil
}

func (m *mapping) str(name string) (string, bool, error) {
	n, ok, err := m.scalar(name)
	if !ok || err != nil {
		return "", ok, err
	}
	return n.Value, true, nil
}

func (m *mapping) integer(name string) (int64, bool, error) {
	n, ok, err := m.scalar(name)
	if !ok || err != nil {
		return 0, ok, err
	}
	var v int64
	if n.Tag != "!!int" || n.Decode(&v) != nil {
		return 0, false, m.errorf(name, "want a whole number, got %q (line %d)", clip(n.Value), n.Line)
	}
	return v, true, nil
}

func (m *mapping) boolean(name string) (bool, bool, error) {
	n, ok, err := m.scalar(name)
	if !ok || err != nil {
		return false, ok, err
	}
	var v bool
	if n.Tag != "!!bool" || n.Decode(&v) != nil {
		return false, false, m.errorf(name, "want true or false, got %q (line %d)", clip(n.Value), n.Line)
	}
	return v, true, nil
}

func (m *mapping) duration(name string) (time.Duration, bool, error) {
	n, ok, err := m.scalar(name)
	if !ok || err != nil {
		return 0, ok, err
	}
	d, perr := time.ParseDuration(n.Value)
	if perr != nil {
		return 0, false, m.errorf(name, "%q is not a duration such as 500ms, 1s, 1m or 1h (line %d)", clip(n.Value), n.Line)
	}
	return d, true, nil
}

// strs reads a list of at most 256 strings; a single value is a list of
// one.
func (m *mapping) strs(name string) ([]string, bool, error) {
	return m.strsMax(name, 256)
}

// strsMax reads a list of at most max strings; a single value is a list
// of one.
func (m *mapping) strsMax(name string, max int) ([]string, bool, error) {
	n, ok := m.fields[name]
	if !ok || n.Tag == "!!null" {
		return nil, false, nil
	}
	if n.Kind == yaml.ScalarNode {
		return []string{n.Value}, true, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, false, m.errorf(name, "want a list, got %s (line %d)", kindName(n), n.Line)
	}
	if len(n.Content) > max {
		return nil, false, m.errorf(name, "more than %d entries", max)
	}
	out := make([]string, 0, len(n.Content))
	for i, c := range n.Content {
		if c.Kind != yaml.ScalarNode {
			return nil, false, m.errorf(name+"["+strconv.Itoa(i)+"]", "want a single value, got %s (line %d)", kindName(c), c.Line)
		}
		out = append(out, c.Value)
	}
	return out, true, nil
}

func (m *mapping) mapping(name string) (*mapping, bool, error) {
	n, ok := m.fields[name]
	if !ok || n.Tag == "!!null" {
		return nil, false, nil
	}
	path := name
	if m.path != "" {
		path = m.path + "." + name
	}
	mm, err := asMapping(n, path, m.index, m.rule)
	return mm, err == nil, err
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", clip(n.Value))
	}
	return "something else"
}

// clip bounds a value quoted in an error message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// yamlSyntaxRE matches yaml.v3's syntax errors.
var yamlSyntaxRE = regexp.MustCompile(`^yaml: line ([0-9]+): (.*)$`)

// yamlLine corrects the line of a yaml.v3 syntax error. yaml.v3 (v3.0.1,
// parser.fail) reports a scanner error's line counted from 1 but a
// parser error's ("did not find expected key", "did not find expected
// node content", ...) counted from 0, so an error on line 7 said "line
// 6". A line past the document's last (the end of input after a final
// newline) is reported as the last line.
func yamlLine(err error, data []byte) error {
	m := yamlSyntaxRE.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	line, _ := strconv.Atoi(m[1])
	msg := m[2]
	if strings.HasPrefix(msg, "did not find expected ") || strings.HasPrefix(msg, "found duplicate %") ||
		msg == "found incompatible YAML document" || msg == "found undefined tag handle" {
		line++ // a parser error: its mark counts lines from 0
	}
	lines := bytes.Count(data, []byte("\n"))
	if len(data) > 0 && data[len(data)-1] != '\n' {
		lines++
	}
	line = max(min(line, lines), 1)
	return fmt.Errorf("yaml: line %d: %s", line, msg)
}
