package memcached_test

// Benchmarks against the real server. Run them with
//
//	scripts/testenv go test -run '^$' -bench . -benchmem ./backends/memcached/
//
// Latency and throughput are reported as ratios to a raw gomemcache get
// measured in the same run, so figures from a busy machine stay comparable.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

const benchKeys = 10000

func benchStore(b *testing.B, addr string, cfg memcached.Config) *memcached.Store {
	b.Helper()
	cfg.Addrs = []string{addr}
	cfg.MaxIdleConns = 256
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second // a shared, loaded machine
	}
	s, err := memcached.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// rawClient is a plain gomemcache client with one small item stored, for
// the reference round trip.
func rawClient(b *testing.B, addr string) (*memcache.Client, string) {
	b.Helper()
	mc := memcache.New(addr)
	mc.MaxIdleConns = 256
	key := "bench-raw-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := mc.Set(&memcache.Item{Key: key, Value: []byte("12345"), Expiration: 600}); err != nil {
		b.Fatal(err)
	}
	return mc, key
}

func percentile(d []time.Duration, p float64) time.Duration {
	slices.Sort(d)
	return d[min(len(d)-1, int(p*float64(len(d))))]
}

// BenchmarkLatency: one decision then one raw get, b.N times, on one
// goroutine; reports both p50 and p99 and their ratios. On one hot key, or
// rotating over 10,000 keys (most decisions then create their counter). The
// limit is never reached, so every window decision is one Add (one
// AddPacked for PackedSliding: the packed window at the default 160 slots
// and its largest limit, limiter.MaxPackedLimit per minute, which a run
// of one key does not reach at this rate; denied/op says so).
func BenchmarkLatency(b *testing.B) {
	addr := testserver.Memcached(b)
	mc, rawKey := rawClient(b, addr)
	for _, c := range []struct {
		name  string
		k     int // sub-windows; 0: fixed window
		proxy bool
	}{
		{"PackedSliding", limiter.DefaultSlots, false},
		{"PackedSliding/Proxy", limiter.DefaultSlots, true},
		{"FixedWindow", 0, false},
		{"Sliding4", 4, false},
		{"Sliding12", 12, false},
		{"Sliding12/Proxy", 12, true},
		{"Sliding20", 20, false}, // limiter.DefaultSubWindows
		{"Sliding60", 60, false},
		{"TokenBucket", -1, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := benchStore(b, addr, memcached.Config{Proxy: c.proxy})
			var l limiter.Limiter
			var err error
			switch {
			case strings.HasPrefix(c.name, "PackedSliding"):
				l, err = packedWindow(s)
			case c.k == 0:
				l, err = limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 1 << 40, Window: time.Minute})
			case c.k > 0:
				l, err = limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1 << 40, Window: time.Minute, SubWindows: c.k})
			default:
				l, err = limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 1 << 40, RefillTime: time.Hour})
			}
			if err != nil {
				b.Fatal(err)
			}
			for _, nkeys := range []int{1, benchKeys} {
				b.Run(fmt.Sprintf("keys=%d", nkeys), func(b *testing.B) { latency(b, l, mc, rawKey, nkeys) })
			}
		})
	}
}

// packedWindow is the packed sliding window of the benchmarks
// (memcached.BenchPackedWindow).
func packedWindow(s *memcached.Store) (*limiter.SlidingWindow, error) {
	return memcached.BenchPackedWindow(s)
}

func latency(b *testing.B, l limiter.Limiter, mc *memcache.Client, rawKey string, nkeys int) {
	prefix := fmt.Sprint("lat-", time.Now().UnixNano(), "-")
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	ctx := context.Background()
	dec := make([]time.Duration, 0, b.N)
	raw := make([]time.Duration, 0, b.N)
	denied := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		d, err := l.AllowN(ctx, keys[i%nkeys], t0, 1)
		if err != nil {
			b.Fatal(err)
		}
		if !d.Allowed {
			denied++
		}
		t1 := time.Now()
		if _, err := mc.Get(rawKey); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		dec = append(dec, t1.Sub(t0))
		raw = append(raw, t2.Sub(t1))
	}
	b.StopTimer()
	if denied > 0 {
		// An allowed decision is what is measured: a denial also refunds.
		b.Fatalf("%d of %d decisions denied: the limits were reached (fewer iterations, or larger limits)", denied, b.N)
	}
	// The median of each iteration's decision over its own get: the two
	// ran back to back, so a machine that changes pace during the run
	// (other tests on the shared cores) weighs on both alike.
	paired := make([]time.Duration, len(dec))
	for i := range dec {
		paired[i] = time.Duration(float64(dec[i]) / float64(raw[i]) * 1000)
	}
	b.ReportMetric(float64(percentile(paired, 0.5))/1000, "paired-p50/get")
	dp50, dp99 := percentile(dec, 0.5), percentile(dec, 0.99)
	rp50, rp99 := percentile(raw, 0.5), percentile(raw, 0.99)
	b.ReportMetric(float64(dp50.Microseconds()), "p50-µs")
	b.ReportMetric(float64(dp99.Microseconds()), "p99-µs")
	b.ReportMetric(float64(rp50.Microseconds()), "get-p50-µs")
	b.ReportMetric(float64(rp99.Microseconds()), "get-p99-µs")
	b.ReportMetric(float64(dp50)/float64(rp50), "p50/get")
	b.ReportMetric(float64(dp99)/float64(rp99), "p99/get")
	b.ReportMetric(float64(denied)/float64(b.N), "denied/op")
}

