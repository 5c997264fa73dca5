package memcached

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter/storage"
)

// modelFake is a memcached of counters for the packed window's commands
// (add, incr, get), counting the commands per level, whose counters can be
// made to vanish (an early eviction).
type modelFake struct {
	mu    sync.Mutex
	vals  map[string]uint64
	adds  [storage.PackedLevels]int
	incrs [storage.PackedLevels]int
	gets  int
	// stored: how adds answer on a missing key (STORED as memcached; an
	// always-NOT_STORED fake shows an existing counter of unknown age).
	notStored bool
}

func (m *modelFake) level(key string) int {
	if _, rest, ok := strings.Cut(key, "|p"); ok {
		return int(rest[0] - '0')
	}
	return 0
}

func (m *modelFake) handle(line string, r *bufio.Reader) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := strings.Fields(line)
	switch f[0] {
	case "add":
		r.ReadString('\n') //nolint:errcheck // the data block
		m.adds[m.level(f[1])-1]++
		if _, ok := m.vals[f[1]]; ok || m.notStored {
			if !ok {
				m.vals[f[1]] = 0
			}
			return "NOT_STORED\r\n"
		}
		m.vals[f[1]] = 0
		return "STORED\r\n"
	case "incr":
		m.incrs[m.level(f[1])-1]++
		v, ok := m.vals[f[1]]
		if !ok {
			return "NOT_FOUND\r\n"
		}
		d, _ := strconv.ParseUint(f[2], 10, 64)
		m.vals[f[1]] = v + d
		return strconv.FormatUint(v+d, 10) + "\r\n"
	case "get":
		m.gets++
		var b strings.Builder
		for _, k := range f[1:] {
			if v, ok := m.vals[k]; ok {
				s := strconv.FormatUint(v, 10)
				fmt.Fprintf(&b, "VALUE %s 0 %d\r\n%s\r\n", k, len(s), s)
			}
		}
		return b.String() + "END\r\n"
	}
	return "ERROR\r\n"
}

// counts returns and resets the commands counted.
func (m *modelFake) counts() (adds, incrs [storage.PackedLevels]int, gets int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	adds, incrs, gets = m.adds, m.incrs, m.gets
	m.adds, m.incrs, m.gets = [storage.PackedLevels]int{}, [storage.PackedLevels]int{}, 0
	return
}

func (m *modelFake) value(key string) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.vals[key]
	return v, ok
}

func (m *modelFake) evict(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.vals[key]; !ok {
		panic("evict: no " + key)
	}
	delete(m.vals, key)
}

// packedDecide runs op for k as AddPacked or as a batch's step.
func packedDecide(s *Store, k storage.Key, op storage.PackedOp, batch bool) (storage.PackedCounts, error) {
	if batch {
		out := make([]storage.StepResult, 1)
		s.Do(context.Background(), []storage.Step{{Kind: storage.StepPackedAdd, Key: k, N: 1, Packed: op}}, out)
		return out[0].Packed, out[0].Err
	}
	return s.AddPacked(context.Background(), k, &op)
}

