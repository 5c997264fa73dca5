package dynamo_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestHistoryMerged runs the merged history checker: a window, a bucket and
// a fixed window on one key decided together (one UpdateItem per batch on
// the key's item), mixed with single-step calls of each on the same key,
// batches held back whole so that they arrive out of order, 64 goroutines
// on 2 keys, every limit's history checked.
func TestHistoryMerged(t *testing.T) {
	if testing.Short() {
		t.Skip("the history checker takes seconds")
	}
	s, r, _ := newStore(t, dynamo.Config{})
	limitertest.RunMergedHistory(t, limitertest.BucketsAtStamp(s))
	st := s.Stats()
	t.Logf("%d requests (%d failed: lost races); %d conflicts, %d moves, %d lost refunds", r.load(), r.failed.Load(), st.Conflicts, st.Moves, st.LostRefunds)
}

// The merged history checker fails a store whose merged writes drop the
// bucket's condition: shown before trusting it, on a sequence that makes
// such a store over-admit whatever the machine's load (a randomized run
// found it in some fresh-clone make test runs and not in others). Two
// processes (two stores) take turns deciding a window and a bucket of 4 on
// one key, one merged UpdateItem each, each writing on the state it
// remembers, which the other's take has made stale. The correct store's
// condition fails, it reads the item and decides on it: 4 admitted. The
// broken store overwrites the bucket each time and admits all 8, above even
// CheckBucketBound's allowance for a refill step (5). The checker must flag
// the broken store's history and pass the correct one's.
func TestHistoryMergedFailsBroken(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			bucket := limiter.TokenBucketConfig{Name: "merged-bucket", MaxAmount: 4, RefillTime: time.Hour}
			procs := make([][]limiter.Item, 2)
			key := limitertest.Key(t)
			for i := range procs {
				s, _, _ := newStore(t, dynamo.Config{})
				dynamo.SetExactOnly(s, true)
				if broken {
					dynamo.BreakMerged(s)
				}
				w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "merged-window", Limit: 100, Window: time.Minute,
					Representation: limiter.SubWindowCounters, NoDenyCache: true})
				if err != nil {
					t.Fatal(err)
				}
				b, err := limiter.NewTokenBucket(s, bucket)
				if err != nil {
					t.Fatal(err)
				}
				procs[i] = []limiter.Item{{Limit: w, Key: key, N: 1}, {Limit: b, Key: key, N: 1}}
			}
			now := time.Now()
			var calls []limitertest.Call
			for i, p := range []int{0, 1, 0, 1, 0, 1, 0, 1} {
				out := make([]limiter.Outcome, 2)
				d, err := limiter.Decide(testCtx(t), now, procs[p], out)
				if err != nil {
					t.Fatal(err)
				}
				allowed := d >= 0 && out[d].Decision.Allowed
				t.Logf("process %d, call %d: allowed %v", p, i, allowed)
				calls = append(calls, limitertest.Call{Key: key, Stamp: now, Cost: 1, Reached: true, Allowed: allowed})
			}
			vs := limitertest.CheckBucketBound(calls, bucket)
			if broken && len(vs) == 0 {
				t.Fatalf("the checker passed a store whose merged writes drop the bucket's condition: %+v", calls)
			}
			if !broken && len(vs) != 0 {
				t.Fatalf("the correct store over-admitted: %v", vs[0])
			}
			if broken {
				t.Logf("broken merged store: %v", vs[0])
			}
		})
	}
}

// Two limit spaces whose attribute prefixes collide are refused on an
// item where the store served one of them (their attributes would mix),
// with an error wrapping limiter.ErrInvalidConfig naming both, and both
// served on items of their own (nothing mixes: a regional share's bucket
// is a new space, on a new item, at every share size).
func TestPrefixCollision(t *testing.T) {
	seen := map[string]string{}
	var a, b string
	for i := 0; a == ""; i++ {
		sp := fmt.Sprintf("sw:%d:1m0s:20", i+1)
		p := dynamo.Attr(sp, "")
		if other, ok := seen[p]; ok {
			a, b = other, sp
		}
		seen[p] = sp
	}
	s, _, _ := newStore(t, dynamo.Config{})
	ctx := testCtx(t)
	key := limitertest.Key(t)
	if _, err := s.Add(ctx, storage.Key{Space: a, Name: key}, 1, 21, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(ctx, storage.Key{Space: b, Name: key + "-other"}, 1, 21, 1, time.Minute); err != nil {
		t.Fatalf("%q on an item of its own after %q on another (prefix %q): %v; want it served", b, a, dynamo.Attr(a, ""), err)
	}
	_, err := s.Add(ctx, storage.Key{Space: b, Name: key}, 1, 21, 1, time.Minute)
	if !errors.Is(err, limiter.ErrInvalidConfig) || !strings.Contains(err.Error(), a) || !strings.Contains(err.Error(), b) {
		t.Fatalf("%q after %q on one item (prefix %q): %v; want ErrInvalidConfig naming both", b, a, dynamo.Attr(a, ""), err)
	}
	if _, err := s.Add(ctx, storage.Key{Space: a, Name: key}, 1, 21, 1, time.Minute); err != nil {
		t.Fatalf("%q again on its item: %v", a, err)
	}
}

// A short-lived limit's write never shortens the life of a longer one's
// state in the same item: the item's ttl is the longest any limit asked.
func TestSharedItemTTL(t *testing.T) {
	s, _, c := newStore(t, dynamo.Config{})
	ctx := testCtx(t)
	w, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 10, Window: time.Hour})
	b, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 2, RefillTime: time.Second})
	key := limitertest.Key(t)
	if d, err := w.Allow(ctx, key, base); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	ttl := func() int64 {
		v, err := strconv.ParseInt(get(t, c, dynamo.ItemKey(storage.Key{Name: key}))["ttl"].(*types.AttributeValueMemberN).Value, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	after := ttl()
	if d, err := b.Allow(ctx, key, base); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	if got, min := ttl(), time.Now().Add(2*time.Hour).Unix(); got < after || got < min {
		t.Fatalf("ttl %d after the bucket's write (%d after the window's), want at least now + 2 h (%d)", got, after, min)
	}
}
