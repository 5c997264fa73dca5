package memory_test

import (
	"testing"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

func newLeases(t testing.TB, cfg memory.Config) *memory.Leases {
	t.Helper()
	l, err := memory.NewLeases(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLeases(t *testing.T) {
	limitertest.RunLeases(t, newLeases(t, memory.Config{}))
}

func TestGauges(t *testing.T) {
	limitertest.RunGauges(t, newLeases(t, memory.Config{}))
}
