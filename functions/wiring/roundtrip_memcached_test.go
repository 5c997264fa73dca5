package wiring

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
)

// mcEvent is an authorizer event for path from 192.0.2.77, with a
// bearer token unless token is empty.
func mcEvent(path, token string) []byte {
	headers := ""
	if token != "" {
		headers = fmt.Sprintf(`,"headers":{"Authorization":"Bearer %s"}`, token)
	}
	return fmt.Appendf(nil, `{"type":"REQUEST","methodArn":"arn:aws:execute-api:us-east-1:1:api/prod/GET%s","httpMethod":"GET","path":%q%s,
		"requestContext":{"stage":"prod","identity":{"sourceIp":"192.0.2.77"}}}`, path, path, headers)
}

// segmentCount is what a set of counting proxies saw: segments waited for
// and noreply segments.
type segmentCount struct{ seg, noreply int64 }

func countOf(ps ...*testserver.Proxy) segmentCount {
	var c segmentCount
	for _, p := range ps {
		pc := p.Counts()
		c.seg += pc.Segments
		c.noreply += pc.NoReply
	}
	return c
}

// roundTripChecker decides events on b and counts the segments each sends
// through the counting proxies.
type roundTripChecker struct {
	t  *testing.T
	b  *Built
	mc *memcached.Store
}

func newRoundTripChecker(t *testing.T, vars map[string]string) *roundTripChecker {
	t.Helper()
	b, _ := buildEnv(t, vars)
	mc, ok := b.Stores[BackendMemcached].(*memcached.Store)
	if !ok {
		t.Fatalf("memcached store is a %T (its breakers are per node, inside)", b.Stores[BackendMemcached])
	}
	return &roundTripChecker{t: t, b: b, mc: mc}
}

// decide decides ev, checks its outcome, waits for the refunds sent
// without waiting (bucket refunds on their own goroutine, noreply
// segments) and returns, per group of proxies, what they received for
// it, with the segments' commands of the first group.
func (c *roundTripChecker) decide(what string, ev []byte, wantAllowed bool, groups ...[]*testserver.Proxy) ([]segmentCount, string) {
	t := c.t
	t.Helper()
	before := make([]segmentCount, len(groups))
	marks := make([]int, len(groups[0]))
	for i, g := range groups {
		before[i] = countOf(g...)
	}
	for i, p := range groups[0] {
		marks[i] = p.Len()
	}
	resp, res, err := c.b.Handler.Decide(t.Context(), ev)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for _, e := range res.Evals {
		if e.Err != nil {
			t.Fatalf("%s: rule %s: %v", what, e.Rule, e.Err)
		}
	}
	if resp.Allowed() != wantAllowed {
		t.Fatalf("%s: allowed=%v, want %v (%+v)", what, resp.Allowed(), wantAllowed, resp.AuthContext())
	}
	if err := c.mc.WaitRefunds(t.Context()); err != nil || c.mc.LostRefunds() != 0 {
		t.Fatalf("%s: refunds: %v, %d lost", what, err, c.mc.LostRefunds())
	}
	// noreply segments need no answer: wait until nothing more arrives.
	var got []segmentCount
	for last := []segmentCount(nil); ; last = got {
		time.Sleep(30 * time.Millisecond)
		got = make([]segmentCount, len(groups))
		for i, g := range groups {
			now := countOf(g...)
			got[i] = segmentCount{now.seg - before[i].seg, now.noreply - before[i].noreply}
		}
		if fmt.Sprint(got) == fmt.Sprint(last) {
			break
		}
	}
	var cmds []string
	for i, p := range groups[0] {
		cmds = append(cmds, p.Log(marks[i])...)
	}
	return got, strings.Join(cmds, " ")
}

// TestRoundTripsMemcached counts the request segments a private memcached
// receives (at a proxy: the wire, not the code) for authorizer decisions
// with the embedded rules: one for an allowed request with or without a
// token, one for a denied one (its refunds sent without waiting, noreply,
// counted apart), none for a denial the deny cache answers.
func TestRoundTripsMemcached(t *testing.T) {
	srv := testserver.StartMemcached(t)
	proxy := testserver.NewProxy(t, srv.Addr())
	c := newRoundTripChecker(t, map[string]string{"SLUICE_MEMCACHED_ADDRS": proxy.Addr()})
	// wantSegments counts the segments the decision waited for and the
	// bucket refunds sent on their own goroutine (detached: the decision
	// does not wait for them; they are waited for here before counting).
	decide := func(what string, ev []byte, wantAllowed bool, wantSegments, wantNoReply int64) {
		t.Helper()
		got, cmds := c.decide(what, ev, wantAllowed, []*testserver.Proxy{proxy})
		if got[0] != (segmentCount{wantSegments, wantNoReply}) {
			t.Fatalf("%s: %d request segments and %d noreply segments at memcached, want %d and %d: %v", what, got[0].seg, got[0].noreply, wantSegments, wantNoReply, cmds)
		}
		t.Logf("%s: %d request segment(s), %d noreply segment(s): %v", what, got[0].seg, got[0].noreply, cmds)
	}
	decide("allowed, no token (cold key)", mcEvent("/pets", ""), true, 1, 0)
	decide("allowed, no token (warm key)", mcEvent("/pets", ""), true, 1, 0)
	decide("allowed, with a token", mcEvent("/pets", "tok-1"), true, 1, 0)
	// /demo/** adds the demo rule and the shadow demo rule (2 a minute):
	// 4 rules, 5 limits. The shadow rule denies the third (it never
	// denies the request): its own take goes back (its packed refund, noreply).
	decide("demo 1, allowed", mcEvent("/demo/hello", "tok-1"), true, 1, 0)
	decide("demo 2, allowed", mcEvent("/demo/hello", "tok-1"), true, 1, 0)
	decide("demo 3, allowed (shadow denied)", mcEvent("/demo/hello", "tok-1"), true, 1, 1)
	// Denied: 1 segment waited for; the per-ip bucket's refund (a cas
	// sent without waiting) and the windows' packed refunds (noreply).
	decide("demo, denied", mcEvent("/demo/hello", "tok-1"), false, 2, 1)
	decide("demo, denied from the cache", mcEvent("/demo/hello", "tok-1"), false, 0, 0)
}

