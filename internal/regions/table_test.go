package regions

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// testTable returns a client of the shared DynamoDB Local and a new table
// on it (skips under -short).
func testTable(t *testing.T) (*dynamodb.Client, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("DynamoDB Local")
	}
	endpoint := testserver.DynamoDB(t)
	client := dynamodb.New(dynamodb.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "test"}, nil
		}),
	})
	table := fmt.Sprintf("sluice-regions-%d", time.Now().UnixNano())
	if err := dynamo.CreateTable(t.Context(), client, table); err != nil {
		t.Fatal(err)
	}
	return client, table
}

// TestSharesTableWait: through the table (one DynamoDB Local for both
// regions, no replication lag, a simulated clock), two regions of a
// window of 100 a second, on stores taken as not fencing (the wait path;
// TestSharesTableFence has the fence). Region 1's demand rises; region 0, idle, lowers
// its cap to give its share away, from a stamp E past the validity of
// the entries it published, and may read its count for the grant only
// from E + Deadline. Meanwhile region 0's process decides 50 units at a
// stamp before E, by the cap its entry shows there (50): the grant,
// given after the wait, is in force only once those units leave region
// 0's view, and no window is over. A broken agent whose lowerings are
// ready at once reads its count before those units and gives at once:
// region 1 admits on the grant while region 0's units are in view, and
// the checker sees a window over the limit.
func TestSharesTableWait(t *testing.T) {
	client, table := testTable(t)
	cfg := Config{Regions: 2, Key: "k", Limit: 100, Window: time.Second, SubWindows: 10}
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			ctx := t.Context()
			// The simulated clock starts at the real one and runs ahead
			// of it (a decision's store requests end by its stamp plus
			// the deadline).
			now := time.Now()
			name := fmt.Sprintf("wait-%v-%d", broken, now.UnixNano())
			var agents [2]*Agent
			var procs [2]*Process
			for r := range agents {
				tt := Table{Client: client, Table: table, Name: name, Region: r, Refresh: 100 * time.Millisecond, Flush: 100 * time.Millisecond,
					Validity: time.Second, Deadline: time.Second, LockLife: 750 * time.Millisecond}
				st := memStore(t)
				a, err := NewTableAgent(cfg, tt, fmt.Sprintf("r%d", r), st)
				if err != nil {
					t.Fatal(err)
				}
				a.brokenWait = broken && r == 0
				a.tbl.fenced = false // the wait path: a store that does not fence
				agents[r] = a
				if r == 0 {
					// Region 0's process uses the entry it read for
					// 900 ms (while it is valid).
					tt.Refresh = 900 * time.Millisecond
				}
				if procs[r], err = NewProcess(cfg, tt, st); err != nil {
					t.Fatal(err)
				}
			}
			var calls []limitertest.Call
			decide := func(r, n int) int {
				got := 0
				for range n {
					d, err := procs[r].AllowN(ctx, "k", now, 1)
					if err != nil {
						t.Fatal(err)
					}
					calls = append(calls, limitertest.Call{Key: "k", Cost: 1, Stamp: now, Allowed: d.Allowed, Reached: true})
					if d.Allowed {
						got++
					}
				}
				return got
			}
			tick := func() {
				for _, a := range agents {
					if err := a.Tick(ctx, now); err != nil {
						t.Fatal(err)
					}
				}
			}
			step := func(d time.Duration) { now = now.Add(d) }
			tick()
			// Region 0's process reads its entry (a cap of 50 until the
			// lowering its agent made with it takes effect, a tick on)
			// with its first decision; region 1's process asks 50 in one
			// decision, which writes its demand.
			step(10 * time.Millisecond)
			got0 := decide(0, 1)
			if d, err := procs[1].AllowN(ctx, "k", now, 50); err != nil || !d.Allowed {
				t.Fatalf("region 1's first 50: %+v, %v", d, err)
			}
			calls = append(calls, limitertest.Call{Key: "k", Cost: 50, Stamp: now, Allowed: true, Reached: true})
			// Region 0's agent learns region 1's demand and gives.
			for range 2 {
				step(40 * time.Millisecond)
				tick()
			}
			if w := agents[0].Stats().Withheld; w == 0 {
				t.Fatalf("region 0 withheld nothing after region 1's demand rose: %+v", agents[0].Stats())
			}
			// Region 0's process decides 49 more by the entry it holds
			// (stamps before the lowering takes effect: a cap of 50);
			// region 1 decides on what it holds.
			step(40 * time.Millisecond)
			got0 += decide(0, 49)
			got1 := decide(1, 100)
			over := limitertest.CheckTrailingWindow(calls, cfg.Limit, cfg.Window)
			t.Logf("region 0 admitted %d, then region 1 %d; region 0: %+v, table %+v; region 1: %+v", got0, got1, agents[0].Stats(), agents[0].TableStats(), agents[1].Stats())
			if broken {
				if len(over) == 0 {
					t.Errorf("lowerings ready at once: no window over the limit (region 0 admitted %d, region 1 %d)", got0, got1)
				}
				return
			}
			for _, v := range over {
				t.Errorf("over the limit: %v", v)
			}
			if got0 != 50 {
				t.Errorf("region 0 admitted %d before its lowering took effect, want 50", got0)
			}
			// Past the wait and the view of region 0's units (region 1
			// still asking), region 1 holds the grant.
			for range 12 {
				step(250 * time.Millisecond)
				decide(1, 25)
				tick()
			}
			// Region 1's demand counts at the rate (90.9 a second) in the
			// plans, region 0's about 5: region 1's target is about 95.
			if s, _ := agents[1].Share(); s < 85 {
				t.Errorf("region 1 holds %d after the wait, want 85 or more: region 0 %+v", s, agents[0].Stats())
			}
			for _, v := range limitertest.CheckTrailingWindow(calls, cfg.Limit, cfg.Window) {
				t.Errorf("over the limit: %v", v)
			}
		})
	}
}

