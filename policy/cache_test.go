package policy

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// reloadSource is a rules source whose document a test changes, read
// through a Reader (keep: the Read carries the document, so an unchanged
// reload keeps the policy) on a counting memory store, with a fake clock.
type reloadSource struct {
	cs   *countingStore
	keep bool

	mu  sync.Mutex
	doc string
	now time.Time
}

func (s *reloadSource) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

func (s *reloadSource) advance(d time.Duration) {
	s.mu.Lock()
	s.now = s.now.Add(d)
	s.mu.Unlock()
}

func (s *reloadSource) set(doc string) {
	s.mu.Lock()
	s.doc = doc
	s.mu.Unlock()
}

func (s *reloadSource) read(context.Context) (Read, error) {
	s.mu.Lock()
	doc := s.doc
	s.mu.Unlock()
	r := Read{Build: func() (*Policy, error) {
		return Load([]byte(doc), Options{Stores: map[string]storage.Store{"memory": s.cs}})
	}}
	if s.keep {
		r.Doc = doc
	}
	return r, nil
}

func newReloadCache(t *testing.T, doc string, keep bool, retire time.Duration) (*reloadSource, *Cache) {
	t.Helper()
	s := &reloadSource{cs: newCounting(t), keep: keep, doc: doc, now: t0}
	c, err := NewReaderCache(t.Context(), s.read, CacheConfig{TTL: time.Minute, Clock: s, RetireAfter: retire})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Wait)
	return s, c
}

// reloadHotKey decides a hot key (one request a millisecond) across five
// reloads of the same rules (the TTL passes on the fake clock, a request
// starts the reload), and returns the store requests, the distinct
// policies seen and the cache's stats.
func reloadHotKey(t *testing.T, keep bool) (requests int64, policies int, st CacheStats) {
	s, c := newReloadCache(t, strings.ReplaceAll(hotRule, "%s", ""), keep, 10*time.Millisecond)
	seen := map[*Policy]bool{}
	at := t0
	for range 5 {
		for range 500 {
			p := c.Policy()
			seen[p] = true
			if res := p.Evaluate(t.Context(), get("192.0.2.9", "/"), at); res.Outcome != Allow {
				t.Fatalf("%v (%s)", res.Outcome, res.Reason)
			}
			at = at.Add(time.Millisecond)
		}
		s.advance(time.Minute)
		c.Policy() // starts the reload
		c.Wait()
	}
	return s.cs.requests(), len(seen), c.Stats()
}

// TestCacheKeepsUnchangedPolicy: a reload that reads the rules the
// current Policy was built from keeps it, and with it its capacity
// leases: a hot key decided across five reloads costs the store the same
// as without reloads. Building a new Policy each time (a Read without its
// Doc: the behaviour before) starts each one cold.
func TestCacheKeepsUnchangedPolicy(t *testing.T) {
	kept, keptPolicies, keptStats := reloadHotKey(t, true)
	rebuilt, rebuiltPolicies, rebuiltStats := reloadHotKey(t, false)
	t.Logf("2,500 decisions over 5 reloads: kept: %d store requests, %d policies, %+v; rebuilt: %d, %d, %+v",
		kept, keptPolicies, keptStats, rebuilt, rebuiltPolicies, rebuiltStats)
	if keptPolicies != 1 || keptStats.Loads != 1 || keptStats.Unchanged != 5 || keptStats.Retired != 0 {
		t.Errorf("unchanged rules: %d policies, %+v; want 1 policy, 1 load, 5 unchanged", keptPolicies, keptStats)
	}
	// The sixth policy, built by the last reload, decided nothing.
	if rebuiltPolicies != 5 || rebuiltStats.Loads != 6 || rebuiltStats.Retired != 5 {
		t.Errorf("without Doc: %d policies, %+v; want 5 policies, 6 loads, 5 retired", rebuiltPolicies, rebuiltStats)
	}
	if kept >= rebuilt {
		t.Errorf("store requests: %d keeping the policy, %d rebuilding it: want fewer kept", kept, rebuilt)
	}
}

const bucketRule = `
rules:
  - name: bucket
    key: "all"
    limits: [{algorithm: token_bucket, max_amount: 400, refill_time: 24h}]
`

