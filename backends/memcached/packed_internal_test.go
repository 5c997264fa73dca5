package memcached

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// The geometry of these tests: the default 160 slots of a one-minute
// window (375 ms).
const (
	tpR    = limiter.DefaultSlots
	tpSlot = time.Minute / tpR
)

// packedCellOf is the level-l counter of slot f and the field of f in it,
// computed here, apart from the limiter's arithmetic.
func packedCellOf(f int64, l int) (idx int64, field uint) {
	return f >> (2 * l), uint((f >> (2 * (l - 1))) & 3)
}

// rawValue reads key with a plain get: its value, or ok false on a miss.
func rawValue(t testing.TB, addr, key string) (v uint64, ok bool) {
	t.Helper()
	reply := rawCommand(t, addr, "get "+key, "END", "ERROR", "CLIENT_ERROR", "SERVER_ERROR")
	if reply == "END\r\n" {
		return 0, false
	}
	lines := strings.Split(reply, "\r\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "VALUE "+key+" ") {
		t.Fatalf("get %s: %q", key, reply)
	}
	v, err := strconv.ParseUint(strings.TrimRight(lines[1], " "), 10, 64)
	if err != nil {
		t.Fatalf("get %s: %q", key, reply)
	}
	return v, true
}

// TestPackedLayout pins the protocol on the real server: a decision of n
// units at slot f adds n<<(16*field) to the item "<base>|p<l>:<f>>(2l)>" at
// every level, which AddPacked returns as Added; each item expires after
// its level's TTL (rounded up to a second, plus one); a refund takes the
// same deltas back and creates nothing.
func TestPackedLayout(t *testing.T) {
	addr := testserver.Memcached(t)
	s := testStore(t, Config{Addrs: []string{addr}, Jitter: -1})
	k := storage.Key{Space: "swp:test", Name: uniqueName(t)}
	base := s.keys.packedBase(k)
	ctx := context.Background()
	f := time.Now().UnixNano() / int64(tpSlot)
	f = f&^15 | 3 // the last slot of a level-1 counter (field 3), not of a level-2 one

	op := storage.PackedPlan(f, tpR, 3, tpSlot)
	c, err := s.AddPacked(ctx, k, &op)
	if err != nil {
		t.Fatal(err)
	}
	if c.Stale {
		t.Fatal("memcached answered Stale")
	}
	for l := 1; l <= storage.PackedLevels; l++ {
		idx, field := packedCellOf(f, l)
		key := fmt.Sprintf("%s|p%d:%d", base, l, idx)
		want := uint64(3) << (16 * field)
		if got, ok := rawValue(t, addr, key); !ok || got != want {
			t.Fatalf("level %d: item %s holds %#x (found %v), want %#x", l, key, got, ok, want)
		}
		if c.Added[l-1] != want {
			t.Fatalf("level %d: Added %#x, want %#x", l, c.Added[l-1], want)
		}
		// TTL: (4^l + 2r+1 + 1) slots, rounded up to a second, plus
		// expirySlack, as memcached's whole-second clock reads it (see
		// TestExpirySetOnServer).
		ttl := time.Duration(int64(1)<<(2*l)+2*tpR+2) * tpSlot
		exp := int((ttl+time.Second-1)/time.Second) + expirySlack
		if got := ttlOnServer(t, addr, key); got < exp-2 || got > exp+2 {
			t.Fatalf("level %d: item expires in %ds, want %d (TTL %v rounded up, plus %d) within 2 s", l, got, exp, ttl, expirySlack)
		}
	}
	// A second decision in the next slot: another field of level 1 (a new
	// counter), the same counters above.
	op2 := storage.PackedPlan(f+1, tpR, 2, tpSlot)
	if c, err = s.AddPacked(ctx, k, &op2); err != nil {
		t.Fatal(err)
	}
	for l := 2; l <= storage.PackedLevels; l++ {
		_, f1 := packedCellOf(f, l)
		_, f2 := packedCellOf(f+1, l)
		if want := uint64(3)<<(16*f1) + uint64(2)<<(16*f2); c.Added[l-1] != want {
			t.Fatalf("level %d after two decisions: %#x, want %#x", l, c.Added[l-1], want)
		}
	}
	if c.Added[0] != 2 {
		t.Fatalf("level 1 of slot f+1 (a new counter): %#x, want 2", c.Added[0])
	}
	// The refund of the first: every level back to the second's alone.
	sub := storage.PackedPlan(f, tpR, 3, tpSlot)
	if err := s.SubPacked(ctx, k, &sub); err != nil {
		t.Fatal(err)
	}
	for l := 1; l <= storage.PackedLevels; l++ {
		idx, field := packedCellOf(f+1, l)
		key := fmt.Sprintf("%s|p%d:%d", base, l, idx)
		if got, _ := rawValue(t, addr, key); got != uint64(2)<<(16*field) {
			t.Fatalf("level %d after the refund: %#x, want %#x", l, got, uint64(2)<<(16*field))
		}
	}
	// A refund never creates a counter.
	far := storage.PackedPlan(f+100000, tpR, 1, tpSlot)
	if err := s.SubPacked(ctx, k, &far); err != nil {
		t.Fatal(err)
	}
	for l := 1; l <= storage.PackedLevels; l++ {
		idx, _ := packedCellOf(f+100000, l)
		if _, ok := rawValue(t, addr, fmt.Sprintf("%s|p%d:%d", base, l, idx)); ok {
			t.Fatalf("a refund created the level-%d counter", l)
		}
	}
}

