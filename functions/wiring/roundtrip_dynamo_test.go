package wiring

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/internal/testserver"
)

// dynamoThroughProxy builds the authorizer with the embedded rules on a
// fresh table of the shared DynamoDB Local, its SDK pointed at a counting
// proxy, and returns the proxy and the store (under its breaker).
func dynamoThroughProxy(t testing.TB) (*Built, *testserver.HTTPProxy, *dynamo.Store) {
	t.Helper()
	endpoint := testserver.DynamoDB(t)
	proxy := testserver.NewHTTPProxy(t, endpoint)
	// sdkEnv's settings, for a benchmark too.
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL_DYNAMODB": proxy.URL(), "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
		"AWS_SESSION_TOKEN": "", "AWS_REGION": "us-east-1", "AWS_PROFILE": "",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		t.Setenv(k, v)
	}
	table := fmt.Sprintf("sluice-roundtrip-%d", time.Now().UnixNano())
	env, err := ParseEnv(func(k string) string {
		return map[string]string{"SLUICE_DYNAMO_TABLE": table, "SLUICE_DEADLINE": "2s"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(context.Background(), env, Outputs{Stdout: discard{}, Stderr: discard{}, CreateTable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	br, ok := b.Stores[BackendDynamo].(*breaker.Store)
	if !ok {
		t.Fatalf("dynamo store %T, want it behind its breaker", b.Stores[BackendDynamo])
	}
	st, ok := br.Unwrap().(*dynamo.Store)
	if !ok {
		t.Fatalf("dynamo store %T", br.Unwrap())
	}
	return b, proxy, st
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// roundTrips is what one authorizer decision cost at the DynamoDB server.
type roundTrips struct {
	waited   []testserver.HTTPRequest // answered before the handler returned
	detached []testserver.HTTPRequest // answered after: refunds sent without waiting
}

func (r roundTrips) String() string {
	return fmt.Sprintf("%d request(s) in %d round trip(s) of latency [%s], %d sent without waiting [%s]",
		len(r.waited), testserver.Waves(r.waited), ops(r.waited), len(r.detached), ops(r.detached))
}

func ops(reqs []testserver.HTTPRequest) string {
	n := map[string]int{}
	for _, r := range reqs {
		n[r.Op]++
	}
	var s []string
	for op, c := range n {
		s = append(s, fmt.Sprintf("%s %d", op, c))
	}
	sort.Strings(s)
	return strings.Join(s, ", ")
}

// decideCounted runs one decision and splits what the proxy saw: requests
// answered before the handler returned (the decision's latency), and those
// answered after (refunds sent without waiting; waited for here).
func decideCounted(t testing.TB, b *Built, proxy *testserver.HTTPProxy, st *dynamo.Store, ev []byte) (bool, roundTrips) {
	t.Helper()
	mark := proxy.Len()
	resp, res, err := b.Handler.Decide(context.Background(), ev)
	returned := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range res.Evals {
		if e.Err != nil {
			t.Fatalf("rule %s: %v", e.Rule, e.Err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := st.WaitRefunds(ctx); err != nil {
		t.Fatal(err)
	}
	var rt roundTrips
	for _, r := range proxy.Since(mark) {
		if r.End.After(returned) {
			rt.detached = append(rt.detached, r)
		} else {
			rt.waited = append(rt.waited, r)
		}
	}
	return resp.Allowed(), rt
}

func roundTripEvent(path, ip, token string) []byte {
	headers := ""
	if token != "" {
		headers = fmt.Sprintf(`,"headers":{"Authorization":"Bearer %s"}`, token)
	}
	return fmt.Appendf(nil, `{"type":"REQUEST","methodArn":"arn:aws:execute-api:us-east-1:1:api/prod/GET%s","httpMethod":"GET","path":%q%s,
		"requestContext":{"stage":"prod","identity":{"sourceIp":%q}}}`, path, path, headers, ip)
}

// TestRoundTripsDynamo counts the requests DynamoDB Local receives (at an
// HTTP proxy, by X-Amz-Target: the wire, not the code) for authorizer
// decisions with the embedded rules and the DynamoDB backend: one round
// trip of latency for an allowed request with or without a token (one
// UpdateItem per key, the limits of a rule on its key merged, sent at
// once), one for a denied one with its refunds sent without waiting
// (counted apart, merged per key too), none for a denial the deny cache
// answers.
func TestRoundTripsDynamo(t *testing.T) {
	b, proxy, st := dynamoThroughProxy(t)
	decide := func(what string, ev []byte, wantAllowed bool, wantWaited, wantDetached int) {
		t.Helper()
		allowed, rt := decideCounted(t, b, proxy, st, ev)
		t.Logf("%s: %v", what, rt)
		if allowed != wantAllowed {
			t.Fatalf("%s: allowed=%v, want %v", what, allowed, wantAllowed)
		}
		if len(rt.waited) != wantWaited || len(rt.detached) != wantDetached {
			t.Fatalf("%s: %v; want %d waited for and %d sent without waiting", what, rt, wantWaited, wantDetached)
		}
		if w := testserver.Waves(rt.waited); wantWaited > 0 && w != 1 {
			t.Errorf("%s: %d round trips of latency, want 1", what, w)
		}
	}
	// A warm process: the SDK's connections are open (a cold client dials
	// one connection per parallel request, which can serialize them).
	for i := range 3 {
		decideCounted(t, b, proxy, st, roundTripEvent("/pets", fmt.Sprintf("192.0.2.%d", 200+i), ""))
	}
	// 50 ms of network latency per request: requests sent at once overlap
	// by that much at the proxy even when a loaded machine schedules their
	// goroutines a few ms apart (one wave); requests sent one after another
	// are 50 ms apart at least (a wave each).
	proxy.SetDelay(50 * time.Millisecond)
	ip := "192.0.2.78"
	// The limits of one rule share a key and so one item: one UpdateItem
	// per rule (per key), whatever its limits.
	decide("allowed, no token (cold key)", roundTripEvent("/pets", ip, ""), true, 1, 0)
	decide("allowed, no token (warm key)", roundTripEvent("/pets", ip, ""), true, 1, 0)
	decide("allowed, with a token", roundTripEvent("/pets", ip, "tok-1"), true, 2, 0)
	// /demo/** adds the demo rule and the shadow rule: 5 limits on 4 keys.
	// The shadow limit (2 a minute) denies the third: its own take goes
	// back.
	decide("demo 1, allowed", roundTripEvent("/demo/hello", ip, "tok-1"), true, 4, 0)
	decide("demo 2, allowed", roundTripEvent("/demo/hello", ip, "tok-1"), true, 4, 0)
	decide("demo 3, allowed (shadow denied)", roundTripEvent("/demo/hello", ip, "tok-1"), true, 4, 1)
	// Denied: all 5 takes go back, one write per key (the per-ip window
	// and bucket together).
	decide("demo, denied", roundTripEvent("/demo/hello", ip, "tok-1"), false, 4, 4)
	decide("demo, denied from the cache", roundTripEvent("/demo/hello", ip, "tok-1"), false, 0, 0)
}
