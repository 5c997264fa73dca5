package memcached_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
)

func BenchmarkExp(b *testing.B) {
	addr := testserver.Memcached(b)
	mc, rawKey := rawClient(b, addr)
	s := benchStore(b, addr, memcached.Config{})
	med := func(b *testing.B, f func()) {
		d := make([]time.Duration, 0, b.N)
		for range b.N {
			t0 := time.Now()
			f()
			d = append(d, time.Since(t0))
		}
		b.ReportMetric(float64(percentile(d, 0.5).Microseconds()), "p50-µs")
	}
	ctx := context.Background()
	k := limiter.Key{Space: "x", Name: fmt.Sprint(time.Now().UnixNano())}
	for range 2 {
		b.Run("get", func(b *testing.B) { med(b, func() { mc.Get(rawKey) }) })
		b.Run("Add13", func(b *testing.B) { med(b, func() { s.Add(ctx, k, 5, 13, 1, 13*time.Minute) }) })
		b.Run("Read13", func(b *testing.B) { med(b, func() { s.Add(ctx, k, 5, 13, 0, 13*time.Minute) }) })
		b.Run("Add1", func(b *testing.B) { med(b, func() { s.Add(ctx, k, 5, 1, 1, time.Minute) }) })
		b.Run("Sub", func(b *testing.B) { med(b, func() { s.Sub(ctx, k, 5, 1) }) })
	}
}