// rawSet stores v under key.
func rawSet(t testing.TB, addr, key string, v uint64) {
	t.Helper()
	d := strconv.FormatUint(v, 10)
	rawCommand(t, addr, fmt.Sprintf("set %s 0 60 %d\r\n%s", key, len(d), d), "STORED")
}

// TestPackedWraps: incr wraps modulo 2^64 (no clamping): a top field that
// overflows carries out of the value, Added shows it (the field reads
// below the delta) and the limiter denies the request; a carry between
// fields is given back exactly by the refund.
func TestPackedWraps(t *testing.T) {
	addr := testserver.Memcached(t)
	s := testStore(t, Config{Addrs: []string{addr}, Jitter: -1})
	ctx := context.Background()
	base := func(k storage.Key) string { return s.keys.packedBase(k) }
	// A slot in field 3 of its level-4 counter, field 2 of level 3.
	f := (time.Now().UnixNano()/int64(tpSlot))&^255 + 3*64 + 2*16

	k := storage.Key{Space: "swp:test", Name: uniqueName(t)}
	idx4, _ := packedCellOf(f, 4)
	key4 := fmt.Sprintf("%s|p4:%d", base(k), idx4)
	rawSet(t, addr, key4, uint64(0xffff)<<48+5)
	op := storage.PackedPlan(f, tpR, 1, tpSlot)
	c, err := s.AddPacked(ctx, k, &op)
	if err != nil {
		t.Fatal(err)
	}
	if c.Added[3] != 5 {
		t.Fatalf("level 4 after 0xffff<<48+5 plus 1<<48: %#x, want 5 (wrapped modulo 2^64)", c.Added[3])
	}
	if got, _ := rawValue(t, addr, key4); got != 5 {
		t.Fatalf("level 4 on the server: %#x, want 5", got)
	}

	// A carry from field 2 into field 3 of the level-3 counter; the
	// refund borrows it back exactly.
	k2 := storage.Key{Space: "swp:test", Name: uniqueName(t) + "-carry"}
	idx3, fld3 := packedCellOf(f, 3)
	if fld3 != 2 {
		t.Fatalf("slot in field %d of level 3, want 2", fld3)
	}
	key3 := fmt.Sprintf("%s|p3:%d", base(k2), idx3)
	before := uint64(7)<<48 | uint64(0xffff)<<32 | 9
	rawSet(t, addr, key3, before)
	if c, err = s.AddPacked(ctx, k2, &op); err != nil {
		t.Fatal(err)
	}
	if want := uint64(8)<<48 | 9; c.Added[2] != want {
		t.Fatalf("level 3 after the carry: %#x, want %#x", c.Added[2], want)
	}
	if err := s.SubPacked(ctx, k2, &op); err != nil {
		t.Fatal(err)
	}
	if got, _ := rawValue(t, addr, key3); got != before {
		t.Fatalf("level 3 after the refund: %#x, want %#x (borrowed back)", got, before)
	}

	// Through the limiter: a window whose level-4 field is full denies,
	// and its decision says nothing of the wrap but the denial.
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 10, Window: time.Minute, Representation: limiter.Packed, NoDenyCache: true})
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName(t) + "-window"
	wk := storage.Key{Space: fmt.Sprintf("swp:10:%v:%d:%d", time.Minute, tpR, storage.PackedLevels), Name: name}
	wkey4 := fmt.Sprintf("%s|p4:%d", base(wk), idx4)
	rawSet(t, addr, wkey4, uint64(0xffff)<<48)
	at := time.Unix(0, f*int64(tpSlot))
	if d, err := w.Allow(ctx, name, at); err != nil || d.Allowed {
		t.Fatalf("a decision whose top field wrapped: %+v, %v; want denied", d, err)
	}
	// Its refund (noreply, on the store's connection) subtracts modulo
	// 2^64: the wrapped counter holds its 0xffff units again, where a decr
	// would have stopped at 0 and lost them.
	var got uint64
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if got, _ = rawValue(t, addr, wkey4); got == uint64(0xffff)<<48 {
			return
		}
	}
	t.Fatalf("level 4 after the wrapped decision's refund: %#x, want %#x", got, uint64(0xffff)<<48)
}

