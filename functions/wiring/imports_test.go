package wiring

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports: among the packages under functions/, only this one imports
// a backend (backends/...) or the AWS SDK (aws-sdk-go-v2, smithy-go); the
// handler (authz), the Lambda's main and the dev tools reach them through
// it. Test files are not held to it: handler tests run on the memory
// store, the built binary's tests create DynamoDB Local tables.
func TestImports(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to list imports: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "github.com/sluicehq/sluice/functions/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const self = "github.com/sluicehq/sluice/functions/wiring"
	forbidden := func(imp string) bool {
		return strings.HasPrefix(imp, "github.com/sluicehq/sluice/backends/") ||
			strings.HasPrefix(imp, "github.com/aws/aws-sdk-go-v2") || strings.HasPrefix(imp, "github.com/aws/smithy-go")
	}
	packages, selfImports := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, imports := fields[0], fields[1:]
		packages++
		for _, imp := range imports {
			switch {
			case !forbidden(imp):
			case pkg == self:
				selfImports++
			default:
				t.Errorf("%s imports %s: only %s may (build it there and pass it in)", pkg, imp, self)
			}
		}
	}
	// The listing works: it saw the other packages, and this one's imports.
	if packages < 6 || selfImports < 4 {
		t.Fatalf("listed %d packages, %d forbidden imports in %s: the listing is broken\n%s", packages, selfImports, self, out)
	}
}
