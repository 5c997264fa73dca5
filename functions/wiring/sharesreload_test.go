package wiring

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/internal/regions"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// sharesReloadRig is a rules table whose rule "global" has scope global,
// and the rules cache buildRules makes of it on an eventual state table
// (two regions on one DynamoDB Local table; this process is region 0),
// with the keeper that sweeps the regional shares the cache's policies
// build. The test reloads it with Refresh.
type sharesReloadRig struct {
	client *dynamodb.Client
	rules  string
	b      *Built
	cache  *policy.Cache
	keeper func(context.Context, *events.CloudWatchEvent) (any, error)
}

// sharesGlobal is the global rule of limit limit, 20 units a request: a
// key's process leases after a few requests, however slow (leases on).
func sharesGlobal(limit int) string {
	return fmt.Sprintf(`{key: "{ip}", scope: global, fail: closed, cost: %d,
		limits: [{name: gw, algorithm: sliding_window, limit: %d, window: 1m, sub_windows: 6, backend: dynamo}]}`, sharesCost, limit)
}

// sharesCost is the cost of sharesGlobal's requests.
const sharesCost = 20

// leasesLive is the units s's leases hold unspent: granted, less the
// units of the decisions they answered (each take's own included), less
// those returned or lost.
func leasesLive(s limiter.LeaseStats) int64 {
	return s.Granted - (s.Decisions+s.Takes)*sharesCost - s.Returned - s.Lost
}