// TestPackedAgainstModel: random decisions, reads and refunds on one key,
// one at a time, against a model of the counters computed here: every
// Added and every Read is exactly the model's (reads of a counter also
// added to, repeated reads, reads of missing counters), and refunds
// subtract modulo 2^64 (an incr of 2^64-delta, exact after a wrap; the
// random refunds here need not match an add, so some wrap below 0), never
// creating a counter.
// Through Do and through AddPacked/SubPacked, plain and in proxy mode.
func TestPackedAgainstModel(t *testing.T) {
	addr := testserver.Memcached(t)
	for _, c := range []struct {
		name  string
		proxy bool
		batch bool
	}{{"Single", false, false}, {"Batch", false, true}, {"Proxy", true, false}, {"ProxyBatch", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			s := testStore(t, Config{Addrs: []string{addr}, Proxy: c.proxy})
			k := storage.Key{Space: "swp:test", Name: uniqueName(t)}
			ctx := context.Background()
			model := map[storage.PackedCell]uint64{}
			rs := rand.New(rand.NewPCG(7, 13))
			f0 := time.Now().UnixNano() / int64(tpSlot)
			add := func(op *storage.PackedOp) storage.PackedCounts {
				t.Helper()
				if !c.batch {
					got, err := s.AddPacked(ctx, k, op)
					if err != nil {
						t.Fatal(err)
					}
					return got
				}
				// A batch of the op and another key's, to share the
				// pipeline.
				other := storage.PackedPlan(op.Slot, tpR, 1, tpSlot)
				steps := []storage.Step{
					{Kind: storage.StepAdd, Key: storage.Key{Space: "sw", Name: k.Name}, Idx: 5, Span: 3, N: 1, TTL: time.Minute},
					{Kind: storage.StepPackedAdd, Key: k, N: 1, Packed: *op},
					{Kind: storage.StepPackedAdd, Key: storage.Key{Space: "swp:other", Name: k.Name}, N: 1, Packed: other},
				}
				out := make([]storage.StepResult, len(steps))
				s.Do(ctx, steps, out)
				for _, r := range out {
					if r.Err != nil {
						t.Fatal(r.Err)
					}
				}
				return out[1].Packed
			}
			sub := func(op *storage.PackedOp) {
				t.Helper()
				if !c.batch {
					if err := s.SubPacked(ctx, k, op); err != nil {
						t.Fatal(err)
					}
					return
				}
				out := make([]storage.StepResult, 1)
				s.Do(ctx, []storage.Step{{Kind: storage.StepPackedSub, Key: k, N: 1, Packed: *op}}, out)
				if out[0].Err != nil {
					t.Fatal(out[0].Err)
				}
				// noreply: the next request of this goroutine goes out on
				// the same connection (the pool is last in, first out),
				// after it.
			}
			reads, subs := 0, 0
			for i := range 300 {
				f := f0 + int64(rs.IntN(600)) - 300
				n := int64(rs.IntN(4)) // 0: reads only
				op := storage.PackedPlan(f, tpR, n, tpSlot)
				if rs.IntN(4) == 0 {
					sop := op
					sop.NReads = 0
					for l := range storage.PackedLevels {
						d := sop.Adds[l]
						if d.Delta == 0 {
							continue
						}
						if v, ok := model[d.Cell]; ok {
							model[d.Cell] = v - d.Delta // modulo 2^64
						}
					}
					sub(&sop)
					subs++
					continue
				}
				for l := range storage.PackedLevels {
					if d := op.Adds[l]; d.Delta != 0 {
						model[d.Cell] += d.Delta
					}
				}
				got := add(&op)
				for l := range storage.PackedLevels {
					want := uint64(0)
					if d := op.Adds[l]; d.Delta != 0 {
						want = model[d.Cell]
					}
					if got.Added[l] != want {
						t.Fatalf("op %d (slot f0%+d, n %d): Added[%d] = %#x, want %#x", i, f-f0, n, l, got.Added[l], want)
					}
				}
				for j := range op.NReads {
					if want := model[op.Reads[j]]; got.Read[j] != want {
						t.Fatalf("op %d (slot f0%+d, n %d): Read[%d] (level %d index %d) = %#x, want %#x", i, f-f0, n, j, op.Reads[j].Level, op.Reads[j].Index, got.Read[j], want)
					}
					reads++
				}
			}
			if reads < 800 || subs < 30 {
				t.Fatalf("the run proved little: %d reads, %d refunds", reads, subs)
			}
		})
	}
}

