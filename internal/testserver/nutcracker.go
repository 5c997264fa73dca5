package testserver

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// NutcrackerConfig configures [StartNutcracker]. The zero value is one
// proxy in front of two shards, nothing counted, no delay.
type NutcrackerConfig struct {
	// Shards is the number of private memcached servers; zero means 2.
	Shards int
	// Proxies is the number of nutcracker processes, each in front of
	// every shard; zero means 1. With more than one, Addr is a balancer
	// that hands each new client connection to the next proxy in turn, as
	// a load balancer spreads connections over a managed proxy fleet:
	// the commands of two client connections then reach a shard in an
	// order that no one proxy chose.
	Proxies int
	// Count puts a counting [Proxy] between each nutcracker and each
	// shard (Nutcracker.Counters), to count what the servers receive.
	Count bool
	// Delay, when positive, holds every request segment proxy p sends to
	// shard p (for each p below both counts) for that long before it
	// reaches the server (replies are not held): with two proxies and two
	// shards, each proxy has one slow path and one fast path, crossed.
	// The commands of one pipeline that a proxy sends to different
	// shards then run in another order than they were written, by
	// milliseconds instead of microseconds, and two clients on different
	// proxies see each other's writes on different shards in opposite
	// orders.
	Delay time.Duration
	// HashTag, when set, is nutcracker's hash_tag: two characters, and a
	// key that holds the first is placed by the part between it and the
	// next second character (all of it when that is missing), so keys
	// that share that part live on one shard. ElastiCache Serverless
	// documents no such thing for memcached: tests use it to show what
	// placing a limiter key's items on one shard changes.
	HashTag string
}

// Nutcracker is twemproxy (nutcracker) sharding keys over private
// memcached servers, as ElastiCache Serverless shards keys behind one
// endpoint: each key lives on one shard (ketama over MD5 of the whole
// key), a multi-key get is split by shard and its replies merged in the
// order asked, and the commands of one client pipeline that go to
// different shards run on different servers, concurrently. Everything is
// stopped by PID or closed when the test ends.
type Nutcracker struct {
	addr string
	// Proxies are the nutcracker processes.
	Proxies []*Server
	// Shards are the memcached servers, in the order of the proxies'
	// server lists.
	Shards []*Server
	// Counters are the counting proxies between proxy p and shard s,
	// Counters[p*len(Shards)+s] (nil unless NutcrackerConfig.Count).
	Counters []*Proxy
}

// Addr returns the address clients use: the proxy's, or the balancer's in
// front of several.
func (n *Nutcracker) Addr() string { return n.addr }

// Counts returns the sum of the counters' counts (zero without Count).
func (n *Nutcracker) Counts() ProxyCounts {
	var c ProxyCounts
	for _, p := range n.Counters {
		pc := p.Counts()
		c.Segments += pc.Segments
		c.NoReply += pc.NoReply
		c.Bytes += pc.Bytes
	}
	return c
}

// StartNutcracker starts cfg.Shards private memcached servers and
// cfg.Proxies nutcrackers in front of them, each on a free loopback port
// with a generated configuration, and waits until they accept
// connections. The binary is SLUICE_TEST_NUTCRACKER_BIN, or nutcracker on
// PATH or in /usr/sbin; a missing one skips the test (fails it under
// SLUICE_TEST_REQUIRE_SERVERS=1).
func StartNutcracker(t testing.TB, cfg NutcrackerConfig) *Nutcracker {
	t.Helper()
	bin := nutcrackerBin()
	if bin == "" {
		missing(t, "no nutcracker binary ("+EnvNutcrackerBin+" unset and none on PATH or in /usr/sbin; apt-get install nutcracker)")
	}
	if cfg.Shards <= 0 {
		cfg.Shards = 2
	}
	if cfg.Proxies <= 0 {
		cfg.Proxies = 1
	}
	n := &Nutcracker{}
	for range cfg.Shards {
		n.Shards = append(n.Shards, startShard(t))
	}
	var front []string
	for p := range cfg.Proxies {
		var targets []string
		for s, m := range n.Shards {
			addr := m.Addr()
			if p == s && cfg.Delay > 0 {
				addr = forward(t, func(int) string { return m.Addr() }, cfg.Delay)
			}
			if cfg.Count {
				c := NewProxy(t, addr)
				n.Counters = append(n.Counters, c)
				addr = c.Addr()
			}
			targets = append(targets, addr)
		}
		srv := startNutcracker(t, bin, targets, cfg.HashTag)
		n.Proxies = append(n.Proxies, srv)
		front = append(front, srv.Addr())
	}
	n.addr = front[0]
	if len(front) > 1 {
		n.addr = forward(t, func(i int) string { return front[i%len(front)] }, 0)
	}
	return n
}