// TestPackedKnownCounters: a counter this Store's add created is then
// incremented without its add (a warm decision is 4 incrs and one get);
// one that vanished (an incr answers NOT_FOUND) is sent again with its add,
// the other levels not added twice, and is known again after; one whose
// add answered NOT_STORED (age unknown), or whose TTL may have run out, is
// sent with its add. Every answer is the model's: Added each incr's
// result, Read the counters after the adds.
func TestPackedKnownCounters(t *testing.T) {
	const f = 1000
	op := storage.PackedPlan(f, tpR, 1, tpSlot)
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			m := &modelFake{vals: map[string]uint64{}}
			addr := startFake(t, m.handle)
			s, err := New(Config{Addrs: []string{addr}, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			k := storage.Key{Space: "swp", Name: "k"}
			base := s.keys.packedBase(k)
			key := func(c storage.PackedCell) string { return string(appendPackedKey(nil, base, c)) }
			var decideGets func(what string, s *Store, wantAdds, wantIncrs [storage.PackedLevels]int, wantGets int)
			decide := func(what string, s *Store, wantAdds, wantIncrs [storage.PackedLevels]int) {
				t.Helper()
				decideGets(what, s, wantAdds, wantIncrs, 1)
			}
			decideGets = func(what string, s *Store, wantAdds, wantIncrs [storage.PackedLevels]int, wantGets int) {
				t.Helper()
				got, err := packedDecide(s, k, op, batch)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				adds, incrs, gets := m.counts()
				if adds != wantAdds || incrs != wantIncrs || gets != wantGets {
					t.Fatalf("%s: adds %v, incrs %v per level, %d gets; want %v, %v, %d", what, adds, incrs, gets, wantAdds, wantIncrs, wantGets)
				}
				for l := range storage.PackedLevels {
					if v, _ := m.value(key(op.Adds[l].Cell)); got.Added[l] != v {
						t.Fatalf("%s: Added[%d] = %d, the counter holds %d", what, l, got.Added[l], v)
					}
				}
				for i := range op.NReads {
					if v, _ := m.value(key(op.Reads[i])); got.Read[i] != v {
						t.Fatalf("%s: Read[%d] = %d, the counter holds %d", what, i, got.Read[i], v)
					}
				}
			}
			all := [storage.PackedLevels]int{1, 1, 1, 1}
			none := [storage.PackedLevels]int{}
			decide("cold", s, all, all)
			decide("warm", s, none, all)
			for l := range storage.PackedLevels {
				if v, _ := m.value(key(op.Adds[l].Cell)); v != 2*op.Adds[l].Delta {
					t.Fatalf("level %d holds %d after two decisions, want %d", l+1, v, 2*op.Adds[l].Delta)
				}
			}

			m.evict(key(op.Adds[1].Cell))
			// Its first round's get is read and dropped; the second reads again.
			decideGets("level 2 evicted", s, [storage.PackedLevels]int{0, 1, 0, 0}, [storage.PackedLevels]int{1, 2, 1, 1}, 2)
			if v, _ := m.value(key(op.Adds[1].Cell)); v != op.Adds[1].Delta {
				t.Fatalf("level 2 holds %d after its eviction, want one delta %d", v, op.Adds[1].Delta)
			}
			decide("level 2 created again", s, none, all)

			// A counter whose TTL may have run out is sent with its add.
			sh := s.keys.known.shard(k)
			sh.mu.Lock()
			e := sh.m[k]
			e.lv[2].until = knownNow() - 1
			sh.m[k] = e
			sh.mu.Unlock()
			decide("level 3 aged", s, [storage.PackedLevels]int{0, 0, 1, 0}, all)
			// NOT_STORED: it exists, since when is unknown.
			decide("level 3 not known again", s, [storage.PackedLevels]int{0, 0, 1, 0}, all)

			// Another Store (another process) knows nothing of them.
			s2, err := New(Config{Addrs: []string{addr}, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			decide("other store", s2, all, all)
			decide("other store again", s2, all, all)
		})
	}
}

// TestPackedKnownKeepsVanishing: a known counter that answers NOT_FOUND
// every time ends in ErrConflict after its add was sent with it three
// times, as a counter that vanishes between add and incr.
func TestPackedKnownKeepsVanishing(t *testing.T) {
	const f = 1000
	op := storage.PackedPlan(f, tpR, 1, tpSlot)
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			m := &modelFake{vals: map[string]uint64{}}
			var vanish atomic.Bool
			addr := startFake(t, func(line string, r *bufio.Reader) string {
				if vanish.Load() && strings.HasPrefix(line, "incr ") && m.level(strings.Fields(line)[1]) == 3 {
					m.mu.Lock()
					m.incrs[2]++
					m.mu.Unlock()
					return "NOT_FOUND\r\n"
				}
				return m.handle(line, r)
			})
			s, err := New(Config{Addrs: []string{addr}, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			k := storage.Key{Space: "swp", Name: "k"}
			if _, err := packedDecide(s, k, op, batch); err != nil {
				t.Fatal(err)
			}
			m.counts()
			vanish.Store(true)
			_, err = packedDecide(s, k, op, batch)
			if !errors.Is(err, storage.ErrConflict) {
				t.Fatalf("error %v, want ErrConflict", err)
			}
			adds, incrs, _ := m.counts()
			// The incr alone (AddPacked's first round, or the batch's
			// own), then three rounds with the add.
			wantAdds, wantIncrs := 3, 4
			if adds != [storage.PackedLevels]int{0, 0, wantAdds, 0} || incrs != [storage.PackedLevels]int{1, 1, wantIncrs, 1} {
				t.Fatalf("adds %v, incrs %v: want level 3's add %d times, its incr %d times, other levels' incrs once", adds, incrs, wantAdds, wantIncrs)
			}
		})
	}
}

