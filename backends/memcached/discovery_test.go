package memcached

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
)

// configEndpoint is a fake ElastiCache configuration endpoint: it answers
// "config get cluster" with the current version and node list.
type configEndpoint struct {
	mu      sync.Mutex
	version int
	nodes   string // "host|ip|port host|ip|port"
	legacy  bool   // only knows "get AmazonElastiCache:cluster" (engines before 1.4.14)
	raw     string // when set, the whole reply
	calls   int
}

func (e *configEndpoint) set(version int, nodes string) {
	e.mu.Lock()
	e.version, e.nodes = version, nodes
	e.mu.Unlock()
}

func (e *configEndpoint) start(t testing.TB) string {
	return startFake(t, func(line string, _ *bufio.Reader) string {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.calls++
		body := fmt.Sprintf("%d\n%s\n", e.version, e.nodes)
		switch {
		case e.raw != "":
			return e.raw
		case line == "config get cluster" && !e.legacy:
			return fmt.Sprintf("CONFIG cluster 0 %d\r\n%s\r\nEND\r\n", len(body), body)
		case line == "get AmazonElastiCache:cluster" && e.legacy:
			return fmt.Sprintf("VALUE AmazonElastiCache:cluster 0 %d\r\n%s\r\nEND\r\n", len(body), body)
		}
		return "ERROR\r\n"
	})
}

// elastiCacheNode renders addr ("127.0.0.1:port") as a cluster config entry.
func elastiCacheNode(host, addr string) string {
	h, p, _ := net.SplitHostPort(addr)
	return host + "|" + h + "|" + p
}