// TestSharesTableFence: as TestSharesTableWait, on stores that fence
// (storage.Fencer): region 0's agent, giving its share to region 1,
// publishes its lowered cap in force at every stamp of the entry that
// carries it, raises its counters' fence to that entry's fence number,
// reads its count and gives, all in the tick that withheld the units (no
// validity or deadline waited). Region 0's process still holds the entry
// read before (Refresh 900 ms: a cap of 50, a lower fence number) and
// decides 49 units by it after the grant: the first is refused by the
// fence (nothing taken), the process reads its entry again at once and
// decides by the new one (its cap lowered), and so do the rest; region
// 1 admits on the grant at once, and no window is over. brokenFence (the
// grant made without raising the fence): the 49 land under the old cap
// beside region 1's grant, and the checker sees a window over the limit.
// With leases, the processes take leases under their caps: a lease take
// is fenced as a decision's add is. "successor": region 0's holder stops
// after publishing the lowering, before it raises the fence; a second
// agent of the region takes the role once it lapses, resumes the
// lowering, raises the fence and gives (brokenFence: it gives without
// raising it, and the window is over).
func TestSharesTableFence(t *testing.T) {
	client, table := testTable(t)
	warmTable(t, client, table)
	for _, mode := range []string{"holder", "leases", "successor"} {
		for _, broken := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/broken=%v", mode, broken), func(t *testing.T) {
				fenceRun(t, client, table, mode, broken)
			})
		}
	}
}

// fenceRig is TestSharesTableFence's two regions, on a simulated clock.
type fenceRig struct {
	t      *testing.T
	now    time.Time
	agents [2]*Agent
	procs  [2]*Process
	calls  []limitertest.Call
	who    []string // the decider of each call (region, or "late")
	// clock is the memory stores' expiry clock, if simulated (newFenceRigClock):
	// rg.now as last synced (sync).
	clock atomic.Int64
}

func newFenceRig(t *testing.T, client *dynamodb.Client, table string, cfg Config, lockLife time.Duration) (*fenceRig, [2]Table, [2]*memory.Store) {
	return newFenceRigClock(t, client, table, cfg, lockLife, false)
}

// newFenceRigClock is newFenceRig, the memory stores' states expiring by
// the rig's clock (sync) if simExpiry, else by the wall clock.
func newFenceRigClock(t *testing.T, client *dynamodb.Client, table string, cfg Config, lockLife time.Duration, simExpiry bool) (*fenceRig, [2]Table, [2]*memory.Store) {
	rg := &fenceRig{t: t, now: time.Now()}
	rg.sync()
	name := fmt.Sprintf("fence-%s-%d", t.Name(), rg.now.UnixNano())
	var tts [2]Table
	var sts [2]*memory.Store
	for r := range rg.agents {
		tt := Table{Client: client, Table: table, Name: name, Region: r, Refresh: 100 * time.Millisecond, Flush: 100 * time.Millisecond,
			Validity: time.Second, Deadline: time.Second, LockLife: lockLife, fenceLeased: true}
		st := memStore(t)
		if simExpiry {
			var err error
			if st, err = memory.New(memory.Config{Clock: func() time.Time { return time.Unix(0, rg.clock.Load()) }}); err != nil {
				t.Fatal(err)
			}
		}
		a, err := NewTableAgent(cfg, tt, fmt.Sprintf("r%d", r), st)
		if err != nil {
			t.Fatal(err)
		}
		if !a.tbl.fenced {
			t.Fatalf("the memory store does not fence (%T)", st)
		}
		rg.agents[r] = a
		if r == 0 {
			tt.Refresh = 900 * time.Millisecond // uses the entry it read while it is valid
		}
		if rg.procs[r], err = NewProcess(cfg, tt, st); err != nil {
			t.Fatal(err)
		}
		tts[r], sts[r] = tt, st
	}
	return rg, tts, sts
}

// sync sets the stores' expiry clock to the rig's (newFenceRigClock).
func (rg *fenceRig) sync() { rg.clock.Store(rg.now.UnixNano()) }

// decide decides n units one at a time in region r at the rig's clock.
func (rg *fenceRig) decide(r, n int) int {
	got := 0
	for range n {
		d, err := rg.procs[r].AllowN(rg.t.Context(), "k", rg.now, 1)
		if err != nil {
			rg.t.Fatal(err)
		}
		rg.calls = append(rg.calls, limitertest.Call{Key: "k", Cost: 1, Stamp: rg.now, Allowed: d.Allowed, Reached: true})
		rg.who = append(rg.who, fmt.Sprintf("region %d", r))
		if d.Allowed {
			got++
		}
	}
	return got
}

// tick ticks the agents given (the rig's by default) at the rig's clock.
func (rg *fenceRig) tick(as ...*Agent) {
	if len(as) == 0 {
		as = rg.agents[:]
	}
	for _, a := range as {
		if err := a.Tick(rg.t.Context(), rg.now); err != nil && !errors.Is(err, errStopped) {
			rg.t.Fatal(err)
		}
	}
}

