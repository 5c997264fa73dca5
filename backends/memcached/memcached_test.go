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
