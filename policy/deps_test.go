package policy

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies keeps the direction honest: policy may import limiter,
// limiter/storage, the standard library and yaml.v3, never a backend, the
// AWS SDK or aws-lambda-go.
func TestDependencies(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool on PATH")
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/sluicehq/sluice/policy").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		first, _, _ := strings.Cut(dep, "/")
		if !strings.Contains(first, ".") {
			continue // the standard library
		}
		switch dep {
		case "github.com/sluicehq/sluice/policy", "github.com/sluicehq/sluice/limiter",
			"github.com/sluicehq/sluice/limiter/storage", "gopkg.in/yaml.v3":
			continue
		}
		t.Errorf("policy depends on %s", dep)
	}
}