func TestParseClusterConfig(t *testing.T) {
	// The example from the ElastiCache documentation.
	v, nodes, err := parseClusterConfig([]byte("12\nmyCluster.pc4ldq.0001.use1.cache.amazonaws.com|10.82.235.120|11211 myCluster.pc4ldq.0002.use1.cache.amazonaws.com|10.80.249.27|11211\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"myCluster.pc4ldq.0001.use1.cache.amazonaws.com:11211", "myCluster.pc4ldq.0002.use1.cache.amazonaws.com:11211"}
	if v != 12 || !slices.Equal(nodes, want) {
		t.Fatalf("got version %d nodes %q", v, nodes)
	}
	// A node without a hostname is reached by IP (IPv6 bracketed).
	_, nodes, err = parseClusterConfig([]byte("1\n|10.0.0.1|11211 |::1|11212\n"))
	if err != nil || !slices.Equal(nodes, []string{"10.0.0.1:11211", "[::1]:11212"}) {
		t.Fatalf("got %q, %v", nodes, err)
	}
	for _, bad := range []string{"", "12", "x\nh|i|1\n", "1\n\n", "1\nhost|ip\n", "1\n||11211\n", "1\nh|i|port\n"} {
		if _, _, err := parseClusterConfig([]byte(bad)); err == nil {
			t.Errorf("parseClusterConfig(%q) accepted", bad)
		}
	}
}

func TestAutoDiscovery(t *testing.T) {
	mc := testserver.Memcached(t)
	e := &configEndpoint{}
	e.set(3, elastiCacheNode("", mc))
	endpoint := e.start(t)

	s, err := New(Config{AutoDiscovery: endpoint, DiscoveryInterval: -1, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.Nodes(); !slices.Equal(got, []string{mc}) {
		t.Fatalf("nodes %q, want [%s]", got, mc)
	}
	w, err := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 2, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprint("discovery-", time.Now().UnixNano())
	for i, want := range []bool{true, true, false} {
		d, err := w.Allow(context.Background(), key, time.Now())
		if err != nil || d.Allowed != want {
			t.Fatalf("request %d through discovered nodes: %+v, %v", i, d, err)
		}
	}

	// A newer config replaces the nodes; an older one is ignored.
	e.set(4, elastiCacheNode("node-a.example", "10.0.0.1:11211")+" "+elastiCacheNode("", "10.0.0.2:11211"))
	if err := s.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := s.Nodes(), []string{"10.0.0.2:11211", "node-a.example:11211"}; !slices.Equal(got, want) {
		t.Fatalf("after refresh: nodes %q, want %q", got, want)
	}
	e.set(2, elastiCacheNode("", mc))
	if err := s.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.Nodes(); len(got) != 2 {
		t.Fatalf("an older config version replaced the nodes: %q", got)
	}
}

func TestAutoDiscoveryRefreshesInBackground(t *testing.T) {
	e := &configEndpoint{}
	e.set(1, "|10.0.0.1|11211")
	s, err := New(Config{AutoDiscovery: e.start(t), DiscoveryInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e.set(2, "|10.0.0.1|11211 |10.0.0.2|11211")
	deadline := time.Now().Add(10 * time.Second)
	for len(s.Nodes()) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("nodes not refreshed: %q", s.Nodes())
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.Close()
	e.mu.Lock()
	calls := e.calls
	e.mu.Unlock()
	time.Sleep(50 * time.Millisecond)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.calls != calls {
		t.Fatalf("discovery went on after Close: %d calls, then %d", calls, e.calls)
	}
}

func TestAutoDiscoveryLegacyCommand(t *testing.T) {
	e := &configEndpoint{legacy: true}
	e.set(7, "|10.0.0.9|11211")
	s, err := New(Config{AutoDiscovery: e.start(t), DiscoveryInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.Nodes(); !slices.Equal(got, []string{"10.0.0.9:11211"}) {
		t.Fatalf("nodes %q", got)
	}
}

func TestAutoDiscoveryErrors(t *testing.T) {
	for _, raw := range []string{
		"END\r\n", // a plain memcached: no such config
		"SERVER_ERROR out of memory\r\n",
		"CONFIG cluster 0 5\r\n1\nx\n\r\nEND\r\n",          // wrong length
		"CONFIG cluster 0 2\r\n1\n\r\nEND\r\n",             // no node line
		"CONFIG cluster 0 99999999\r\n",                    // absurd size
		"CONFIG cluster 0 8\r\n1\n|h|1\n\r\nEN",            // truncated
		"CONFIG cluster 0 14\r\n1\n|h|1 |i|x\n\r\nEND\r\n", // bad port
	} {
		e := &configEndpoint{raw: raw}
		_, err := New(Config{AutoDiscovery: e.start(t), DiscoveryInterval: -1, Timeout: time.Second})
		if !errors.Is(err, ErrDiscovery) || !errors.Is(err, ErrUnavailable) {
			t.Errorf("reply %q: %v, want ErrDiscovery and ErrUnavailable", raw, err)
		}
	}
	// An endpoint that accepts and never answers: New gives up at Timeout.
	release := make(chan struct{})
	hang := startFake(t, func(string, *bufio.Reader) string { <-release; return "" })
	defer close(release)
	start := time.Now()
	_, err := New(Config{AutoDiscovery: hang, Timeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hanging endpoint: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("hanging endpoint: New took %v with a 100ms timeout", el)
	}
	if _, err := New(Config{AutoDiscovery: "nohost"}); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Fatalf("bad endpoint address: %v", err)
	}
	if _, err := New(Config{AutoDiscovery: "a:1", Addrs: []string{"b:1"}}); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Fatalf("both Addrs and AutoDiscovery: %v", err)
	}
}

// TestRefreshForgetsDepartedBreakers: a node that leaves the ring on a
// refresh takes its breaker with it; the node that stays keeps its own.
func TestRefreshForgetsDepartedBreakers(t *testing.T) {
	a, b := testserver.Memcached(t), testserver.StartMemcached(t).Addr()
	e := &configEndpoint{}
	e.set(1, elastiCacheNode("", a)+" "+elastiCacheNode("", b))
	s, err := New(Config{AutoDiscovery: e.start(t), DiscoveryInterval: -1, Timeout: 5 * time.Second, Breaker: &BreakerConfig{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, err := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 1 << 20, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	nodes := func() []string {
		var out []string
		for _, st := range s.Breakers() {
			out = append(out, st.Node)
		}
		slices.Sort(out)
		return out
	}
	// Keys until both nodes have been called (each gets its breaker).
	for i := 0; len(nodes()) < 2; i++ {
		if i == 1000 {
			t.Fatalf("1000 keys reached only %q", nodes())
		}
		if _, err := w.Allow(context.Background(), fmt.Sprint("departed-", i), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	e.set(2, elastiCacheNode("", b))
	if err := s.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := nodes(); !slices.Equal(got, []string{b}) {
		t.Fatalf("breakers after %s left: %q, want [%s]", a, got, b)
	}
}