// TestPackedPipelineAgainstFakes: a counter that vanishes between its add
// and its incr is sent again alone (the other levels are not added twice),
// and replies a real server never sends are errors.
func TestPackedPipelineAgainstFakes(t *testing.T) {
	k := storage.Key{Space: "swp", Name: "k"}
	const f = 1000
	op := storage.PackedPlan(f, tpR, 1, tpSlot)
	base := "k:swp/k"
	for _, c := range []struct {
		name string
		// reply to add, incr (of level l, its n-th time) or get
		reply   func(cmd string, level, n int) string
		wantErr error // nil: success
		incrs   [storage.PackedLevels]int
	}{
		{"Normal", func(cmd string, level, _ int) string {
			switch cmd {
			case "add":
				return "NOT_STORED\r\n"
			case "incr":
				return strconv.Itoa(level) + "\r\n"
			}
			return "END\r\n"
		}, nil, [4]int{1, 1, 1, 1}},
		{"Level2VanishesOnce", func(cmd string, level, n int) string {
			switch {
			case cmd == "add":
				return "STORED\r\n"
			case cmd == "incr" && level == 2 && n == 1:
				return "NOT_FOUND\r\n"
			case cmd == "incr":
				return strconv.Itoa(level) + "\r\n"
			}
			return "END\r\n"
		}, nil, [4]int{1, 2, 1, 1}},
		{"Level4VanishesOnce", func(cmd string, level, n int) string {
			switch {
			case cmd == "add":
				return "STORED\r\n"
			case cmd == "incr" && level == 4 && n == 1:
				return "NOT_FOUND\r\n"
			case cmd == "incr":
				return strconv.Itoa(level) + "\r\n"
			}
			return "END\r\n"
		}, nil, [4]int{1, 1, 1, 2}},
		{"KeepsVanishing", func(cmd string, level, _ int) string {
			switch {
			case cmd == "add":
				return "STORED\r\n"
			case cmd == "incr" && level == 3:
				return "NOT_FOUND\r\n"
			case cmd == "incr":
				return "1\r\n"
			}
			return "END\r\n"
		}, storage.ErrConflict, [4]int{1, 1, 3, 1}}, // 4 in a batch: its own round, then three as AddPacked (as a window's Add)
		{"NotANumber", func(cmd string, _, _ int) string {
			switch cmd {
			case "add":
				return "NOT_STORED\r\n"
			case "incr":
				return "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
			}
			return "END\r\n"
		}, storage.ErrCorruptState, [4]int{}},
		{"ForeignKeyInReply", func(cmd string, _, _ int) string {
			switch cmd {
			case "add":
				return "NOT_STORED\r\n"
			case "incr":
				return "1\r\n"
			}
			return "VALUE " + base + "|p2:7 0 1\r\n1\r\nEND\r\n"
		}, ErrUnavailable, [4]int{}},
		{"NegativeValue", func(cmd string, _, _ int) string {
			switch cmd {
			case "add":
				return "NOT_STORED\r\n"
			case "incr":
				return "1\r\n"
			}
			return fmt.Sprintf("VALUE %s|p%d:%d 0 2\r\n-1\r\nEND\r\n", base, op.Reads[0].Level, op.Reads[0].Index)
		}, storage.ErrCorruptState, [4]int{}},
	} {
		for _, batch := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/batch=%v", c.name, batch), func(t *testing.T) {
				var mu sync.Mutex
				var incrs [storage.PackedLevels]int
				addr := startFake(t, func(line string, r *bufio.Reader) string {
					mu.Lock()
					defer mu.Unlock()
					fields := strings.Fields(line)
					level := 0
					if len(fields) > 1 {
						if _, rest, ok := strings.Cut(fields[1], "|p"); ok {
							level = int(rest[0] - '0')
						}
					}
					switch fields[0] {
					case "add":
						r.ReadString('\n') // the data block
					case "incr":
						incrs[level-1]++
						return c.reply("incr", level, incrs[level-1])
					case "get":
						if len(fields) > storage.MaxPackedReads+1 {
							return "CLIENT_ERROR too many keys\r\n"
						}
					default:
						return "ERROR\r\n"
					}
					return c.reply(fields[0], level, 0)
				})
				s, err := New(Config{Addrs: []string{addr}, Timeout: 500 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				var got storage.PackedCounts
				o := op
				if batch {
					out := make([]storage.StepResult, 1)
					s.Do(context.Background(), []storage.Step{{Kind: storage.StepPackedAdd, Key: k, N: 1, Packed: o}}, out)
					got, err = out[0].Packed, out[0].Err
				} else {
					got, err = s.AddPacked(context.Background(), k, &o)
				}
				if c.wantErr != nil {
					if !errors.Is(err, c.wantErr) {
						t.Fatalf("error %v, want %v", err, c.wantErr)
					}
				} else if err != nil {
					t.Fatal(err)
				} else {
					for l := range storage.PackedLevels {
						if got.Added[l] != uint64(l+1) {
							t.Fatalf("Added %v, want each level's reply", got.Added)
						}
					}
				}
				mu.Lock()
				defer mu.Unlock()
				want := c.incrs
				if batch && c.wantErr == storage.ErrConflict {
					want[2]++
				}
				if c.incrs != ([storage.PackedLevels]int{}) && incrs != want {
					t.Fatalf("incrs per level %v, want %v (a level added twice, or not again)", incrs, want)
				}
			})
		}
	}
}
