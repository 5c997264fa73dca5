package wiring

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/policy"
)

// reloadRig is a rules table and a state table on DynamoDB Local behind a
// proxy that counts each table's requests, with the rules cache buildRules
// makes of them (reloaded by the test with Refresh) and a fake clock.
type reloadRig struct {
	proxy         *testserver.CapProxy
	client        *dynamodb.Client
	rules, state  string
	cache         *policy.Cache
	clock         *fakeClock
	admit, failed int
}

// newReloadRig puts rule in a new rules table as "hot" and builds its
// cache with the state on DynamoDB (SLUICE_DEADLINE 1s: the replaced
// policy's leases go back 2 s after a replacement).
func newReloadRig(t *testing.T, rule string) *reloadRig {
	t.Helper()
	r := &reloadRig{proxy: testserver.NewCapProxy(t, testserver.DynamoDBLocal(t), testserver.CapConfig{})}
	sdkEnv(t, r.proxy.URL())
	cfg, err := awsconfig.LoadDefaultConfig(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r.client = dynamodb.NewFromConfig(cfg)
	r.rules = createRulesTable(t, r.client)
	putRule(t, r.client, r.rules, "hot", rule, 1)
	r.state = fmt.Sprintf("sluice-rulesreload-%d", time.Now().UnixNano())
	r.clock = newFakeClock(time.Now().Truncate(time.Minute))
	env, err := ParseEnv(func(k string) string {
		return map[string]string{config.EnvDynamoTable: r.state, config.EnvRulesTable: r.rules, config.EnvDeadline: "1s"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(t.Context(), env, Outputs{Stdout: io.Discard, Stderr: io.Discard, Clock: r.clock, CreateTable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	src, err := b.buildRules(t.Context(), r.client, policy.Options{Stores: b.Stores, DefaultBackend: env.DefaultBackend}, r.clock)
	if err != nil {
		t.Fatal(err)
	}
	r.cache = src.(*policy.Cache)
	t.Cleanup(func() {
		// Replaced policies' returns still waiting go now, not in 2 s.
		r.cache.ReturnLeases(context.Background(), r.clock.Now()) //nolint:errcheck // the test's checks are done
		r.cache.Wait()
	})
	return r
}

// decide decides one request of the hot key on p, 2 ms after the last:
// whether it was allowed. A store error fails the test (the rules fail
// closed: it would read as a denial).
func (r *reloadRig) decide(t *testing.T, p *policy.Policy) bool {
	t.Helper()
	res := p.Evaluate(t.Context(), &policy.Request{SourceIP: "198.51.100.7", Method: "GET", Path: "/x", Stage: "prod"}, r.clock.Now())
	r.clock.Advance(2 * time.Millisecond)
	for _, e := range res.Evals {
		if e.Err != nil {
			t.Fatalf("rule %s: %v", e.Rule, e.Err)
		}
	}
	return res.Outcome == policy.Allow
}

// stateRequests is the requests the state table has served.
func (r *reloadRig) stateRequests() int64 { return r.proxy.TableStats(r.state).Requests }

// reloadHot decides a hot key of a sliding window on DynamoDB, 300
// requests between reloads of the same rules, five reloads: the state
// table's requests, the policies seen and the cache's stats.
func reloadHot(t *testing.T) (requests int64, policies int, st policy.CacheStats) {
	r := newReloadRig(t, `{key: "all", fail: closed, limits: [{algorithm: sliding_window, limit: 100000, window: 1m}]}`)
	seen := map[*policy.Policy]bool{}
	start := r.stateRequests()
	for range 5 {
		for range 300 {
			p := r.cache.Policy()
			seen[p] = true
			if !r.decide(t, p) {
				t.Fatal("the hot key was denied")
			}
		}
		if err := r.cache.Refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	return r.stateRequests() - start, len(seen), r.cache.Stats()
}

// TestRulesReloadKeepsPolicy: a rules table reload that reads the same
// rules keeps the policy, so a hot key keeps deciding from its capacity
// leases: across five reloads it costs the state table a few lease takes.
// Rebuilding the policy at each reload (brokenRulesKeep, the behaviour
// before) starts each policy's limiters cold: the hot key goes to the
// store request by request until it is known as hot again.
func TestRulesReloadKeepsPolicy(t *testing.T) {
	kept, keptPolicies, keptStats := reloadHot(t)
	brokenRulesKeep = true
	rebuilt, rebuiltPolicies, rebuiltStats := reloadHot(t)
	brokenRulesKeep = false
	t.Logf("1,500 decisions over 5 reloads: kept: %d state table requests, %d policies, %+v; rebuilt: %d, %d, %+v",
		kept, keptPolicies, keptStats, rebuilt, rebuiltPolicies, rebuiltStats)
	if keptPolicies != 1 || keptStats.Loads != 1 || keptStats.Unchanged != 5 {
		t.Errorf("same rules: %d policies, %+v; want 1 policy, 1 load, 5 unchanged", keptPolicies, keptStats)
	}
	if rebuiltPolicies != 5 || rebuiltStats.Loads != 6 || rebuiltStats.Unchanged != 0 {
		t.Errorf("brokenRulesKeep: %d policies, %+v; want 5 policies, 6 loads", rebuiltPolicies, rebuiltStats)
	}
	// A cold policy sends the hot key's first few requests to the store
	// one by one (its first decision tells what remains; a lease follows
	// once its rate is known): about 4 a reload.
	if kept+10 > rebuilt {
		t.Errorf("state table requests: %d keeping the policy, %d rebuilding it: want at least 10 fewer kept", kept, rebuilt)
	}
}

// retireBucket decides 100 requests of a hot key of a bucket of 400
// tokens (no refill to speak of) on DynamoDB, changes the rules (a second
// rule, on another path), reloads, waits for the replaced policy's
// return, then drains the bucket on the new policy: the units admitted in
// all, the state table's requests during the wait and the cache's stats.
func retireBucket(t *testing.T) (admitted int, returns int64, st policy.CacheStats) {
	r := newReloadRig(t, `{key: "all", fail: closed, limits: [{algorithm: token_bucket, max_amount: 400, refill_time: 24h}]}`)
	old := r.cache.Policy()
	for range 100 {
		if !r.decide(t, old) {
			t.Fatal("denied before the bucket was spent")
		}
	}
	if ls := old.LeaseStats("hot"); ls.Takes == 0 {
		t.Fatalf("the hot key took no lease: %+v", ls)
	}
	putRule(t, r.client, r.rules, "other", `{match: {paths: ["/other"]}, key: "{ip}", limits: [{algorithm: fixed_window, limit: 5, window: 1m}]}`, 2)
	if err := r.cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r.cache.Policy() == old {
		t.Fatal("changed rules kept the policy")
	}
	before := r.stateRequests()
	r.cache.Wait()
	returns = r.stateRequests() - before
	admitted = 100
	for i := 0; i < 1000 && r.decide(t, r.cache.Policy()); i++ {
		admitted++
	}
	return admitted, returns, r.cache.Stats()
}

// TestRulesReloadReturnsLeases: a rules table reload that reads changed
// rules replaces the policy and, once the requests holding the replaced
// one are done, gives back its capacity leases: the state table sees the
// return, and the bucket's 400 tokens are all admitted over both
// policies. Without the return (brokenRulesRetire, the behaviour before)
// the replaced policy's lease holds its units out of the bucket.
func TestRulesReloadReturnsLeases(t *testing.T) {
	admitted, returns, st := retireBucket(t)
	brokenRulesRetire = true
	admittedOld, returnsOld, stOld := retireBucket(t)
	brokenRulesRetire = false
	t.Logf("returned: %d of 400 admitted, %d state table requests at the return, %+v; never returned: %d, %d, %+v",
		admitted, returns, st, admittedOld, returnsOld, stOld)
	if admitted != 400 || returns == 0 || st.Retired != 1 || st.RetireErrors != 0 || st.ReturnedUnits == 0 {
		t.Errorf("returned: %d admitted (want 400), %d return requests, %+v", admitted, returns, st)
	}
	if admittedOld >= 400 || returnsOld != 0 || stOld.Retired != 0 {
		t.Errorf("brokenRulesRetire: %d admitted (want fewer than 400), %d return requests, %+v", admittedOld, returnsOld, stOld)
	}
}

// TestRulesReloadSeesListsAndTiers: a reload compares the whole of what
// it read, so a change of the lists item or of a tier item alone replaces
// the policy, and reading them again unchanged keeps it.
func TestRulesReloadSeesListsAndTiers(t *testing.T) {
	r := newReloadRig(t, `{key: "{api_key}", tier: "{api_key}", tier_lookup: true, limits: [{algorithm: fixed_window, limit: 1, window: 1m}],
		tiers: {pro: [{algorithm: fixed_window, limit: 3, window: 1m}]}}`)
	steps := []struct {
		name    string
		edit    func()
		replace bool
	}{
		{"nothing", func() {}, false},
		{"a tier item", func() { putTier(t, r.client, r.rules, "key-pro", "pro") }, true},
		{"the same tier item", func() { putTier(t, r.client, r.rules, "key-pro", "pro") }, false},
		{"the lists item", func() { putRule(t, r.client, r.rules, RulesListsItem, `{deny: {cidrs: ["192.0.2.0/28"]}}`, -1) }, true},
		{"the lists item respaced", func() { putRule(t, r.client, r.rules, RulesListsItem, `{deny:  {cidrs: [ "192.0.2.0/28" ]}}`, -1) }, false},
		{"a tier's tier", func() { putTier(t, r.client, r.rules, "key-pro", "free") }, true},
	}
	for _, s := range steps {
		before := r.cache.Policy()
		s.edit()
		if err := r.cache.Refresh(t.Context()); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if replaced := r.cache.Policy() != before; replaced != s.replace {
			t.Errorf("changing %s: replaced %v, want %v", s.name, replaced, s.replace)
		}
	}
	if st := r.cache.Stats(); st.Loads != 4 || st.Unchanged != 3 {
		t.Errorf("stats %+v, want 4 loads and 3 unchanged", st)
	}
}

// putTier puts the tier item of value in a rules table.
func putTier(t *testing.T, client *dynamodb.Client, table, value, tier string) {
	t.Helper()
	_, err := client.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		RulesAttrName: &types.AttributeValueMemberS{Value: RulesTierPrefix + value},
		RulesAttrTier: &types.AttributeValueMemberS{Value: tier},
	}})
	if err != nil {
		t.Fatal(err)
	}
}
