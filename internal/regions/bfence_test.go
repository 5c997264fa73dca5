package regions

import (
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// warmTable makes a few ticks on the table: a cold DynamoDB Local's first
// requests take long enough to push the real clock past the simulated
// one's deadlines.
func warmTable(t *testing.T, client *dynamodb.Client, table string) {
	t.Helper()
	warm, err := NewTableAgent(Config{Regions: 2, Key: "k", Limit: 100, Window: time.Second, SubWindows: 10},
		Table{Client: client, Table: table, Name: "warm-" + t.Name(), Region: 0}, "warm", memStore(t))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := warm.Tick(t.Context(), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSharesTableFenceTTL: as TestSharesTableBucketFence (a bucket of 22,
// region 0 idle gives its share to region 1, which spends all it can;
// the rebase fenced), on memory stores whose states expire by the
// simulated clock. Region 0's process holds the entry it read before the
// rebase (Refresh 900 ms) and decides nothing until the carry has claimed
// the old item and the old item's own TTL (its refill from empty) has
// passed since; then it decides 10 units by that entry, on the old item,
// and again twice 100 ms apart.
// The raise and the claim kept the old item and its fence fenceTTL
// (Validity + Deadline + Skew): the decision is refused, read again and
// decided on the new item, and no interval is over the bucket.
// brokenFenceTTL (they keep it for its own TTL): the state is dropped, the
// decisions find a full bucket without a fence and take its old share
// again and its refills at its old rate, and the checker sees an
// interval over.
func TestSharesTableFenceTTL(t *testing.T) {
	client, table := testTable(t)
	warmTable(t, client, table)
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			fenceTTLRun(t, client, table, broken)
		})
	}
}

func fenceTTLRun(t *testing.T, client *dynamodb.Client, table string, broken bool) {
	b := limiter.TokenBucketConfig{Name: "global", MaxAmount: 22, RefillTime: 10 * time.Millisecond, RefillAmount: 1}
	cfg := Config{Regions: 2, Key: "k", Bucket: &b}
	rg, _, _ := newFenceRigClock(t, client, table, cfg, 750*time.Millisecond, true)
	giver := rg.agents[0]
	giver.tbl.brokenFenceTTL = broken
	step := func(d time.Duration) {
		// Never behind the wall clock (TestSharesTableBucketFence).
		if rg.now = rg.now.Add(d); rg.now.Before(time.Now()) {
			rg.now = time.Now()
		}
		rg.sync()
	}
	rg.tick()
	step(10 * time.Millisecond)
	read := rg.now
	rg.decide(0, 1) // region 0's process reads its entry, held 900 ms
	var oldTTL time.Duration
	var carried time.Time
	var got0, got1 int
	for i := 0; carried.IsZero() && i < 8; i++ {
		step(100 * time.Millisecond)
		got1 += rg.decide(1, 30) // all it can
		rg.tick()
		giver.mu.Lock()
		if len(giver.items) > 1 {
			oldTTL = giver.items[0].ttl()
		}
		giver.mu.Unlock()
		if giver.TableStats().Carries > 0 {
			carried = rg.now
		}
	}
	if carried.IsZero() || oldTTL == 0 {
		t.Fatalf("region 0 made and carried no rebase: %+v, table %+v", giver.Stats(), giver.TableStats())
	}
	// Region 1 spends on; region 0's process decides once the old item's
	// own TTL has passed since the claim.
	for rg.now.Sub(carried) <= oldTTL {
		step(min(100*time.Millisecond, oldTTL-rg.now.Sub(carried)+10*time.Millisecond))
		got1 += rg.decide(1, 30)
		rg.tick()
	}
	if held := rg.now.Sub(read); held >= 900*time.Millisecond {
		t.Fatalf("region 0's process would read its entry again (%v after it read it): the host is too slow for this test", held)
	}
	fenced := rg.procs[0].Stats().Fenced
	afterRead, afterClaim := rg.now.Sub(read), rg.now.Sub(carried)
	got0 = rg.decide(0, 10)
	for range 2 {
		step(100 * time.Millisecond)
		got0 += rg.decide(0, 10) // by the old entry still, unless refused
		got1 += rg.decide(1, 30)
		rg.tick()
	}
	ps := rg.procs[0].Stats()
	over := limitertest.CheckBucketBound(rg.calls, b)
	t.Logf("old item's TTL %v; region 0 decided %v after its read, %v after the claim, and twice 100 ms apart: admitted %d (fenced %d times); region 1 admitted %d; giver's table %+v",
		oldTTL, afterRead, afterClaim, got0, ps.Fenced-fenced, got1, giver.TableStats())
	if broken {
		if len(over) == 0 {
			t.Errorf("the old item kept for its own TTL only: no interval over the bucket (region 0 admitted %d)", got0)
		} else {
			t.Logf("brokenFenceTTL: %d intervals over the bucket, the first %v (the test fails on it)", len(over), over[0])
		}
		return
	}
	for _, v := range over {
		t.Errorf("over the bucket: %v", v)
	}
	if ps.Fenced == fenced {
		t.Errorf("region 0's decision by its old entry was not refused by the old item's fence: %+v", ps)
	}
}
