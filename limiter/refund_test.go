package limiter_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// doCounter is a batching store (memory's steps, through the plain loop)
// that counts its Do calls and steps by kind.
type doCounter struct {
	*memory.Store
	dos   int
	syncs int // steps with Sync
	kinds map[storage.StepKind]int
}

func (c *doCounter) Do(ctx context.Context, steps []storage.Step, out []storage.StepResult) {
	c.dos++
	for _, st := range steps {
		c.kinds[st.Kind]++
		if st.Sync {
			c.syncs++
		}
	}
	storage.AsBatcher(c.Store).Do(ctx, steps, out)
}

// TestRefundIsABatch checks that the public Refund methods and a Stack's
// Refund give back through the store's Do, the same path as Decide's
// refunds: one Do per Refund, one for the whole stack.
func TestRefundIsABatch(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := &doCounter{Store: mem, kinds: map[storage.StepKind]int{}}
	tb, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "tb", MaxAmount: 2, RefillTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fw, err := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "fw", Limit: 2, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sw, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "sw", Limit: 2, Window: time.Hour, Representation: limiter.SubWindowCounters})
	if err != nil {
		t.Fatal(err)
	}
	sl, err := limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Name: "sl", Limit: 2, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []limiter.Limiter{tb, fw, sw, sl} {
		for range 2 {
			if d, err := l.AllowN(ctx, "k", now, 1); err != nil || !d.Allowed {
				t.Fatalf("AllowN = %+v, %v", d, err)
			}
		}
		if d, _ := l.AllowN(ctx, "k", now, 1); d.Allowed {
			t.Fatalf("third AllowN allowed: %+v", d)
		}
		before := s.dos
		if err := l.Refund(ctx, "k", now, 1); err != nil {
			t.Fatal(err)
		}
		if s.dos != before+1 {
			t.Errorf("%T.Refund: %d Do calls, want 1", l, s.dos-before)
		}
		if d, err := l.AllowN(ctx, "k", now, 1); err != nil || !d.Allowed {
			t.Errorf("%T: AllowN after Refund = %+v, %v, want allowed", l, d, err)
		}
	}
	if s.syncs != 4 {
		t.Errorf("Sync steps: %d, want 4 (each Refund's, and no batch refund)", s.syncs)
	}
	if s.kinds[storage.StepSub] != 4 {
		t.Errorf("StepSub steps: %d, want 4 (each window's Refund, and the give-back of its own denied take)", s.kinds[storage.StepSub])
	}

	st, err := limiter.NewStack(fw, tb)
	if err != nil {
		t.Fatal(err)
	}
	before := s.dos
	if err := st.Refund(ctx, "other", now, 1); err != nil {
		t.Fatal(err)
	}
	if s.dos != before+1 {
		t.Errorf("Stack.Refund: %d Do calls, want 1 (both limits on one store)", s.dos-before)
	}
	if err := st.Refund(ctx, "other", now, 0); err == nil {
		t.Error("Stack.Refund of 0 units: no error")
	}
}

// TestDecideGroupsByStore checks that Decide sends the steps of each store
// in one Do, whether the store's items are contiguous in the batch or not
// (then they are gathered), and that every answer reaches its item.
func TestDecideGroupsByStore(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	newStore := func() *doCounter {
		mem, err := memory.New(memory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return &doCounter{Store: mem, kinds: map[storage.StepKind]int{}}
	}
	a, b := newStore(), newStore()
	fw := func(s *doCounter, limit int64) limiter.Limiter {
		l, err := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "fw", Limit: limit, Window: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for _, c := range []struct {
		name   string
		stores []*doCounter
	}{
		{"contiguous", []*doCounter{a, a, b}},
		{"interleaved", []*doCounter{a, b, a}},
	} {
		a.dos, b.dos = 0, 0
		items := make([]limiter.Item, len(c.stores))
		for i, s := range c.stores {
			items[i] = limiter.Item{Limit: fw(s, int64(10+i)), Key: c.name + strconv.Itoa(i), N: 1}
		}
		out := make([]limiter.Outcome, len(items))
		d, err := limiter.Decide(ctx, now, items, out)
		if err != nil {
			t.Fatal(err)
		}
		if a.dos != 1 || b.dos != 1 {
			t.Errorf("%s: Do calls %d and %d, want 1 each", c.name, a.dos, b.dos)
		}
		for i, o := range out {
			if want := int64(10 + i - 1); !o.Decision.Allowed || o.Decision.Remaining != want || o.Decision.Limit != int64(10+i) {
				t.Errorf("%s: item %d: %+v, want allowed with %d remaining", c.name, i, o.Decision, want)
			}
		}
		if d != 0 {
			t.Errorf("%s: decider %d, want 0 (least remaining)", c.name, d)
		}
	}
}