// TestRoundTripsMemcachedProxy counts the same decisions in proxy mode
// (SLUICE_MEMCACHED_PROXY=true, as the construct deploys for ElastiCache
// Serverless): on one memcached (as before proxy mode batched, for
// comparison), and through nutcracker sharding the keys over two private
// memcached servers, at the client (a counting proxy between the store
// and nutcracker: the round trips a decision waits for) and at the two
// servers behind nutcracker. A round whose keys lie on both shards reaches
// both servers, in parallel: one round trip of latency, one segment at
// each server.
func TestRoundTripsMemcachedProxy(t *testing.T) {
	for _, sharded := range []bool{false, true} {
		name := map[bool]string{false: "one server", true: "nutcracker, two shards"}[sharded]
		t.Run(name, func(t *testing.T) {
			var client *testserver.Proxy
			var servers []*testserver.Proxy
			if sharded {
				n := testserver.StartNutcracker(t, testserver.NutcrackerConfig{Count: true})
				client, servers = testserver.NewProxy(t, n.Addr()), n.Counters
			} else {
				client = testserver.NewProxy(t, testserver.StartMemcached(t).Addr())
				servers = []*testserver.Proxy{client}
			}
			c := newRoundTripChecker(t, map[string]string{"SLUICE_MEMCACHED_ADDRS": client.Addr(), "SLUICE_MEMCACHED_PROXY": "true"})
			// want: the client's segments waited for and noreply; at
			// most want segments waited for at each server.
			decide := func(what string, ev []byte, wantAllowed bool, wantSegments, wantNoReply int64) {
				t.Helper()
				groups := [][]*testserver.Proxy{{client}, servers}
				for _, s := range servers {
					groups = append(groups, []*testserver.Proxy{s})
				}
				got, cmds := c.decide(what, ev, wantAllowed, groups...)
				cl, all, each := got[0], got[1], got[2:]
				var per []string
				for _, e := range each {
					per = append(per, fmt.Sprint(e.seg))
				}
				t.Logf("%s: client %d round trip(s) + %d noreply; servers %d segment(s) (%s) + %d noreply: %v",
					what, cl.seg, cl.noreply, all.seg, strings.Join(per, " + "), all.noreply, cmds)
				if cl != (segmentCount{wantSegments, wantNoReply}) {
					t.Fatalf("%s: %d round trips and %d noreply segments at the client, want %d and %d: %v", what, cl.seg, cl.noreply, wantSegments, wantNoReply, cmds)
				}
				for i, e := range each {
					if e.seg > wantSegments {
						t.Fatalf("%s: %d segments at server %d, want at most %d", what, e.seg, i, wantSegments)
					}
				}
			}
			// An allowed request: the writes (the per-ip packed window's
			// incrs, the bucket's cas or add, the per-token window's
			// incrs), then the reads (one get or gets).
			decide("allowed, no token (cold key)", mcEvent("/pets", ""), true, 2, 0)
			decide("allowed, no token (warm key)", mcEvent("/pets", ""), true, 2, 0)
			decide("allowed, with a token", mcEvent("/pets", "tok-1"), true, 2, 0)
			decide("demo 1, allowed", mcEvent("/demo/hello", "tok-1"), true, 2, 0)
			decide("demo 2, allowed", mcEvent("/demo/hello", "tok-1"), true, 2, 0)
			decide("demo 3, allowed (shadow denied)", mcEvent("/demo/hello", "tok-1"), true, 2, 1)
			// Denied: 2 round trips waited for, then the bucket's refund
			// (a cas, sent without waiting) and the windows' packed
			// refunds (noreply).
			decide("demo, denied", mcEvent("/demo/hello", "tok-1"), false, 3, 1)
			decide("demo, denied from the cache", mcEvent("/demo/hello", "tok-1"), false, 0, 0)
		})
	}
}
