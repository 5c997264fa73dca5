package limitertest

import (
	"context"
	"errors"
	mrand "math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// The packed window's geometry in these tests: 64 slots of 10 ms (a window
// of 640 ms); level boundaries every 4, 16, 64 and 256 slots.
const (
	packedR   = 64
	packedLen = 10 * time.Millisecond
)

// packedT0 is the first slot at or after Base that starts a level-4
// counter (256 slots): tests place traffic on both sides of it.
func packedT0() int64 {
	s := Base.UnixNano() / int64(packedLen)
	return (s + 255) &^ 255
}

// slotAt is Base-relative time of slot f plus off.
func slotAt(f int64, off time.Duration) time.Duration {
	return time.Duration(f*int64(packedLen)-Base.UnixNano()) + off
}

func packedWindow(t testing.TB, s Store, limit int64) *limiter.SlidingWindow {
	return sliding(t, s, limiter.SlidingWindowConfig{Limit: limit, Window: packedR * packedLen, Representation: limiter.Packed, Slots: packedR})
}

// testPacked: the packed sliding window (limiter.Packed) on a store that
// implements storage.PackedCounter: the store protocol itself, worked
// examples across slot and level boundaries, requests out of order within
// and past the horizon, refunds after a roll and after a slipped write,
// and a differential run against Bounded at resolution r. A store without
// PackedCounter must make NewSlidingWindow refuse the representation.
func testPacked(t *testing.T, s Store) {
	ps, ok := s.(storage.PackedCounter)
	if !ok {
		t.Run("Refused", func(t *testing.T) {
			_, err := limiter.NewSlidingWindow(s, leaseWindow(limiter.SlidingWindowConfig{Limit: 2, Window: time.Second, Representation: limiter.Packed, Slots: packedR}))
			if !errors.Is(err, limiter.ErrInvalidConfig) {
				t.Fatalf("a packed window on %T (no PackedCounter): %v, want ErrInvalidConfig", s, err)
			}
		})
		return
	}
	t.Run("Store", func(t *testing.T) { testPackedStore(t, ps) })
	t.Run("RefundsAfterTopCarry", func(t *testing.T) { testPackedTopCarry(t, ps) })
	testPackedExamples(t, s)
	testPackedRefunds(t, s, ps)
	testPackedStack(t, s, ps)
	t.Run("AgainstBounded", func(t *testing.T) { testPackedAgainstModel(t, s) })
}

// testPackedExamples: worked examples across slot and level boundaries,
// and requests out of order within and past the horizon.
func testPackedExamples(t *testing.T, s Store) {
	ms := time.Millisecond
	t0 := packedT0()
	t.Run("Basic", func(t *testing.T) {
		w := packedWindow(t, s, 3)
		runSteps(t, w, Key(t), []step{
			{at: slotAt(t0, 5*ms), allowed: true, remaining: 2},
			{at: slotAt(t0, 5*ms), allowed: true, remaining: 1},
			{at: slotAt(t0, 5*ms), allowed: true, remaining: 0},
			// The three leave the view at slot t0+65: 645 ms later.
			{at: slotAt(t0, 5*ms), allowed: false, retry: 645 * ms},
			{at: slotAt(t0+64, 9*ms), allowed: false},
			{at: slotAt(t0+65, 0), allowed: true, remaining: 2},
		})
	})
	t.Run("AcrossLevels", func(t *testing.T) {
		w := packedWindow(t, s, 3)
		runSteps(t, w, Key(t), []step{
			{at: slotAt(t0-1, 5*ms), n: 2, allowed: true, remaining: 1}, // the last slot of a level-4 counter
			{at: slotAt(t0+63, 5*ms), allowed: true, remaining: 0},      // its view starts at t0-1
			{at: slotAt(t0+63, 9*ms), allowed: false, retry: ms},        // t0-1 leaves at t0+64
			{at: slotAt(t0+64, 0), allowed: true, remaining: 1},
		})
	})
	t.Run("NewerThenOlder", func(t *testing.T) {
		w := packedWindow(t, s, 2)
		runSteps(t, w, Key(t), []step{
			{at: slotAt(t0-2, 0), allowed: true, remaining: 1},
			{at: slotAt(t0-2, 0), allowed: true, remaining: 0},
			{at: slotAt(t0+63, 0), allowed: true, remaining: 1}, // its view starts at t0-1
			{at: slotAt(t0+62, 0), allowed: false},              // its view holds t0-2's two, and t0+63's
		})
	})
	t.Run("AtTheHorizon", func(t *testing.T) {
		w := packedWindow(t, s, 3)
		a := t0 - 3
		runSteps(t, w, Key(t), []step{
			{at: slotAt(a, 0), n: 3, allowed: true, remaining: 0},
			{at: slotAt(a+130, 0), allowed: true, remaining: 2},
			// 65 slots behind (the horizon): its view a+1..a+129 is
			// empty; a+130 is counted with the top-level field of
			// a+129 (Later).
			{at: slotAt(a+65, 0), allowed: true, remaining: 1},
			// 66 behind: past the horizon, denied (Stale, or its view
			// still holds a's three).
			{at: slotAt(a+64, 0), allowed: false},
			{at: slotAt(a+66, 0), allowed: true, remaining: 0},
		})
	})
	t.Run("PastHorizon", func(t *testing.T) {
		pastHorizonCheck(t, packedWindow(t, s, 2), 500*ms, 5500*ms)
	})
}

// testPackedRefunds: refunds after a roll and after a slipped write.
func testPackedRefunds(t *testing.T, s Store, ps storage.PackedCounter) {
	t0 := packedT0()
	t.Run("RefundAfterRoll", func(t *testing.T) {
		w := packedWindow(t, s, 3)
		key := Key(t)
		runSteps(t, w, key, []step{
			{at: slotAt(t0-2, 0), allowed: true, remaining: 2},
			{at: slotAt(t0+100, 0), allowed: true, remaining: 2},
		})
		if err := w.Refund(ctx(t), key, Base.Add(slotAt(t0-2, 0)), 1); err != nil {
			t.Fatal(err)
		}
		runSteps(t, w, key, []step{
			{at: slotAt(t0+50, 0), n: 2, allowed: true, remaining: 0}, // t0-2's unit is back: 1 + 2
			{at: slotAt(t0+50, 0), allowed: false},
		})
	})
	t.Run("DenialRefundAfterSlippedWrite", func(t *testing.T) {
		hook := &slipPacked{Store: s, inner: ps}
		w := sliding(t, hook, limiter.SlidingWindowConfig{Limit: 2, Window: packedR * packedLen, Representation: limiter.Packed, Slots: packedR})
		key := Key(t)
		runSteps(t, w, key, []step{
			{at: slotAt(t0-1, 0), allowed: true, remaining: 1},
			{at: slotAt(t0-1, 0), allowed: true, remaining: 0},
		})
		hook.slip = func(k storage.Key) {
			op := storage.PackedPlan(t0+64, packedR, 1, packedLen) // the horizon (65 slots) ahead of t0-1
			if _, err := ps.AddPacked(ctx(t), k, &op); err != nil {
				t.Errorf("slipped add: %v", err)
			}
		}
		runSteps(t, w, key, []step{{at: slotAt(t0-1, 0), allowed: false}})
		if !hook.slipped {
			t.Fatal("the denial sent no refund")
		}
		for _, c := range []struct {
			slot int64
			want int64
		}{{t0 - 1, 2}, {t0 + 63, 3}, {t0 + 64, 1}} {
			if got := packedRead(t, ps, hook.key, c.slot); got != c.want {
				t.Errorf("the view of slot t0%+d holds %d after the refund, want %d", c.slot-t0, got, c.want)
			}
		}
	})
}

// testPackedStack: a packed window stacked with a fixed window.
func testPackedStack(t *testing.T, s Store, ps storage.PackedCounter) {
	ms := time.Millisecond
	t0 := packedT0()
	t.Run("Stack", func(t *testing.T) {
		// A packed window of 3 per 640 ms under a per-slot fixed window of
		// 1: each slot's second request is denied by the fixed window and
		// its take given back to the packed one (a batch's refund), so
		// exactly 3 pass in 3 slots, then the packed window denies.
		pw := packedWindow(t, s, 3)
		fw := fixed(t, s, limiter.FixedWindowConfig{Name: "per-slot", Limit: 1, Window: packedLen})
		st, err := limiter.NewStack(pw, fw)
		if err != nil {
			t.Fatal(err)
		}
		key := Key(t)
		allowed := 0
		for i := range 4 {
			for j := range 2 {
				d := allow(t, st, key, Base.Add(slotAt(t0-2+int64(i), time.Duration(j)*ms)), 1)
				if d.Allowed {
					allowed++
				}
			}
		}
		if allowed != 3 {
			t.Fatalf("%d allowed, want 3", allowed)
		}
		if got := packedRead(t, ps, storage.Key{Space: packedSpace(pw), Name: key}, t0+1); got != 3 {
			t.Fatalf("the packed window holds %d after the stack's refunds, want 3", got)
		}
	})
}

// packedSpace is the key space of a packed window (as the limiter names
// it: "swp:<limit>:<window>:<slots>:<levels>").
func packedSpace(w *limiter.SlidingWindow) string {
	c := w.Config()
	return "swp:" + strconv.FormatInt(c.Limit, 10) + ":" + c.Window.String() + ":" + strconv.Itoa(c.Slots) + ":" + strconv.Itoa(storage.PackedLevels)
}

// packedRead is the count in the view of slot f (reads only).
func packedRead(t testing.TB, ps storage.PackedCounter, k storage.Key, f int64) int64 {
	t.Helper()
	op := storage.PackedPlan(f, packedR, 0, packedLen)
	c, err := ps.AddPacked(ctx(t), k, &op)
	if err != nil {
		t.Fatal(err)
	}
	if c.Stale {
		t.Fatalf("a read at slot %d answered Stale", f)
	}
	return storage.PackedTotal(&op, packedR, &c)
}

// testPackedStore checks the store protocol with the limiter's own ops.
func testPackedStore(t *testing.T, ps storage.PackedCounter) {
	t0 := packedT0()
	k := storage.Key{Space: "swp:test", Name: Key(t)}
	add := func(f, n int64) storage.PackedCounts {
		t.Helper()
		op := storage.PackedPlan(f, packedR, n, packedLen)
		c, err := ps.AddPacked(ctx(t), k, &op)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if got := packedRead(t, ps, k, t0); got != 0 {
		t.Fatalf("a fresh key reads %d", got)
	}
	c := add(t0-1, 2)
	for l := 1; l <= storage.PackedLevels; l++ {
		_, fld := storage.PackedField(t0-1, l)
		if got := c.Added[l-1]; got != 2<<(16*fld) {
			t.Fatalf("level %d counter after the first add: %#x, want %#x", l, got, uint64(2)<<(16*fld))
		}
	}
	c = add(t0-1, 3)
	if got := storage.FieldOf(c.Added[3], 3); got != 5 {
		t.Fatalf("level 4 field after two adds: %d, want 5", got)
	}
	add(t0, 7)
	if got := packedRead(t, ps, k, t0); got != 12 {
		t.Fatalf("view of t0 holds %d, want 12", got)
	}
	if got := packedRead(t, ps, k, t0+64); got != 7 {
		t.Fatalf("view of t0+64 holds %d, want 7 (t0-1 is out)", got)
	}
	sub := storage.PackedPlan(t0-1, packedR, 3, packedLen)
	if err := ps.SubPacked(ctx(t), k, &sub); err != nil {
		t.Fatal(err)
	}
	if got := packedRead(t, ps, k, t0); got != 9 {
		t.Fatalf("view of t0 holds %d after a refund of 3, want 9", got)
	}
	testPackedStoreHorizon(t, ps, k, add)
}

// testPackedStoreHorizon continues testPackedStore on its key k, where
// the newest slot written is t0 (add adds n at slot f): writers past and
// at the horizon.
func testPackedStoreHorizon(t *testing.T, ps storage.PackedCounter, k storage.Key, add func(f, n int64) storage.PackedCounts) {
	t0 := packedT0()
	// The newest moves 300 slots on: t0-1 is then past the horizon (65)
	// and behind Keep (129). A store that tracks the newest refuses it
	// (Stale, nothing created); one that keeps counters by age still
	// holds its view exactly.
	add(t0+300, 1)
	late := storage.PackedPlan(t0-1, packedR, 1, packedLen)
	c, err := ps.AddPacked(ctx(t), k, &late)
	if err != nil {
		t.Fatal(err)
	}
	if c.Stale {
		if c.Added != ([storage.PackedLevels]uint64{}) {
			t.Fatalf("a Stale answer reports adds %v", c.Added)
		}
	} else if got := storage.PackedTotal(&late, packedR, &c); got != 10 {
		t.Fatalf("a late writer past the horizon, not Stale, reads %d, want its view exactly (10)", got)
	}
	// Exactly at the horizon: never Stale, its view exact.
	h := storage.PackedPlan(t0+300-65, packedR, 1, packedLen)
	if c, err = ps.AddPacked(ctx(t), k, &h); err != nil {
		t.Fatal(err)
	}
	if c.Stale {
		t.Fatal("a writer at the horizon answered Stale")
	}
	if got := storage.PackedTotal(&h, packedR, &c); got != 2 {
		t.Fatalf("a writer at the horizon reads %d, want 2 (its own and t0+300's)", got)
	}
	// Far past the horizon (three level-4 counters behind): whatever the
	// store answers, the newest writer's view is untouched (a store that
	// created the late counters again in place of live ones would lose
	// it).
	for _, f := range []int64{t0 - 400, t0 - 500, t0 - 700} {
		far := storage.PackedPlan(f, packedR, 1, packedLen)
		if _, err := ps.AddPacked(ctx(t), k, &far); err != nil {
			t.Fatal(err)
		}
	}
	if got := packedRead(t, ps, k, t0+300); got != 1 {
		t.Fatalf("after late writers far past the horizon the newest's view holds %d, want 1", got)
	}
}

// testPackedTopCarry: adds in flight that carry out of a counter's top
// field (past 65,535 units in it: more than 2^15 denied units in flight
// over a limit's worth admitted, or a few large costs) wrap a 64-bit
// counter. The limiter detects each such add (its Added field is below its
// delta), denies it and refunds it; the adds that did not carry are
// refunded too. Every add being in its counter, the refunds must leave
// exactly what was there before, in whatever order they arrive: the top
// field's admitted units and the other fields' units alike. A store that
// clamped a refund once the wrapped counter held less than its delta (a
// per-field clamp, or memcached's decr stopping at 0) would lose them:
// over-admission.
func testPackedTopCarry(t *testing.T, ps storage.PackedCounter) {
	k := storage.Key{Space: "swp:carry", Name: Key(t)}
	// f is in the top field (field 3) at every level: the last slot of a
	// level-4 counter. f-1 is in field 2 of its level-1 counter and in
	// the top field at the others.
	f := packedT0() + 255
	add := func(slot, n int64) (*storage.PackedOp, storage.PackedCounts) {
		t.Helper()
		op := storage.PackedPlan(slot, packedR, n, packedLen)
		c, err := ps.AddPacked(ctx(t), k, &op)
		if err != nil {
			t.Fatal(err)
		}
		return &op, c
	}
	add(f-1, 5)
	add(f, 100)
	if got := packedRead(t, ps, k, f); got != 105 {
		t.Fatalf("before the carries the view of f holds %d, want 105", got)
	}
	const n = 30000 // three of them carry out of 100 + 5 + 2*30000 at every level
	var ops []*storage.PackedOp
	carried := 0
	for range 3 {
		op, c := add(f, n)
		ops = append(ops, op)
		for l := 1; l <= storage.PackedLevels; l++ {
			if _, fld := storage.PackedField(f, l); storage.FieldOf(c.Added[l-1], fld) < n {
				carried++
				break
			}
		}
	}
	if carried != 1 {
		t.Fatalf("%d of the 3 adds saw their field carry, want 1 (the third)", carried)
	}
	// The refunds: the first two (no carry of their own) before the one
	// that carried, as they may arrive.
	for _, op := range ops {
		if err := ps.SubPacked(ctx(t), k, op); err != nil {
			t.Fatal(err)
		}
	}
	if got := packedRead(t, ps, k, f); got != 105 {
		t.Fatalf("after the refunds the view of f holds %d, want 105 (the units admitted before the carries)", got)
	}
	if got := packedRead(t, ps, k, f-1); got != 105 {
		t.Fatalf("after the refunds the view of f-1 holds %d, want 105", got)
	}
}

// slipPacked runs slip (once) before the first SubPacked it forwards.
type slipPacked struct {
	Store
	inner   storage.PackedCounter
	slip    func(storage.Key)
	slipped bool
	key     storage.Key
}

func (p *slipPacked) AddPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) (storage.PackedCounts, error) {
	p.key = k
	return p.inner.AddPacked(ctx, k, op)
}

func (p *slipPacked) SubPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) error {
	if p.slip != nil && !p.slipped {
		p.slipped = true
		p.slip(k)
	}
	return p.inner.SubPacked(ctx, k, op)
}