// startNutcracker starts one nutcracker sharding over targets (by
// hashTag, if set).
func startNutcracker(t testing.TB, bin string, targets []string, hashTag string) *Server {
	t.Helper()
	dir := t.TempDir()
	stats := freePort()
	return start(t, "nutcracker", 10*time.Second, func(port int) *exec.Cmd {
		conf := filepath.Join(dir, "nutcracker.yml")
		if err := os.WriteFile(conf, []byte(nutcrackerConf(port, targets, hashTag)), 0o644); err != nil {
			t.Errorf("testserver: %v", err) // start then fails on the missing file
		}
		return serverCommand(bin, "-c", conf,
			"-s", strconv.Itoa(stats), "-a", "127.0.0.1",
			"-p", filepath.Join(dir, "nutcracker.pid"),
			"-o", filepath.Join(dir, "nutcracker.log"))
	})
}

// startShard starts a private memcached as StartMemcached does, on the
// servers' CPU when pinned (serverCommand).
func startShard(t testing.TB) *Server {
	t.Helper()
	return startMemcached(t, serverCommand)
}

// serverCommand runs bin with args, under `taskset -c <last CPU>` when
// scripts/testenv pinned the shared servers there (SLUICE_TEST_PINNED=1:
// the test runs on the other CPUs), so that the proxy and its shards run
// beside the shared servers and not on the client's CPU, as they would on
// other hosts.
func serverCommand(bin string, args ...string) *exec.Cmd {
	if os.Getenv("SLUICE_TEST_PINNED") == "1" {
		if ts, err := exec.LookPath("taskset"); err == nil && runtime.NumCPU() >= 2 {
			return exec.Command(ts, append([]string{"-c", strconv.Itoa(runtime.NumCPU() - 1), bin}, args...)...)
		}
	}
	return exec.Command(bin, args...)
}

// nutcrackerBin returns the nutcracker binary, or "".
func nutcrackerBin() string {
	if bin := os.Getenv(EnvNutcrackerBin); bin != "" {
		return bin
	}
	if bin, err := exec.LookPath("nutcracker"); err == nil {
		return bin
	}
	if _, err := os.Stat("/usr/sbin/nutcracker"); err == nil {
		return "/usr/sbin/nutcracker" // Debian's, off a user's PATH
	}
	return ""
}

// nutcrackerConf is the configuration of one memcached pool listening on
// port and sharding over servers (host:port each) by ketama over MD5 of
// the whole key, or of its hash-tag part when hashTag is set (by default
// none: ElastiCache Serverless offers none for memcached). Not fnv1a_64:
// twemproxy keeps its low 32 bits, which a change in a key's last bytes
// barely moves, so the sub-window counters of one limiter key
// ("...|c1000", "...|c1001") all land on one shard. One connection per
// server (the default: more would let the proxy reorder two commands on
// one key, twemproxy's documented caveat), hosts never ejected, and a
// server silent for 5 s fails the request.
func nutcrackerConf(port int, servers []string, hashTag string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sluice:\n  listen: 127.0.0.1:%d\n  hash: md5\n  distribution: ketama\n", port)
	if hashTag != "" {
		fmt.Fprintf(&b, "  hash_tag: %q\n", hashTag)
	}
	b.WriteString("  timeout: 5000\n  auto_eject_hosts: false\n  server_connections: 1\n  servers:\n")
	for i, s := range servers {
		fmt.Fprintf(&b, "    - %s:1 shard%d\n", s, i)
	}
	return b.String()
}

// forward starts a TCP forwarder that sends its i-th client connection to
// target(i) and, when delay is positive, holds every request segment that
// long before writing it on (in order; replies flow back at once). It
// returns its address and stops when the test ends.
func forward(t testing.TB, target func(i int) string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{delay: delay}
	var accepted atomic.Int64
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go f.serve(c, target(int(accepted.Add(1)-1)))
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		f.close()
		f.wg.Wait()
	})
	return ln.Addr().String()
}

type forwarder struct {
	delay  time.Duration
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

// track keeps cs to close at the end, or closes them if that has come.
func (f *forwarder) track(cs ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	f.conns = append(f.conns, cs...)
	return true
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for _, c := range f.conns {
		c.Close()
	}
}

func (f *forwarder) serve(c net.Conn, target string) {
	defer f.wg.Done()
	s, err := net.Dial("tcp", target)
	if err != nil {
		c.Close()
		return
	}
	if !f.track(c, s) {
		return
	}
	go func() {
		io.Copy(c, s) //nolint:errcheck // ends with either side
		c.Close()
	}()
	if f.delay <= 0 {
		io.Copy(s, c) //nolint:errcheck // ends with either side
		s.Close()
		return
	}
	type segment struct {
		b  []byte
		at time.Time
	}
	ch := make(chan segment, 1024)
	go func() {
		defer s.Close()
		failed := false
		for seg := range ch { // drained to the end: the reader never blocks
			if failed {
				continue
			}
			time.Sleep(time.Until(seg.at))
			_, err := s.Write(seg.b)
			failed = err != nil
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			ch <- segment{b: append([]byte(nil), buf[:n]...), at: time.Now().Add(f.delay)}
		}
		if err != nil {
			break
		}
	}
	close(ch)
}
