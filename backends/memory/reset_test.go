package memory_test

import (
	"testing"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestReset: every algorithm's Peek takes nothing and Reset gives a key
// its capacity back, one limit at a time (limitertest.RunReset).
func TestReset(t *testing.T) {
	s, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	limitertest.RunReset(t, s)
}