func fenceRun(t *testing.T, client *dynamodb.Client, table, mode string, broken bool) {
	cfg := Config{Regions: 2, Key: "k", Limit: 100, Window: time.Second, SubWindows: 10, Leases: mode == "leases"}
	lockLife := 750 * time.Millisecond
	if mode == "successor" {
		lockLife = 100 * time.Millisecond // the stopped holder's role lapses soon
	}
	rg, tts, sts := newFenceRig(t, client, table, cfg, lockLife)
	giver := rg.agents[0]
	if mode == "successor" {
		rg.agents[0].tbl.stopEarly = true
		b, err := NewTableAgent(cfg, tts[0], "r0-successor", sts[0])
		if err != nil {
			t.Fatal(err)
		}
		giver = b
	}
	giver.tbl.brokenFence = broken
	rg.tick()
	rg.now = rg.now.Add(10 * time.Millisecond)
	got0 := rg.decide(0, 1)
	if d, err := rg.procs[1].AllowN(t.Context(), "k", rg.now, 50); err != nil || !d.Allowed {
		t.Fatalf("region 1's first 50: %+v, %v", d, err)
	}
	rg.calls = append(rg.calls, limitertest.Call{Key: "k", Cost: 50, Stamp: rg.now, Allowed: true, Reached: true})
	// Region 0's agent learns region 1's demand and gives in the tick
	// that withholds (or stops there: successor).
	for i := range 2 {
		rg.now = rg.now.Add(40 * time.Millisecond)
		if i == 1 && mode == "successor" {
			// Region 1 ticks next with the successor: two ticks in a
			// row without its decisions would take its demand as gone.
			rg.tick(rg.agents[0])
		} else {
			rg.tick()
		}
		if st := rg.agents[0].Stats(); mode != "successor" && st.Withheld > 0 && st.Given == 0 {
			t.Fatalf("region 0 withheld %d and gave nothing in the same tick: %+v, table %+v", st.Withheld, st, rg.agents[0].TableStats())
		}
	}
	if mode == "successor" {
		if ts := rg.agents[0].TableStats(); ts.Early == 0 || rg.agents[0].Stats().Given != 0 {
			t.Fatalf("region 0's holder did not stop after publishing a lowering: %+v, %+v", ts, rg.agents[0].Stats())
		}
		rg.now = rg.now.Add(300 * time.Millisecond) // past the stopped holder's role
		rg.tick(giver, rg.agents[1])
	}
	st0 := giver.Stats()
	if st0.Given == 0 {
		t.Fatalf("region 0 gave nothing after region 1's demand rose: %+v, table %+v", st0, giver.TableStats())
	}
	reads := rg.procs[0].Stats().Reads
	// Region 0's process decides 49 more by the entry it holds (a cap of
	// 50, read before the lowering); region 1 decides on its grant.
	rg.now = rg.now.Add(40 * time.Millisecond)
	got0 += rg.decide(0, 49)
	got1 := rg.decide(1, 100)
	fenceCheck(t, rg, giver, broken, got0, got1, reads)
}

// fenceCheck is TestSharesTableFence's verdict on a run.
func fenceCheck(t *testing.T, rg *fenceRig, giver *Agent, broken bool, got0, got1 int, reads int64) {
	t.Helper()
	ps, st0, ts := rg.procs[0].Stats(), giver.Stats(), giver.TableStats()
	over := limitertest.CheckTrailingWindow(rg.calls, 100, time.Second)
	t.Logf("region 0 gave %d and admitted %d, region 1 admitted %d on it; region 0's process: %+v (reads %d before the 49); giver's table %+v",
		st0.Given, got0, got1, ps, reads, ts)
	if broken {
		if len(over) == 0 {
			t.Errorf("the grant made without raising the fence: no window over the limit (region 0 admitted %d, region 1 %d)", got0, got1)
		} else {
			t.Logf("brokenFence: %d windows over the limit, the first %v (the test fails on it)", len(over), over[0])
		}
		return
	}
	for _, v := range over {
		t.Errorf("over the limit: %v", v)
	}
	if ps.Fenced == 0 || ps.Reads == reads {
		t.Errorf("region 0's process was not refused by the fence and read again: %+v (reads %d before)", ps, reads)
	}
	if got1 == 0 {
		t.Errorf("region 1 admitted nothing on region 0's grant of %d", st0.Given)
	}
	if ts.Raises == 0 {
		t.Errorf("region 0's giver raised no fence: %+v", ts)
	}
}

