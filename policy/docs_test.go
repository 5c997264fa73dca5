package policy

import (
	"os"
	"strings"
	"testing"
)

// TestDocsExamples parses every YAML example of docs/rules.md that is a
// rules document or a list of rules, so that the documentation stays true.
func TestDocsExamples(t *testing.T) {
	b, err := os.ReadFile("../docs/rules.md")
	if err != nil {
		t.Fatalf("loading docs/rules.md: %v", err)
	}
	blocks := strings.Split(string(b), "```yaml\n")[1:]
	checked := 0
	for i, blk := range blocks {
		doc, _, _ := strings.Cut(blk, "```")
		switch {
		case strings.Contains(doc, "rules:"):
		case strings.HasPrefix(doc, "- name:"):
			doc = "rules:\n" + indent(doc)
		default:
			continue // a fragment (match:, client_ip:, fail:)
		}
		stores := memStores(t)
		stores["memcached"], stores["dynamo"] = stores["memory"], stores["memory"]
		if _, err := Load([]byte(doc), Options{Stores: stores, Leases: memLeases(t)}); err != nil {
			t.Errorf("example %d:\n%s\n%v", i, doc, err)
		}
		checked++
	}
	if checked < 5 {
		t.Errorf("only %d examples checked", checked)
	}
}

func indent(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = "  " + l
		}
	}
	return strings.Join(lines, "\n")
}