// runConcurrently runs f b.N times over exactly g goroutines.
func runConcurrently(b *testing.B, g int, f func(i int) error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	b.ResetTimer()
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= b.N {
					return
				}
				if err := f(i); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkThroughput: decisions per second at 1, 16 and 64 goroutines, on
// one hot key and on 10,000 keys, next to raw gets and raw incrs (of one
// key) at the same concurrency; each decision row reports x-incr, its rate
// over the raw incrs' measured just before it in the same run (the packed window's
// acceptance: PackedSliding/keys=10000/g=64 at 0.7 or more). Windows:
// Sliding12 and Sliding20 (sub-window counters, 20 the default), and
// PackedSliding (the packed window at the default 160 slots: see
// packedWindow). The limits are not reached (every decision allows; the
// packed window's limit per minute, limiter.MaxPackedLimit, can be on one
// hot key: denied/op says how often; conflicts/op counts the calls that
// gave up after MaxRetries lost races, a token bucket's on one hot key).
func BenchmarkThroughput(b *testing.B) {
	addr := testserver.Memcached(b)
	mc, rawKey := rawClient(b, addr)
	s := benchStore(b, addr, memcached.Config{Timeout: 2 * time.Second})
	sw, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1 << 40, Window: time.Minute, SubWindows: 12})
	sw20, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1 << 40, Window: time.Minute, SubWindows: limiter.DefaultSubWindows})
	pw, err := packedWindow(s)
	if err != nil {
		b.Fatal(err)
	}
	tb, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 1 << 40, RefillTime: time.Hour})
	ctx := context.Background()
	incrKey := rawKey + "-incr"
	if err := mc.Set(&memcache.Item{Key: incrKey, Value: []byte("0"), Expiration: 600}); err != nil {
		b.Fatal(err)
	}
	for _, g := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("RawGet/g=%d", g), func(b *testing.B) {
			runConcurrently(b, g, func(int) error { _, err := mc.Get(rawKey); return err })
		})
		var incrRate float64
		b.Run(fmt.Sprintf("RawIncr/g=%d", g), func(b *testing.B) {
			runConcurrently(b, g, func(int) error { _, err := mc.Increment(incrKey, 1); return err })
			incrRate = float64(b.N) / b.Elapsed().Seconds()
		})
		for _, alg := range []struct {
			name string
			l    limiter.Limiter
		}{{"Sliding12", sw}, {"Sliding20", sw20}, {"PackedSliding", pw}, {"TokenBucket", tb}} {
			for _, nkeys := range []int{1, benchKeys} {
				b.Run(fmt.Sprintf("%s/keys=%d/g=%d", alg.name, nkeys, g), func(b *testing.B) {
					prefix := fmt.Sprint("tp-", time.Now().UnixNano(), "-")
					keys := make([]string, nkeys)
					for i := range keys {
						keys[i] = prefix + strconv.Itoa(i)
					}
					var denied, conflicts atomic.Int64
					runConcurrently(b, g, func(i int) error {
						d, err := alg.l.AllowN(ctx, keys[i%nkeys], time.Now(), 1)
						if errors.Is(err, storage.ErrConflict) {
							// A bucket on one hot key at 16 or 64
							// goroutines can lose MaxRetries races in a
							// row: counted, not fatal to the run.
							conflicts.Add(1)
							return nil
						}
						if err == nil && !d.Allowed {
							denied.Add(1)
						}
						return err
					})
					if incrRate > 0 {
						b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/incrRate, "x-incr")
					}
					b.ReportMetric(float64(denied.Load())/float64(b.N), "denied/op")
					b.ReportMetric(float64(conflicts.Load())/float64(b.N), "conflicts/op")
				})
			}
		}
	}
}

