package memcached_test

import (
	"testing"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestReset: every algorithm's Peek takes nothing and Reset gives a key
// its capacity back, one limit at a time (limitertest.RunReset), on the
// test memcached, directly and through a proxy-mode Store.
func TestReset(t *testing.T) {
	t.Run("Direct", func(t *testing.T) {
		limitertest.RunReset(t, newStore(t, memcached.Config{KeyPrefix: "reset:"}))
	})
	t.Run("Proxy", func(t *testing.T) {
		limitertest.RunReset(t, newStore(t, memcached.Config{KeyPrefix: "reset:", Proxy: true}))
	})
}
