package memcached_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// fleetDelay holds the requests of one path from each proxy of the fleet
// to a shard (testserver.NutcrackerConfig.Delay), crossed: the commands of
// one pipeline then reach the two shards milliseconds apart, and two
// connections on different proxies see each other's writes in opposite
// orders on the two shards.
const fleetDelay = 10 * time.Millisecond

// newFleetStore returns a Store through two nutcrackers (behind a balancer
// that spreads the Store's connections over them) sharding keys over two
// private memcached servers, with crossed slow paths: as ElastiCache
// Serverless serves one endpoint from a fleet of proxies in front of
// shards, where the commands of two connections reach a shard in an order
// no single proxy chose.
func newFleetStore(t *testing.T, proxy bool) *memcached.Store {
	t.Helper()
	n := testserver.StartNutcracker(t, testserver.NutcrackerConfig{Proxies: 2, Delay: fleetDelay})
	return newStore(t, memcached.Config{Addrs: []string{n.Addr()}, Proxy: proxy})
}

// straddleScenario is a sliding window whose callers race across
// sub-window boundaries all the time: 20 per 200 ms in 10 sub-windows of
// 20 ms, on 16 keys, callers' clocks up to one sub-window apart
// (SkewedClock), no deny cache, delays below 10 ms, 2 s. Two decisions
// stamped in neighbouring sub-windows, near the limit, that each read the
// other's counter before the other's increment lands both get in: what
// the history checker must catch on a store that lets a read overtake the
// increment it follows.
func straddleScenario() limitertest.Scenario {
	return limitertest.Scenario{Name: "SlidingWindowStraddle",
		Sliding: &limiter.SlidingWindowConfig{Name: "history-straddle", Limit: 20, Window: 200 * time.Millisecond, SubWindows: 10,
			Representation: limiter.SubWindowCounters, NoDenyCache: true},
		Duration: 2 * time.Second, MaxDelay: 10 * time.Millisecond, Skew: 20 * time.Millisecond, Keys: 16}
}

// TestConformanceNutcracker runs the conformance suite in proxy mode
// through nutcracker sharding keys over two memcached servers.
func TestConformanceNutcracker(t *testing.T) {
	n := testserver.StartNutcracker(t, testserver.NutcrackerConfig{})
	limitertest.Run(t, newStore(t, memcached.Config{Addrs: []string{n.Addr()}, Proxy: true}))
}

// TestHistoryNutcracker runs the history checker in proxy mode through the
// fleet (newFleetStore), arrivals reordered as everywhere: every
// algorithm (DefaultScenarios and the packed window) on the shared clock,
// and straddleScenario, which fails the store without Config.Proxy
// (TestHistoryNutcrackerBroken), on skewed clocks.
func TestHistoryNutcracker(t *testing.T) {
	runFleetHistory(t, newFleetStore(t, true))
}

// runFleetHistory runs the history checker on s, a Store through the
// fleet: every algorithm (DefaultScenarios and the packed window, 2 s at
// most each) on the shared clock, and straddleScenario on skewed clocks.
func runFleetHistory(t *testing.T, s *memcached.Store) {
	t.Helper()
	scs := append(limitertest.DefaultScenarios(), limitertest.PackedScenario())
	for i := range scs {
		scs[i].Duration = min(scs[i].Duration, 2*time.Second)
	}
	limitertest.RunHistory(t, s, limitertest.HistoryOptions{Scenarios: scs, Clocks: []limitertest.Clock{limitertest.SharedClock}, Parallel: true})
	limitertest.RunHistory(t, s, limitertest.HistoryOptions{Scenarios: []limitertest.Scenario{straddleScenario()}, Clocks: []limitertest.Clock{limitertest.SkewedClock},
		Parallel: true})
}

// TestHistoryNutcrackerBatched runs the batched history checker (every
// call in a batch with a companion window step: two steps' writes in one
// round, both steps' reads in the next) in proxy mode through the fleet.
func TestHistoryNutcrackerBatched(t *testing.T) {
	limitertest.RunHistoryBatched(t, newFleetStore(t, true))
}

// TestHistoryNutcrackerBroken shows the history checker fails a store that
// sends a window's reads in the same pipeline as the increment they must
// follow, across shards: the Store without Config.Proxy, through the
// fleet. A proxy runs the get on one shard before the incr on the other,
// so two decisions across a sub-window boundary can each miss the other's
// unit. Up to three runs (other draws) must find a window over the limit.
func TestHistoryNutcrackerBroken(t *testing.T) {
	seed, err := limitertest.HistorySeed()
	if err != nil {
		t.Fatal(err)
	}
	s := newFleetStore(t, false)
	for try := range uint64(3) {
		rep, err := limitertest.RunScenario(context.Background(), s, straddleScenario(), limitertest.SkewedClock, limitertest.HistoryOptions{Seed: seed + try})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(rep.Summary())
		if len(rep.Violations) > 0 {
			t.Logf("seed %d: %d windows over the limit, first %v", seed+try, len(rep.Violations), rep.Violations[0])
			return
		}
	}
	t.Fatalf("seed %d: in three runs the checker passed a store that pipelines reads with the writes they follow through a sharding proxy", seed)
}