// BenchmarkInterleavedThroughput: the packed window's target figure, the
// throughput of window decisions on 10,000 keys at 64 goroutines over raw
// incrs of one key at 64 goroutines, measured in turns: b.N decisions in
// 20 blocks, each block following a block of as many raw incrs, so that
// both meet the same load (on a shared machine whose load changes from
// second to second, rates measured seconds apart are not comparable).
// x-incr is the incrs' time over the decisions': their throughput ratio.
// Windows: FixedWindow (one counter), Sliding20 (the default sub-window
// counters) and PackedSliding (see packedWindow).
func BenchmarkInterleavedThroughput(b *testing.B) {
	addr := testserver.Memcached(b)
	mc, rawKey := rawClient(b, addr)
	s := benchStore(b, addr, memcached.Config{Timeout: 2 * time.Second})
	incrKey := rawKey + "-incr"
	if err := mc.Set(&memcache.Item{Key: incrKey, Value: []byte("0"), Expiration: 600}); err != nil {
		b.Fatal(err)
	}
	fixed, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 1 << 40, Window: time.Minute})
	sw20, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1 << 40, Window: time.Minute, SubWindows: limiter.DefaultSubWindows})
	pw, err := packedWindow(s)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const g, blocks = 64, 20
	for _, alg := range []struct {
		name string
		l    limiter.Limiter
	}{{"FixedWindow", fixed}, {"Sliding20", sw20}, {"PackedSliding", pw}} {
		b.Run(fmt.Sprintf("%s/keys=%d/g=%d", alg.name, benchKeys, g), func(b *testing.B) {
			prefix := fmt.Sprint("itp-", time.Now().UnixNano(), "-")
			keys := make([]string, benchKeys)
			for i := range keys {
				keys[i] = prefix + strconv.Itoa(i)
			}
			var denied atomic.Int64
			var decT, incrT time.Duration
			b.ResetTimer()
			for j := range blocks {
				n := b.N/blocks + boolInt(j < b.N%blocks)
				if n == 0 {
					continue
				}
				d, err := burst(g, n, func(int) error { _, err := mc.Increment(incrKey, 1); return err })
				if err != nil {
					b.Fatal(err)
				}
				incrT += d
				d, err = burst(g, n, func(i int) error {
					dec, err := alg.l.AllowN(ctx, keys[(i*blocks+j)%benchKeys], time.Now(), 1)
					if err == nil && !dec.Allowed {
						denied.Add(1)
					}
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				decT += d
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/decT.Seconds(), "ops/s")
			b.ReportMetric(float64(b.N)/incrT.Seconds(), "incr/s")
			b.ReportMetric(incrT.Seconds()/decT.Seconds(), "x-incr")
			b.ReportMetric(float64(denied.Load())/float64(b.N), "denied/op")
		})
	}
}

func boolInt(v bool) int {
	if v {
		return 1
	}
	return 0
}

// burst runs f n times over g goroutines and returns the time it took.
func burst(g, n int, f func(i int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	start := time.Now()
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return 0, *err
	}
	return time.Since(start), nil
}

var bytesOnce sync.Map // name -> [2]float64

// BenchmarkBytesPerKey: memcached's "bytes" statistic per tracked key on a
// private server, for 10,000 keys: a sliding window key with traffic in one
// sub-window and in all 13 sub-windows in view (12 plus the partly visible
// one), a fixed window key, and a token bucket; and a packed window key
// (160 slots of 375 ms) with traffic in one slot, or in every slot of the
// 2r+2 = 322 that its counters' TTLs span (the items a key holds under
// steady traffic; 1,000 keys). The measurement is made once; the figure
// is the bytes/key metric.
func BenchmarkBytesPerKey(b *testing.B) {
	for _, c := range []struct {
		name  string
		subs  int           // sub-windows (slots) written per key
		every time.Duration // between them; 0: 5 s
		keys  int           // 0: benchKeys
		mk    func(storage.Counter, storage.BucketStore) limiter.Limiter
	}{
		{"PackedSliding/OneSlot", 1, 0, 0, func(s storage.Counter, _ storage.BucketStore) limiter.Limiter {
			l, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1000, Window: time.Minute, Representation: limiter.Packed})
			return l
		}},
		{"PackedSliding/SteadyTraffic", 2*limiter.DefaultSlots + 2, time.Minute / limiter.DefaultSlots, 1000, func(s storage.Counter, _ storage.BucketStore) limiter.Limiter {
			l, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1000, Window: time.Minute, Representation: limiter.Packed})
			return l
		}},
		{"Sliding12/OneSubWindow", 1, 0, 0, func(s storage.Counter, _ storage.BucketStore) limiter.Limiter {
			l, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1000, Window: time.Minute, SubWindows: 12})
			return l
		}},
		{"Sliding12/AllSubWindows", 13, 0, 0, func(s storage.Counter, _ storage.BucketStore) limiter.Limiter {
			l, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1000, Window: time.Minute, SubWindows: 12})
			return l
		}},
		{"FixedWindow", 1, 0, 0, func(s storage.Counter, _ storage.BucketStore) limiter.Limiter {
			l, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 1000, Window: time.Minute})
			return l
		}},
		{"TokenBucket", 1, 0, 0, func(_ storage.Counter, s storage.BucketStore) limiter.Limiter {
			l, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 1000, RefillTime: time.Second})
			return l
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			v, ok := bytesOnce.Load(c.name)
			if !ok {
				srv := testserver.StartMemcached(b)
				s := benchStore(b, srv.Addr(), memcached.Config{})
				l := c.mk(s, s)
				before, err := statsOf(srv.Addr())
				if err != nil {
					b.Fatal(err)
				}
				ctx, now := context.Background(), time.Now()
				every, nkeys := c.every, int64(c.keys)
				if every == 0 {
					every = 5 * time.Second
				}
				if nkeys == 0 {
					nkeys = benchKeys
				}
				var wg sync.WaitGroup
				var next atomic.Int64
				for range 16 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := next.Add(1) - 1; i < nkeys; i = next.Add(1) - 1 {
							key := "user-" + strconv.FormatInt(1_000_000+i, 10)
							for j := range c.subs {
								if _, err := l.AllowN(ctx, key, now.Add(time.Duration(j)*every), 1); err != nil {
									b.Error(err)
									return
								}
							}
						}
					}()
				}
				wg.Wait()
				after, err := statsOf(srv.Addr())
				if err != nil {
					b.Fatal(err)
				}
				bytes := float64(after["bytes"]-before["bytes"]) / float64(nkeys)
				items := float64(after["curr_items"]-before["curr_items"]) / float64(nkeys)
				v = [2]float64{bytes, items}
				bytesOnce.Store(c.name, v)
			}
			for range b.N {
			}
			b.ReportMetric(v.([2]float64)[0], "bytes/key")
			b.ReportMetric(v.([2]float64)[1], "items/key")
		})
	}
}

