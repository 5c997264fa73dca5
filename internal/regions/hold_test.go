package regions

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// holdAgent is region 0 of three through the table (no request is made:
// the tests call lowerTable and its helpers alone), a window of 1,000 in
// 5 s, holding s units with a demand estimate of est, its entries valid
// until until.
func holdAgent(t *testing.T, s int64, est float64, until int64) *Agent {
	t.Helper()
	cfg := Config{Regions: 3, Key: "k", Limit: 1000, Window: 5 * time.Second, SubWindows: 5}
	tt := Table{Client: dynamodb.New(dynamodb.Options{}), Table: "t", Name: "hold", Region: 0, Refresh: 100 * time.Millisecond,
		Flush: 100 * time.Millisecond, Validity: time.Second, Deadline: time.Second, LockLife: 750 * time.Millisecond}
	a, err := NewTableAgent(cfg, tt, "h", memStore(t))
	if err != nil {
		t.Fatal(err)
	}
	a.owned, a.states[0].Demand, a.stats.Ticks = s, est, 10
	a.tbl.maxUntil, a.tbl.started = until, time.Now()
	a.tbl.fenced = false // the wait (a store that does not fence)
	return a
}

// TestSharesTableHold: through the table, a window's lowering withholds
// what the region's own demand leaves once the plan asks anything, or
// once a tick's count falls far below the estimate, not only what the
// plan asks (holdFor). The demand moves away from region 0, which holds
// 974 units (the benchmark's moving split):
//
//   - asks-more: its estimate fell to 4 a second; its plan asks 534 at
//     a tick (the others' demands it reads are a lag old: it splits them
//     between regions 1 and 2) and 949 1.25 s later (region 2's demand
//     read). At the tick the first lowering is ready (a validity and a
//     deadline after its tick), the plan's 949 may be given but for the
//     units its own demand needs (914, 974 less the need of 4 a second:
//     60), where withholding only what the plan asks (brokenHold) gives
//     534 there and the rest a validity and a deadline after the second
//     ask;
//   - falls: the tick counts 4 a second where the estimate is 235 (a
//     first such tick: the estimate is weighed at the bound, 221, and
//     the plan asks nothing): the 914 are withheld from that tick's
//     lowering, a tick sooner than the estimate's fall (brokenHold:
//     none); a next tick back at 235 releases them all (no grant asked:
//     a blip costs the region nothing but the entries published
//     meanwhile, which show the lower cap from a stamp a validity on).
func TestSharesTableHold(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t0 := time.Unix(1000, 0)
		at := func(d time.Duration) time.Time { return t0.Add(d) }
		t.Run("asks-more/broken="+map[bool]string{false: "false", true: "true"}[broken], func(t *testing.T) {
			a := holdAgent(t, 974, 4, at(750*time.Millisecond).UnixNano())
			a.brokenHold, a.brokenReady = broken, true // ready only past Ready: the times are simulated
			if got, _ := a.lowerTable(at(0), []int64{0, 267, 267}, 534); got != 0 {
				t.Fatalf("given %d at once, want none (the lowering waits)", got)
			}
			a.tbl.maxUntil = at(2 * time.Second).UnixNano() // the entries published since
			if got, _ := a.lowerTable(at(1250*time.Millisecond), []int64{0, 0, 949}, 949); got != 0 {
				t.Fatalf("given %d before the first lowering is ready, want none", got)
			}
			got, _ := a.lowerTable(at(1760*time.Millisecond), []int64{0, 0, 949}, 949)
			t.Logf("given %d at the first lowering's Ready; withheld %d in %+v", got, a.pending, a.tbl.lows)
			if want := int64(914); got != want {
				if broken {
					t.Logf("brokenHold: given %d, want %d (the test fails on it)", got, want)
					return
				}
				t.Errorf("given %d when the first lowering is ready, want %d", got, want)
			} else if broken {
				t.Errorf("brokenHold gives %d as the rule does: the test cannot fail", got)
			}
		})
		t.Run("falls/broken="+map[bool]string{false: "false", true: "true"}[broken], func(t *testing.T) {
			a := holdAgent(t, 974, 235, at(750*time.Millisecond).UnixNano())
			a.brokenHold = broken
			a.mu.Lock()
			a.states[0].Demand = a.nextDemand(235, 1, 0.25) // 4 a second
			est, falling := a.states[0].Demand, a.falling
			a.mu.Unlock()
			a.lowerTable(at(0), []int64{0, 0, 0}, 0)
			t.Logf("estimate %.1f, falling %v: withheld %d in %+v", est, falling, a.pending, a.tbl.lows)
			if !falling || est < 200 {
				t.Fatalf("the tick's count: estimate %.1f, falling %v; want the bound (above 200) and falling", est, falling)
			}
			want := []lowering{{Units: 914, From: at(750 * time.Millisecond).UnixNano(), Ready: at(1750 * time.Millisecond).UnixNano()}}
			if len(a.tbl.lows) != 1 || a.tbl.lows[0] != want[0] {
				if broken {
					t.Logf("brokenHold: lowerings %+v, want %+v (the test fails on it)", a.tbl.lows, want)
					return
				}
				t.Errorf("lowerings after a falling tick %+v, want %+v", a.tbl.lows, want)
			} else if broken {
				t.Errorf("brokenHold withholds as the rule does: the test cannot fail")
			}
			a.mu.Lock()
			a.states[0].Demand = a.nextDemand(a.states[0].Demand, 59, 0.25) // back at 235 a second
			a.mu.Unlock()
			a.lowerTable(at(250*time.Millisecond), []int64{0, 0, 0}, 0)
			if a.pending != 0 || len(a.tbl.lows) != 0 {
				t.Errorf("a tick back at the estimate keeps %d withheld in %+v, want none", a.pending, a.tbl.lows)
			}
		})
	}
}

