package wiring

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
)

// TestRoundTripsMemcached counts the request segments a private memcached
// receives (at a proxy: the wire, not the code) for authorizer decisions
// with the embedded rules: one for an allowed request with or without a
// token, one for a denied one (its refunds sent without waiting, noreply,
// counted apart), none for a denial the deny cache answers.
func TestRoundTripsMemcached(t *testing.T) {
	srv := testserver.StartMemcached(t)
	proxy := testserver.NewProxy(t, srv.Addr())
	b, _ := buildEnv(t, map[string]string{"SLUICE_MEMCACHED_ADDRS": proxy.Addr()})
	mc, ok := b.Stores[BackendMemcached].(*memcached.Store)
	if !ok {
		t.Fatalf("memcached store is a %T (its breakers are per node, inside)", b.Stores[BackendMemcached])
	}

	event := func(path, token string) []byte {
		headers := ""
		if token != "" {
			headers = fmt.Sprintf(`,"headers":{"Authorization":"Bearer %s"}`, token)
		}
		return fmt.Appendf(nil, `{"type":"REQUEST","methodArn":"arn:aws:execute-api:us-east-1:1:api/prod/GET%s","httpMethod":"GET","path":%q%s,
			"requestContext":{"stage":"prod","identity":{"sourceIp":"192.0.2.77"}}}`, path, path, headers)
	}
	// wantSegments counts the segments the decision waited for and the
	// bucket refunds sent on their own goroutine (detached: the decision
	// does not wait for them; they are waited for here before counting).
	decide := func(what string, ev []byte, wantAllowed bool, wantSegments, wantNoReply int64) {
		t.Helper()
		before, mark := proxy.Counts(), proxy.Len()
		resp, res, err := b.Handler.Decide(t.Context(), ev)
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
		if err := mc.WaitRefunds(t.Context()); err != nil || mc.LostRefunds() != 0 {
			t.Fatalf("%s: refunds: %v, %d lost", what, err, mc.LostRefunds())
		}
		// noreply segments need no answer: let the proxy read them.
		deadline := time.Now().Add(2 * time.Second)
		for {
			after := proxy.Counts()
			seg, nr := after.Segments-before.Segments, after.NoReply-before.NoReply
			if seg == wantSegments && nr == wantNoReply {
				time.Sleep(20 * time.Millisecond) // nothing more arrives
				if proxy.Counts() == after {
					t.Logf("%s: %d request segment(s), %d noreply segment(s), %d rules: %v", what, seg, nr, len(res.Evals), proxy.Log(mark))
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d request segments and %d noreply segments at memcached, want %d and %d: %v", what, seg, nr, wantSegments, wantNoReply, proxy.Log(mark))
			}
			time.Sleep(time.Millisecond)
		}
	}
	decide("allowed, no token (cold key)", event("/pets", ""), true, 1, 0)
	decide("allowed, no token (warm key)", event("/pets", ""), true, 1, 0)
	decide("allowed, with a token", event("/pets", "tok-1"), true, 1, 0)
	// /demo/** adds the demo rule and the shadow demo rule (2 a minute):
	// 4 rules, 5 limits. The shadow rule denies the third (it never
	// denies the request): its own take goes back (its packed refund, noreply).
	decide("demo 1, allowed", event("/demo/hello", "tok-1"), true, 1, 0)
	decide("demo 2, allowed", event("/demo/hello", "tok-1"), true, 1, 0)
	decide("demo 3, allowed (shadow denied)", event("/demo/hello", "tok-1"), true, 1, 1)
	// Denied: 1 segment waited for; the per-ip bucket's refund (a cas
	// sent without waiting) and the windows' packed refunds (noreply).
	decide("demo, denied", event("/demo/hello", "tok-1"), false, 2, 1)
	decide("demo, denied from the cache", event("/demo/hello", "tok-1"), false, 0, 0)
}