// TestSharesTableRaise: through the table (as TestSharesTableWait), two
// regions of a bucket of 22 (20 units shared), refilled 10 a second.
// Region 1 spends all it has; region 0, idle, gives it its surplus,
// listing the grant (State.Moves) with the stamp its own rate left (its
// new item's first), and at its carry, a tick later, the tokens it saved
// above its new share go with the grant (Move.Tokens). Region 1's raise
// takes over a validity after its tick, its new item empty there: it
// holds what each grant, a bucket of its units holding its tokens, holds
// from its giver's stamp to the new item's first (min(units, tokens +
// refill)), and the carry adds the old item's free tokens, up to the new
// capacity. The tokens in the new item as it takes over are read from
// the store and must be exactly that count, computed from the stamps;
// they are checked against the bound never over rests on (each grant a
// bucket of its units holding its tokens refilled at their rate while in
// transit, and the old item's tokens).
//
// Without tokens (region 0 carries none, as before: the grants' refill
// in transit alone):
//
//   - in-time: region 1 ticks every 100 ms and takes the grant at its
//     first tick after it is in force;
//   - late: region 1 reads it 600 ms after it is in force (as a
//     replication lag would have it): the transit refill is more than a
//     refill from its tick;
//   - restart: as late, but region 1's save of the raise is lost; a
//     successor takes the role over and makes the raise again: its item
//     holds the refill once, the lost attempt's item is never listed, and
//     the board records the grant as out of transit, so a later rebase
//     credits nothing of it again;
//   - broken-whole: a raise that adds its whole units, refilled or not;
//   - broken-accrued: grants counted as in transit for an hour (full):
//     both put more in the item than the bound (the check sees it).
//
// With tokens:
//
//   - tokens-before: as late: region 1 reads the grant with its tokens
//     and its new item holds min(units, tokens + refill);
//   - tokens-after: region 1 raises before region 0's carry (refill
//     only), reads the tokens at its next tick, the new item still ahead,
//     and adds min(tokens, units - what it credited) once: the same
//     count; later ticks add nothing;
//   - tokens-after-lost: as tokens-after, but the save of the tick that
//     reads the tokens is lost: the next tick, resuming from the item,
//     adds them once;
//   - carry-lost: region 0's save of its carry is lost: the next tick
//     redoes the carry, finds the old item claimed and carries nothing
//     (the tokens are lost, never carried twice): refill only;
//   - broken-late: tokens read after added whole (no cap by what the
//     grant would have held); broken-early: added before the save that
//     records them as taken, which is lost: added twice. Both exceed the
//     bound.
func TestSharesTableRaise(t *testing.T) {
	client, table := testTable(t)
	b := limiter.TokenBucketConfig{Name: "global", MaxAmount: 22, RefillTime: 100 * time.Millisecond, RefillAmount: 1}
	cfg := Config{Regions: 2, Key: "k", Bucket: &b}
	for _, c := range []struct {
		name                 string
		late, restart        bool
		brokenExtra, brokenA bool
		// tokens: region 0 carries tokens; first: region 1 ticks before
		// region 0 (it raises before the carry); loseLate: region 1's
		// save of the tick that reads the tokens is lost; loseCarry:
		// region 0's save of its carry is lost.
		tokens, first, loseLate, loseCarry bool
		brokenLate, brokenEarly            bool
		// giverLate: region 0 does not tick from its grant until region
		// 1 has drained its new item a second after it took over;
		// brokenRoom: tokens read after added without the item's room.
		giverLate, brokenRoom bool
	}{
		{name: "in-time"},
		{name: "late", late: true},
		{name: "restart", late: true, restart: true},
		{name: "broken-whole", brokenExtra: true},
		{name: "broken-accrued", late: true, brokenA: true},
		{name: "tokens-before", late: true, tokens: true},
		{name: "tokens-after", first: true, tokens: true},
		{name: "tokens-after-lost", first: true, tokens: true, loseLate: true},
		{name: "carry-lost", tokens: true, loseCarry: true},
		{name: "broken-late", first: true, tokens: true, brokenLate: true},
		{name: "broken-early", first: true, tokens: true, loseLate: true, brokenEarly: true},
		{name: "tokens-in-force", tokens: true, giverLate: true},
		{name: "broken-room", tokens: true, giverLate: true, brokenRoom: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			now := time.Now()
			name := fmt.Sprintf("raise-%s-%d", c.name, now.UnixNano())
			var agents [2]*Agent
			var procs [2]*Process
			var tts [2]Table
			var stores [2]*memory.Store
			var lossy [2]*loseSave
			for r := range agents {
				tts[r] = Table{Client: client, Table: table, Name: name, Region: r, Refresh: 100 * time.Millisecond, Flush: 100 * time.Millisecond,
					Validity: time.Second, Deadline: time.Second, LockLife: 750 * time.Millisecond}
				tt := tts[r]
				lossy[r] = &loseSave{TableClient: client}
				tt.Client = lossy[r]
				st := memStore(t)
				stores[r] = st
				a, err := NewTableAgent(cfg, tt, fmt.Sprintf("r%d", r), st)
				if err != nil {
					t.Fatal(err)
				}
				a.tbl.fenced = false // the wait path (TestSharesTableBucketFence has the fence)
				a.brokenExtra, a.brokenAccrue = c.brokenExtra, c.brokenA
				a.brokenLate, a.brokenEarly, a.brokenRoom = c.brokenLate, c.brokenEarly, c.brokenRoom
				a.noTokens = !c.tokens
				agents[r] = a
				if procs[r], err = NewProcess(cfg, tts[r], st); err != nil {
					t.Fatal(err)
				}
			}
			// The grant's stamp: its giver's new item's first (0: not
			// given yet).
			givenAt := func() int64 {
				for _, m := range agents[0].states[0].Moves {
					if m.To == 1 {
						return m.At
					}
				}
				return 0
			}
			carryLost, giverBack := false, false
			tickOne := func(r int) {
				t.Helper()
				if r == 0 && c.giverLate && !giverBack && givenAt() != 0 {
					return // region 0 stops ticking once it gave
				}
				if r == 0 && c.loseCarry && !carryLost && givenAt() != 0 && now.UnixNano() >= givenAt() {
					carryLost = true
					lossy[0].lose.Store(true)
					if err := agents[0].Tick(ctx, now); err == nil || !lossy[0].lost.Load() {
						t.Fatalf("region 0's save of its carry was not lost: %v", err)
					}
					return
				}
				if err := agents[r].Tick(ctx, now); err != nil {
					t.Fatal(err)
				}
			}
			tickOne(0)
			tickOne(1)
			// Region 1 spends what it has every 100 ms (its demand is
			// written with its reads) until its raise is under way.
			var raised *bucketItem
			var started time.Time
			var failed int
			for i := 0; raised == nil && i < 60; i++ {
				// Never behind the wall clock: a decision's requests end
				// by its stamp plus the Deadline (a loaded host).
				if now = now.Add(100 * time.Millisecond); now.Before(time.Now()) {
					now = time.Now()
				}
				for range 10 {
					if _, err := procs[1].AllowN(ctx, "k", now, 1); errors.Is(err, storage.ErrUnavailable) {
						failed++ // no valid entry, or past the deadline: as the rule's fail mode
					} else if err != nil {
						t.Fatal(err)
					}
				}
				if !c.first {
					tickOne(0)
				}
				if at := givenAt(); c.late && at != 0 && now.UnixNano() >= at && now.UnixNano() < at+int64(600*time.Millisecond) {
					continue // region 1 reads the grant late
				}
				if c.restart && givenAt() != 0 && now.UnixNano() >= givenAt() {
					lossy[1].lose.Store(true) // the save of the tick that raises
				}
				err := agents[1].Tick(ctx, now)
				a := agents[1]
				a.mu.Lock()
				if len(a.items) > 1 && a.items[1].share > a.items[0].share {
					raised, started = a.items[1], now
				}
				a.mu.Unlock()
				if lossy[1].lost.Load() {
					if raised == nil || err == nil {
						t.Fatalf("a save was lost, yet raised %v, error %v", raised != nil, err)
					}
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if c.first {
					tickOne(0)
				}
			}
			if raised == nil {
				t.Fatalf("region 1 never raised its share: %+v, region 0 %+v", agents[1].Stats(), agents[0].Stats())
			}
			if failed > 0 {
				t.Logf("%d of region 1's decisions failed as an unavailable store (a loaded host)", failed)
			}
			if c.restart {
				// The holder stops; a successor (another process's agent)
				// takes the role once it lapses and makes the raise again.
				lost := raised
				succ, err := NewTableAgent(cfg, tts[1], "r1-next", stores[1])
				if err != nil {
					t.Fatal(err)
				}
				succ.tbl.fenced = false
				succ.noTokens = !c.tokens
				agents[1], raised = succ, nil
				for i := 0; raised == nil && i < 40; i++ {
					now = now.Add(100 * time.Millisecond)
					tickOne(0)
					tickOne(1)
					succ.mu.Lock()
					if len(succ.items) > 1 && succ.items[1].share > succ.items[0].share {
						raised, started = succ.items[1], now
					}
					succ.mu.Unlock()
				}
				if raised == nil || succ.TableStats().Takeovers != 1 {
					t.Fatalf("no successor raised region 1's share: %+v %+v", succ.Stats(), succ.TableStats())
				}
				if raised.key == lost.key {
					t.Fatalf("the successor listed the lost attempt's item %q", lost.key)
				}
				t.Logf("the lost attempt's item %s (never listed) held %d refilled; the successor's is %s", lost.key, lost.extra, raised.key)
			}
			movedBefore := agents[1].TableStats().Moved
			// No decision from here on: the carry is the only change.
			lateLost := false
			for now.UnixNano() < raised.from {
				now = now.Add(100 * time.Millisecond)
				tickOne(0)
				if c.loseLate && !lateLost && agents[0].TableStats().TokensOut > 0 {
					// The save of the tick that reads the tokens.
					lateLost = true
					lossy[1].lose.Store(true)
					if err := agents[1].Tick(ctx, now); err == nil || !lossy[1].lost.Load() {
						t.Fatalf("region 1's save was not lost: %v", err)
					}
					continue
				}
				tickOne(1)
			}
			if c.loseLate && !lateLost {
				t.Fatalf("region 0 carried no tokens before region 1's raise took over: %+v", agents[0].TableStats())
			}
			moved := agents[1].TableStats().Moved - movedBefore
			at := time.Unix(0, raised.from)
			// What the raise's grants held in transit, from the stamps:
			// a grant of g carrying k from its giver's stamp A to at
			// holds min(g, k + floor(g * 1 * (at - A) / (20 * 100 ms))).
			// owed is what the tokens add to a refill-only credit.
			raise := raised.share - cfg.base(1)
			inTransit := func() (transit, tokens, owed int64) {
				var listed int64
				for _, m := range agents[0].states[0].Moves {
					if m.To == 1 && m.Upto <= raise {
						refill := m.Units * (raised.from - m.At) / (cfg.units() * int64(b.RefillTime))
						transit += min(m.Units, m.Tokens+refill)
						listed += m.Units
						tokens += m.Tokens
						owed += min(m.Tokens, m.Units-min(m.Units, refill))
					}
				}
				if listed != raise {
					t.Fatalf("region 0 listed %d units to region 1, the raise is %d", listed, raise)
				}
				return transit, tokens, owed
			}
			if c.giverLate {
				// Region 1 decides on its new item a second after it took
				// over, draining it, before region 0's carry (and the
				// grant's tokens) are read. In memory the item would have
				// held min(19, want + r) by then, r its refills since at
				// (its grid starts there), and a full item drops refill:
				// what region 1 may admit after its drain is at most what
				// that item would hold after it, so the tokens added late
				// must not exceed it.
				for now.UnixNano() < raised.from+int64(time.Second) {
					now = now.Add(100 * time.Millisecond)
					tickOne(1)
				}
				if !raised.heldOK {
					t.Fatalf("region 1's item does not know what it held at its first stamp")
				}
				held := raised.held
				var drained int64
				for range 40 {
					d, err := procs[1].AllowN(ctx, "k", now, 1)
					if err != nil {
						t.Fatal(err)
					}
					if !d.Allowed {
						break
					}
					drained++
				}
				giverBack = true
				tickOne(0)
				tickOne(1)
				transit, tokens, owed := inTransit()
				want := transit + min(moved, raised.share-transit)
				r := (now.UnixNano() - raised.from) / int64(raised.cfg.RefillTime)
				after := min(raised.share, want+r) - drained
				ts1 := agents[1].TableStats()
				t.Logf("region 1's item held %d at its first stamp (%d in memory), %d refills later drained %d; then region 0 carried %d tokens (%d owed): %d added, at most %d",
					held, want, r, drained, tokens, owed, ts1.TokensLate, after)
				if drained != min(raised.share, held+r) {
					t.Errorf("region 1 drained %d, want %d (its item's %d and %d refills)", drained, min(raised.share, held+r), held, r)
				}
				if tokens == 0 || ts1.TokensOwed != owed {
					t.Errorf("region 1 owed %d, want %d (of %d tokens carried)", ts1.TokensOwed, owed, tokens)
				}
				if c.brokenRoom {
					if ts1.TokensLate <= after {
						t.Errorf("tokens added without the room: %d, within what the item would hold (%d)", ts1.TokensLate, after)
					}
				} else if ts1.TokensLate > after {
					t.Errorf("tokens added late: %d, more than the item would hold in memory after the drain (%d)", ts1.TokensLate, after)
				}
				return
			}
			d, err := raised.own.Get(ctx, raised.key, at)
			if err != nil {
				t.Fatal(err)
			}
			transit, tokens, owed := inTransit()
			fromTick := cfg.refilled(raise, at.Sub(started)) // the refill counted from region 1's tick, before
			want := transit + min(moved, raised.share-transit)
			bound := transit + moved
			ts0, ts1 := agents[0].TableStats(), agents[1].TableStats()
			t.Logf("region 1's raise to %d (by %d), in force %v after its tick: %d tokens there (moved %d; the grants held %d in transit, %d of it tokens carried, %d from the tick; want %d, bound %d); region 0 %+v; region 1 %+v",
				raised.share, raise, at.Sub(started), d.Remaining, moved, transit, tokens, fromTick, want, bound, ts0, ts1)
			if broken := c.brokenExtra || c.brokenA || c.brokenLate || c.brokenEarly; broken {
				if d.Remaining <= bound {
					t.Errorf("a broken raise: the new item holds %d, within the bound %d", d.Remaining, bound)
				}
				return
			}
			if d.Remaining > bound {
				t.Errorf("the new item holds %d tokens as it takes over, more than the bound %d (the old item's %d and the transit's %d)", d.Remaining, bound, moved, transit)
			}
			if d.Remaining != want {
				t.Errorf("the new item holds %d tokens, want %d (%d held in transit, %d moved)", d.Remaining, want, transit, moved)
			}
			if c.late && !c.tokens && transit <= fromTick {
				t.Errorf("read late, the grants refilled %d in transit, no more than %d from region 1's tick", transit, fromTick)
			}
			switch {
			case c.loseCarry:
				if tokens != 0 || ts0.TokensOut != 0 || ts0.Carries != 2 {
					t.Errorf("region 0's carry was redone (%d carries) after its save was lost, and carried %d tokens (%d listed), want 2 carries and none", ts0.Carries, ts0.TokensOut, tokens)
				}
			case c.tokens:
				if tokens == 0 || tokens != ts0.TokensOut {
					t.Errorf("region 0 listed %d tokens with its grants, carried %d, want them equal and some", tokens, ts0.TokensOut)
				}
				if c.first {
					if ts1.TokensIn != 0 || ts1.TokensLate != owed || owed == 0 {
						t.Errorf("tokens read after the raise: %d in the raise and %d added later, want 0 and %d", ts1.TokensIn, ts1.TokensLate, owed)
					}
				} else if ts1.TokensIn != tokens || ts1.TokensLate != 0 {
					t.Errorf("tokens read before the raise: %d in the raise and %d added later, want %d and 0", ts1.TokensIn, ts1.TokensLate, tokens)
				}
			}
			// The grants are out of transit on the board: a later rebase
			// credits none of them again, and later ticks add no token.
			for range 3 {
				now = now.Add(100 * time.Millisecond)
				tickOne(0)
				tickOne(1)
			}
			if late := agents[1].TableStats().TokensLate; late != ts1.TokensLate {
				t.Errorf("later ticks added %d tokens more", late-ts1.TokensLate)
			}
			it, err := tts[1].load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(it.board.In) != 2 || it.board.In[0] != raise {
				t.Errorf("the board's In is %v, want [%d 0]", it.board.In, raise)
			}
			if c.tokens && !c.loseCarry && len(it.board.Took) != 0 {
				t.Errorf("the board still waits for tokens of %+v", it.board.Took)
			}
			if got, units, _, _ := agents[1].transit(it.board.In, []int64{raise, 0}, raised.from+int64(time.Hour)); got != 0 || units != 0 {
				t.Errorf("a later rebase would credit %d tokens of %d units again", got, units)
			}
		})
	}
}