// TestPackedKnownDeletedOnServer: on the real server, a counter deleted
// between two decisions of a Store that knows it is created again at the
// decision's delta, and every other level holds exactly its deltas.
func TestPackedKnownDeletedOnServer(t *testing.T) {
	addr := testserver.Memcached(t)
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			s := testStore(t, Config{Addrs: []string{addr}, Jitter: -1})
			k := storage.Key{Space: "swp:test", Name: uniqueName(t)}
			base := s.keys.packedBase(k)
			key := func(c storage.PackedCell) string { return string(appendPackedKey(nil, base, c)) }
			f := time.Now().UnixNano() / int64(tpSlot)
			op := storage.PackedPlan(f, tpR, 3, tpSlot)
			for range 2 {
				if _, err := packedDecide(s, k, op, batch); err != nil {
					t.Fatal(err)
				}
			}
			for l := range storage.PackedLevels {
				if kc := s.keys.known.lookup(k).lv[l]; !kc.has(op.Adds[l].Cell, knownNow()) {
					t.Fatalf("level %d: its counter is not known after the Store created it", l+1)
				}
			}
			rawCommand(t, addr, "delete "+key(op.Adds[0].Cell), "DELETED")
			got, err := packedDecide(s, k, op, batch)
			if err != nil {
				t.Fatal(err)
			}
			for l := range storage.PackedLevels {
				want := 3 * op.Adds[l].Delta
				if l == 0 {
					want = op.Adds[l].Delta
				}
				v, ok := rawValue(t, addr, key(op.Adds[l].Cell))
				if !ok || v != want || got.Added[l] != want {
					t.Fatalf("level %d: Added %d, the server holds %d (%v), want %d", l+1, got.Added[l], v, ok, want)
				}
			}
			for i := range op.NReads {
				v, _ := rawValue(t, addr, key(op.Reads[i]))
				if got.Read[i] != v {
					t.Fatalf("Read[%d] = %d, the server holds %d", i, got.Read[i], v)
				}
			}
		})
	}
}

// TestKnownCacheBounded: the cache holds at most knownShards*knownPerShard
// keys, and keys too long for it still get their base.
func TestKnownCacheBounded(t *testing.T) {
	kr, err := newKeyer("b:")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 * knownShards * knownPerShard {
		k := storage.Key{Space: "s", Name: strconv.Itoa(i)}
		if got, want := kr.packedBase(k), kr.baseFor(k, maxPackedSuffixLen); got != want {
			t.Fatalf("packedBase(%v) = %q, want %q", k, got, want)
		}
	}
	n := 0
	for i := range kr.known.shards {
		n += len(kr.known.shards[i].m)
	}
	if n > knownShards*knownPerShard || n < knownShards*knownPerShard/2 {
		t.Fatalf("%d keys cached, want at most %d (and most of them used)", n, knownShards*knownPerShard)
	}
	long := storage.Key{Space: "s", Name: strings.Repeat("x", knownMaxKey)}
	if got, want := kr.packedBase(long), kr.baseFor(long, maxPackedSuffixLen); got != want {
		t.Fatalf("packedBase(long) = %q, want %q", got, want)
	}
	if _, ok := kr.known.shard(long).m[long]; ok {
		t.Fatal("a key longer than knownMaxKey was cached")
	}
}

// lookup returns k's cache entry (test helper).
func (c *knownCache) lookup(k storage.Key) knownEntry {
	sh := c.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.m[k]
}