// TestProxyRoundTrips counts, at a proxy between the Store and nutcracker,
// the round trips of decisions in proxy mode: two for stacks with a
// window that reads (the writes, then the reads), whatever the number of
// limits; one for a bucket, a log and fixed windows alone (their reads are
// of the keys they wrote, or none); and, at the two servers behind
// nutcracker, at most as many segments each.
func TestProxyRoundTrips(t *testing.T) {
	n := testserver.StartNutcracker(t, testserver.NutcrackerConfig{Count: true})
	client := testserver.NewProxy(t, n.Addr())
	s := newStore(t, memcached.Config{Addrs: []string{client.Addr()}, Proxy: true})
	const big = 1 << 40
	window := func(name string, rep limiter.Representation) limiter.Limiter {
		w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: name, Limit: limiter.MaxPackedLimit, Window: time.Minute, Representation: rep})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	bucket, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: big, RefillTime: time.Hour})
	log, _ := limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Name: "l", Limit: 1000, Window: time.Minute})
	fixed := func(name string) limiter.Limiter {
		f, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: name, Limit: big, Window: time.Minute})
		return f
	}
	stack := func(ls ...limiter.Limiter) limiter.Limiter {
		st, err := limiter.NewStack(ls...)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	for _, c := range []struct {
		name string
		l    limiter.Limiter
		want int64
	}{
		{"packed window", window("p", limiter.Packed), 2},
		{"sub-window window", window("s", limiter.SubWindowCounters), 2},
		{"bucket", bucket, 1},
		{"log", log, 1},
		{"three fixed windows", stack(fixed("f1"), fixed("f2"), fixed("f3")), 1},
		{"bucket and fixed window", stack(bucket, fixed("f4")), 1},
		{"packed window, bucket, fixed window", stack(window("p2", limiter.Packed), bucket, fixed("f5")), 2},
		{"four windows, bucket, log", stack(window("p3", limiter.Packed), window("p4", limiter.Packed),
			window("s2", limiter.SubWindowCounters), window("s3", limiter.SubWindowCounters), bucket, log), 2},
	} {
		key := limitertestKey(t) + "/" + c.name
		// The first decision on a key creates it; the third is warm.
		for i := range 3 {
			got, shards := countDecision(t, client, n, c.l, key)
			if got != c.want {
				t.Errorf("%s, decision %d: %d round trips, want %d", c.name, i+1, got, c.want)
			}
			var servers int64
			for j, seg := range shards {
				servers += seg
				if seg > c.want {
					t.Errorf("%s, decision %d: %d segments at shard %d, want at most %d", c.name, i+1, seg, j, c.want)
				}
			}
			if i == 2 {
				t.Logf("%s: %d round trips, %d segments at the servers", c.name, got, servers)
			}
		}
	}
}

// countDecision makes one decision of l on key, which must be allowed, and
// returns the request segments it cost at client and at each counter of
// n (one per shard).
func countDecision(t *testing.T, client *testserver.Proxy, n *testserver.Nutcracker, l limiter.Limiter, key string) (int64, []int64) {
	t.Helper()
	before := client.Counts().Segments
	shards := make([]int64, len(n.Counters))
	for j, p := range n.Counters {
		shards[j] = p.Counts().Segments
	}
	if d, err := l.AllowN(context.Background(), key, time.Now(), 1); err != nil || !d.Allowed {
		t.Fatalf("%s: %+v, %v", key, d, err)
	}
	for j, p := range n.Counters {
		shards[j] = p.Counts().Segments - shards[j]
	}
	return client.Counts().Segments - before, shards
}

