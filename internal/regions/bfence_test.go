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

// TestSharesTableOverlap: a bucket of 220 (200 units shared) refilled
// 1,000 a second, on stores that fence buckets, without leases, as
// TestSharesTableBucketFence ten times over. Region 1 spends all it can;
// region 0's process spends at once (and reads its entry, held: Refresh
// 900 ms), then idles, and region 0 gives region 1 its surplus. Its
// holder stops after the save that publishes the rebase, before the raise
// (stopEarly): the raise is left to the carry, 130 ms past the new item's
// first stamp (at). Before the raise, region 0's process decides by the
// entry it holds on the old item: all it can at the rebase's tick (before
// at: the old item is emptied), then one unit at a stamp 110 ms past at,
// which lands before the raise: it refilled the old item at its old rate
// past at. The carry claims the old item at at, behind its clock, so it
// holds those refills: with the overlap it leaves them behind, and the old
// item gives from at on (the carry and the late decision) at most its
// free tokens at at, its refills since it was emptied, which the bound
// rests on (the new item and the grant refill from at). brokenOverlap: the
// carry moves them, several times those free tokens. The whole bucket is
// checked never over too (CheckBucketBound), but that check does not fail
// on brokenOverlap here: what the carry moves past the new item's room
// goes with the grant, capped at what the grant would have held, and the
// run's slack (the 20 units not shared, the raise's losses) is larger than
// the rest; the logs give its margin on the worst interval and the whole
// run.
func TestSharesTableOverlap(t *testing.T) {
	client, table := testTable(t)
	warmTable(t, client, table)
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			overlapRun(t, client, table, broken)
		})
	}
}

// overlapRun's figures, for overlapCheck.
type overlapRun1 struct {
	got0, got1, late, steps int
	at                      int64
	moved, left, free       int64
}

func overlapRun(t *testing.T, client *dynamodb.Client, table string, broken bool) {
	b := limiter.TokenBucketConfig{Name: "global", MaxAmount: 220, RefillTime: time.Millisecond, RefillAmount: 1}
	cfg := Config{Regions: 2, Key: "k", Bucket: &b}
	rg, _, _ := newFenceRig(t, client, table, cfg, 750*time.Millisecond)
	giver := rg.agents[0]
	giver.tbl.brokenOverlap = broken
	giver.tbl.stopEarly = true
	step := func(d time.Duration) {
		// Never behind the wall clock (TestSharesTableBucketFence).
		if rg.now = rg.now.Add(d); rg.now.Before(time.Now()) {
			rg.now = time.Now()
		}
	}
	rg.tick()
	step(10 * time.Millisecond)
	var r overlapRun1
	r.got1 += rg.decide(1, 300)
	r.got0 += rg.decide(0, 300) // region 0's process reads its entry, held 900 ms
	var old limiter.TokenBucketConfig
	for ; r.at == 0 && r.steps < 16; r.steps++ {
		step(50 * time.Millisecond)
		r.got1 += rg.decide(1, 300) // all it can
		rg.tick()
		giver.mu.Lock()
		if len(giver.items) > 1 {
			r.at, old = giver.items[1].from, giver.items[0].cfg
		}
		giver.mu.Unlock()
	}
	if ts := giver.TableStats(); r.at == 0 || ts.Early == 0 || ts.Raises >= ts.Early {
		t.Fatalf("region 0 made no rebase, or did not stop before its raise: %+v, table %+v", giver.Stats(), ts)
	}
	giver.tbl.stopEarly = false
	drained := rg.now
	r.got0 += rg.decide(0, 300) // at the rebase's tick, before at: empties the old item
	step(time.Duration(r.at-rg.now.UnixNano()) + 110*time.Millisecond)
	r.got1 += rg.decide(1, 300)
	rg.tick(rg.agents[1])
	r.late = rg.decide(0, 1) // past at, by the old entry, before the raise
	r.got0 += r.late
	step(20 * time.Millisecond)
	before := giver.TableStats()
	rg.tick() // the carry: raise, claim at at
	carry := giver.TableStats()
	if carry.Carries == before.Carries || carry.Raises == before.Raises {
		t.Fatalf("region 0's carry was not made: %+v", carry)
	}
	// The old item's free tokens at at: its refills since it was
	// emptied, the grid steps in (drained, at].
	r.free = (int64(time.Duration(r.at-drained.UnixNano())/old.RefillTime) + 1) * old.RefillAmount
	r.moved, r.left = carry.Moved-before.Moved, carry.Overlap-before.Overlap
	for range 5 {
		step(100 * time.Millisecond)
		r.got0 += rg.decide(0, 100)
		r.got1 += rg.decide(1, 300)
		rg.tick()
	}
	overlapCheck(t, rg, giver, b, broken, r)
}