// parallelDesign is the first design of the window protocol, kept here only
// to measure it: incr (add on a miss) on one connection in parallel with a
// gomemcache GetMulti of the 12 older sub-windows and the next one, on
// another. It makes no decision.
type parallelDesign struct{ mc *memcache.Client }

func (p parallelDesign) AllowN(_ context.Context, key string, now time.Time, n int64) (limiter.Decision, error) {
	cur := now.UnixNano() / int64(5*time.Second)
	ck := func(idx int64) string { return key + "|c" + strconv.FormatInt(idx, 10) }
	done := make(chan error, 1)
	go func() {
		_, err := p.mc.Increment(ck(cur), uint64(n))
		if errors.Is(err, memcache.ErrCacheMiss) {
			if err = p.mc.Add(&memcache.Item{Key: ck(cur), Value: []byte("1"), Expiration: 70}); errors.Is(err, memcache.ErrNotStored) {
				_, err = p.mc.Increment(ck(cur), uint64(n))
			}
		}
		done <- err
	}()
	keys := []string{ck(cur + 1)}
	for j := int64(1); j <= 12; j++ {
		keys = append(keys, ck(cur-j))
	}
	_, err := p.mc.GetMulti(keys)
	return limiter.Decision{Allowed: true}, errors.Join(err, <-done)
}

func (parallelDesign) Refund(context.Context, string, time.Time, int64) error { return nil }

// BenchmarkParallelDesign measures the protocol this package does not use
// (see the package comment), in the same way as BenchmarkLatency.
func BenchmarkParallelDesign(b *testing.B) {
	addr := testserver.Memcached(b)
	mc, rawKey := rawClient(b, addr)
	pd := memcache.New(addr)
	pd.MaxIdleConns = 256
	for _, nkeys := range []int{1, benchKeys} {
		b.Run(fmt.Sprintf("Sliding12/keys=%d", nkeys), func(b *testing.B) { latency(b, parallelDesign{pd}, mc, rawKey, nkeys) })
	}
}
