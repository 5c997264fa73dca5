package policy

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/limiter"
)

// The rules schema is one definition: the `rule` tags of [Rule], [Match],
// [ClientIP], [ConcurrencyLimit] and [Limit] name their fields in a rules
// document, `required` marks a field that must be given (its value is the
// rest of the message), and a Limit field's `algs` tag lists the
// algorithms it belongs to. decode reads a YAML mapping into one of these
// structs by that definition (unknown fields, wrong types and the fields
// of another algorithm are errors with the node's line); compile and
// checkLimit validate the struct, naming fields by the same tags, so a
// rule built in Go gets the same checks and messages as a parsed one.

// schemaField is one field of a schema struct.
type schemaField struct {
	name     string      // its name in a rules document
	index    int         // its index in the struct
	required string      // non-empty: required, and the rest of the message
	algs     []Algorithm // a Limit's field: the algorithms it belongs to (nil: all)
}

var schemas sync.Map // reflect.Type -> []schemaField

// schemaOf returns the fields of the struct type t, in declaration order.
func schemaOf(t reflect.Type) []schemaField {
	if s, ok := schemas.Load(t); ok {
		return s.([]schemaField)
	}
	var fields []schemaField
	for i := range t.NumField() {
		sf := t.Field(i)
		name := sf.Tag.Get("rule")
		if name == "" {
			continue
		}
		f := schemaField{name: name, index: i, required: sf.Tag.Get("required")}
		for _, a := range strings.Fields(sf.Tag.Get("algs")) {
			f.algs = append(f.algs, algorithmNames[a])
		}
		fields = append(fields, f)
	}
	schemas.Store(t, fields)
	return fields
}

// names returns the fields' names.
func names(fields []schemaField) []string {
	out := make([]string, len(fields))
	for i, f := range fields {
		out[i] = f.name
	}
	return out
}

// belongs reports whether the field belongs to a limit of algorithm a.
func (f schemaField) belongs(a Algorithm) bool { return f.algs == nil || slices.Contains(f.algs, a) }

// decode reads m into *v, a schema struct: every field of m must be one
// of its fields; each is decoded by its type (field).
func (m *mapping) decode(v any) error {
	rv := reflect.ValueOf(v).Elem()
	fields := schemaOf(rv.Type())
	if err := m.only(names(fields)...); err != nil {
		return err
	}
	for _, f := range fields {
		if _, ok := m.fields[f.name]; !ok {
			if f.required != "" {
				return m.errorf(f.name, "required%s", f.required)
			}
			continue
		}
		if err := m.field(f.name, rv.Field(f.index).Addr().Interface()); err != nil {
			return err
		}
	}
	return nil
}

// field decodes the field name of m into *p, by p's type.
func (m *mapping) field(name string, p any) (err error) {
	switch p := p.(type) {
	case *string:
		*p, _, err = m.str(name)
	case *bool:
		*p, _, err = m.boolean(name)
	case *int64:
		*p, _, err = m.integer(name)
	case *int:
		var n int64
		n, _, err = m.integer(name)
		*p = int(min(max(n, -1), 1<<20)) // out of range either way; compile says which
	case *[]string:
		*p, _, err = m.strs(name)
	case *time.Duration:
		*p, _, err = m.duration(name)
	case *Algorithm, *FailMode, *limiter.Priority, *limiter.Estimator, *limiter.Representation, *LeaseMode, *Scope:
		return m.enum(name, p)
	case *Match, *ClientIP:
		return m.nested(name, func(sub *mapping) error { return sub.decode(p) })
	case **ConcurrencyLimit:
		return m.nested(name, func(sub *mapping) error {
			*p = &ConcurrencyLimit{}
			return sub.decode(*p)
		})
	case *[]Limit:
		*p, err = m.limits(name, "rule")
	case *[]Tier:
		*p, err = m.tiers(name)
	default:
		return m.errorf(name, "no decoder for %T", p) // a schema field of a new type: add it above
	}
	return err
}

// enum decodes a field whose value is one of a set of names.
func (m *mapping) enum(name string, p any) error {
	s, ok, err := m.str(name)
	if err != nil || !ok {
		return err
	}
	switch p := p.(type) {
	case *Algorithm:
		if *p, ok = algorithmNames[s]; !ok {
			return m.errorf(name, "%q is not token_bucket, sliding_window, fixed_window or sliding_log", s)
		}
	case *FailMode:
		switch s {
		case "open":
			*p = FailOpen
		case "closed":
			*p = FailClosed
		default:
			return m.errorf(name, "%q is not open or closed", s)
		}
	case *limiter.Priority:
		if *p, err = parsePriority(s); err != nil {
			return m.errorf(name, "%v", err)
		}
	case *limiter.Estimator:
		if err = p.UnmarshalText([]byte(s)); err != nil {
			return m.errorf(name, "%q is not bounded or interpolated", s)
		}
	case *limiter.Representation:
		if err = p.UnmarshalText([]byte(s)); err != nil || s == "" {
			return m.errorf(name, "%q is not auto, packed or subwindows", s)
		}
	case *LeaseMode:
		switch s {
		case "auto":
			*p = LeaseAuto
		case "off":
			*p = LeaseOff
		default:
			return m.errorf(name, "%q is not auto or off", s)
		}
	case *Scope:
		switch s {
		case "region":
			*p = ScopeRegion
		case "global":
			*p = ScopeGlobal
		default:
			return m.errorf(name, "%q is not region or global", s)
		}
	}
	return nil
}

// nested decodes the mapping of field name with f, if it is given.
func (m *mapping) nested(name string, f func(*mapping) error) error {
	sub, ok, err := m.mapping(name)
	if err != nil || !ok {
		return err
	}
	return f(sub)
}