// settledLeases returns the lease counts once no unit is live, or after 5
// s: a lease closed by a decision sends its return on a goroutine of its
// own (bounded by the limiter's 1 s return timeout) and counts it when
// the store answers, so a count read just after the decisions can hold
// units whose return is on its way (a fresh-clone make test read 8 units
// live, the return of a second lease not yet counted).
func settledLeases(stats func() limiter.LeaseStats) limiter.LeaseStats {
	s := stats()
	for deadline := time.Now().Add(5 * time.Second); leasesLive(s) != 0 && time.Now().Before(deadline); s = stats() {
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

func newSharesReloadRig(t *testing.T, global string) *sharesReloadRig {
	t.Helper()
	sdkEnv(t, testserver.DynamoDBLocal(t))
	cfg, err := awsconfig.LoadDefaultConfig(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r := &sharesReloadRig{client: dynamodb.NewFromConfig(cfg)}
	r.rules = createRulesTable(t, r.client)
	putRule(t, r.client, r.rules, "global", global, 1)
	// The state table, warmed (DynamoDB Local's first requests are slow).
	state := fmt.Sprintf("sluice-sharesreload-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := createWarm(ctx, r.client, state, 30); err != nil {
		t.Fatal(err)
	}
	raw := map[string]string{
		config.EnvDynamoTable: state, config.EnvDeadline: "1s",
		config.EnvTableMode: config.TableEventual, config.EnvRegions: "us-east-1,eu-west-1", config.EnvAWSRegion: "us-east-1",
	}
	env, err := ParseEnv(func(k string) string { return raw[k] })
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(t.Context(), env, Outputs{Stdout: io.Discard, Stderr: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	r.b = b
	b.Env.RulesTable = r.rules
	sh, err := b.buildShares(r.client, authz.NewMetrics(io.Discard, "sharesreload"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := b.buildRules(t.Context(), r.client, policy.Options{Stores: b.Stores, DefaultBackend: env.DefaultBackend, Shares: sh}, limiter.SystemClock)
	if err != nil {
		t.Fatal(err)
	}
	r.cache = src.(*policy.Cache)
	t.Cleanup(func() {
		r.cache.ReturnLeases(context.Background(), time.Now()) //nolint:errcheck // the test's checks are done
		r.cache.Wait()
	})
	r.keeper = b.keeper(sh, limiter.SystemClock)
	// Warm DynamoDB Local's paths of the shares (a key's first tick and
	// reads) on a key of its own: on a fresh DynamoDB Local the first
	// ones may take longer than the deadline.
	for range 8 {
		r.cache.Policy().Evaluate(t.Context(), &policy.Request{SourceIP: "198.51.100.200", Method: "GET", Path: "/x", Stage: "prod"}, time.Now())
	}
	return r
}

// decide decides one request of the global rule's key on the current
// policy: whether it was allowed, and the error of a decision that
// failed (DynamoDB Local on a loaded machine may answer after the
// deadline: the rule fails closed).
func (r *sharesReloadRig) decide(t *testing.T) (bool, error) {
	t.Helper()
	res := r.cache.Policy().Evaluate(t.Context(), &policy.Request{SourceIP: "198.51.100.9", Method: "GET", Path: "/x", Stage: "prod"}, time.Now())
	for _, e := range res.Evals {
		if e.Err != nil {
			return false, e.Err
		}
	}
	return res.Outcome == policy.Allow, nil
}

// change puts a regional rule of its own on path /other<i> (the global
// rule unchanged) and reloads: the policy is replaced.
func (r *sharesReloadRig) change(t *testing.T, i int) {
	t.Helper()
	before := r.cache.Policy()
	putRule(t, r.client, r.rules, "other", fmt.Sprintf(`{match: {paths: ["/other%d"]}, key: "{ip}", limits: [{algorithm: fixed_window, limit: 5, window: 1m, backend: memory}]}`, i), 2)
	if err := r.cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r.cache.Policy() == before {
		t.Fatal("changed rules kept the policy")
	}
}

// held is the number of Keys the process holds (the keeper sweeps them).
func (r *sharesReloadRig) held() int {
	n := 0
	for range r.b.shares {
		n++
	}
	return n
}

// hot decides n requests of the global rule's key on the current policy
// (its process leases: the limit is far above them; a decision that
// failed is logged, not fatal), and returns the Keys held last made that
// decided a key (the current policy's).
func (r *sharesReloadRig) hot(t *testing.T, n int) *regions.Keys {
	t.Helper()
	failed := 0
	for range n {
		ok, err := r.decide(t)
		if err != nil {
			failed++
			continue
		}
		if !ok {
			t.Fatal("the global key was denied")
		}
	}
	if failed > 0 {
		t.Logf("%d of %d decisions failed (the store's deadline)", failed, n)
	}
	var last *regions.Keys
	for _, k := range r.b.shares {
		if k.Len() > 0 { // not a failed build's
			last = k
		}
	}
	return last
}

// TestSharesReloadKeepsKeys: a rules table reload that replaces the
// policy keeps the global limit's regional shares (one regions.Keys, with
// its processes, leases and agent roles) when the limit's name and
// parameters are the same, so the keeper, sweeping meanwhile (under
// -race: the reloads build while it reads the Keys), sweeps one Keys
// however many reloads there were; a build that fails after reaching the
// global limit adds none; a changed limit's new Keys is swept beside the
// old one until the replaced policy is retired (2 s here), then alone, and
// the old one's leases go back then, the new one's at shutdown (the rules
// cache's ReturnLeases). Before (brokenSharesKeep), each build appended a
// cold Keys that was swept for ever, unguarded, and whose leases never
// went back.
func TestSharesReloadKeepsKeys(t *testing.T) {
	r := newSharesReloadRig(t, sharesGlobal(10000000))
	const reloads = 5
	ctx, stop := context.WithTimeout(t.Context(), regions.DefaultKeeperMargin+time.Minute)
	defer stop()
	var rep any
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		rep, _ = r.keeper(ctx, &events.CloudWatchEvent{ID: "sharesreload"}) //nolint:errcheck // the keeper's errors are logged, never returned
	}()
	start := time.Now()
	counts := []int{r.held()}
	for i := range reloads {
		r.hot(t, 1)
		r.change(t, i)
		counts = append(counts, r.held())
	}
	stop()
	<-kept
	swept := rep.(map[string]any)["keeper"].(regions.KeeperReport)
	t.Logf("%v: %d changed reloads", time.Since(start), reloads)
	// A build that fails at a rule after the global one (memcached is
	// not configured).
	putRule(t, r.client, r.rules, "other", `{key: "{ip}", limits: [{algorithm: fixed_window, limit: 5, window: 1m, backend: memcached}]}`, 2)
	if err := r.cache.Refresh(t.Context()); err == nil || !strings.Contains(err.Error(), "memcached") {
		t.Fatalf("a rule on memcached: %v, want the build's error", err)
	}
	counts = append(counts, r.held())
	// The global limit changed: a new Keys beside the replaced policy's.
	old := r.hot(t, 40)
	t.Logf("%v: hot", time.Since(start))
	putRule(t, r.client, r.rules, "global", sharesGlobal(9000000), 1)
	r.change(t, reloads)
	counts = append(counts, r.held())
	before := old.LeaseStats()
	r.cache.Wait() // the replaced policies retired
	counts = append(counts, r.held())
	retired := settledLeases(old.LeaseStats)
	t.Logf("%v: retired", time.Since(start))
	cur := r.hot(t, 40)
	t.Logf("%v: hot", time.Since(start))
	beforeShutdown := cur.LeaseStats()
	if err := r.cache.ReturnLeases(t.Context(), time.Now()); err != nil {
		t.Fatal(err)
	}
	shutdown := settledLeases(cur.LeaseStats)
	t.Logf("Keys held: at start, after each of %d changed reloads, a failed build, a changed global limit, its retirement: %v; "+
		"keeper during the reloads: %+v; leases of the replaced Keys: %+v, then %+v; of the current one at shutdown: %+v, then %+v",
		reloads, counts, swept, before, retired, beforeShutdown, shutdown)
	want := []int{1, 1, 1, 1, 1, 1, 1, 2, 1}
	if fmt.Sprint(counts) != fmt.Sprint(want) || swept.Rounds == 0 || swept.Limits != 1 {
		t.Errorf("Keys held %v, want %v; keeper swept %d limits in its last of %d rounds, want 1", counts, want, swept.Limits, swept.Rounds)
	}
	// Every unit leased and not spent goes back: none is left live, none
	// lost. (A lease spent whole just before leaves nothing to give back:
	// its return is counted, of no units.)
	for i, s := range [][2]limiter.LeaseStats{{before, retired}, {beforeShutdown, shutdown}} {
		live := leasesLive(s[0])
		if s[0].Takes == 0 || s[1].Returns == s[0].Returns || leasesLive(s[1]) != 0 || s[1].Returned-s[0].Returned != live || s[1].Lost != s[0].Lost {
			t.Errorf("leases %+v (%d units live), then %+v (%d live) at the %s: want takes, then every unit live returned",
				s[0], live, s[1], leasesLive(s[1]), []string{"retirement", "shutdown"}[i])
		}
	}
}