// overlapCheck is TestSharesTableOverlap's verdict on a run.
func overlapCheck(t *testing.T, rg *fenceRig, giver *Agent, b limiter.TokenBucketConfig, broken bool, r overlapRun1) {
	t.Helper()
	ts := giver.TableStats()
	over := limitertest.CheckBucketBound(rg.calls, b)
	t.Logf("rebase at %v after %d steps; region 0 admitted %d, region 1 %d; region 0's process %+v; giver's table %+v; the bound's margin %d on the worst interval, %d on the whole run",
		time.Unix(0, r.at).Format("15:04:05.000"), r.steps, r.got0, r.got1, rg.procs[0].Stats(), ts, bucketMargin(rg.calls, b), wholeMargin(rg.calls, b))
	t.Logf("the carry moved %d and left %d behind; the late decision took %d; the old item's free tokens at at %d",
		r.moved, r.left, r.late, r.free)
	gave := r.moved + int64(r.late)
	if broken {
		if gave <= r.free {
			t.Errorf("brokenOverlap: the old item gave %d from at on, within its free tokens at at (%d)", gave, r.free)
		} else {
			t.Logf("brokenOverlap: the old item gave %d from at on, its free tokens at at %d (the test fails on it); %d intervals over the bucket", gave, r.free, len(over))
		}
		return
	}
	for _, v := range over {
		t.Errorf("over the bucket: %v", v)
	}
	if gave > r.free {
		t.Errorf("the old item gave %d from at on (carry %d, the late decision %d), more than its free tokens at at (%d)", gave, r.moved, r.late, r.free)
	}
	if r.left == 0 || r.late == 0 {
		t.Errorf("the carry left no overlap behind (%d), or the late decision took nothing (%d): %+v", r.left, r.late, ts)
	}
}

// bucketMargin is how far below the bound the calls' worst interval is
// (negative: over by that much).
func bucketMargin(calls []limitertest.Call, b limiter.TokenBucketConfig) int64 {
	if len(limitertest.CheckBucketBound(calls, b)) > 0 {
		for m := int64(1); ; m++ {
			c := b
			c.MaxAmount += m
			if len(limitertest.CheckBucketBound(calls, c)) == 0 {
				return -m
			}
		}
	}
	var m int64
	for ; m < b.MaxAmount; m++ {
		c := b
		c.MaxAmount -= m + 1
		if len(limitertest.CheckBucketBound(calls, c)) > 0 {
			break
		}
	}
	return m
}

// wholeMargin is how far below the bound the calls' whole run is.
func wholeMargin(calls []limitertest.Call, b limiter.TokenBucketConfig) int64 {
	var lo, hi time.Time
	var n int64
	for _, c := range calls {
		if !c.Allowed {
			continue
		}
		if lo.IsZero() || c.Stamp.Before(lo) {
			lo = c.Stamp
		}
		if c.Stamp.After(hi) {
			hi = c.Stamp
		}
		n += c.Cost
	}
	return b.MaxAmount + int64(hi.Sub(lo)/b.RefillTime)*b.RefillAmount + 1 - n
}
