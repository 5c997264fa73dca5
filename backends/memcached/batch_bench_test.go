package memcached_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
)

// BenchmarkFlood: 64 goroutines on one key far over its limit (a sliding
// window of 100 per minute and a token bucket of 50, stacked), next to raw
// incrs at the same concurrency in the same run. Once the store has denied
// the key, the deny cache answers without a round trip. Reports decisions/s,
// incr/s, their ratio, and the units admitted (never above 100: a fresh key,
// and a run far shorter than the window).
func BenchmarkFlood(b *testing.B) {
	addr := testserver.Memcached(b)
	mc, _ := rawClient(b, addr)
	s := benchStore(b, addr, memcached.Config{})
	w, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "w", Limit: 100, Window: time.Minute})
	tb, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 50, RefillTime: time.Hour})
	stack, _ := limiter.NewStack(w, tb)
	ctx := context.Background()
	rawKey := fmt.Sprint("flood-raw-", time.Now().UnixNano())
	if err := mc.Set(&memcache.Item{Key: rawKey, Value: []byte("0"), Expiration: 600}); err != nil {
		b.Fatal(err)
	}
	key := fmt.Sprint("flood-", time.Now().UnixNano())
	const g = 64
	// Far over the limit: the bucket's 50 tokens are gone and the store
	// has said so once.
	var allowed atomic.Int64
	for {
		d, err := stack.Allow(ctx, key, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		if !d.Allowed {
			break
		}
		allowed.Add(1)
	}

	rawRate := concurrentRate(b, g, func() error { _, err := mc.Increment(rawKey, 1); return err })
	rate := concurrentRate(b, g, func() error {
		d, err := stack.Allow(ctx, key, time.Now())
		if d.Allowed {
			allowed.Add(1)
		}
		return err
	})
	b.ReportMetric(rate, "decisions/s")
	b.ReportMetric(rawRate, "incr/s")
	b.ReportMetric(rate/rawRate, "x-incr")
	b.ReportMetric(float64(allowed.Load()), "admitted")
	if allowed.Load() > 50 {
		b.Fatalf("%d admitted, over the bucket's 50", allowed.Load())
	}
}

// BenchmarkThreeLimits: the latency of one allowed decision with three
// limits on one key (a sliding window, sub-window or packed, a token
// bucket and a fixed window, never reached), next to one raw get in the same loop: one pipelined
// round trip against one.
func BenchmarkThreeLimits(b *testing.B) {
	addr := testserver.Memcached(b)
	mc, rawKey := rawClient(b, addr)
	s := benchStore(b, addr, memcached.Config{})
	for _, k := range []int{limiter.DefaultSubWindows, 4} {
		b.Run(fmt.Sprintf("Sliding%d+Bucket+Fixed", k), func(b *testing.B) {
			w, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "w", Limit: 1 << 40, Window: time.Minute, SubWindows: k})
			tb, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 1 << 40, RefillTime: time.Hour})
			f, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "f", Limit: 1 << 40, Window: time.Minute})
			stack, _ := limiter.NewStack(w, tb, f)
			latency(b, stack, mc, rawKey, 1)
			cpuSplit(b, addr, stack, mc, rawKey)
		})
	}
	b.Run("PackedSliding+Bucket+Fixed", func(b *testing.B) {
		// The packed window (160 slots) in place of the sub-window one.
		w, err := packedWindow(s)
		if err != nil {
			b.Fatal(err)
		}
		tb, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 1 << 40, RefillTime: time.Hour})
		f, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "f", Limit: 1 << 40, Window: time.Minute})
		stack, _ := limiter.NewStack(w, tb, f)
		latency(b, stack, mc, rawKey, 1)
		cpuSplit(b, addr, stack, mc, rawKey)
	})
	b.Run("EmbeddedRules", func(b *testing.B) {
		// The embedded rules' limits of a request with a token: per-ip
		// (a sliding window and a token bucket) and per-token (a window).
		// Their windows (600 and 1200 a minute) are packed, the default
		// for limits up to limiter.MaxPackedLimit: the largest two such
		// limits keep them packed and far from denying.
		ip, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "per-minute", Limit: limiter.MaxPackedLimit, Window: time.Minute, NoDenyCache: true})
		tb, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "burst", MaxAmount: 1 << 40, RefillTime: 100 * time.Millisecond})
		tok, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "per-token", Limit: limiter.MaxPackedLimit - 1, Window: time.Minute, NoDenyCache: true})
		stack, _ := limiter.NewStack(ip, tb, tok)
		latency(b, stack, mc, rawKey, 1)
		cpuSplit(b, addr, stack, mc, rawKey)
	})
	b.Run("Fixed+Fixed+Fixed", func(b *testing.B) {
		var ls []limiter.Limiter
		for i := range 3 {
			f, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "f", Limit: 1<<40 + int64(i), Window: time.Minute})
			ls = append(ls, f)
		}
		stack, _ := limiter.NewStack(ls...)
		latency(b, stack, mc, rawKey, 1)
		cpuSplit(b, addr, stack, mc, rawKey)
	})
}

// cpuSplit reports where the time of a decision goes, next to a raw get:
// the CPU time memcached spends on one (its own rusage, from stats: user
// and system, so the loopback's share of the kernel's work too) and the
// CPU time this process spends on one (getrusage, the same), from 2,000
// decisions and 2,000 gets run after the timed loop in alternating blocks
// of 200, so that both see the machine alike.
func cpuSplit(b *testing.B, addr string, l limiter.Limiter, mc *memcache.Client, rawKey string) {
	b.Helper()
	const blocks, per = 10, 200
	ctx := context.Background()
	key := fmt.Sprint("cpu-", time.Now().UnixNano())
	var server, client [2]int64 // µs: decisions, gets
	measure := func(i int, f func() error) {
		st0, err := statsOf(addr)
		if err != nil {
			b.Fatal(err)
		}
		var ru0, ru1 syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru0) //nolint:errcheck // cannot fail for RUSAGE_SELF
		for range per {
			if err := f(); err != nil {
				b.Fatal(err)
			}
		}
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru1) //nolint:errcheck // as above
		st1, err := statsOf(addr)
		if err != nil {
			b.Fatal(err)
		}
		server[i] += st1["rusage_user"] + st1["rusage_system"] - st0["rusage_user"] - st0["rusage_system"]
		client[i] += (ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano()) / 1000
	}
	for range blocks {
		measure(0, func() error {
			d, err := l.AllowN(ctx, key, time.Now(), 1)
			if err == nil && !d.Allowed {
				err = fmt.Errorf("denied: %+v", d)
			}
			return err
		})
		measure(1, func() error { _, err := mc.Get(rawKey); return err })
	}
	const n = blocks * per
	b.ReportMetric(float64(server[0])/n, "server-cpu-µs/decision")
	b.ReportMetric(float64(server[1])/n, "server-cpu-µs/get")
	b.ReportMetric(float64(client[0])/n, "client-cpu-µs/decision")
	b.ReportMetric(float64(client[1])/n, "client-cpu-µs/get")
}

// concurrentRate runs f b.N times over g goroutines and returns the calls
// per second.
func concurrentRate(b *testing.B, g int, f func() error) float64 {
	b.Helper()
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := f(); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	return float64(b.N) / time.Since(start).Seconds()
}
