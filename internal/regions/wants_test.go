package regions

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
)

// harness starts the three-region harness (lag) with a replicated table
// and returns it, a client of each region and the table (skips under
// -short).
func harness(t *testing.T, lag time.Duration) (*testserver.Regions, []*dynamodb.Client, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("the three-region harness")
	}
	g := testserver.StartRegions(t, testserver.RegionsConfig{Lag: lag})
	table := fmt.Sprintf("sluice-wants-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var cs []*dynamodb.Client
	for i := range g.Len() {
		c := dynamodb.New(dynamodb.Options{BaseEndpoint: aws.String(g.Endpoint(i)), Region: "us-east-1",
			Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
				return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "test"}, nil
			})})
		if err := dynamo.CreateTable(ctx, c, table); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	if err := g.Replicate(ctx, table); err != nil {
		t.Fatal(err)
	}
	return g, cs, table
}

// sweepLog is one region's sweeps: when each started and what it did.
type sweepLog struct {
	at []time.Time
	st []SweepStats
}

// TestWantsExpire: on the harness (lag 200 ms), region 0 decides a key
// until it lists it as wanted, then stops deciding it (its traffic went
// away: its agent is ticked no more, so it never removes the listing).
// Regions 1 and 2 sweep every 250 ms, as a keeper does. The listing goes
// out of force WantsLife (2 s here) after it was written: from then on
// (plus the lag and a margin) the other regions' sweeps read the key as
// out of force (Expired) and no longer as wanted, and region 0's next
// prune removes it from its index. What the listed key cost the other
// regions after region 0 stopped (their ticks of it, their requests at
// the gates) is logged and bounded. A broken reader that ignores the
// stamps reads the key as wanted to the end (the check sees it). Region
// 0's demand follows the time its calls take (wantsDemand), and a run in
// which a region never read the listing in force (a tick on a loaded host
// wrote it late) checked nothing and runs again (wantsAttempts at most).
func TestWantsExpire(t *testing.T) {
	g, clients, table := harness(t, wantsLag)
	cfg := Config{Regions: 3, Limit: 300, Window: time.Second, SubWindows: 10}
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			for attempt := 1; !wantsRun(t, g, clients, table, cfg, broken); attempt++ {
				if attempt == wantsAttempts {
					t.Fatalf("the other regions never read the listing in force in %d runs", attempt)
				}
			}
		})
	}
}

// wantsLag is TestWantsExpire's harness lag; wantsAttempts the most runs
// it makes for one whose listing reached the other regions in force.
const (
	wantsLag      = 200 * time.Millisecond
	wantsAttempts = 3
)

