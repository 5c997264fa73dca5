package policy

import (
	"strings"
	"testing"
)

// TestYAMLSyntaxErrorLine: a YAML syntax error on line 7 is reported as
// line 7, whether yaml.v3 finds it in its scanner or in its parser (whose
// lines count from 0).
func TestYAMLSyntaxErrorLine(t *testing.T) {
	const head = "rules:\n  - name: a\n    key: x\n    limits:\n      - {algorithm: fixed_window, limit: 1, window: 1m}\n  - name: b\n"
	for _, line7 := range []string{
		"    key: \"{ip\n",        // an unterminated quote (scanner)
		"    key: [\n",            // a flow sequence never closed (parser, at the end of input)
		"- x\n",                   // a sequence entry inside a mapping (parser)
		"    key: {x\n",           // a flow mapping never closed (parser)
		"    key: a: b\n",         // a mapping value where none is allowed (scanner)
		"    limits: [a, b\n",     // no closing bracket (parser)
		"    key: x\n  - name: c", // no final newline: fine, and parsed further
	} {
		doc := head + line7
		if strings.Count(doc[:len(head)], "\n") != 6 {
			t.Fatal("the head must be 6 lines")
		}
		_, err := Parse([]byte(doc))
		if line7 == "    key: x\n  - name: c" {
			if err == nil || strings.Contains(err.Error(), "yaml:") {
				t.Errorf("%q: %v, want a rule error, not a syntax error", line7, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "yaml: line 7: ") {
			t.Errorf("line 7 %q: %v, want it reported on line 7", line7, err)
		}
	}
}
