package memcached_test

import (
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// newLeases returns a lease store on the shared test memcached, with a
// client of its own built on the package's Ring.
func newLeases(t testing.TB, cfg memcached.Config) *memcached.Leases {
	t.Helper()
	ring, err := memcached.NewRing(testserver.Memcached(t))
	if err != nil {
		t.Fatal(err)
	}
	mc := memcache.NewFromSelector(ring)
	mc.Timeout = 5 * time.Second // -race on a shared 2-core machine
	mc.MaxIdleConns = 256
	t.Cleanup(func() { mc.Close() })
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	l, err := memcached.NewLeases(mc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLeases(t *testing.T) {
	limitertest.RunLeases(t, newLeases(t, memcached.Config{KeyPrefix: "leases:"}))
}

func TestGauges(t *testing.T) {
	limitertest.RunGauges(t, newLeases(t, memcached.Config{KeyPrefix: "gauges:"}))
}