// loseSave is a table client whose agent save is lost once when lose is
// set (the write not made, an error returned), as a holder's write that
// never reached the table.
type loseSave struct {
	TableClient
	lose, lost atomic.Bool
}

func (c *loseSave) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if in.ConditionExpression != nil && *in.ConditionExpression == "ep = :ep" && c.lose.CompareAndSwap(true, false) {
		c.lost.Store(true)
		return nil, errors.New("test: the save was lost")
	}
	return c.TableClient.UpdateItem(ctx, in, opts...)
}

// TestSharesTableCarryRoom: a region's bucket (22, 20 units shared,
// refilled 10 a second) rebases from its share of 10, full (idle), to 7,
// giving 3 with its new item's first stamp F; its processes decide on
// the new item (empty at F, one token every 286 ms) before the carry
// lands, 600 ms on, and take the 2 it refilled. In memory the new item
// held 7 at F (the old one's tokens, at most its capacity), dropped those
// refills (full), and holds 5 after the 2 taken; the carry must leave it
// no fuller, and send the rest with the grant (3, one a unit). The carry
// as before (its room counted at F alone, brokenCarry) adds 7 to the
// drained item: 2 more than in memory.
func TestSharesTableCarryRoom(t *testing.T) {
	b := limiter.TokenBucketConfig{Name: "global", MaxAmount: 22, RefillTime: 100 * time.Millisecond, RefillAmount: 1}
	cfg := Config{Regions: 2, Key: "k", Bucket: &b}
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			ctx := t.Context()
			tt := Table{Client: &loseSave{}, Table: "t", Name: "carry", Region: 0}
			a, err := NewTableAgent(cfg, tt, "r0", memStore(t))
			if err != nil {
				t.Fatal(err)
			}
			a.tbl.fenced = false // the carry of the wait path
			a.brokenCarry = broken
			now := time.Now()
			f := now.Add(100 * time.Millisecond)
			it, err := a.newItem(ctx, f, 7, true)
			if err != nil {
				t.Fatal(err)
			}
			it.mine = true
			old := a.items[0]
			a.items = append(a.items, it)
			a.states[0].Given[1] = 3
			a.states[0].Moves = []Move{{To: 1, Units: 3, At: f.UnixNano(), Upto: 3}}
			// Decisions on the new item 600 ms after F: its 2 refills.
			now = f.Add(600 * time.Millisecond)
			var took int64
			for range 10 {
				d, err := it.own.AllowN(ctx, it.key, now, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					took++
				}
			}
			a.tbl.started = time.Now()
			if err := a.carryTable(ctx, now); err != nil {
				t.Fatal(err)
			}
			d, err := it.own.Get(ctx, it.key, now)
			if err != nil {
				t.Fatal(err)
			}
			ts := a.TableStats()
			t.Logf("old item %s: moved %d; new item took %d, then holds %d; tokens with the grant %+v", old.key, ts.Moved, took, d.Remaining, a.states[0].Moves)
			if took != 2 || ts.Moved != 10 {
				t.Fatalf("took %d from the new item and moved %d, want 2 and 10", took, ts.Moved)
			}
			memory := min(int64(7), 10) - took
			if broken {
				if d.Remaining <= memory {
					t.Errorf("the carry as before: the new item holds %d, no more than in memory (%d)", d.Remaining, memory)
				}
				return
			}
			if d.Remaining > memory || d.Remaining < memory-1 {
				t.Errorf("the new item holds %d after the carry, want %d (in memory) or one less", d.Remaining, memory)
			}
			if k := a.states[0].Moves[0].Tokens; k != 3 {
				t.Errorf("the grant carries %d tokens, want 3 (one a unit)", k)
			}
		})
	}
}

