package regions

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestSharesTableRaiseFence: through the table, a bucket with leases on a
// store that fences buckets fences its raises (fenceFor): the new item
// takes over rebaseAhead after the old item's fence rose, not at the
// validity of the entries published before (about 0.75 s later), while
// a lowering still waits for it. Region 0 of two (a bucket of 220
// refilled 10 a millisecond), its late process holding a lease on the
// old item and the entry read before the raise (Refresh 900 ms), raises
// its share to 200 (called directly, as a tick's give would after a
// grant); 40 ms past the new item's first stamp (the new item full) the
// late process decides until its first denial: the lease's last units
// without the store, then, refused by the fence, on the new item, which
// holds the old item's leased units (holdLeases); then a fresh process. CheckBucketBound on region 0's
// decisions from the new item's first stamp against the new bucket
// (200) finds none over, and a fresh process finds the new item empty.
// brokenRaiseWait (the raise waits, as before): the first stamp is at
// the latest validity, and the test fails on it; brokenLeaseHold: the
// checker sees more than 200 at one stamp; brokenFence (the new item
// takes over as soon as its entry is written, the old item's fence not
// raised: a raise "needs no older entry to expire"): the late process
// decides on the old item by its older entry, beside the new item, and
// the checker sees it. A raise of 3 units with 12 leased (small) waits:
// its hold would cost more than the wait (raiseWorth; brokenRaiseWorth:
// fenced, and the test fails on it).
func TestSharesTableRaiseFence(t *testing.T) {
	client, table := testTable(t)
	warmTable(t, client, table)
	for _, mode := range []string{"rule", "brokenRaiseWait", "brokenLeaseHold", "brokenFence", "small", "brokenRaiseWorth"} {
		t.Run(mode, func(t *testing.T) {
			raiseFenceRun(t, client, table, mode)
		})
	}
	t.Run("lowering", func(t *testing.T) {
		rg, _, _ := newFenceRig(t, client, table, raiseFenceCfg(), 750*time.Millisecond)
		a := rg.agents[0]
		a.tbl.waitLower = true // as NewTableAgent makes it with leases
		rg.tick()
		rg.now = rg.now.Add(30 * time.Millisecond)
		until, raises := a.tbl.maxUntil, a.TableStats().Raises
		if err := a.rebaseTable(t.Context(), rg.now, 20); err != nil {
			t.Fatal(err)
		}
		if from := a.items[1].from; from < until || a.TableStats().Raises != raises {
			t.Errorf("a lowering's new item from %v before the latest validity %v, or fenced (raises %d, before %d)",
				time.Duration(from-rg.now.UnixNano()), time.Duration(until-rg.now.UnixNano()), a.TableStats().Raises, raises)
		}
	})
}

func raiseFenceCfg() Config {
	b := limiter.TokenBucketConfig{Name: "global", MaxAmount: 220, RefillTime: time.Millisecond, RefillAmount: 10}
	return Config{Regions: 2, Key: "k", Bucket: &b, Leases: true}
}

func raiseFenceRun(t *testing.T, client *dynamodb.Client, table, mode string) {
	cfg := raiseFenceCfg()
	rg, tts, sts := newFenceRig(t, client, table, cfg, 750*time.Millisecond)
	a := rg.agents[0]
	a.tbl.waitLower = true // as NewTableAgent makes it with leases
	a.tbl.brokenRaiseWait = mode == "brokenRaiseWait"
	a.tbl.brokenLeaseHold = mode == "brokenLeaseHold"
	a.tbl.brokenFence = mode == "brokenFence"
	a.tbl.brokenRaiseWorth = mode == "brokenRaiseWorth"
	to := int64(200)
	if mode == "small" || mode == "brokenRaiseWorth" {
		to = 112 // 3 units, less than the 12 leased
	}
	lt := tts[0]
	lt.Refresh = 900 * time.Millisecond
	late, err := NewProcess(cfg, lt, sts[0])
	if err != nil {
		t.Fatal(err)
	}
	rg.tick()
	for range 6 {
		rg.now = rg.now.Add(5 * time.Millisecond)
		rg.decideBy(late, 3)
	}
	leased, err := a.leasedAt(t.Context(), a.items[0], rg.now.UnixNano())
	if err != nil || leased == 0 {
		t.Fatalf("the late process holds no lease on the region's item (%d, %v)", leased, err)
	}
	old, until, at := a.items[0].share, a.tbl.maxUntil, rg.now
	a.tbl.started = time.Now()
	if err := a.rebaseTable(t.Context(), rg.now, to); err != nil {
		t.Fatal(err)
	}
	if err := a.fenceRebase(t.Context(), rg.now); err != nil {
		t.Fatal(err)
	}
	s, ts := a.items[1].from, a.TableStats()
	ahead, wait := time.Duration(s-at.UnixNano()), time.Duration(until-at.UnixNano())
	early := s < until
	if to < 200 {
		t.Logf("%s: share %d raised to %d with %d leased on the old item; new item from %v after the raise's tick (latest validity %v), raised %d fences",
			mode, old, to, leased, ahead, wait, ts.Raises)
		switch {
		case mode == "small" && (early || ts.Raises > 0):
			t.Errorf("a raise of 3 units fenced with 12 leased: the hold costs more than the wait")
		case mode == "brokenRaiseWorth" && !early:
			t.Errorf("brokenRaiseWorth: the raise waited: the test cannot fail")
		case mode == "brokenRaiseWorth":
			t.Logf("brokenRaiseWorth: a raise of 3 units fenced, holding 12 (the test fails on it)")
		}
		return
	}
	if mode == "brokenRaiseWait" {
		t.Logf("brokenRaiseWait: new item from %v after the raise's tick (latest validity %v)", ahead, wait)
		if early {
			t.Errorf("brokenRaiseWait: the raise took over %v ahead, before the latest validity: the test cannot fail", ahead)
		} else {
			t.Logf("brokenRaiseWait: the raise waits for the latest validity (the test fails on it)")
		}
		return
	}
	from := len(rg.calls)
	rg.now = time.Unix(0, s).Add(40 * time.Millisecond)
	got := rg.decideBy(late, 250)
	fresh, err := NewProcess(cfg, tts[0], sts[0])
	if err != nil {
		t.Fatal(err)
	}
	gotFresh := rg.decideBy(fresh, 250)
	after := rg.callsSince(from, s)
	over := limitertest.CheckBucketBound(after, cfg.bucketFor(200, false))
	t.Logf("%s: share %d raised to 200 with %d leased on the old item; new item from %v after the raise's tick (latest validity %v), held %d; 40 ms past it the late process admitted %d (refused by the fence %d times), then a fresh one %d; over: %d",
		mode, old, leased, ahead, wait, ts.Held, got, late.Stats().Fenced, gotFresh, len(over))
	if mode != "rule" {
		if len(over) == 0 {
			t.Errorf("%s: region 0 admitted %d from its new item's first stamp on, within its new bucket", mode, got+gotFresh)
		} else {
			t.Logf("%s: over the new bucket, %v (the test fails on it)", mode, over[0])
		}
		return
	}
	if !early || ts.Raises == 0 || ts.Held == 0 {
		t.Errorf("the raise took over %v ahead (latest validity %v ahead), raised %d fences, held %d: want it fenced, before the validity, holding the leases",
			ahead, wait, ts.Raises, ts.Held)
	}
	for _, v := range over {
		t.Errorf("over the new bucket: %v", v)
	}
}
