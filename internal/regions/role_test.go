package regions

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/internal/testserver"
)

// TestRoleKeptUnderSlowTicks: a holder whose ticks are slow keeps the
// agent role while it ticks. Region 0's agent A reaches DynamoDB Local
// through a proxy that holds every request 150 ms (a loaded host: its
// ticks, three requests one after another, take about 450 ms, its next
// tick follows at once), while another container's agent B of the same
// region, with a fast client, tries to take the role every 50 ms (a tick:
// it takes the role only once it has lapsed). The role must stay with A
// for its ticks (a steady slow tick is not a holder that stopped). With
// the role extended from the tick's stamp only (the broken run, as
// before), it lapses before A's next save lands, whenever two of A's
// ticks outlast LockLife (750 ms): B takes it and A's save is refused.
// The two runs (agents of their own) run at once, through the same proxy.
func TestRoleKeptUnderSlowTicks(t *testing.T) {
	client, table := testTable(t)
	proxy := testserver.NewHTTPProxy(t, *client.Options().BaseEndpoint)
	proxy.SetDelay(150 * time.Millisecond)
	slow := dynamodb.New(dynamodb.Options{BaseEndpoint: aws.String(proxy.URL()), Region: "us-east-1", Credentials: client.Options().Credentials})
	cfg := Config{Regions: 2, Key: "k", Limit: 100, Window: time.Second, SubWindows: 10}
	const run = 4 * time.Second
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			name := fmt.Sprintf("role-%v-%d", broken, time.Now().UnixNano())
			agent := func(c *dynamodb.Client, holder string) *Agent {
				a, err := NewTableAgent(cfg, Table{Client: c, Table: table, Name: name, Region: 0}, holder, memStore(t))
				if err != nil {
					t.Fatal(err)
				}
				a.tbl.brokenLife = broken
				return a
			}
			a, b := agent(slow, "slow"), agent(client, "fast")
			// A takes the role first.
			if err := a.Tick(ctx, time.Now()); err != nil || !a.Holds() {
				t.Fatalf("A's first tick: holds %v, %v", a.Holds(), err)
			}
			stop := make(chan struct{})
			var (
				wg     sync.WaitGroup
				aTicks int
				took   time.Duration
			)
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					if err := a.Tick(ctx, start); err != nil && ctx.Err() == nil {
						t.Errorf("A's tick: %v", err)
					}
					aTicks++
					took = max(took, time.Since(start))
				}
			})
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					if b.Holds() {
						continue // it took the role: A lost it
					}
					tctx, cancel := context.WithTimeout(ctx, time.Second)
					if err := b.Tick(tctx, time.Now()); err != nil && ctx.Err() == nil {
						t.Errorf("B's tick: %v", err)
					}
					cancel()
				}
			})
			time.Sleep(run)
			close(stop)
			wg.Wait()
			as, bs := a.TableStats(), b.TableStats()
			t.Logf("A: %d ticks (longest %v), table %+v; B: table %+v", aTicks, took.Round(time.Millisecond), as, bs)
			if broken {
				if bs.Takeovers == 0 {
					t.Errorf("the role extended from the tick's stamp only: B never took it from A's slow ticks")
				}
				return
			}
			if aTicks < 3 {
				t.Fatalf("A ticked %d times in %v", aTicks, run)
			}
			if bs.Takeovers != 0 || as.Lost != 0 {
				t.Errorf("B took the role %d times, A lost it %d times, while A ticked without a pause", bs.Takeovers, as.Lost)
			}
		})
	}
}