// retireRun decides a hot key of a bucket of 400 tokens (no refill to
// speak of) on a policy, replaces it with a changed document (a second
// rule), waits for the replaced policy's return, then drains the bucket
// on the new policy: the units admitted in all, the store requests the
// return made and the cache's stats.
func retireRun(t *testing.T, retire time.Duration) (admitted int, returnRequests int64, st CacheStats) {
	s, c := newReloadCache(t, bucketRule, true, retire)
	old := c.Policy()
	at := t0
	decide := func(p *Policy) bool {
		res := p.Evaluate(t.Context(), get("192.0.2.9", "/"), at)
		at = at.Add(time.Millisecond)
		return res.Outcome == Allow
	}
	for range 100 {
		if !decide(old) {
			t.Fatal("denied before the bucket was spent")
		}
	}
	admitted = 100
	if ls := old.LeaseStats("bucket"); ls.Takes == 0 {
		t.Fatalf("the hot key took no lease: %+v", ls)
	}
	s.set(bucketRule + `  - {name: other, match: {paths: ["/other"]}, key: "{ip}", limits: [{algorithm: fixed_window, limit: 5, window: 1m}]}` + "\n")
	s.advance(at.Sub(s.Now()))
	if err := c.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if c.Policy() == old {
		t.Fatal("a changed document kept the policy")
	}
	before := s.cs.requests()
	c.Wait()
	returnRequests = s.cs.requests() - before
	for i := 0; i < 1000 && decide(c.Policy()); i++ {
		admitted++
	}
	return admitted, returnRequests, c.Stats()
}

// TestCacheRetiresReplacedPolicy: a reload that reads changed rules
// replaces the Policy, and RetireAfter later the replaced one's capacity
// leases go back to the store: the bucket admits its 400 tokens exactly
// over both policies. Without the return (RetireAfter negative: the
// behaviour before) the replaced policy's lease holds its units.
func TestCacheRetiresReplacedPolicy(t *testing.T) {
	admitted, returns, st := retireRun(t, 10*time.Millisecond)
	admittedOld, returnsOld, stOld := retireRun(t, -1)
	t.Logf("returned: %d admitted, %d store requests at the return, %+v; never returned: %d admitted, %d, %+v",
		admitted, returns, st, admittedOld, returnsOld, stOld)
	if admitted != 400 || returns == 0 || st.Retired != 1 || st.RetireErrors != 0 || st.ReturnedUnits == 0 {
		t.Errorf("returned: %d admitted (want 400), %d return requests, %+v", admitted, returns, st)
	}
	if admittedOld >= 400 || returnsOld != 0 || stOld.Retired != 0 {
		t.Errorf("never returned: %d admitted (want fewer than 400), %d return requests, %+v", admittedOld, returnsOld, stOld)
	}
}

// TestCacheReturnLeases: at shutdown a Cache gives back a replaced
// Policy still waiting for its return at once, and the current one's.
func TestCacheReturnLeases(t *testing.T) {
	s, c := newReloadCache(t, bucketRule, true, time.Hour)
	old := c.Policy()
	for i := range 100 {
		old.Evaluate(t.Context(), get("192.0.2.9", "/"), t0.Add(time.Duration(i)*time.Millisecond))
	}
	s.set(strings.ReplaceAll(bucketRule, "400", "401"))
	if err := c.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.ReturnLeases(t.Context(), t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	c.Wait() // no timer left: returns at once
	if st := c.Stats(); st.Retired != 1 || st.ReturnedUnits == 0 {
		t.Errorf("stats %+v", st)
	}
	if ls := old.LeaseStats("bucket"); ls.Returns == 0 {
		t.Errorf("replaced policy's leases %+v", ls)
	}
}

var _ limiter.Clock = (*reloadSource)(nil)

// denyReload denies a key of a rule of 2 a minute (the store's third
// answer), reloads the same rules, and counts the store requests of five
// more requests of the key after the reload.
func denyReload(t *testing.T, keep bool) (requests int64, reasons map[Reason]int) {
	doc := `
rules:
  - name: tight
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 2, window: 1m}]
`
	s, c := newReloadCache(t, doc, keep, 10*time.Millisecond)
	for i := range 3 {
		c.Policy().Evaluate(t.Context(), get("192.0.2.7", "/"), t0.Add(time.Duration(i)*time.Millisecond))
	}
	s.advance(time.Minute)
	c.Policy()
	c.Wait()
	before := s.cs.requests()
	reasons = map[Reason]int{}
	for i := range 5 {
		res := c.Policy().Evaluate(t.Context(), get("192.0.2.7", "/"), t0.Add(time.Duration(10+i)*time.Millisecond))
		if res.Outcome != Deny {
			t.Fatalf("request %d after the reload: %v", i, res.Outcome)
		}
		reasons[res.Reason]++
	}
	return s.cs.requests() - before, reasons
}

// TestCacheKeepsDenyCache: a key its store denied is denied from the deny
// cache after a reload of the same rules, without a store request; a
// rebuilt policy (a Read without its Doc: the behaviour before) asks the
// store again.
func TestCacheKeepsDenyCache(t *testing.T) {
	kept, keptReasons := denyReload(t, true)
	rebuilt, rebuiltReasons := denyReload(t, false)
	t.Logf("5 requests of a denied key after a reload: kept: %d store requests %v; rebuilt: %d %v", kept, keptReasons, rebuilt, rebuiltReasons)
	if kept != 0 || keptReasons[ReasonCache] != 5 {
		t.Errorf("kept: %d store requests, reasons %v; want 0 and 5 from the deny cache", kept, keptReasons)
	}
	if rebuilt == 0 {
		t.Errorf("rebuilt: %d store requests, want some", rebuilt)
	}
}
