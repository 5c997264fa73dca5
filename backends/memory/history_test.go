package memory_test

import (
	"testing"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestHistory runs the history checker (limitertest.RunHistory): 64
// goroutines on hot keys with arrivals reordered on purpose, every algorithm,
// wall-clock and shared-clock stamps, checked against the exact model.
func TestHistory(t *testing.T) {
	limitertest.RunHistory(t, newStore(t, memory.Config{}), limitertest.HistoryOptions{})
}