// TestSharesTableReady: a tick finds its lowering's Ready a few
// milliseconds ahead (Ready is a validity and a deadline past a save
// made late in an earlier tick, which ticks as regular as the stamps
// reach within the tick's own time): it counts the lowering as ready
// and waits until then (waitReady) before it reads its count, where
// before (brokenReady) the grant waited for the next tick.
func TestSharesTableReady(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "rule", true: "broken"}[broken], func(t *testing.T) {
			now := time.Now()
			a := holdAgent(t, 974, 4, now.UnixNano())
			a.brokenReady = broken
			ready := now.Add(20 * time.Millisecond).UnixNano()
			a.tbl.lows, a.pending = []lowering{{Units: 900, From: ready - int64(time.Second), Ready: ready}}, 900
			got, by := a.lowerTable(now, []int64{0, 0, 900}, 900)
			if broken {
				if got != 0 {
					t.Errorf("brokenReady gives %d before Ready: the test cannot fail", got)
				}
				t.Logf("brokenReady: given %d (the test fails on it)", got)
				return
			}
			if got != 900 || by != ready {
				t.Fatalf("given %d, ready by %d; want 900 by %d", got, by, ready)
			}
			if err := a.waitReady(t.Context(), now, by); err != nil {
				t.Fatal(err)
			}
			if s := a.tbl.stamp(now); s < ready {
				t.Errorf("waited until %d, before Ready %d", s, ready)
			}
		})
	}
}

// TestTableAgentFences: a table agent of a window fences where its store
// does (storage.Fencer: the memory store) and keeps the wait where it
// does not (the same store behind a Counter alone); a bucket's fences
// where its store fences buckets (storage.BucketFencer) and, with leases,
// where a test enables it: its raises only (Table.FenceRaises, waitLower)
// or every rebase (Table.fenceLeased); it keeps the wait otherwise.
func TestTableAgentFences(t *testing.T) {
	tt := Table{Client: dynamodb.New(dynamodb.Options{}), Table: "t", Name: "fences", Region: 0}
	lt := tt
	lt.fenceLeased = true
	rt := tt
	rt.FenceRaises = true
	window := Config{Regions: 2, Key: "k", Limit: 100, Window: time.Second, SubWindows: 10}
	bucket := Config{Regions: 2, Key: "k", Bucket: &limiter.TokenBucketConfig{MaxAmount: 22, RefillAmount: 1, RefillTime: 100 * time.Millisecond}}
	bucketLeases := bucket
	bucketLeases.Leases = true
	for _, c := range []struct {
		name  string
		cfg   Config
		tt    Table
		store any
		want  bool
		lower bool // waitLower
	}{
		{"window/fencer", window, tt, memStore(t), true, false},
		{"window/counter", window, tt, struct{ storage.Counter }{memStore(t)}, false, false},
		{"bucket/fencer", bucket, tt, memStore(t), true, false},
		{"bucket/leases", bucketLeases, tt, memStore(t), false, false},
		{"bucket/leases/raises", bucketLeases, rt, memStore(t), true, true},
		{"bucket/leases/enabled", bucketLeases, lt, memStore(t), true, false},
		{"bucket/counter", bucket, tt, struct {
			storage.BucketStore
			storage.Fencer
		}{memStore(t), memStore(t)}, false, false},
	} {
		a, err := NewTableAgent(c.cfg, c.tt, "h", c.store)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if a.tbl.fenced != c.want || a.tbl.fenced && a.tbl.waitLower != c.lower {
			t.Errorf("%s: fenced %v, lowerings wait %v; want %v, %v", c.name, a.tbl.fenced, a.tbl.waitLower, c.want, c.lower)
		}
	}
}
