package memcached_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// newStore returns a Store on the shared test memcached.
func newStore(t testing.TB, cfg memcached.Config) *memcached.Store {
	t.Helper()
	if len(cfg.Addrs) == 0 && cfg.AutoDiscovery == "" {
		cfg.Addrs = []string{testserver.Memcached(t)}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second // -race on a shared 2-core machine
	}
	if cfg.MaxIdleConns == 0 {
		cfg.MaxIdleConns = 256
	}
	s, err := memcached.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	limitertest.Run(t, newStore(t, memcached.Config{KeyPrefix: "conformance:"}))
}
