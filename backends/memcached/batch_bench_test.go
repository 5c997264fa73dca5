package memcached_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
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
// bucket and a fixed window, never reached), next to one raw get in the
// same loop: one pipelined round trip against one. Each case also reports
// floor-p50/get: the bytes of one warm decision of the same limits,
// recorded at a proxy, sent again by a bare client that only writes them
// and reads up to the reply's last line, alternating with raw gets. That
// is what memcached and the loopback alone cost for the decision's
// commands, the part no client work can remove. Run under SLUICE_PIN=1
// (scripts/testenv puts the servers on the last CPU and the benchmark on
// the others) for figures that do not depend on where the scheduler puts
// the two processes; docs/benchmarks.md has both.
func BenchmarkThreeLimits(b *testing.B) {
	addr := testserver.Memcached(b)
	mc, rawKey := rawClient(b, addr)
	s := benchStore(b, addr, memcached.Config{})
	for _, c := range memcached.ThreeLimitCases() {
		b.Run(c.Name, func(b *testing.B) {
			stack, err := c.Build(s)
			if err != nil {
				b.Fatal(err)
			}
			latency(b, stack, mc, rawKey, 1)
			cpuSplit(b, addr, stack, mc, rawKey)
			replayFloor(b, addr, c.Build, mc, rawKey)
		})
	}
}

// replayFloor reports floor-p50/get (see BenchmarkThreeLimits): the third
// warm decision of build's limits on a store behind a recording proxy
// gives the bytes; a bare connection then sends them and reads until the
// END of the batch's retrieval (the last command: reads go last), or one
// reply line per command when it has none, 2,000 times, each followed by
// a raw get. The replayed writes land on that decision's keys again
// (its counters keep counting; a replayed cas answers EXISTS, a little
// less work than the decision's successful one), so the floor is a lower
// bound.
func replayFloor(b *testing.B, addr string, build func(s *memcached.Store) (limiter.Limiter, error), mc *memcache.Client, rawKey string) {
	b.Helper()
	proxy := testserver.NewProxy(b, addr)
	ps := benchStore(b, proxy.Addr(), memcached.Config{})
	l, err := build(ps)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	key := fmt.Sprint("floor-", time.Now().UnixNano())
	var req []byte
	mark := 0
	for i := range 3 {
		if i == 2 {
			proxy.Record()
		}
		mark = proxy.SentLen()
		d, err := l.AllowN(ctx, key, time.Now(), 1)
		if err != nil || !d.Allowed {
			b.Fatalf("decision %d: %+v, %v", i, d, err)
		}
		req = slices.Clone(proxy.Sent(mark))
	}
	cmds := sentCommands(b, proxy, mark)
	retrieval := false
	for _, c := range cmds {
		retrieval = retrieval || c[0] == "get" || c[0] == "gets"
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 64<<10)
	// replay sends req and reads its replies: up to the retrieval's END
	// (skipping each VALUE's data block), or one line per command.
	replay := func() error {
		if _, err := conn.Write(req); err != nil {
			return err
		}
		for replies := 0; ; {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return err
			}
			if f := bytes.Fields(line); len(f) >= 4 && string(f[0]) == "VALUE" {
				n, err := strconv.Atoi(string(f[3]))
				if err != nil {
					return fmt.Errorf("reply %q: %w", line, err)
				}
				if _, err := br.Discard(n + 2); err != nil {
					return err
				}
				continue
			}
			replies++
			if retrieval && string(line) == "END\r\n" || !retrieval && replies == len(cmds) {
				return nil
			}
		}
	}
	const n = 2000
	rep := make([]time.Duration, 0, n)
	raw := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if err := replay(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := mc.Get(rawKey); err != nil {
			b.Fatal(err)
		}
		rep, raw = append(rep, t1.Sub(t0)), append(raw, time.Since(t1))
	}
	fp50, rp50 := percentile(rep, 0.5), percentile(raw, 0.5)
	b.ReportMetric(float64(fp50.Microseconds()), "floor-p50-µs")
	b.ReportMetric(float64(fp50)/float64(rp50), "floor-p50/get")
	b.ReportMetric(float64(len(req)), "request-bytes")
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