// TestProxyGetSplit checks that in proxy mode a batch whose reads exceed
// ElastiCache Serverless's 16 KB limit on a get sends them as several gets
// of at most 16,000 bytes each (in the same round), and that every read
// still reaches its step: four windows of the largest view on long keys,
// (limits 1000-1003: four keys) after 3 units each are allowed with the
// tightest at 996.
func TestProxyGetSplit(t *testing.T) {
	rec := testserver.NewProxy(t, testserver.Memcached(t))
	s := newStore(t, memcached.Config{Addrs: []string{rec.Addr()}, Proxy: true})
	var ls []limiter.Limiter
	for i := range 4 {
		w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: fmt.Sprint("split", i), Limit: 1000 + int64(i), Window: time.Minute,
			SubWindows: limiter.MaxSubWindows, Representation: limiter.SubWindowCounters})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, w)
	}
	st, err := limiter.NewStack(ls...)
	if err != nil {
		t.Fatal(err)
	}
	key := limitertestKey(t) + strings.Repeat("k", 120)
	now := time.Now()
	for range 3 {
		if d, err := st.AllowN(context.Background(), key, now, 1); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	rec.Record()
	mark := rec.SentLen()
	d, err := st.AllowN(context.Background(), key, now, 1)
	if err != nil || !d.Allowed || d.Remaining != 1000-4 {
		t.Fatalf("fourth decision: %+v, %v; want allowed with %d remaining", d, err, 1000-4)
	}
	gets := 0
	for _, line := range strings.Split(string(rec.Sent(mark)), "\r\n") {
		if strings.HasPrefix(line, "get ") {
			gets++
			if len(line)+2 > 16000 {
				t.Errorf("a get of %d bytes, over 16,000", len(line)+2)
			}
		}
	}
	if gets < 2 {
		t.Fatalf("%d get commands, want the reads split over several", gets)
	}
	t.Logf("%d get commands", gets)
}

// tagged places every item of one limiter key on one shard behind
// nutcracker: the Store's KeyPrefix opens the hash tag, and the '|' that
// starts every item's suffix closes it, so nutcracker places an item by
// its base, which all the items of one limiter key share. ElastiCache
// Serverless offers no such placement for memcached; the tests use it to
// show that where one limiter key's commands reach one shard in order,
// one pipeline is exact through a sharding proxy.
var tagged = struct{ hashTag, prefix string }{"{|", "{"}

// newTaggedFleetStore returns a Store in one-pipeline mode (Config.Proxy
// off) through the fleet of newFleetStore, each limiter key's items on
// one shard (tagged).
func newTaggedFleetStore(t *testing.T) *memcached.Store {
	t.Helper()
	n := testserver.StartNutcracker(t, testserver.NutcrackerConfig{Proxies: 2, Delay: fleetDelay, HashTag: tagged.hashTag})
	return newStore(t, memcached.Config{Addrs: []string{n.Addr()}, KeyPrefix: tagged.prefix})
}

// TestHistoryNutcrackerTagged runs TestHistoryNutcracker's scenarios
// (every algorithm, and straddleScenario on skewed clocks) on the Store
// without Config.Proxy, one pipeline per request, through the fleet with
// each limiter key's items on one shard: exact, where the same Store with
// keys spread over the shards is not (TestHistoryNutcrackerBroken). What
// breaks one pipeline behind a sharding proxy is the order across shards,
// which nutcracker keeps per shard and connection.
func TestHistoryNutcrackerTagged(t *testing.T) {
	runFleetHistory(t, newTaggedFleetStore(t))
}

// TestTaggedRoundTrips counts, at the client and at the two shards, the
// round trips of decisions in one-pipeline mode through nutcracker with
// each limiter key's items on one shard (tagged): one at the client, and
// one segment at each shard that holds one of the decision's limiter keys:
// exactly one for one limit, at most 2 over both shards for any stack.
func TestTaggedRoundTrips(t *testing.T) {
	n := testserver.StartNutcracker(t, testserver.NutcrackerConfig{Count: true, HashTag: tagged.hashTag})
	client := testserver.NewProxy(t, n.Addr())
	s := newStore(t, memcached.Config{Addrs: []string{client.Addr()}, KeyPrefix: tagged.prefix})
	window, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "p", Limit: limiter.MaxPackedLimit, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	bucket, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 1 << 40, RefillTime: time.Hour})
	token, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "t", Limit: limiter.MaxPackedLimit - 1, Window: time.Minute})
	stack, err := limiter.NewStack(window, bucket, token)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		l    limiter.Limiter
	}{{"packed window", window}, {"bucket", bucket}, {"packed window, bucket, packed window", stack}} {
		for i := range 20 {
			key := fmt.Sprintf("%s/%s/%d", limitertestKey(t), c.name, i)
			for d := range 3 { // the third decision is warm
				got, shards := countDecision(t, client, n, c.l, key)
				var sum int64
				reached := 0
				for j, seg := range shards {
					sum += seg
					if seg > 0 {
						reached++
					}
					if seg > 1 {
						t.Errorf("%s, key %d, decision %d: %d segments at shard %d, want at most 1", c.name, i, d+1, seg, j)
					}
				}
				if got != 1 || sum > 2 || c.l != stack && reached != 1 {
					t.Errorf("%s, key %d, decision %d: %d round trips, %d segments at %d shards; want 1, and one shard per limiter key", c.name, i, d+1, got, sum, reached)
				}
			}
		}
	}
}
