package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// TestRoundTripsTaggedNutcracker counts, at the client and at the two
// memcached servers behind nutcracker, the round trips of requests to the
// local API with the embedded rules, on a memcached store in one-pipeline
// mode (proxy mode off) whose limiter keys each live on one shard:
// nutcracker's hash_tag "{|" and the key prefix "{" place every item of a
// limiter key by its base (backends/memcached TestHistoryNutcrackerTagged
// shows this exact through a fleet of nutcrackers). An allowed request,
// with or without a token, is 1 round trip and at most 2 segments summed
// over both servers; a denial the deny cache answers, none. ElastiCache
// Serverless offers no such placement for memcached: the construct's
// proxy mode takes 2 round trips, 4 segments over two shards
// (functions/wiring TestRoundTripsMemcachedProxy).
func TestRoundTripsTaggedNutcracker(t *testing.T) {
	n := testserver.StartNutcracker(t, testserver.NutcrackerConfig{Count: true, HashTag: "{|"})
	client := testserver.NewProxy(t, n.Addr())
	mc, err := memcached.New(memcached.Config{Addrs: []string{client.Addr()}, KeyPrefix: "{", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mc.Close() })
	p, err := policy.Load(authz.DefaultRules, policy.Options{Stores: map[string]storage.Store{"memcached": mc}, DefaultBackend: "memcached"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := authz.New(authz.Config{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(newServer(h, kindREST, "local", nil))
	t.Cleanup(ts.Close)

	segments := func() (int64, []int64) {
		var shards []int64
		for _, c := range n.Counters {
			shards = append(shards, c.Counts().Segments)
		}
		return client.Counts().Segments, shards
	}
	request := func(what, path, token string, wantStatus int, wantClient, wantServers int64) {
		t.Helper()
		c0, s0 := segments()
		req, _ := http.NewRequest(http.MethodGet, ts.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != wantStatus {
			t.Fatalf("%s: status %d, want %d", what, resp.StatusCode, wantStatus)
		}
		// Refunds sent without waiting land before the count.
		if err := mc.WaitRefunds(t.Context()); err != nil || mc.LostRefunds() != 0 {
			t.Fatalf("%s: refunds: %v, %d lost", what, err, mc.LostRefunds())
		}
		var c1 int64
		var s1 []int64
		for last := ""; ; {
			time.Sleep(30 * time.Millisecond) // noreply segments: until nothing more arrives
			c1, s1 = segments()
			if now := fmt.Sprint(c1, s1); now != last {
				last = now
				continue
			}
			break
		}
		var sum int64
		var per []string
		for j := range s1 {
			d := s1[j] - s0[j]
			sum += d
			per = append(per, fmt.Sprint(d))
		}
		t.Logf("%s: %d round trip(s) at the client; %d segment(s) at the servers (%s)", what, c1-c0, sum, strings.Join(per, " + "))
		if c1-c0 != wantClient || sum > wantServers {
			t.Errorf("%s: %d round trips at the client and %d segments at the servers, want %d and at most %d", what, c1-c0, sum, wantClient, wantServers)
		}
	}
	request("allowed, no token (cold key)", "/pets", "", http.StatusOK, 1, 2)
	request("allowed, no token (warm key)", "/pets", "", http.StatusOK, 1, 2)
	request("allowed, with a token", "/pets", "tok-1", http.StatusOK, 1, 2)
	// /demo/** adds the demo rule and its shadow rule: 5 limits on 4
	// limiter keys, still one round trip, one segment per shard.
	request("demo 1, allowed", "/demo/hello", "tok-1", http.StatusOK, 1, 2)
	request("demo 2, allowed", "/demo/hello", "tok-1", http.StatusOK, 1, 2)
	// The shadow rule denies the third: its window's refund is noreply
	// (not counted). Denied: the round trip, then the bucket's refund (a
	// cas sent without waiting, to its one shard).
	request("demo 3, allowed (shadow denied)", "/demo/hello", "tok-1", http.StatusOK, 1, 2)
	request("demo, denied", "/demo/hello", "tok-1", http.StatusTooManyRequests, 2, 3)
	request("demo, denied from the cache", "/demo/hello", "tok-1", http.StatusTooManyRequests, 0, 0)
}