// TestSharesTableStall: through the table, region 0's agent (holder a)
// counts 50 units a tick of 250 ms (200 a second), then its store
// stalls: two ticks count none and their reads are slow (700 and 450
// ms: Agent.storeWait). They are held, and the board keeps the demand
// counter and the stamp of the last tick counted, so the next tick,
// another process's agent (holder b) that takes the role over a second
// later, weighs the 300 units that came in the 1.5 s since with its own:
// the estimate stays at 200. With brokenStall the two ticks of none drop
// it to 0 and the next one, a single tick far above, moves it by its
// bound only.
func TestSharesTableStall(t *testing.T) {
	client, table := testTable(t)
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			ctx := t.Context()
			now := time.Now()
			tt := Table{Client: client, Table: table, Name: fmt.Sprintf("stall-%v-%d", broken, now.UnixNano())}
			st := memStore(t)
			var agents [2]*Agent
			for i := range agents {
				a, err := NewTableAgent(simBucket, tt, fmt.Sprintf("holder-%d", i), st)
				if err != nil {
					t.Fatal(err)
				}
				a.brokenStall = broken
				agents[i] = a
			}
			tw := tt.withDefaults()
			tick := func(a *Agent, n int64, reads time.Duration) {
				t.Helper()
				if n > 0 {
					if _, _, err := tw.read(ctx, n); err != nil {
						t.Fatal(err)
					}
				}
				a.storeWait = func(time.Time) time.Duration { return reads }
				if err := a.Tick(ctx, now); err != nil {
					t.Fatal(err)
				}
				if !a.Holds() {
					t.Fatalf("%s does not hold the role", a.tbl.holder)
				}
			}
			for range 10 {
				now = now.Add(250 * time.Millisecond)
				tick(agents[0], 50, 2*time.Millisecond)
			}
			counted := now.UnixNano()
			for _, reads := range []time.Duration{700 * time.Millisecond, 450 * time.Millisecond} {
				now = now.Add(250 * time.Millisecond)
				tick(agents[0], 0, reads)
			}
			it, err := tw.load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			before := agents[0].Stats().Demand
			now = now.Add(time.Second) // the role lapses: holder 1 takes it
			tick(agents[1], 300, 2*time.Millisecond)
			after := agents[1].Stats().Demand
			t.Logf("estimate %.1f after the stalled ticks (held %d, the board's tick %v after the last counted), %.1f after holder 1's",
				before, agents[0].Stats().Held, time.Duration(it.board.Tick-counted), after)
			if broken {
				if before > 1 || after > 50 {
					t.Errorf("brokenStall: the estimate %.1f after the stalled ticks, %.1f after (the test cannot fail)", before, after)
				}
				return
			}
			if it.board.Tick != counted || before != 200 || after < 180 || after > 220 {
				t.Errorf("the board's tick %v after the last counted, the estimate %.1f after the stalled ticks and %.1f after holder 1's; want 0, 200, 180-220",
					time.Duration(it.board.Tick-counted), before, after)
			}
		})
	}
}

