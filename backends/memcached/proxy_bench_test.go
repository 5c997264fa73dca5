package memcached_test

import (
	"testing"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
)

// BenchmarkThreeLimitsProxy: BenchmarkThreeLimits's stacks in proxy mode
// (Config.Proxy: the writes of every step in one round trip, the reads in
// a second) through nutcracker sharding keys over two private memcached
// servers, next to one raw get through the same nutcracker in the same
// loop (latency: p50/get, paired-p50/get). With Proxy off the same stacks
// through the same nutcracker (one round trip, but unsafe behind a proxy
// that may run a pipeline's commands out of order) for the cost of the
// second round.
func BenchmarkThreeLimitsProxy(b *testing.B) {
	n := testserver.StartNutcracker(b, testserver.NutcrackerConfig{})
	mc, rawKey := rawClient(b, n.Addr())
	for _, proxy := range []bool{true, false} {
		s := benchStore(b, n.Addr(), memcached.Config{Proxy: proxy})
		for _, c := range memcached.ThreeLimitCases() {
			name := c.Name
			if !proxy {
				name += "/OnePipeline"
			}
			b.Run(name, func(b *testing.B) {
				stack, err := c.Build(s)
				if err != nil {
					b.Fatal(err)
				}
				latency(b, stack, mc, rawKey, 1)
			})
		}
	}
}
