package memcached_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/backends/memcached"
)

func pick(t *testing.T, s memcache.ServerSelector, key string) string {
	t.Helper()
	a, err := s.PickServer(key)
	if err != nil {
		t.Fatal(err)
	}
	return a.String()
}

func TestRingAddingANodeRemapsFewKeys(t *testing.T) {
	nodes := []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"}
	before, err := memcached.NewRing(nodes...)
	if err != nil {
		t.Fatal(err)
	}
	after, err := memcached.NewRing(append(nodes, "10.0.0.4:11211")...)
	if err != nil {
		t.Fatal(err)
	}
	// gomemcache's default for comparison: CRC-32 modulo n.
	var modBefore, modAfter memcache.ServerList
	modBefore.SetServers(nodes...)
	modAfter.SetServers(append(nodes, "10.0.0.4:11211")...)

	const keys = 20000
	moved, modMoved := 0, 0
	perNode := map[string]int{}
	for i := range keys {
		k := fmt.Sprintf("k:sw:100:1m0s:10/user-%d|c123", i)
		b, a := pick(t, before, k), pick(t, after, k)
		perNode[b]++
		if a != b {
			moved++
			if a != "10.0.0.4:11211" {
				t.Fatalf("key %q moved from %s to %s, not to the new node", k, b, a)
			}
		}
		if pick(t, &modBefore, k) != pick(t, &modAfter, k) {
			modMoved++
		}
	}
	frac := float64(moved) / keys
	t.Logf("adding a 4th node moved %.1f%% of keys (ideal 25%%); CRC-32 modulo moved %.1f%%", 100*frac, 100*float64(modMoved)/keys)
	if frac > 0.35 || frac < 0.15 {
		t.Fatalf("adding a 4th node moved %.1f%% of keys, want about 25%%", 100*frac)
	}
	for n, c := range perNode {
		if share := float64(c) / keys; share < 0.2 || share > 0.47 {
			t.Fatalf("node %s owns %.1f%% of keys, want about a third", n, 100*share)
		}
	}
	// Removing the node again restores the old placement exactly.
	if err := after.SetNodes(nodes...); err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		k := fmt.Sprintf("user-%d", i)
		if pick(t, before, k) != pick(t, after, k) {
			t.Fatalf("key %q placed differently after removing the added node", k)
		}
	}
}

func TestRingHashTag(t *testing.T) {
	r, err := memcached.NewRing("a:1", "b:1", "c:1", "d:1", "e:1")
	if err != nil {
		t.Fatal(err)
	}
	// Every item of one limiter key lives on one node.
	for i := range 200 {
		base := fmt.Sprintf("k:sw:1/key|%d", i) // a '|' inside the name too
		want := pick(t, r, base+"|b")
		for _, suffix := range []string{"|l", "|c0", "|c-1", "|c9223372036854775807"} {
			if got := pick(t, r, base+suffix); got != want {
				t.Fatalf("%s%s on %s, %s|b on %s", base, suffix, got, base, want)
			}
		}
	}
	// Order and duplicates of the node list do not matter.
	r2, _ := memcached.NewRing("e:1", "d:1", "c:1", "b:1", "a:1", "a:1")
	for i := range 1000 {
		k := fmt.Sprint(i)
		if pick(t, r, k) != pick(t, r2, k) {
			t.Fatalf("key %q placed differently by the same nodes in another order", k)
		}
	}
}

func TestRingErrors(t *testing.T) {
	var empty memcached.Ring
	if _, err := empty.PickServer("x"); !errors.Is(err, memcache.ErrNoServers) {
		t.Fatalf("empty ring: %v, want ErrNoServers", err)
	}
	for _, bad := range []string{"nohost", "host:", ":11211", "host:0", "host:99999", "host:port"} {
		if _, err := memcached.NewRing(bad); err == nil {
			t.Errorf("NewRing(%q) accepted", bad)
		}
	}
	r, _ := memcached.NewRing("a:1")
	if err := r.SetNodes("a:1", "bad"); err == nil || r.Nodes()[0] != "a:1" {
		t.Fatalf("failed SetNodes changed the ring: %v %v", err, r.Nodes())
	}
}
