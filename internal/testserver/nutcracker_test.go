package testserver

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// mcClient is a bare memcached text-protocol client for these tests.
type mcClient struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialMC(t *testing.T, addr string) *mcClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &mcClient{t: t, c: c, r: bufio.NewReader(c)}
}

// do sends cmds (one write) and returns the reply lines up to and
// including the n-th line that ends a reply (anything but VALUE lines and
// data blocks; a get's END counts once).
func (m *mcClient) do(cmds string, n int) []string {
	m.t.Helper()
	m.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := m.c.Write([]byte(cmds)); err != nil {
		m.t.Fatal(err)
	}
	var lines []string
	for ends := 0; ends < n; {
		l, err := m.r.ReadString('\n')
		if err != nil {
			m.t.Fatalf("after %q: %v", lines, err)
		}
		l = strings.TrimSuffix(l, "\r\n")
		lines = append(lines, l)
		if strings.HasPrefix(l, "VALUE ") {
			d, err := m.r.ReadString('\n')
			if err != nil {
				m.t.Fatal(err)
			}
			lines = append(lines, strings.TrimSuffix(d, "\r\n"))
			continue
		}
		ends++
	}
	return lines
}

// TestNutcracker checks what the memcached store relies on through
// nutcracker: keys spread over both shards, a multi-key get split over
// them answered in the order asked (a key asked twice, twice; a miss left
// out), gets with CAS ids and cas, incr wrapping modulo 2^64, noreply, and
// the counters in front of the shards.
func TestNutcracker(t *testing.T) {
	n := StartNutcracker(t, NutcrackerConfig{Count: true})
	m := dialMC(t, n.Addr())
	var keys []string
	for i := range 40 {
		k := fmt.Sprintf("k:test/key%d|c%d", i, i)
		keys = append(keys, k)
		if got := m.do(fmt.Sprintf("set %s 0 0 %d\r\n%d\r\n", k, len(fmt.Sprint(i)), i), 1); got[0] != "STORED" {
			t.Fatalf("set %s: %q", k, got)
		}
	}
	for s, c := range n.Counters {
		if got := c.Counts().Segments; got < 5 {
			t.Errorf("shard %d received %d of 40 sets, want them spread over both shards", s, got)
		}
	}
	ask := append(append([]string{}, keys...), "missing", keys[3])
	lines := m.do("get "+strings.Join(ask, " ")+"\r\n", 1)
	var got []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "VALUE" {
			got = append(got, f[1])
		}
	}
	want := append(append([]string{}, keys...), keys[3])
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("multi-key get over both shards answered\n%v\nwant\n%v", got, want)
	}
	// gets, then cas on its id; a stale id is EXISTS.
	lines = m.do("gets "+keys[1]+"\r\n", 1)
	f := strings.Fields(lines[0])
	if len(f) != 5 {
		t.Fatalf("gets: %q", lines)
	}
	if got := m.do(fmt.Sprintf("cas %s 0 0 1 %s\r\nx\r\n", keys[1], f[4]), 1); got[0] != "STORED" {
		t.Fatalf("cas: %q", got)
	}
	if got := m.do(fmt.Sprintf("cas %s 0 0 1 %s\r\ny\r\n", keys[1], f[4]), 1); got[0] != "EXISTS" {
		t.Fatalf("cas on a stale id: %q", got)
	}
	// incr wraps modulo 2^64; a noreply command sends nothing back.
	if got := m.do("incr "+keys[2]+" 18446744073709551615\r\n", 1); got[0] != "1" {
		t.Fatalf("incr 2 by 2^64-1: %q, want 1", got)
	}
	if got := m.do("incr "+keys[2]+" 5 noreply\r\nget "+keys[2]+"\r\n", 1); len(got) != 3 || got[1] != "6" {
		t.Fatalf("incr noreply then get: %q, want 6", got)
	}
}

// TestNutcrackerFleet checks the balancer spreads client connections over
// the proxies, and that the delay holds shard 0's requests from proxy 0.
func TestNutcrackerFleet(t *testing.T) {
	const delay = 50 * time.Millisecond
	n := StartNutcracker(t, NutcrackerConfig{Proxies: 2, Count: true, Delay: delay})
	if len(n.Proxies) != 2 || len(n.Counters) != 4 {
		t.Fatalf("%d proxies, %d counters", len(n.Proxies), len(n.Counters))
	}
	a, b := dialMC(t, n.Addr()), dialMC(t, n.Addr())
	for _, m := range []*mcClient{a, b} {
		if got := m.do("set k:fleet 0 0 1\r\n1\r\n", 1); got[0] != "STORED" {
			t.Fatalf("set: %q", got)
		}
	}
	var shard int // the shard of k:fleet
	if n.Counters[1].Counts().Segments > 0 || n.Counters[3].Counts().Segments > 0 {
		shard = 1
	}
	for p := range 2 {
		if got := n.Counters[p*2+shard].Counts().Segments; got != 1 {
			t.Errorf("proxy %d sent %d segments to shard %d, want 1 (one connection each)", p, got, shard)
		}
	}
	// A key on shard 0 through proxy 0 waits for the delay.
	m := dialMC(t, n.Proxies[0].Addr())
	for i := 0; ; i++ {
		k := fmt.Sprintf("k:fleet%d", i)
		before := n.Counters[0].Counts().Segments
		start := time.Now()
		m.do("get "+k+"\r\n", 1)
		if n.Counters[0].Counts().Segments == before {
			continue // shard 1
		}
		if took := time.Since(start); took < delay {
			t.Fatalf("a get on shard 0 through proxy 0 took %v, want the delay of %v at least", took, delay)
		}
		break
	}
}

// TestNutcrackerPinned checks that under SLUICE_TEST_PINNED=1 the proxy
// and its shards run on the last CPU only (where scripts/testenv puts the
// shared servers).
func TestNutcrackerPinned(t *testing.T) {
	t.Setenv("SLUICE_TEST_PINNED", "1")
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: nothing to pin")
	}
	n := StartNutcracker(t, NutcrackerConfig{})
	want := strconv.Itoa(runtime.NumCPU() - 1)
	for _, s := range append([]*Server{n.Proxies[0]}, n.Shards...) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
		if err != nil {
			t.Skipf("no /proc: %v", err)
		}
		_, after, _ := strings.Cut(string(b), "Cpus_allowed_list:")
		if got, _, _ := strings.Cut(strings.TrimSpace(after), "\n"); got != want {
			t.Errorf("%s runs on CPUs %q, want %q", s.name, got, want)
		}
	}
}
