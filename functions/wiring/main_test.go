package wiring

import (
	"fmt"
	"os"
	"testing"
)

// TestMain stops the package's shared three-region harness
// (sharesHarness) after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if err := sharesHarness.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "wiring: shared regions: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