// TestSharesTableBucketFence: as TestSharesTableFence, for a bucket of 22
// (20 units shared: 10 a region, each 50 tokens a second) refilled 100 a
// second, on stores that fence buckets, without leases. Region 1 spends
// what it can (10 units asked every 100 ms); region 0, idle, gives it
// its share: its rebase's new item takes over rebaseAhead on (not a
// validity), listed in an entry with a new fence number, and the old
// item's fence is raised to it in the same tick; the carry claims the
// old item at the new one's first stamp (at) at the next tick. Region 0's
// process still holds the entry read before (Refresh 900 ms: the old item
// only) and decides 10 units every 100 ms by it, at stamps past at: the
// first is refused by the fence, the process reads its entry again and
// decides on the new item. brokenFence (the rebase takes over at once,
// without raising the fence): those decisions take the old item's
// refills at its old rate past at, beside the new item's and the grant's,
// and the checker (CheckBucketBound on the whole bucket) sees an
// interval over.
func TestSharesTableBucketFence(t *testing.T) {
	client, table := testTable(t)
	warmTable(t, client, table)
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			for attempt := 1; attempt <= fenceAttempts; attempt++ {
				if !bucketFenceRun(t, client, table, broken, attempt == fenceAttempts) {
					break
				}
			}
		})
	}
}

