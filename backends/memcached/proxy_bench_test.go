package memcached_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
)

// BenchmarkThreeLimitsProxy: BenchmarkThreeLimits's stacks in proxy mode
// (Config.Proxy: the writes of every step in one round trip, the reads in
// a second) through nutcracker sharding keys over two private memcached
// servers, next to one raw get through the same nutcracker in the same
// loop (latency: p50/get, paired-p50/get). Each case also reports
// floor-p50/get: the bytes of one warm decision's rounds, recorded, sent
// again round after round by a bare client that only writes them and
// reads their replies, alternating with raw gets: what the proxy, the
// shards and the loopback alone cost for those commands. With Proxy off,
// the same stacks through the same nutcracker in one pipeline (unsafe
// behind a proxy that may run a pipeline's commands out of order), for
// the cost of the second round. Run under SLUICE_PIN=1 (the proxy and its
// shards then run on the servers' CPU). Each case with two rounds also
// reports each round alone (floor-r1-p50/get, floor-r2-p50/get), and
// TwoShardRounds what any round that reaches both shards costs: one get
// of two keys, one on each shard (get2-p50/get), and two such gets one
// after the other (get2x2-p50/get): the floor of two dependent rounds
// that each reach both shards. EmbeddedRules/Tagged: one pipeline through
// another nutcracker that places each limiter key's items on one shard
// (tagged), against a raw get through that one.
func BenchmarkThreeLimitsProxy(b *testing.B) {
	n := testserver.StartNutcracker(b, testserver.NutcrackerConfig{})
	mc, rawKey := rawClient(b, n.Addr())
	b.Run("TwoShardRounds", func(b *testing.B) { twoShardRounds(b, n, mc, rawKey) })
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
				replayRounds(b, n.Addr(), memcached.Config{Proxy: proxy}, c.Build, mc, rawKey)
			})
		}
	}
	// One pipeline through a nutcracker that places each limiter key's
	// items on one shard (TestHistoryNutcrackerTagged: exact there).
	tn := testserver.StartNutcracker(b, testserver.NutcrackerConfig{HashTag: tagged.hashTag})
	tmc, tRawKey := rawClient(b, tn.Addr())
	cfg := memcached.Config{KeyPrefix: tagged.prefix}
	s := benchStore(b, tn.Addr(), cfg)
	for _, c := range memcached.ThreeLimitCases() {
		if c.Name != "EmbeddedRules" {
			continue
		}
		b.Run(c.Name+"/Tagged", func(b *testing.B) {
			stack, err := c.Build(s)
			if err != nil {
				b.Fatal(err)
			}
			latency(b, stack, tmc, tRawKey, 1)
			replayRounds(b, tn.Addr(), cfg, c.Build, tmc, tRawKey)
		})
	}
}

