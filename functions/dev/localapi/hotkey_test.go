package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/functions/wiring"
	"github.com/sluicehq/sluice/internal/testserver"
)

// TestHotGlobalKeyThroughLocalAPI is the hot-key run through the local API
// on DynamoDB behind real DynamoDB's partition cap (testserver.CapProxy,
// scaled to 1/200: 5 write units a second per partition key): a global
// rule (one key for the whole API, a bucket of three times what its
// partition takes) beside a per-ip rule (20 a minute), both fail-open, 20
// clients on 20 loopback addresses, two connections each. The global key is throttled; no
// client is ever admitted beyond its per-ip limit, and no breaker opens.
// Before throttles were denied, the throttled global key opened the
// breaker and every client's requests were admitted through the fail mode
// (a temporary edit that fails throttles open: 678 and 2290 admitted,
// clients at 25 to 126 of 20).
//
// At 1/50 (20 units a second) the run flaked on a loaded machine: DynamoDB
// Local, sharing 2 cores with other work, served fewer writes than the
// cap (about 14 a second in all, with four busy loops beside it), the
// decisions waited out the 2 s deadline and failed open (each client made
// two requests in 4 s), so the proxy throttled nothing; with the deadline
// missed on many keys the breaker opened too. So: a cap of 5 a second,
// a 10 s deadline, and a run that goes on past 4 s, up to 20 s, until
// the proxy has throttled.
func TestHotGlobalKeyThroughLocalAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("a 4 s run against DynamoDB Local")
	}
	proxy := testserver.NewCapProxy(t, testserver.DynamoDBLocal(t), testserver.CapConfig{Scale: 0.005})
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.URL())
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_SESSION_TOKEN": "",
		"AWS_REGION": "us-east-1", "AWS_PROFILE": "", "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull} {
		t.Setenv(k, v)
	}
	const (
		clients     = 20
		perIP       = 20 // a minute
		pace        = 50 * time.Millisecond
		duration    = 4 * time.Second
		maxDuration = 20 * time.Second
	)
	rules := fmt.Sprintf(`rules:
  - {name: global, key: "all", fail: open, limits: [{algorithm: token_bucket, max_amount: 15, refill_time: 200ms, refill_amount: 3}]}
  - {name: per-ip, key: "{ip}", fail: open, limits: [{algorithm: sliding_window, limit: %d, window: 1m}]}
`, perIP)
	vars := map[string]string{
		"SLUICE_DYNAMO_TABLE": fmt.Sprintf("sluice-localapi-hot-%d", time.Now().UnixNano()),
		"SLUICE_RULES_YAML":   rules,
		// Generous, so that a loaded machine's slow answers (DynamoDB
		// Local's most of all) do not send decisions to the fail mode or
		// open the breaker: this run is about throttling.
		"SLUICE_DEADLINE": "10s",
	}
	var logs bytes.Buffer
	b := buildFrom(t, vars, wiring.Outputs{Stdout: io.Discard, Stderr: &logs, CreateTable: true})
	ts := httptest.NewServer(newServer(b.Handler, kindREST, "local", nil))
	t.Cleanup(ts.Close)

	type tally struct{ ok, limited, throttled, other int }
	tallies := make([]tally, clients)
	// The run lasts duration, and longer, up to maxDuration, until the
	// proxy has throttled: on a loaded machine DynamoDB Local may answer
	// so slowly that every decision of the first seconds waits out the
	// deadline and fails open, and the global key is not yet written
	// faster than its partition takes.
	start := time.Now()
	end, hardEnd := start.Add(duration), start.Add(maxDuration)
	running := func() bool {
		now := time.Now()
		return now.Before(end) || now.Before(hardEnd) && proxy.Stats().Throttled == 0
	}
	var wg sync.WaitGroup
	for i := range clients {
		// Client i connects from 127.0.0.(i+2): its own {ip}.
		addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(i+2))}
		c := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: addr}).DialContext}}
		var mu sync.Mutex
		for range 2 {
			wg.Go(func() {
				defer c.CloseIdleConnections()
				for running() {
					resp, err := c.Get(ts.URL + "/x")
					if err != nil {
						t.Error(err)
						return
					}
					var body struct{ Rule, Reason string }
					json.NewDecoder(resp.Body).Decode(&body)
					resp.Body.Close()
					mu.Lock()
					switch {
					case resp.StatusCode == http.StatusOK:
						tallies[i].ok++
					case resp.StatusCode == http.StatusTooManyRequests && body.Reason == "throttled":
						tallies[i].throttled++
					case resp.StatusCode == http.StatusTooManyRequests:
						tallies[i].limited++
					default:
						tallies[i].other++
					}
					mu.Unlock()
					time.Sleep(pace)
				}
			})
		}
	}
	wg.Wait()

	var sum tally
	for i, tl := range tallies {
		if tl.ok > perIP {
			t.Errorf("client 127.0.0.%d admitted %d times, above its per-ip limit of %d", i+2, tl.ok, perIP)
		}
		if tl.other > 0 {
			t.Errorf("client 127.0.0.%d: %d answers neither 200 nor 429", i+2, tl.other)
		}
		sum.ok += tl.ok
		sum.limited += tl.limited
		sum.throttled += tl.throttled
	}
	st := proxy.Stats()
	t.Logf("%d clients for %v: %d admitted, %d denied by a limit, %d denied as throttled; proxy: %d forwarded, %.0f write units, %d throttled",
		clients, time.Since(start).Round(time.Millisecond), sum.ok, sum.limited, sum.throttled, st.Requests, st.WriteUnits, st.Throttled)
	if st.Throttled == 0 {
		t.Fatal("the proxy throttled nothing: the run did not reach the partition's cap")
	}
	if sum.throttled == 0 {
		t.Errorf("the proxy throttled %d requests, and no answer was a 429 with reason throttled", st.Throttled)
	}
	if br := b.Breakers[wiring.BackendDynamo]; br == nil {
		t.Error("no breaker on dynamo")
	} else if s := br.Stats(); s.Opens != 0 {
		t.Errorf("the DynamoDB breaker opened: %+v", s)
	}
	if bytes.Contains(logs.Bytes(), []byte("circuit breaker open")) {
		t.Errorf("log says the breaker opened:\n%s", logs.String())
	}
}
