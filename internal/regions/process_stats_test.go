package regions

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/limiter"
)

// noTable is a TableClient that fails its test when called: the process
// under test decides by an entry set in place.
type noTable struct{ t *testing.T }

func (c noTable) GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	c.t.Error("the process read its entry")
	return nil, context.Canceled
}

func (c noTable) UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	c.t.Error("the process read its entry")
	return nil, context.Canceled
}

// TestProcessCountsLeases: what a Process answers without a store
// request is counted where a caller reads it, since a Process's
// decisions carry no limiter.Outcome (limitertest.RunHot, the
// benchmarks' harness, sums LeaseStats, and read no lease of a Process
// before: "0 takes"). On a simulated clock, by entries set in place
// (no table read), one process of a bucket share (1,000 a second, a
// share of 100: 100.2 a second):
//
//   - a hot key (50 a second, 2 s) on item 1 takes leases and answers
//     most decisions from them (LeaseStats);
//   - the entry moves the share to item 2 (a rebase: the process drops
//     item 1's bucket) and 40 more decisions lease there: the counts
//     are item 1's plus item 2's, never fewer than before the move;
//   - item 3, a share of 2: ten decisions at one stamp take 2, the
//     store denies the third, and the deny cache the other seven
//     (ProcessStats.Cached); a decision of 3 units is denied by the
//     entry (Unshared).
func TestProcessCountsLeases(t *testing.T) {
	ctx := t.Context()
	cfg := Config{Regions: 2, Key: "k", Leases: true,
		Bucket: &limiter.TokenBucketConfig{Name: "b", MaxAmount: 1000, RefillTime: 10 * time.Millisecond, RefillAmount: 10}}
	tt := Table{Client: noTable{t}, Table: "t", Name: "k", Region: 0, Refresh: time.Hour, Flush: time.Hour, Validity: 2 * time.Hour,
		Deadline: time.Second, LockLife: time.Minute}
	p, err := NewProcess(cfg, tt, memStore(t))
	if err != nil {
		t.Fatal(err)
	}
	ls, ok := any(p).(interface{ LeaseStats() limiter.LeaseStats })
	if !ok {
		t.Fatalf("a Process has no LeaseStats: its leases are not counted")
	}
	now := time.Now()
	set := func(items ...ItemStep) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.entry.Seq++
		p.entry.Until, p.entry.Items = now.Add(time.Hour).UnixNano(), items
		p.has, p.fetched = true, now.UnixNano()
	}
	decide := func(n int, every time.Duration, units int64) (admitted int) {
		t.Helper()
		for range n {
			d, err := p.AllowN(ctx, "k", now, units)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
			now = now.Add(every)
		}
		return admitted
	}
	set(ItemStep{Key: "k#1", From: now.UnixNano(), Share: 100})
	if got := decide(100, 20*time.Millisecond, 1); got != 100 {
		t.Fatalf("item 1 admitted %d of 100 at half its rate", got)
	}
	s1 := ls.LeaseStats()
	set(ItemStep{Key: "k#2", From: now.UnixNano(), Share: 100})
	decide(40, 20*time.Millisecond, 1) // the first makes item 2's bucket and drops item 1's
	p.mu.Lock()
	_, kept := p.buckets["k#1"]
	p.mu.Unlock()
	if kept {
		t.Fatalf("item 1's bucket kept after the move")
	}
	s2 := ls.LeaseStats()
	t.Logf("leases after item 1: %+v; after item 2: %+v", s1, s2)
	if s1.Takes == 0 || s1.Decisions < 50 {
		t.Errorf("item 1, 100 decisions at half its rate: %+v, want leases taken and most decisions answered from them", s1)
	}
	if s2.Takes <= s1.Takes || s2.Decisions <= s1.Decisions {
		t.Errorf("after the move to item 2: %+v, want item 1's counts (%+v) and item 2's takes", s2, s1)
	}
	set(ItemStep{Key: "k#3", From: now.UnixNano(), Share: 2})
	got := decide(10, 0, 1)
	decide(1, 0, 3)
	ps := p.Stats()
	t.Logf("item 3: %d of 10 admitted; process %+v", got, ps)
	if got != 2 || ps.Cached != 7 || ps.Unshared != 1 {
		t.Errorf("item 3 (a share of 2): %d admitted, %d denied by the deny cache, %d by the entry; want 2, 7 and 1", got, ps.Cached, ps.Unshared)
	}
}
