package dynamo_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

var base = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

func TestConformance(t *testing.T) {
	s, r, _ := newStore(t, dynamo.Config{})
	limitertest.Run(t, limitertest.BucketsAtStamp(s))
	st := s.Stats()
	t.Logf("%d requests (%d failed: lost races and the suite's bad calls); %d conflicts, %d reads, %d cleanups, %d lost refunds, %d packed Stale",
		r.load(), r.failed.Load(), st.Conflicts, st.Reads, st.Cleanups, st.LostRefunds, st.PackedStale)
}

// TestConformanceLeased runs the suite with capacity leases on every
// token bucket and sliding window.
func TestConformanceLeased(t *testing.T) {
	s, r, _ := newStore(t, dynamo.Config{})
	limitertest.RunLeased(t, limitertest.BucketsAtStamp(s))
	t.Logf("%d requests", r.load())
}

// The acceptance: a bucket of 100 with a one-hour refill, 64
// goroutines x 50 tries: exactly 100 allowed, and fewer than 1.5 requests
// per decision (relative writes let concurrent takes that fit all succeed).
func TestBucketExactUnderContention(t *testing.T) {
	const workers, tries = 64, 50
	s, r, _ := newStore(t, dynamo.Config{})
	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 100, RefillTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	key := limitertest.Key(t)
	if n := limitertest.Hammer(t, b, key, base, workers, tries); n != 100 {
		t.Fatalf("%d allowed, want exactly 100", n)
	}
	perDecision := float64(r.load()) / (workers * tries)
	st := s.Stats()
	t.Logf("64-way contention: %.3f requests per decision (%d requests: %d UpdateItem, %d GetItem; %d lost conditions)",
		perDecision, r.load(), r.update.Load(), r.get.Load(), st.Conflicts)
	if perDecision >= 1.5 {
		t.Errorf("%.3f requests per decision under 64-way contention, want < 1.5", perDecision)
	}
	// The bucket is empty for everyone, whatever a process remembers.
	s.ForgetCache()
	if d, err := b.Get(testCtx(t), key, base); err != nil || d.Remaining != 0 || d.Allowed {
		t.Fatalf("Get after the storm: %+v, %v", d, err)
	}
}

// A warm key without contention costs exactly one request per decision:
// allowed takes (a relative write), denials (the take is tried anyway; the
// item its failed condition returns confirms the denial), refills (nothing
// moves: a take), refunds and gets (one consistent read).
func TestOneRequestPerDecisionWarm(t *testing.T) {
	s, r, _ := newStore(t, dynamo.Config{})
	for _, strict := range []bool{false, true} {
		b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 5, RefillTime: time.Second, Strict: strict, NoDenyCache: true}) // the store's requests, not the limiter's cache
		if err != nil {
			t.Fatal(err)
		}
		key := limitertest.Key(t)
		ctx := testCtx(t)
		decisions := 0
		check := func(what string) {
			t.Helper()
			decisions++
			if got := r.load(); got != int64(decisions) {
				t.Fatalf("strict=%v, after %s: %d requests for %d decisions", strict, what, got, decisions)
			}
		}
		r.total.Store(0)
		for i := range 5 { // the first one creates the bucket
			if d, err := b.Allow(ctx, key, base); err != nil || !d.Allowed || d.Remaining != int64(4-i) {
				t.Fatalf("take %d: %+v, %v", i, d, err)
			}
			check("a take")
		}
		for range 3 {
			if d, err := b.Allow(ctx, key, base.Add(100*time.Millisecond)); err != nil || d.Allowed {
				t.Fatalf("take from an empty bucket: %+v, %v", d, err)
			}
			check("a denial")
		}
		at := base.Add(1500 * time.Millisecond)
		if strict {
			at = base.Add(1200 * time.Millisecond) // the last denial restarted the timer at 100ms
		}
		if d, err := b.Allow(ctx, key, at); err != nil || !d.Allowed || d.Remaining != 0 {
			t.Fatalf("take after one refill: %+v, %v", d, err)
		}
		check("a refill")
		if err := b.Refund(ctx, key, at, 1); err != nil {
			t.Fatal(err)
		}
		check("a refund")
		if d, err := b.Get(ctx, key, at); err != nil || d.Remaining != 1 {
			t.Fatalf("get: %+v, %v", d, err)
		}
		check("a get")
	}
}

