package regions

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
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
// window of 100 a second. Region 1's demand rises; region 0, idle, lowers
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
			if s, _ := agents[1].Share(); s < 90 {
				t.Errorf("region 1 holds %d after the wait, want 90 or more: region 0 %+v", s, agents[0].Stats())
			}
			for _, v := range limitertest.CheckTrailingWindow(calls, cfg.Limit, cfg.Window) {
				t.Errorf("over the limit: %v", v)
			}
		})
	}
}

// TestSharesTableRaise: through the table (as TestSharesTableWait), two
// regions of a bucket of 22 (20 units shared), refilled 10 a second.
// Region 1 spends all it has; region 0, idle, gives it its surplus. Region
// 1's raise takes over a validity on, its new item empty there: the carry
// adds the old item's free tokens and what the raise's units refilled
// since the tick that started it (at their part of the rate), no more.
// The tokens in the new item as it takes over are read from the store. A
// broken agent that adds the raise's whole units, refilled or not, puts
// more there (the check sees it).
func TestSharesTableRaise(t *testing.T) {
	client, table := testTable(t)
	b := limiter.TokenBucketConfig{Name: "global", MaxAmount: 22, RefillTime: 100 * time.Millisecond, RefillAmount: 1}
	cfg := Config{Regions: 2, Key: "k", Bucket: &b}
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			ctx := t.Context()
			now := time.Now()
			name := fmt.Sprintf("raise-%v-%d", broken, now.UnixNano())
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
				a.brokenExtra = broken
				agents[r] = a
				if procs[r], err = NewProcess(cfg, tt, st); err != nil {
					t.Fatal(err)
				}
			}
			tick := func() {
				for _, a := range agents {
					if err := a.Tick(ctx, now); err != nil {
						t.Fatal(err)
					}
				}
			}
			tick()
			// Region 1 spends what it has every 100 ms (its demand is
			// written with its reads) until its raise is under way.
			var raised *bucketItem
			var started time.Time
			for i := 0; raised == nil && i < 40; i++ {
				now = now.Add(100 * time.Millisecond)
				for range 10 {
					if _, err := procs[1].AllowN(ctx, "k", now, 1); err != nil {
						t.Fatal(err)
					}
				}
				tick()
				a := agents[1]
				a.mu.Lock()
				if len(a.items) > 1 && a.items[1].share > a.items[0].share {
					raised, started = a.items[1], now
				}
				a.mu.Unlock()
			}
			if raised == nil {
				t.Fatalf("region 1 never raised its share: %+v, region 0 %+v", agents[1].Stats(), agents[0].Stats())
			}
			// No decision from here on: the carry is the only change.
			for now.UnixNano() < raised.from {
				now = now.Add(100 * time.Millisecond)
				tick()
			}
			moved := agents[1].TableStats().Moved
			at := time.Unix(0, raised.from)
			d, err := raised.own.Get(ctx, raised.key, at)
			if err != nil {
				t.Fatal(err)
			}
			raise := raised.share - (cfg.units() / 2)
			due := float64(raise) / float64(cfg.units()) * 10 * at.Sub(started).Seconds()
			t.Logf("region 1's raise to %d (by %d) from %v after its tick: %d tokens there (moved %d, refilled %.1f)", raised.share, raise,
				at.Sub(started), d.Remaining, moved, due)
			if float64(d.Remaining) > float64(moved)+due {
				if !broken {
					t.Errorf("the new item holds %d tokens as it takes over, more than the old item's %d and the raise's refill %.1f", d.Remaining, moved, due)
				}
				return
			}
			if broken {
				t.Errorf("a raise that adds its whole units: the new item holds %d, within %d moved and %.1f refilled", d.Remaining, moved, due)
			}
			if d.Remaining < int64(due)-1 {
				t.Errorf("the new item holds %d tokens, want about %.1f of the raise's refill", d.Remaining, due)
			}
		})
	}
}
