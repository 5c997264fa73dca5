package regions

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// TestProcessFenceExhausted: a process whose every read of its entry
// returns one whose fence number is below its counters' fence (here the
// fence is raised far above any number the agent publishes, as if the
// entries that carry it never reached the reads) is refused by the fence
// on each try of a decision. Through a global rule (policy, regional
// shares as Keys on a memory store, the table on DynamoDB Local), each
// decision of that key is refused once, waits fenceWait for an entry above
// the refused number, which never comes, returns an error wrapping
// ErrStale well within the table's deadline, and the rule's fail mode
// decides it (open admits, closed denies); nothing is taken from the
// key's counters, and another key of the same limit is decided and
// counted as before.
func TestProcessFenceExhausted(t *testing.T) {
	client, table := testTable(t)
	const (
		deadline = 5 * time.Second // every decision is stamped now: its store requests end by then
		n        = 5               // decisions of each key under the raised fence
		hot      = "192.0.2.1"     // the fenced key
		other    = "192.0.2.2"
	)
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			ctx := t.Context()
			st := memStore(t)
			base := fmt.Sprintf("fx-%s-%d:", mode, time.Now().UnixNano())
			var keys *Keys
			opts := policy.Options{Stores: map[string]storage.Store{"memory": st, "dynamo": st}, Shares: &policy.Shares{Regions: 2,
				Build: func(l *policy.Limit, _ int64, _ bool) (limiter.Limiter, error) {
					cfg := Config{Regions: 2, Limit: l.Limit, Window: l.Window, SubWindows: l.SubWindows}
					k, err := NewKeys(KeysConfig{Config: cfg, Table: Table{Client: client, Table: table, Region: 0, Deadline: deadline},
						Prefix: base + l.Name + ":", Store: st, Holder: "h0"})
					keys = k
					return k, err
				}}}
			doc := `rules:
  - name: g
    key: "{ip}"
    scope: global
    fail: ` + mode + `
    limits: [{name: w, algorithm: sliding_window, limit: 100, window: 1m, sub_windows: 4, backend: dynamo}]
`
			pol, err := policy.Load([]byte(doc), opts)
			if err != nil {
				t.Fatal(err)
			}
			eval := func(ip string, at time.Time) policy.Result {
				return pol.Evaluate(ctx, &policy.Request{SourceIP: ip, Method: "GET", Path: "/"}, at)
			}
			// Every decision is stamped within a tick of t0: the key's
			// agent ticks once (at its first decision), and the first
			// entry's cap holds at every stamp used.
			t0 := time.Now()
			for _, ip := range []string{hot, other} {
				if r := eval(ip, t0); r.Outcome != policy.Allow || len(r.Evals) != 1 || r.Evals[0].Err != nil {
					t.Fatalf("%s's first decision: %+v, want admitted by its share", ip, r)
				}
			}
			share := func(ip string) *keyShare {
				keys.mu.Lock()
				defer keys.mu.Unlock()
				for k, ks := range keys.keys {
					if strings.HasSuffix(k, ip) {
						return ks
					}
				}
				t.Fatalf("no key of %s among %d", ip, len(keys.keys))
				return nil
			}
			hs, os := share(hot), share(other)
			counted := func(ks *keyShare) int64 { // units in the region's counters
				d, err := ks.proc.w.Peek(ctx, ks.proc.cfg.Key+"@0", t0.Add(50*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				return d.Limit - d.Remaining
			}
			hs.proc.mu.Lock()
			entryFence := hs.proc.entry.Fence
			hs.proc.mu.Unlock()
			const fence = 1 << 40
			if err := hs.proc.w.RaiseFence(ctx, hs.proc.cfg.Key+"@0", fence); err != nil {
				t.Fatal(err)
			}
			hot0, other0 := counted(hs), counted(os)
			hst0, ost0 := hs.proc.Stats(), os.proc.Stats()

			var admitted [2]int // hot, other
			var slowest time.Duration
			for i := range n {
				at := t0.Add(time.Duration(10+i) * time.Millisecond)
				start := time.Now()
				r := eval(hot, at)
				took := time.Since(start)
				slowest = max(slowest, took)
				if len(r.Evals) != 1 {
					t.Fatalf("hot decision %d: %+v, want one rule's", i, r)
				}
				ev := r.Evals[0]
				if i == 0 {
					t.Logf("hot decision: outcome %v, reason %v, failed %v, %v, in %v", r.Outcome, r.Reason, ev.Failed, ev.Err, took)
				}
				// An error wrapping ErrFenced is never given to the fail
				// mode (limiter.Decide): the exhausted decision must not.
				if !ev.Failed || !errors.Is(ev.Err, ErrStale) || errors.Is(ev.Err, storage.ErrFenced) || took >= deadline {
					t.Errorf("hot decision %d: failed %v, %v, in %v: want the fail mode to decide an error wrapping ErrStale, not ErrFenced, within %v",
						i, ev.Failed, ev.Err, took, deadline)
				}
				if r.Outcome == policy.Allow {
					admitted[0]++
				}
				r = eval(other, at)
				if len(r.Evals) != 1 || r.Evals[0].Failed || r.Evals[0].Err != nil {
					t.Errorf("other decision %d: %+v, want decided by its share", i, r)
				}
				if r.Outcome == policy.Allow {
					admitted[1]++
				}
			}
			hst, ost := hs.proc.Stats(), os.proc.Stats()
			hot1, other1 := counted(hs), counted(os)
			t.Logf("fence %d raised over the entry's %d; %d decisions of each key (slowest hot %v): admitted hot %d, other %d; "+
				"hot process fenced %d, reads %d; other fenced %d; counted hot %d -> %d, other %d -> %d",
				fence, entryFence, n, slowest, admitted[0], admitted[1], hst.Fenced-hst0.Fenced, hst.Reads-hst0.Reads,
				ost.Fenced-ost0.Fenced, hot0, hot1, other0, other1)
			wantHot := 0
			if mode == "open" {
				wantHot = n
			}
			if admitted[0] != wantHot || admitted[1] != n {
				t.Errorf("admitted hot %d, other %d: want %d (fail %s) and %d", admitted[0], admitted[1], wantHot, mode, n)
			}
			if got := hst.Fenced - hst0.Fenced; got != n {
				t.Errorf("hot process fenced %d times: want %d (each decision refused once, then its wait for a higher entry runs out)", got, n)
			}
			if got := hst.Reads - hst0.Reads; got < 2*n {
				t.Errorf("hot process read its entry %d times: want at least %d (reads while it waits)", got, 2*n)
			}
			if slowest < fenceWait || slowest >= 2*fenceWait+time.Second {
				t.Errorf("slowest hot decision %v: want its wait of %v and not much more", slowest, fenceWait)
			}
			if hot1 != hot0 || other1-other0 != n || ost.Fenced != ost0.Fenced {
				t.Errorf("counted hot %d -> %d, other %d -> %d, other fenced %d: want the refused tries to take nothing and the other key's %d counted",
					hot0, hot1, other0, other1, ost.Fenced-ost0.Fenced, n)
			}
		})
	}
}
