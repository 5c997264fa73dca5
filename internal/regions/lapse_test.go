package regions

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/internal/testserver"
)

// slowTable returns a client of a new table on DynamoDB Local reached
// through a proxy that holds each request from delay to delay+jitter (a
// loaded host).
func slowTable(t *testing.T, delay, jitter time.Duration) (*dynamodb.Client, string) {
	t.Helper()
	client, table := testTable(t)
	proxy := testserver.NewHTTPProxy(t, *client.Options().BaseEndpoint)
	proxy.SetDelay(delay)
	proxy.SetJitter(jitter)
	return dynamodb.New(dynamodb.Options{BaseEndpoint: aws.String(proxy.URL()), Region: "us-east-1", Credentials: client.Options().Credentials}), table
}

// lapseKeys returns n containers' Keys of region 0 of one limit on table,
// sharing the region's store.
func lapseKeys(t *testing.T, client *dynamodb.Client, table string, broken bool, n int) []*Keys {
	t.Helper()
	cfg := Config{Regions: 2, Limit: 1000, Window: time.Second, SubWindows: 10}
	prefix := fmt.Sprintf("lapse-%v-%d:", broken, time.Now().UnixNano())
	store := memStore(t)
	keys := make([]*Keys, n)
	for i := range keys {
		k, err := NewKeys(KeysConfig{Config: cfg, Table: Table{Client: client, Table: table, Region: 0, brokenLapse: broken},
			Prefix: prefix, Store: store, Holder: fmt.Sprintf("c%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
	}
	return keys
}

// lapseCounts are decisions of one key and those that failed (as stale,
// or otherwise: their deadline passed while they waited for an entry).
type lapseCounts struct {
	decisions, stale, failed atomic.Int64
	longest                  atomic.Int64 // ns
}

func (c *lapseCounts) decide(t *testing.T, k *Keys) {
	start := time.Now()
	_, err := k.AllowN(t.Context(), "k", start, 1)
	c.decisions.Add(1)
	for took := int64(time.Since(start)); ; {
		if l := c.longest.Load(); took <= l || c.longest.CompareAndSwap(l, took) {
			break
		}
	}
	switch {
	case errors.Is(err, ErrStale):
		c.stale.Add(1)
	case err != nil:
		c.failed.Add(1)
		if t.Context().Err() == nil {
			t.Logf("%s's decision at %s (%v): %v", k.cfg.Holder, start.Format("05.000"), time.Since(start).Round(time.Millisecond), err)
		}
	}
}

func (c *lapseCounts) String() string {
	return fmt.Sprintf("%d decisions (longest %v), %d stale, %d failed otherwise", c.decisions.Load(),
		time.Duration(c.longest.Load()).Round(time.Millisecond), c.stale.Load(), c.failed.Load())
}

func takeovers(keys []*Keys) (takes, lost int64) {
	for _, k := range keys {
		if st, ok := k.Stats("k"); ok {
			takes += st.Table.Takeovers
			lost += st.Table.Lost
		}
	}
	return takes, lost
}

// TestEntryKeptWhileHolderQuiet: a global key's entry does not lapse
// for long when its holder's decisions pause, on a loaded host. Three
// containers of region 0 reach DynamoDB Local through a proxy that holds
// each request 150-200 ms (a tick, three or five requests one after
// another, takes about 0.5-1 s). Container 0 decides the key every 100 ms
// for 1.2 s (it takes the agent role at its first decision), then goes
// quiet; containers 1 and 2 decide it every 50-150 ms throughout. One of
// them must take the role and publish before their decisions, which wait
// for an entry until their deadline (1 s), fail. With the rule before
// (brokenLapse: the entry valid from the tick's stamp, the role lapsing
// LockLife and twice the last tick after the save, the successor
// publishing only at its first tick's save) the entry lapsed about 0.5 s
// after the holder's last save and the successor published about 1.5 s
// later: decisions failed. Now the entry is valid from its save, the role
// lapses with it, and the take publishes the entry again: none fails.
// The two runs (tables of their own) run at once.
func TestEntryKeptWhileHolderQuiet(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			t.Parallel()
			client, table := slowTable(t, 150*time.Millisecond, 50*time.Millisecond)
			keys := lapseKeys(t, client, table, broken, 3)
			var first lapseCounts
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				first.decide(t, keys[0])
				if st, _ := keys[0].Stats("k"); st.Holds {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("container 0 never took the role: %v", &first)
				}
			}
			var (
				wg     sync.WaitGroup
				others lapseCounts
			)
			start := time.Now()
			t.Logf("container 0 holds at %s", start.Format("05.000"))
			wg.Go(func() {
				for time.Since(start) < 1200*time.Millisecond {
					first.decide(t, keys[0])
					time.Sleep(100 * time.Millisecond)
				}
			})
			for _, k := range keys[1:] {
				wg.Go(func() {
					for time.Since(start) < 4*time.Second {
						others.decide(t, k)
						time.Sleep(50*time.Millisecond + rand.N(100*time.Millisecond))
					}
				})
			}
			wg.Wait()
			takes, lost := takeovers(keys)
			t.Logf("container 0: %v; containers 1 and 2: %v; takeovers %d, role lost %d", &first, &others, takes, lost)
			if takes < 2 {
				t.Fatalf("no container took the role from the quiet holder (takeovers %d): the test cannot fail", takes)
			}
			failed := others.stale.Load() + others.failed.Load()
			if broken {
				if failed == 0 {
					t.Errorf("brokenLapse: no decision failed while the holder was quiet (the test cannot fail)")
				}
				return
			}
			if failed != 0 {
				t.Errorf("%d decisions failed while the holder was quiet", failed)
			}
		})
	}
}

// TestLapseMeasure (SLUICE_LAPSE_MEASURE=1; SLUICE_LAPSE_N containers,
// SLUICE_LAPSE_GAP their mean Poisson gap, SLUICE_LAPSE_RUN, and
// SLUICE_LAPSE_BROKEN=1 for the rule before) logs the decisions of one key
// by several containers of a region through a proxy that holds each
// request 100-150 ms, and those that failed (docs/regions.md, "The role
// under slow ticks").
func TestLapseMeasure(t *testing.T) {
	if os.Getenv("SLUICE_LAPSE_MEASURE") == "" {
		t.Skip("SLUICE_LAPSE_MEASURE")
	}
	n, _ := strconv.Atoi(os.Getenv("SLUICE_LAPSE_N"))
	gap, _ := time.ParseDuration(os.Getenv("SLUICE_LAPSE_GAP"))
	run, _ := time.ParseDuration(os.Getenv("SLUICE_LAPSE_RUN"))
	broken := os.Getenv("SLUICE_LAPSE_BROKEN") == "1"
	client, table := slowTable(t, 100*time.Millisecond, 50*time.Millisecond)
	keys := lapseKeys(t, client, table, broken, n)
	var (
		wg sync.WaitGroup
		c  lapseCounts
	)
	end := time.Now().Add(run)
	for _, k := range keys {
		wg.Go(func() {
			for {
				time.Sleep(time.Duration(rand.ExpFloat64() * float64(gap)))
				if time.Now().After(end) {
					return
				}
				c.decide(t, k)
			}
		})
	}
	wg.Wait()
	takes, lost := takeovers(keys)
	t.Logf("broken=%v: %v; takeovers %d, role lost %d", broken, &c, takes, lost)
}