// limits decodes the list of limits of field name (of a rule, or of one
// of its tiers: per says which in the message on too many).
func (m *mapping) limits(name, per string) ([]Limit, error) {
	n := m.fields[name]
	if n.Kind != yaml.SequenceNode {
		return nil, m.errorf(name, "want a list of limits, got %s (line %d)", kindName(n), n.Line)
	}
	if len(n.Content) > MaxLimitsPerRule {
		return nil, m.errorf(name, "%d limits; at most %d per %s", len(n.Content), MaxLimitsPerRule, per)
	}
	path := name
	if m.path != "" {
		path = m.path + "." + name
	}
	var out []Limit
	for i, ln := range n.Content {
		l, err := decodeLimit(ln, fmt.Sprintf("%s[%d]", path, i), m.index, m.rule)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// tiers decodes a rule's tiers: a mapping of tier names to lists of
// limits.
func (m *mapping) tiers(name string) ([]Tier, error) {
	tn := m.fields[name]
	if tn.Tag == "!!null" {
		return nil, nil
	}
	if tn.Kind != yaml.MappingNode {
		return nil, m.errorf(name, "want a mapping of tier names to lists of limits, got %s (line %d)", kindName(tn), tn.Line)
	}
	if len(tn.Content)/2 > MaxTiers {
		return nil, m.errorf(name, "%d tiers; at most %d per rule", len(tn.Content)/2, MaxTiers)
	}
	if _, err := asMapping(tn, name, m.index, m.rule); err != nil { // refuses a name given twice
		return nil, err
	}
	var out []Tier
	for i := 0; i+1 < len(tn.Content); i += 2 {
		k, v := tn.Content[i], tn.Content[i+1]
		field := clip(k.Value) // compile checks the name; a message quotes at most 40 bytes of it
		tier := &mapping{path: name, index: m.index, rule: m.rule, fields: map[string]*yaml.Node{field: v}}
		limits, err := tier.limits(field, "tier")
		if err != nil {
			return nil, err
		}
		out = append(out, Tier{Name: k.Value, Limits: limits})
	}
	return out, nil
}

// decodeLimit decodes the limit at path of rules[index]: its algorithm
// first, then the fields, which must be that algorithm's.
func decodeLimit(n *yaml.Node, path string, index int, rule string) (Limit, error) {
	var l Limit
	m, err := asMapping(n, path, index, rule)
	if err != nil {
		return l, err
	}
	if _, ok := m.fields["algorithm"]; !ok {
		return l, m.errorf("algorithm", "required (token_bucket, sliding_window, fixed_window or sliding_log)")
	}
	if err := m.field("algorithm", &l.Algorithm); err != nil {
		return l, err
	}
	fields := schemaOf(reflect.TypeFor[Limit]())
	var own []string
	for _, f := range fields {
		if f.algs != nil && f.belongs(l.Algorithm) {
			own = append(own, f.name)
		}
	}
	for k, v := range m.fields {
		if i := slices.IndexFunc(fields, func(f schemaField) bool { return f.name == k }); i < 0 || !fields[i].belongs(l.Algorithm) {
			return l, m.errorf(k, "not a field of %s (it takes %s) (line %d)", l.Algorithm, strings.Join(own, ", "), v.Line)
		}
	}
	return l, m.decode(&l)
}

// strays returns the fields of l that are set but belong to another
// algorithm than l's.
func (l *Limit) strays() []string {
	var out []string
	rv := reflect.ValueOf(l).Elem()
	for _, f := range schemaOf(rv.Type()) {
		if !f.belongs(l.Algorithm) && !rv.Field(f.index).IsZero() {
			out = append(out, f.name)
		}
	}
	return out
}

// atLine adds to err, an error of compile about the rule decoded from n,
// the line of the field it names: "limits[1]: window: ..." is on the line
// of limits[1].window when the document gives that field, else on the
// line of limits[1], else on the rule's. Errors of decode carry their line
// already.
func atLine(err error, n *yaml.Node) error {
	var fe *fieldError
	if !errors.As(err, &fe) || fe.line != 0 {
		return err
	}
	at, rest := n, fe.field
	if sub, _, ok := strings.Cut(fe.msg, ": "); ok && !strings.ContainsAny(sub, " ,") {
		rest = strings.TrimPrefix(rest+"."+sub, ".") // the message's own field, as checkLimit names it
	}
	for rest != "" {
		next, r, ok := step(at, rest)
		if !ok {
			break
		}
		at, rest = next, r
	}
	fe.line = at.Line
	return err
}

// step follows the first element of path ("name", "name[2]", or
// "name.rest") from n: a mapping's field (the longest name that fits, as a
// tier's name may contain '.') or a list's element. It returns the node
// and the rest of the path.
func step(n *yaml.Node, path string) (*yaml.Node, string, bool) {
	if strings.HasPrefix(path, "[") {
		end := strings.IndexByte(path, ']')
		i, err := strconv.Atoi(path[1:max(end, 1)])
		if end < 0 || err != nil || n.Kind != yaml.SequenceNode || i < 0 || i >= len(n.Content) {
			return nil, "", false
		}
		return n.Content[i], strings.TrimPrefix(path[end+1:], "."), true
	}
	if n.Kind != yaml.MappingNode {
		return nil, "", false
	}
	var best *yaml.Node
	rest := ""
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i].Value
		r, ok := strings.CutPrefix(path, k)
		if !ok || (r != "" && r[0] != '.' && r[0] != '[') || (best != nil && len(r) >= len(rest)) {
			continue
		}
		best, rest = n.Content[i+1], r
	}
	if best == nil {
		return nil, "", false
	}
	return best, strings.TrimPrefix(rest, "."), true
}
