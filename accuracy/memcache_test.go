package accuracy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
)

func TestSlabClasses(t *testing.T) {
	// memcached 1.6.18 -vv with the default -n 48 -f 1.25 prints 39
	// classes: 96, 120, 152, 192, 240, 304, ..., 315872, 394840, 524288.
	if n := len(slabClasses); n != 39 {
		t.Errorf("%d slab classes, want 39", n)
	}
	if got, want := slabClasses[:6], []int{96, 120, 152, 192, 240, 304}; !slices.Equal(got, want) {
		t.Errorf("first classes %v, want %v", got, want)
	}
	if got, want := slabClasses[len(slabClasses)-3:], []int{315872, 394840, 524288}; !slices.Equal(got, want) {
		t.Errorf("last classes %v, want %v", got, want)
	}
	tests := []struct{ key, value, want int }{
		{30, 7, 96},  // 48+8+31+9 = 96
		{30, 8, 120}, // 97
		{30, 32, 152},
		{1, 1, 96},
		{250, 1000, 1480},
	}
	for _, tt := range tests {
		if got := ItemSize(tt.key, tt.value); got != tt.want {
			t.Errorf("ItemSize(%d, %d) = %d, want %d", tt.key, tt.value, got, tt.want)
		}
	}
}

// mcConn speaks memcached's text protocol, for what gomemcache does not
// offer (stats).
type mcConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func (m *mcConn) cmd(line string, until ...string) []string {
	m.t.Helper()
	if _, err := fmt.Fprintf(m.c, "%s\r\n", line); err != nil {
		m.t.Fatal(err)
	}
	var out []string
	for {
		s, err := m.r.ReadString('\n')
		if err != nil {
			m.t.Fatalf("memcached %q: %v", line, err)
		}
		s = strings.TrimRight(s, "\r\n")
		out = append(out, s)
		if slices.Contains(until, s) || strings.HasPrefix(s, "ERROR") || strings.HasPrefix(s, "CLIENT_ERROR") || strings.HasPrefix(s, "SERVER_ERROR") {
			return out
		}
	}
}

// slabs returns, per slab class in use, its chunk size and used chunks.
func (m *mcConn) slabs() map[int][2]int {
	m.t.Helper()
	out := map[int][2]int{}
	for _, l := range m.cmd("stats slabs", "END") {
		// STAT <class>:chunk_size 96
		f := strings.Fields(l)
		if len(f) != 3 || f[0] != "STAT" {
			continue
		}
		cls, stat, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		c, err1 := strconv.Atoi(cls)
		v, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			continue
		}
		e := out[c]
		switch stat {
		case "chunk_size":
			e[0] = v
		case "used_chunks":
			e[1] = v
		}
		out[c] = e
	}
	return out
}

// usedBytes is the sum over slab classes of chunk size times used chunks.
func usedBytes(s map[int][2]int) int {
	n := 0
	for _, e := range s {
		n += e[0] * e[1]
	}
	return n
}

// TestItemSizeAgainstMemcached checks the item-size formula and the
// simulator's memcached footprint against a private memcached: the slab
// chunk that stores items of given key and value lengths, and the bytes a
// sliding window's counters take when backends/memcached writes them.
func TestItemSizeAgainstMemcached(t *testing.T) {
	srv := testserver.StartMemcached(t)
	c, err := net.DialTimeout("tcp", srv.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := &mcConn{t: t, c: c, r: bufio.NewReader(c)}

	for i, kv := range [][2]int{{30, 7}, {30, 8}, {30, 32}, {30, 33}, {45, 14}, {45, 15}, {60, 20}, {200, 500}} {
		key := fmt.Sprintf("%0*d", kv[0], i)
		before := usedBytes(m.slabs())
		if got := m.cmd(fmt.Sprintf("set %s 0 0 %d\r\n%s", key, kv[1], strings.Repeat("7", kv[1])), "STORED"); got[len(got)-1] != "STORED" {
			t.Fatalf("set: %v", got)
		}
		grown := usedBytes(m.slabs()) - before
		if want := ItemSize(kv[0], kv[1]); grown != want {
			t.Errorf("key %d bytes, value %d bytes: memcached used %d bytes, the formula says %d", kv[0], kv[1], grown, want)
		}
		m.cmd("delete "+key, "DELETED", "NOT_FOUND")
	}

	// A sliding window on backends/memcached: 3 requests in each of k+1
	// consecutive sub-windows leave k+1 counters of one digit.
	store, err := memcached.New(memcached.Config{Addrs: []string{srv.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	p := DefaultParams
	for _, k := range []int{4, 20} {
		cfg := Config{Algorithm: Bounded, SubWindows: k}
		s := int64(p.Window) / int64(k)
		tr := Trace{Name: "counters"}
		for j := range int64(k + 1) {
			for i := range int64(3) {
				tr.Times = append(tr.Times, Epoch.UnixNano()+j*s+i)
			}
		}
		sim, err := Simulate(tr, p, cfg)
		if err != nil {
			t.Fatal(err)
		}
		w, err := limiter.NewSlidingWindow(store, limiter.SlidingWindowConfig{Name: cfg.Name(), Limit: p.Limit, Window: p.Window, SubWindows: k})
		if err != nil {
			t.Fatal(err)
		}
		before := m.slabs()
		for _, at := range tr.Times {
			if d, err := w.Allow(context.Background(), SimKey, time.Unix(0, at)); err != nil || !d.Allowed {
				t.Fatalf("memcached window: %+v, %v", d, err)
			}
		}
		after := m.slabs()
		if got := usedBytes(after) - usedBytes(before); got != sim.Memcached.Bytes {
			t.Errorf("%s: memcached used %d bytes for the key's counters, the simulator says %d (%d items of key %d, value %d bytes)",
				cfg.Name(), got, sim.Memcached.Bytes, sim.Memcached.Items, sim.Memcached.KeyLen, sim.Memcached.ValueLen)
		}
		items := 0
		for cls, e := range after {
			items += e[1] - before[cls][1]
		}
		if items != sim.Memcached.Items {
			t.Errorf("%s: %d items in memcached, the simulator says %d", cfg.Name(), items, sim.Memcached.Items)
		}
	}

	// The prototypes pack more than a count into the same counters: on
	// real memcached (incr of large amounts, decr to refund, values of up
	// to 20 digits) they decide as on the memory store.
	tr := Bursty(p, 10*p.Window, 3)
	for _, cfg := range []Config{{Algorithm: Sliced, SubWindows: 10, Slices: 4}, {Algorithm: Moment, SubWindows: 10}} {
		sim, err := Simulate(tr, p, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var lim limiter.Limiter
		if cfg.Algorithm == Sliced {
			lim, err = NewSlicedWindow(store, p, cfg.SubWindows, cfg.Slices)
		} else {
			lim, err = NewMomentWindow(store, p, cfg.SubWindows)
		}
		if err != nil {
			t.Fatal(err)
		}
		var admits []int64
		for _, at := range tr.Times {
			d, err := lim.AllowN(context.Background(), SimKey+"-"+cfg.Name(), time.Unix(0, at), 1)
			if err != nil {
				t.Fatalf("%s on memcached: %v", cfg.Name(), err)
			}
			if d.Allowed {
				admits = append(admits, at)
			}
		}
		if !slices.Equal(admits, sim.Admits) || sim.Admitted == len(tr.Times) {
			t.Errorf("%s: %d admitted on memcached, %d on the memory store (of %d)", cfg.Name(), len(admits), sim.Admitted, len(tr.Times))
		}
	}
}