// A remembered state is never trusted for a denial: another process's
// refund is seen.
func TestDenialConfirmedByServer(t *testing.T) {
	a, _, _ := newStore(t, dynamo.Config{})
	b, _, _ := newStore(t, dynamo.Config{})
	cfg := limiter.TokenBucketConfig{MaxAmount: 2, RefillTime: time.Hour, NoDenyCache: true} // the store's answers
	ba, _ := limiter.NewTokenBucket(a, cfg)
	bb, _ := limiter.NewTokenBucket(b, cfg)
	key := limitertest.Key(t)
	ctx := testCtx(t)
	for range 2 {
		if d, err := ba.Allow(ctx, key, base); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	if d, _ := ba.Allow(ctx, key, base); d.Allowed {
		t.Fatal("third take allowed")
	}
	if err := bb.Refund(ctx, key, base, 1); err != nil {
		t.Fatal(err)
	}
	// a remembers an empty bucket; the server holds one token.
	if d, err := ba.Allow(ctx, key, base); err != nil || !d.Allowed {
		t.Fatalf("take after another process's refund: %+v, %v", d, err)
	}
	if d, _ := bb.Allow(ctx, key, base); d.Allowed {
		t.Fatal("b took a token that a took")
	}
}

// Windows under the same storm never admit more than the limit, and the
// sliding log is exact.
func TestWindowsAndLogUnderContention(t *testing.T) {
	const workers, tries = 64, 50
	s, r, _ := newStore(t, dynamo.Config{})
	sw, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 100, Window: time.Minute, SubWindows: 10})
	swi, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 100, Window: time.Minute, SubWindows: 10, Estimator: limiter.Interpolated})
	fw, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 100, Window: time.Minute})
	// A version-conditioned log admits one writer per round trip under
	// contention. When the cap proxy forwarded an item's writes one at a
	// time, each round of a storm queued there: 64 writers' first
	// decisions needed up to 20 rounds of about 1.4 s, and 62-293 of 640
	// decisions ran out their 10 s. It forwards them at once now (64
	// writers passed 2 of 2, docs/stores.md); 16 writers, 20 tries each,
	// are still a storm on one item.
	sl, _ := limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Limit: 20, Window: time.Minute})
	for _, c := range []struct {
		name                  string
		l                     limiter.Limiter
		limit, workers, tries int64
		exact                 bool
	}{
		{"SlidingBounded", sw, 100, workers, tries, false},
		{"SlidingInterpolated", swi, 100, workers, tries, false},
		{"FixedWindow", fw, 100, workers, tries, false},
		{"SlidingLog", sl, 20, 16, 20, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := limitertest.Key(t)
			before := r.load()
			defer logCapWaits(t, testserver.DynamoDBCap(t))()
			n := limitertest.Hammer(t, c.l, key, base.Add(30*time.Second), int(c.workers), int(c.tries))
			per := float64(r.load()-before) / float64(c.workers*c.tries)
			t.Logf("%d allowed under contention, %.3f requests per decision", n, per)
			if n > c.limit || (c.exact && n != c.limit) {
				t.Fatalf("%d allowed, want at most %d (exactly for the log)", n, c.limit)
			}
			n += limitertest.Hammer(t, c.l, key, base.Add(30*time.Second), 1, int(c.limit)+20)
			if n != c.limit {
				t.Fatalf("%d allowed in all, want exactly %d", n, c.limit)
			}
		})
	}
}

// logCapWaits returns a func that logs what the cap proxy p (nil: none)
// counted since: requests, throttles, write units (and those billed on an
// uncertain before), the writes in flight with another of their item and
// those that waited for their item (only writes that need it alone).
// The proxy is the binary's: run the test alone for figures of its own.
func logCapWaits(t *testing.T, p *testserver.CapProxy) func() {
	if p == nil {
		return func() {}
	}
	b := p.Stats()
	return func() {
		a := p.Stats()
		t.Logf("cap proxy: %d requests, %d throttled, %.0f write units (%.0f uncertain), %d probes; %d writes in flight with another of their item; %d writes waited for their item, %v in all",
			a.Requests-b.Requests, a.Throttled-b.Throttled, a.WriteUnits-b.WriteUnits, a.UncertainUnits-b.UncertainUnits, a.Probes-b.Probes,
			a.Overlaps-b.Overlaps, a.ItemWaits-b.ItemWaits, a.ItemWait-b.ItemWait)
	}
}

// Both protocols are exact with refills due on the way: the default (a
// refill is an exact-value write, then takes are relative) and the fallback
// alone (every write conditioned on the exact old values, lost races
// re-applied to the item the failed condition returns). 16 goroutines x 8
// calls on a bucket of 20 that refills 5 every 10 ms of caller time, all
// calls at four instants 10 ms apart, allow exactly 20 + 3*5. (Exact
// writes admit one writer a round: with 64 goroutines a step's calls ran
// out their deadlines on a loaded host; see limitertest.Hammer.) The
// item's TTL is on the wall clock, about 1-2 s after its last successful
// write, while a step's denials can take longer than that under load, and
// DynamoDB Local deletes expired items (one 8 s after its last write, in a
// probe): a deleted bucket is a full one, 20 tokens more at the same
// stamp (55 admitted at load 25-27). The store's clock for the TTL is an
// hour ahead, so the item outlives the test.
func TestBucketExactWithRefills(t *testing.T) {
	ahead := func() time.Time { return time.Now().Add(time.Hour) }
	for _, exactOnly := range []bool{false, true} {
		s, r, _ := newStore(t, dynamo.Config{MaxAttempts: 1 << 20, Clock: ahead})
		dynamo.SetExactOnly(s, exactOnly)
		b, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 20, RefillTime: 10 * time.Millisecond, RefillAmount: 5})
		key := limitertest.Key(t)
		var total int64
		for step := range 4 {
			total += limitertest.Hammer(t, b, key, base.Add(time.Duration(step)*10*time.Millisecond), 16, 8)
		}
		if total != 20+3*5 {
			t.Fatalf("exact-only=%v: %d allowed, want exactly 35", exactOnly, total)
		}
		t.Logf("exact-only=%v: %d requests for 512 decisions, %d lost conditions", exactOnly, r.load(), s.Stats().Conflicts)
	}
}
