package regions

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestProcessWaitsForEntry: a process's decision that finds no entry
// valid reads again, within the table's deadline, until one is: a new
// key's first decisions in several processes at once (only one takes the
// agent role and publishes; the others' ticks end without an entry) were
// failed at once and went to the rule's fail mode. Here the agent
// publishes the region's first entry 100 ms after the decision began: the
// decision waits and is admitted, with the reads it made again counted;
// failing at once (brokenNoWait, as before) it is stale.
func TestProcessWaitsForEntry(t *testing.T) {
	client, table := testTable(t)
	cfg := Config{Regions: 2, Key: "k", Limit: 100, Window: time.Second, SubWindows: 10}
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			ctx := t.Context()
			tt := Table{Client: client, Table: table, Name: fmt.Sprintf("wait-%v-%d", broken, time.Now().UnixNano()), Region: 0,
				Refresh: 100 * time.Millisecond, Flush: 100 * time.Millisecond, Validity: time.Second, Deadline: 5 * time.Second,
				LockLife: 750 * time.Millisecond}
			st := memStore(t)
			a, err := NewTableAgent(cfg, tt, "r0", st)
			if err != nil {
				t.Fatal(err)
			}
			p, err := NewProcess(cfg, tt, st)
			if err != nil {
				t.Fatal(err)
			}
			p.brokenNoWait = broken
			published := make(chan error, 1)
			now := time.Now()
			go func() {
				time.Sleep(100 * time.Millisecond)
				published <- a.Tick(ctx, now)
			}()
			d, err := p.AllowN(ctx, "k", now, 1)
			if perr := <-published; perr != nil || !a.Holds() {
				t.Fatalf("the agent's first tick: %v (holds: %v)", perr, a.Holds())
			}
			st2 := p.Stats()
			t.Logf("decision %+v, %v; process %+v", d, err, st2)
			if broken {
				if !errors.Is(err, ErrStale) {
					t.Errorf("brokenNoWait: %+v, %v, want ErrStale (the test cannot fail)", d, err)
				}
				return
			}
			if err != nil || !d.Allowed {
				t.Errorf("the decision: %+v, %v, want admitted on the entry published meanwhile", d, err)
			}
			if st2.Waits == 0 || st2.Stale != 0 {
				t.Errorf("process stats %+v: want reads made again (Waits) and no stale decision", st2)
			}
		})
	}
}
