package memcached_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
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

// TestConformanceLeased runs the suite with capacity leases on every
// token bucket and sliding window.
func TestConformanceLeased(t *testing.T) {
	limitertest.RunLeased(t, newStore(t, memcached.Config{KeyPrefix: "conformance-leased:"}))
}

// limitertestKey returns a fresh key for t.
func limitertestKey(t testing.TB) string { return limitertest.Key(t) }

// TestSeveralNodes runs the conformance suite on a Store over three private
// memcached servers, then checks that the keys went to all of them.
func TestSeveralNodes(t *testing.T) {
	var addrs []string
	for range 3 {
		addrs = append(addrs, testserver.StartMemcached(t).Addr())
	}
	s := newStore(t, memcached.Config{Addrs: addrs})
	limitertest.Run(t, s)
	// Distinct keys spread evenly.
	w, err := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 1, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const keys = 3000
	prefix := limitertestKey(t)
	before := map[string]int64{}
	for _, a := range addrs {
		st, err := statsOf(a)
		if err != nil {
			t.Fatal(err)
		}
		before[a] = st["curr_items"]
	}
	for i := range keys {
		if _, err := w.Allow(context.Background(), fmt.Sprint(prefix, i), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range addrs {
		st, err := statsOf(a)
		if err != nil {
			t.Fatal(err)
		}
		got := st["curr_items"] - before[a]
		t.Logf("node %s: %d of %d new keys", a, got, keys)
		if got < keys/6 || got > keys/2 {
			t.Errorf("node %s got %d of %d keys, want about a third", a, got, keys)
		}
	}
}

// TestConformanceProxyMode runs the suite with Config.Proxy (reads after
// the increment's reply).
func TestConformanceProxyMode(t *testing.T) {
	limitertest.Run(t, newStore(t, memcached.Config{KeyPrefix: "proxy:", Proxy: true}))
}

// TestCounterView checks Add's view on the real server: the sub-windows in
// span, and Later summing every newer sub-window up to span-1 ahead, for
// the largest span (121 keys in one get).
func TestCounterView(t *testing.T) {
	s := newStore(t, memcached.Config{})
	ctx := context.Background()
	for _, span := range []int{1, 2, 13, storage.MaxSpan} {
		k := storage.Key{Space: "view", Name: limitertestKey(t) + fmt.Sprint(span)}
		const cur = 1000
		// One unit at every sub-window from cur-span-1 to cur+span+1, with
		// cur+j holding j+100 units.
		for idx := int64(cur - span - 1); idx <= cur+int64(span)+1; idx++ {
			if _, err := s.Add(ctx, k, idx, 1, idx-cur+100, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		c, err := s.Add(ctx, k, cur, span, 0, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for j := range storage.MaxSpan {
			want := int64(0)
			if j < span {
				want = int64(100 - j)
			}
			if c.C[j] != want {
				t.Fatalf("span %d: C[%d] = %d, want %d", span, j, c.C[j], want)
			}
		}
		wantLater := int64(0)
		for j := 1; j <= int(storage.Ahead(span)); j++ {
			wantLater += int64(100 + j)
		}
		if c.Later != wantLater {
			t.Fatalf("span %d: Later = %d, want %d", span, c.Later, wantLater)
		}
		// Adding returns the count after the add, the rest unchanged.
		c2, err := s.Add(ctx, k, cur, span, 5, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if c2.C[0] != 105 || c2.Later != c.Later || (span > 1 && c2.C[1] != 99) {
			t.Fatalf("span %d: after adding 5: C[0] %d C[1] %d Later %d", span, c2.C[0], c2.C[1], c2.Later)
		}
		// Sub never goes below zero; a missing counter is fine.
		if err := s.Sub(ctx, k, cur, 1000); err != nil {
			t.Fatal(err)
		}
		if err := s.Sub(ctx, k, cur+100000, 1); err != nil {
			t.Fatal(err)
		}
		if c3, _ := s.Add(ctx, k, cur, span, 0, time.Minute); c3.C[0] != 0 {
			t.Fatalf("span %d: after subtracting too much: %d", span, c3.C[0])
		}
	}
}

// TestLeasesOnStoreClient: a Store's client serves NewLeases, so one Store
// configuration (nodes, TLS, discovery) covers every limiter.
func TestLeasesOnStoreClient(t *testing.T) {
	s := newStore(t, memcached.Config{})
	l, err := memcached.NewLeases(s.Client(), memcached.Config{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	k := storage.Key{Space: "gauge", Name: limitertestKey(t)}
	if err := l.PutGauge(context.Background(), k, storage.Gauge{Value: 0.5, At: 7}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if g, ok, err := l.GetGauge(context.Background(), k); err != nil || !ok || g.Value != 0.5 {
		t.Fatalf("gauge through the Store's client: %+v %v %v", g, ok, err)
	}
}