// wantsRun is a run of TestWantsExpire on a fresh prefix: false if the
// other regions never read the listing in force (it checked nothing).
func wantsRun(t *testing.T, g *testserver.Regions, clients []*dynamodb.Client, table string, cfg Config, broken bool) bool {
	t.Helper()
	const (
		lag   = wantsLag
		life  = 2 * time.Second
		tick  = 250 * time.Millisecond
		after = time.Second // margin past the listing's end and the lag
	)
	ctx := t.Context()
	prefix := fmt.Sprintf("wants-%v-%d:", broken, time.Now().UnixNano())
	var (
		keys     [3]*Keys
		repMu    sync.Mutex
		reported [3]Counts // what Report was given, summed
		reports  [3]int
	)
	for r := range keys {
		k, err := NewKeys(KeysConfig{Config: cfg, Table: Table{Client: clients[r], Table: table, Region: r}, Prefix: prefix,
			Store: memStore(t), Holder: fmt.Sprintf("r%d", r), Tick: tick, WantsLife: life, ReportEvery: time.Second,
			Report: func(_ time.Time, c Counts) {
				repMu.Lock()
				defer repMu.Unlock()
				reported[r].add(c)
				reports[r]++
			}})
		if err != nil {
			t.Fatal(err)
		}
		k.brokenExpiry = broken && r != 0
		keys[r] = k
	}
	// Regions 1 and 2 sweep until stop is closed; they count in
	// lateN their sweeps that started past endNs (the listing's
	// end, the lag and the margin, Unix ns; 0 until listed).
	stop := make(chan struct{})
	var (
		wg    sync.WaitGroup
		logs  [3]sweepLog
		endNs atomic.Int64
		lateN [3]atomic.Int64
	)
	for r := 1; r < 3; r++ {
		wg.Go(func() {
			for {
				now := time.Now()
				st, _ := keys[r].Sweep(ctx, now) // errors counted in st
				logs[r].at = append(logs[r].at, now)
				logs[r].st = append(logs[r].st, st)
				if e := endNs.Load(); e != 0 && now.UnixNano() > e {
					lateN[r].Add(1)
				}
				select {
				case <-stop:
					return
				case <-time.After(time.Until(now.Add(tick))):
				}
			}
		})
	}
	listedAt, err := wantsDemand(t, keys[0], cfg)
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	marks := [3]int{g.Gate(0).Len(), g.Gate(1).Len(), g.Gate(2).Len()}
	// Region 0's traffic stops; the others sweep past the
	// listing's end, the lag and the margin, and 750 ms more, and
	// each at least wantsLateSweeps times past it (a loaded host
	// sweeps late), for at most a minute more.
	expired := listedAt.Add(life + lag + after)
	endNs.Store(expired.UnixNano())
	time.Sleep(time.Until(expired.Add(750 * time.Millisecond)))
	for end := time.Now().Add(time.Minute); time.Now().Before(end) &&
		(lateN[1].Load() < wantsLateSweeps || lateN[2].Load() < wantsLateSweeps); time.Sleep(tick) {
	}
	close(stop)
	wg.Wait()
	var idle [3]int
	for r := range idle {
		idle[r] = g.Gate(r).Len() - marks[r]
	}
	// The premise: each other region read the listing in force (on a
	// loaded host a tick may write it with a stamp already a life old, or
	// the harness replicate it as late); else the run checked nothing of
	// its end, and runs again.
	for r := 1; r < 3; r++ {
		var wanted int64
		for _, st := range logs[r].st {
			wanted += st.Wanted
		}
		if wanted == 0 {
			t.Logf("region %d never read the listing in force in %d sweeps", r, len(logs[r].st))
			return false
		}
	}
	for r := 1; r < 3; r++ {
		// The counts reported (every second, and at a flush)
		// are the sweeps': every tick here is a sweep's.
		keys[r].Flush(time.Now())
		var sum SweepStats
		for _, st := range logs[r].st {
			sum.add(st)
		}
		repMu.Lock()
		rc, n := reported[r], reports[r]
		repMu.Unlock()
		t.Logf("region %d: %d reports: %+v", r, n, rc)
		if n < 2 || rc.Sweeps != sum.Sweeps || rc.Ticks != sum.Ticks || rc.Expired != sum.Expired || rc.Wanted == 0 {
			t.Errorf("region %d: reported %+v in %d reports; its sweeps: %+v", r, rc, n, sum)
		}
		var ticks, late, wantedLate, expiredLate int64
		lateSweeps := 0
		for i, at := range logs[r].at {
			st := logs[r].st[i]
			if at.After(listedAt) {
				ticks += st.Ticks
			}
			if at.After(expired) {
				lateSweeps++
				late += st.Ticks
				wantedLate += st.Wanted
				expiredLate += st.Expired
			}
		}
		st, _ := keys[r].Stats("hot")
		t.Logf("region %d: after region 0 stopped: %d ticks, %d requests at its gate; past the listing's end: %d sweeps, %d ticks, wanted %d, out of force %d; agent %+v, table %+v",
			r, ticks, idle[r], lateSweeps, late, wantedLate, expiredLate, st.Agent, st.Table)
		if broken {
			if wantedLate == 0 {
				t.Errorf("region %d: readers that ignore the stamps no longer read the key as wanted past its listing's end", r)
			}
			continue
		}
		if lateSweeps == 0 {
			t.Fatalf("region %d swept nothing past the listing's end", r)
		}
		// The listing reached the region (read in force or out of
		// force: a loaded harness may replicate it late), and
		// nobody removed it (region 0 has not pruned yet): its
		// stamp alone stops the ticks.
		if sum.Wanted+sum.Expired == 0 {
			t.Fatalf("region %d never read the listing (replication): %+v", r, sum)
		}
		if wantedLate != 0 {
			t.Errorf("region %d: past the listing's end, %d sweeps read it as wanted %d times (out of force %d times): want never",
				r, lateSweeps, wantedLate, expiredLate)
		}
		// The bound on an idle listed key: ticked at most every
		// tick while it is in force (its life, the lag and the
		// margin), a few more for a grant under way.
		if most := int64((life+lag+after)/tick) + 6; ticks > most {
			t.Errorf("region %d ticked the key %d times after region 0 stopped, more than %d", r, ticks, most)
		}
	}
	if broken {
		return true
	}
	// Region 0's next prune removes the listing.
	st, err := keys[0].Sweep(ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ls, err := listings(ctx, clients[0], table, prefix, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("region 0's sweep: %+v; its index now %v", st, ls)
	if _, ok := ls["hot"]; ok || st.Pruned != 1 {
		t.Errorf("region 0's prune removed %d listings, and its index holds %v: want the key removed", st.Pruned, ls)
	}
	return true
}

// wantsLateSweeps is the sweeps past a listing's end TestWantsExpire
// waits for in each other region.
const wantsLateSweeps = 2

// wantsDemand decides key "hot" in region 0's Keys k until its agent
// lists it, and returns when it saw it listed. Each call asks for six
// times the share's rate (the limit over the regions, a second) of the
// time since the call before, 3 units at least: the demand stays above
// the share however slowly the calls run (one unit a call read 62.7 a
// second against the share's 100 in a fresh-clone run, and 3 units every
// 5 ms read 1.5 to 8 a second on a host at a load of 28-40, its calls
// taking far longer than 5 ms: neither listed the key). It gives up after
// wantsTicks of the agent's ticks, or ten minutes.
func wantsDemand(t *testing.T, k *Keys, cfg Config) (time.Time, error) {
	ctx := t.Context()
	rate := 6 * float64(cfg.Limit) / float64(cfg.Regions) / cfg.Window.Seconds()
	start := time.Now()
	last := start
	var calls, units int64
	for backstop := last.Add(10 * time.Minute); time.Now().Before(backstop); time.Sleep(5 * time.Millisecond) {
		now := time.Now()
		n := max(3, int64(math.Ceil(rate*now.Sub(last).Seconds())))
		last = now
		if _, err := k.AllowN(ctx, "hot", now, n); err != nil && ctx.Err() != nil {
			return time.Time{}, err
		}
		calls, units = calls+1, units+n
		st, _ := k.Stats("hot")
		if st.Wants.Listed {
			took := time.Since(start)
			t.Logf("region 0 listed the key after %d calls of %d units in %v (%.0f a second), %d ticks of its agent",
				calls, units, took.Round(time.Millisecond), float64(units)/took.Seconds(), st.Agent.Ticks)
			return time.Now(), nil
		}
		if st.Agent.Ticks >= wantsTicks {
			return time.Time{}, fmt.Errorf("region 0 never listed the key in %d of its agent's ticks: %+v", st.Agent.Ticks, st)
		}
	}
	st, _ := k.Stats("hot")
	return time.Time{}, fmt.Errorf("region 0 never listed the key in ten minutes: %+v", st)
}

// wantsTicks bounds the ticks of region 0's agent before it lists.
const wantsTicks = 40

// TestWantsFull: a full index (MaxWants listings) takes a key once
// listings out of force are pruned from it, and refuses it while all are
// in force; a listing renewed meanwhile is never pruned.
func TestWantsFull(t *testing.T) {
	client, table := testTable(t)
	ctx := t.Context()
	prefix := fmt.Sprintf("full-%d:", time.Now().UnixNano())
	life := 10 * time.Second
	now := time.Now().UnixNano()
	// MaxWants listings, half of them out of force.
	m := map[string]types.AttributeValue{}
	for i := range MaxWants {
		at := now
		if i%2 == 0 {
			at = now - int64(2*life)
		}
		m[fmt.Sprintf("k%04d", i)] = n(at)
	}
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table),
		Item: map[string]types.AttributeValue{"pk": wantsItem(prefix, 0)["pk"], "ws": &types.AttributeValueMemberM{Value: m}}}); err != nil {
		t.Fatal(err)
	}
	w := &wantsRef{client: client, table: table, prefix: prefix, key: "new", region: 0, life: life}
	// Renewed before the prune: it stays.
	renew := &wantsRef{client: client, table: table, prefix: prefix, key: "k0000", region: 0, life: life}
	if ok, err := renew.list(ctx, now); err != nil || !ok {
		t.Fatalf("renewing a listed key in a full index: %v, %v", ok, err)
	}
	ok, err := w.list(ctx, now)
	if err != nil || !ok {
		t.Fatalf("listing in a full index with listings out of force: %v, %v", ok, err)
	}
	ls, err := listings(ctx, client, table, prefix, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != MaxWants/2+2 || ls["new"] != now || ls["k0000"] != now {
		t.Errorf("after the prune: %d listings (new %d, k0000 %d), want %d with both at %d", len(ls), ls["new"], ls["k0000"], MaxWants/2+2, now)
	}
	// An index full of listings in force refuses a new key.
	for k := range m {
		m[k] = n(now)
	}
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table),
		Item: map[string]types.AttributeValue{"pk": wantsItem(prefix, 0)["pk"], "ws": &types.AttributeValueMemberM{Value: m}}}); err != nil {
		t.Fatal(err)
	}
	late := &wantsRef{client: client, table: table, prefix: prefix, key: "late", region: 0, life: life}
	if ok, err := late.list(ctx, now); err != nil || ok {
		t.Errorf("listing in an index full of listings in force: %v, %v; want refused", ok, err)
	}
	if err := late.unlist(ctx); err != nil {
		t.Errorf("removing a key not listed: %v", err)
	}
}

