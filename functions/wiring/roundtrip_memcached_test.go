package wiring

import (
	"fmt"
	"testing"
	"time"

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

	event := func(path, token string) []byte {
		headers := ""
		if token != "" {
			headers = fmt.Sprintf(`,"headers":{"Authorization":"Bearer %s"}`, token)
		}
		return fmt.Appendf(nil, `{"type":"REQUEST","methodArn":"arn:aws:execute-api:us-east-1:1:api/prod/GET%s","httpMethod":"GET","path":%q%s,
			"requestContext":{"stage":"prod","identity":{"sourceIp":"192.0.2.77"}}}`, path, path, headers)
	}
	decide := func(what string, ev []byte, wantAllowed bool, wantSegments, wantNoReply int64) {
		t.Helper()
		before := proxy.Counts()
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
		deadline := time.Now().Add(2 * time.Second)
		for {
			after := proxy.Counts()
			seg, nr := after.Segments-before.Segments, after.NoReply-before.NoReply
			if seg == wantSegments && nr == wantNoReply {
				t.Logf("%s: %d request segment(s), %d noreply segment(s), %d rules", what, seg, nr, len(res.Evals))
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d request segments and %d noreply segments at memcached, want %d and %d", what, seg, nr, wantSegments, wantNoReply)
			}
			time.Sleep(time.Millisecond)
		}
	}
	decide("allowed, no token (cold key)", event("/pets", ""), true, 1, 0)
	decide("allowed, no token (warm key)", event("/pets", ""), true, 1, 0)
	decide("allowed, with a token", event("/pets", "tok-1"), true, 1, 0)
	for i := range 3 {
		decide(fmt.Sprintf("demo %d, allowed", i+1), event("/demo/hello", "tok-1"), true, 1, 0)
	}
	decide("demo, denied", event("/demo/hello", "tok-1"), false, 1, 1)
	decide("demo, denied from the cache", event("/demo/hello", "tok-1"), false, 0, 0)
}
