package memory_test

import (
	"testing"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

func newStore(t testing.TB, cfg memory.Config) *memory.Store {
	t.Helper()
	s, err := memory.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	limitertest.Run(t, newStore(t, memory.Config{}))
}