// replayRounds reports floor-p50/get and rounds (see
// BenchmarkThreeLimitsProxy): the third decision of build's limits on a
// store behind a recording proxy in front of addr gives each round's
// bytes; a bare connection to addr then sends them round by round, each
// read to its last reply (a get's END, one line for any other command),
// 2,000 times, each followed by a raw get.
func replayRounds(b *testing.B, addr string, cfg memcached.Config, build func(s *memcached.Store) (limiter.Limiter, error), mc *memcache.Client, rawKey string) {
	b.Helper()
	rec := testserver.NewProxy(b, addr)
	l, err := build(benchStore(b, rec.Addr(), cfg))
	if err != nil {
		b.Fatal(err)
	}
	key := fmt.Sprint("floor-", time.Now().UnixNano())
	var sent []byte
	var segs []string
	for i := range 3 {
		if i == 2 {
			rec.Record()
		}
		mark, bmark := rec.Len(), rec.SentLen()
		if d, err := l.AllowN(context.Background(), key, time.Now(), 1); err != nil || !d.Allowed {
			b.Fatalf("decision %d: %+v, %v", i, d, err)
		}
		sent, segs = rec.Sent(bmark), rec.Log(mark)
	}
	// Cut the bytes into rounds: segment j holds the commands Log lists.
	type round struct {
		req  []byte
		cmds []string
	}
	var rounds []round
	for _, seg := range segs {
		var r round
		for _, name := range strings.Split(seg, "+") {
			line, rest, ok := bytes.Cut(sent, []byte("\r\n"))
			f := strings.Fields(string(line))
			if !ok || len(f) < 2 || f[0] != name {
				b.Fatalf("replay: command %q, want %s", line, name)
			}
			end := len(line) + 2
			if name == "add" || name == "cas" || name == "set" {
				n, err := strconv.Atoi(f[4])
				if err != nil || len(rest) < n+2 {
					b.Fatalf("replay: command %q", line)
				}
				end += n + 2
			}
			r.req, r.cmds, sent = append(r.req, sent[:end]...), append(r.cmds, name), sent[end:]
		}
		rounds = append(rounds, r)
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 64<<10)
	replay := func(rounds []round) error {
		for _, r := range rounds {
			if _, err := conn.Write(r.req); err != nil {
				return err
			}
			for _, cmd := range r.cmds {
				for {
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
					if cmd != "get" && cmd != "gets" || string(line) == "END\r\n" {
						break
					}
				}
			}
		}
		return nil
	}
	fp50, rp50 := againstGet(b, mc, rawKey, func() error { return replay(rounds) })
	b.ReportMetric(float64(fp50.Microseconds()), "floor-p50-µs")
	b.ReportMetric(float64(fp50)/float64(rp50), "floor-p50/get")
	b.ReportMetric(float64(len(rounds)), "rounds")
	if len(rounds) == 2 {
		for j, unit := range []string{"floor-r1-p50/get", "floor-r2-p50/get"} {
			p50, g50 := againstGet(b, mc, rawKey, func() error { return replay(rounds[j : j+1]) })
			b.ReportMetric(float64(p50)/float64(g50), unit)
		}
	}
}

// againstGet runs f 2,000 times, each followed by a raw get of rawKey, and
// returns the p50 of f and of the gets.
func againstGet(b *testing.B, mc *memcache.Client, rawKey string, f func() error) (time.Duration, time.Duration) {
	b.Helper()
	const n = 2000
	rep := make([]time.Duration, 0, n)
	raw := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := mc.Get(rawKey); err != nil {
			b.Fatal(err)
		}
		rep, raw = append(rep, t1.Sub(t0)), append(raw, time.Since(t1))
	}
	return percentile(rep, 0.5), percentile(raw, 0.5)
}

// twoShardRounds reports get2-p50/get and get2x2-p50/get (see
// BenchmarkThreeLimitsProxy): a key on each of n's two shards, found by
// storing keys through the proxy and asking each shard directly.
func twoShardRounds(b *testing.B, n *testserver.Nutcracker, mc *memcache.Client, rawKey string) {
	var keys [2]string
	shards := []*memcache.Client{memcache.New(n.Shards[0].Addr()), memcache.New(n.Shards[1].Addr())}
	prefix := fmt.Sprint("two-shards-", time.Now().UnixNano(), "-")
	for i := 0; keys[0] == "" || keys[1] == ""; i++ {
		if i == 1000 {
			b.Fatal("no key on each shard in 1,000 tries")
		}
		k := prefix + strconv.Itoa(i)
		if err := mc.Set(&memcache.Item{Key: k, Value: []byte("12345"), Expiration: 600}); err != nil {
			b.Fatal(err)
		}
		for j, sh := range shards {
			if _, err := sh.Get(k); err == nil && keys[j] == "" {
				keys[j] = k
			}
		}
	}
	get2 := func() error {
		m, err := mc.GetMulti(keys[:])
		if err == nil && len(m) != 2 {
			err = fmt.Errorf("get of two keys: %d items", len(m))
		}
		return err
	}
	for range b.N {
		if err := get2(); err != nil {
			b.Fatal(err)
		}
	}
	p50, g50 := againstGet(b, mc, rawKey, get2)
	b.ReportMetric(float64(p50)/float64(g50), "get2-p50/get")
	p50, g50 = againstGet(b, mc, rawKey, func() error {
		if err := get2(); err != nil {
			return err
		}
		return get2()
	})
	b.ReportMetric(float64(p50)/float64(g50), "get2x2-p50/get")
}