// TestStaleEntries: an agent counts the other regions' entries that show
// demand and were published more than StaleEntry before.
func TestStaleEntries(t *testing.T) {
	a, err := NewAgent(Config{Regions: 3, Key: "k", Limit: 100, Window: time.Second, SubWindows: 10}, 0, &tableLedger{}, memStore(t))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().UnixNano()
	a.states[0] = State{Seq: 9, Demand: 5, At: t0 - int64(time.Hour)} // its own: never counted
	a.states[1] = State{Seq: 3, Demand: 5, At: t0}
	a.states[2] = State{Seq: 1, At: t0} // no demand
	for _, tc := range []struct {
		after time.Duration
		want  int64
	}{{0, 0}, {StaleEntry / 2, 0}, {StaleEntry + time.Second, 1}} {
		if got := a.staleEntries(t0 + int64(tc.after)); got != tc.want {
			t.Errorf("%v after: %d stale, want %d", tc.after, got, tc.want)
		}
	}
}

// TestShortHeld: a listed key is held (neither unlisted nor listed
// again) for wantsHold after the region was last short, even when no
// plan gives as this tick reads the states (a holder that has just taken
// the role over, before it reads what its predecessor did); not after.
// Three regions of equal demand and shares: no region has a surplus, so
// no plan gives and the region is not short now.
func TestShortHeld(t *testing.T) {
	now := time.Now().UnixNano()
	states := make([]State, 3)
	for i := range states {
		states[i] = State{Demand: 100, Given: make([]int64, 3)}
	}
	for _, c := range []struct {
		name    string
		listed  bool
		shortAt int64
		held    bool
	}{
		{"listed, short a second ago", true, now - int64(time.Second), true},
		{"listed, short longer ago than the hold", true, now - int64(wantsHold) - 1, false},
		{"not listed", false, now - int64(time.Second), false},
	} {
		a := &Agent{cfg: simWindow, r: 0, states: states, tbl: &tableAgent{listed: c.listed, shortAt: c.shortAt}}
		if g := a.cfg.plan(1, states, false); g != nil {
			t.Fatalf("%s: region 1's plan gives %v; the case needs none", c.name, g)
		}
		if short, held := a.short(now); short || held != c.held {
			t.Errorf("%s: short %v, held %v; want false, %v", c.name, short, held, c.held)
		}
	}
}