// fenceAttempts is how many runs bucketFenceRun makes at most. The broken
// run's excess is thin (2-3 units over a bound of 83 in runs alone): a
// fresh-clone run under the suite's load found none (region 1 admitted
// 51, not 53-54), so a broken run that finds no interval over is run
// again, and fails only when none of the runs finds one. The correct
// run is checked in full each time.
const fenceAttempts = 3

func bucketFenceRun(t *testing.T, client *dynamodb.Client, table string, broken, last bool) (again bool) {
	b := limiter.TokenBucketConfig{Name: "global", MaxAmount: 22, RefillTime: 10 * time.Millisecond, RefillAmount: 1}
	cfg := Config{Regions: 2, Key: "k", Bucket: &b}
	rg, _, _ := newFenceRig(t, client, table, cfg, 750*time.Millisecond)
	giver := rg.agents[0]
	giver.tbl.brokenFence = broken
	late := 0 // steps that caught up with the wall clock
	step := func() {
		// Never behind the wall clock: a decision's requests end by its
		// stamp plus the Deadline (a loaded host).
		if rg.now = rg.now.Add(100 * time.Millisecond); rg.now.Before(time.Now()) {
			rg.now = time.Now()
			late++
		}
	}
	rg.tick()
	rg.now = rg.now.Add(10 * time.Millisecond)
	rg.decide(0, 1) // region 0's process reads its entry, held 900 ms
	var at int64
	for i := 0; at == 0 && i < 8; i++ {
		step()
		rg.decide(1, 10)
		rg.tick()
		giver.mu.Lock()
		if len(giver.items) > 1 {
			at = giver.items[1].from
		}
		giver.mu.Unlock()
	}
	if at == 0 {
		t.Fatalf("region 0 made no rebase: %+v, table %+v", giver.Stats(), giver.TableStats())
	}
	if d := time.Duration(at - rg.now.UnixNano()); d > 200*time.Millisecond {
		t.Fatalf("region 0's rebase takes over %v after its tick, not rebaseAhead on: table %+v", d, giver.TableStats())
	}
	reads := rg.procs[0].Stats().Reads
	var got0, got1 int
	late = 0
	for range 7 {
		step()
		got0 += rg.decide(0, 10)
		got1 += rg.decide(1, 30) // all it can
		rg.tick()
	}
	ps, ts := rg.procs[0].Stats(), giver.TableStats()
	over := limitertest.CheckBucketBound(rg.calls, b)
	t.Logf("region 0 gave %d, rebase at +%v; after it region 0 admitted %d, region 1 %d; region 0's process %+v (reads %d before); giver's table %+v",
		giver.Stats().Given, time.Duration(at-rg.now.UnixNano()), got0, got1, ps, reads, ts)
	if broken {
		switch {
		case len(over) == 0 && !last:
			t.Logf("no interval over the bucket (%d of 7 steps after the rebase caught up with the wall clock): running again", late)
			return true
		case len(over) == 0:
			t.Errorf("the rebase taken over at once without raising the fence: no interval over the bucket (%d of 7 steps late)", late)
		default:
			t.Logf("brokenFence: over the bucket, %v (the test fails on it)", over[0])
		}
		return false
	}
	for _, v := range over {
		t.Errorf("over the bucket: %v", v)
	}
	if ps.Fenced == 0 || ps.Reads == reads {
		t.Errorf("region 0's process was not refused by the fence and read again: %+v (reads %d before)", ps, reads)
	}
	if ts.Fenced == 0 || ts.Raises == 0 || ts.Early == 0 || ts.Carries == 0 {
		t.Errorf("region 0's rebase was not fenced, published early, raised and carried: %+v", ts)
	}
	if got1 == 0 {
		t.Errorf("region 1 admitted nothing on region 0's grant")
	}
	return false
}