// packedModel is Bounded at resolution r on slot counts, with the
// top-level field overrun a packed window counts as Later: the slots
// f-r to the end of the 64-slot field holding f+r.
type packedModel struct {
	r     int64
	limit int64
	slots map[int64]int64
}

func (m *packedModel) count(f int64) int64 {
	var sum int64
	for s := f - m.r; s <= (f+m.r)|63; s++ {
		sum += m.slots[s]
	}
	return sum
}

// testPackedAgainstModel replays a random sequence, out of order within
// the horizon (up to r+1 slots behind the newest) and with refunds after
// the roll, through the window and the model, call for call: the
// decisions and remaining counts agree, and every denial's RetryAfter is a
// lower bound (the model denies at every slot before it).
func testPackedAgainstModel(t *testing.T, s Store) {
	const limit = 60
	w := sliding(t, s, limiter.SlidingWindowConfig{Limit: limit, Window: packedR * packedLen, Representation: limiter.Packed, Slots: packedR, NoDenyCache: true})
	key := Key(t)
	m := &packedModel{r: packedR, limit: limit, slots: map[int64]int64{}}
	rs := mrand.New(mrand.NewPCG(13, 13))
	type taken struct{ f, n int64 }
	var allowed []taken
	newest := packedT0() - 300
	late, denied := 0, 0
	for i := range 700 {
		f := newest + int64(rs.IntN(86)) - 65 // up to the horizon behind
		if f > newest {
			newest = f
		} else if f < newest {
			late++
		}
		n := int64(1 + rs.IntN(3))
		at := time.Duration(f*int64(packedLen)+rs.Int64N(int64(packedLen))) - time.Duration(Base.UnixNano())
		d := allow(t, w, key, Base.Add(at), n)
		total := m.count(f) + n
		if d.Allowed != (total <= limit) || (d.Allowed && d.Remaining != limit-total) {
			t.Fatalf("call %d (slot newest%+d, n %d): allowed=%v remaining=%d, Bounded at r=%d: total %d of %d", i, f-newest, n, d.Allowed, d.Remaining, packedR, total, limit)
		}
		if d.Allowed {
			m.slots[f] += n
			allowed = append(allowed, taken{f, n})
		} else {
			denied++
			last := (int64(at) + Base.UnixNano() + int64(d.RetryAfter) - 1) / int64(packedLen)
			for g := f + 1; g <= last; g++ {
				if m.count(g)+n <= limit {
					t.Fatalf("call %d: RetryAfter %v names slot f+%d, but the store admits at f+%d", i, d.RetryAfter, last-f, g-f)
				}
			}
		}
		// Now and then a refund of an earlier take still within the
		// horizon, often after the roll.
		if len(allowed) > 0 && rs.IntN(6) == 0 {
			j := rs.IntN(len(allowed))
			if tk := allowed[j]; tk.f >= newest-packedR-1 {
				at := time.Duration(tk.f*int64(packedLen)) - time.Duration(Base.UnixNano())
				if err := w.Refund(ctx(t), key, Base.Add(at), tk.n); err != nil {
					t.Fatal(err)
				}
				m.slots[tk.f] -= tk.n
				allowed = append(allowed[:j], allowed[j+1:]...)
			}
		}
	}
	if late < 100 || denied < 50 || len(allowed) < 100 {
		t.Fatalf("the run proved little: %d late calls, %d denied, %d kept", late, denied, len(allowed))
	}
}
