package memcached_test

import (
	"testing"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestLeaseHistory runs capacity leases on the shared test memcached (a
// window of sub-window counters, a packed window, a token bucket whose
// value keeps the lease ring), 4 processes at four times the limit with
// arrivals reordered: never over the limit (limitertest.RunLeaseHistory).
func TestLeaseHistory(t *testing.T) {
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	limitertest.RunLeaseHistory(t, newStore(t, memcached.Config{KeyPrefix: "lease-history:"}), mem)
}

// TestColdLeases: a cold key decides the same with and without leases on
// memcached, one store call per decision the deny cache does not answer.
func TestColdLeases(t *testing.T) {
	limitertest.RunColdLeases(t, newStore(t, memcached.Config{KeyPrefix: "cold-leases:"}))
}
