package memcached

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/bradfitz/gomemcache/memcache"
)

// PointsPerNode is the number of points each node has on a [Ring].
const PointsPerNode = 160

// Ring is a consistent-hashing [memcache.ServerSelector] in the style of
// ketama: each node owns PointsPerNode points on a 32-bit circle (four per
// MD5 digest of "address-i"), and a key belongs to the first point at or
// after the MD5 of the key. Adding or removing one of n nodes moves about
// 1/n of the keys; gomemcache's default ServerList (CRC-32 modulo n) moves
// almost all of them.
//
// A key containing '|' is placed by the part before its last '|' (a hash
// tag), so the sub-window counters, bucket and log of one limiter key all
// live on one node and a decision talks to one server.
//
// Addresses are kept as given ("host:port", or a path for a Unix socket) and
// resolved when a connection is dialled, so a DNS change (an ElastiCache
// failover) is followed without rebuilding the ring. The zero value has no
// nodes. A Ring is safe for concurrent use.
type Ring struct {
	mu     sync.RWMutex
	points []point // sorted by hash
	nodes  []net.Addr
}

type point struct {
	hash uint32
	addr net.Addr
}

var _ memcache.ServerSelector = (*Ring)(nil)

// addr is a net.Addr that is not resolved until dialled.
type addr struct{ network, s string }

func (a *addr) Network() string { return a.network }
func (a *addr) String() string  { return a.s }

// NewRing returns a ring over nodes.
func NewRing(nodes ...string) (*Ring, error) {
	r := new(Ring)
	if err := r.SetNodes(nodes...); err != nil {
		return nil, err
	}
	return r, nil
}

// SetNodes replaces the ring's nodes. Duplicates are ignored. On error the
// ring is unchanged.
func (r *Ring) SetNodes(nodes ...string) error {
	addrs := make([]net.Addr, 0, len(nodes))
	seen := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		a, err := parseAddr(n)
		if err != nil {
			return err
		}
		if !seen[a.String()] {
			seen[a.String()] = true
			addrs = append(addrs, a)
		}
	}
	slices.SortFunc(addrs, func(a, b net.Addr) int { return strings.Compare(a.String(), b.String()) })
	points := make([]point, 0, len(addrs)*PointsPerNode)
	for _, a := range addrs {
		for i := 0; i < PointsPerNode/4; i++ {
			d := md5.Sum([]byte(a.String() + "-" + strconv.Itoa(i)))
			for h := 0; h < 4; h++ {
				points = append(points, point{binary.LittleEndian.Uint32(d[4*h:]), a})
			}
		}
	}
	// Ties (vanishingly rare) are broken by address, so every client
	// builds the same ring from the same nodes.
	slices.SortFunc(points, func(a, b point) int {
		if a.hash != b.hash {
			if a.hash < b.hash {
				return -1
			}
			return 1
		}
		return strings.Compare(a.addr.String(), b.addr.String())
	})
	r.mu.Lock()
	r.points, r.nodes = points, addrs
	r.mu.Unlock()
	return nil
}

// parseAddr checks a node address: host:port, or a Unix socket path.
func parseAddr(s string) (net.Addr, error) {
	if strings.Contains(s, "/") {
		return &addr{"unix", s}, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return nil, fmt.Errorf("memcached: node address %q: %w", s, err)
	}
	if host == "" {
		return nil, fmt.Errorf("memcached: node address %q: no host", s)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return nil, fmt.Errorf("memcached: node address %q: bad port", s)
	}
	return &addr{"tcp", net.JoinHostPort(host, port)}, nil
}

// Nodes returns the ring's node addresses, sorted.
func (r *Ring) Nodes() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, len(r.nodes))
	for i, a := range r.nodes {
		out[i] = a.String()
	}
	return out
}

// PickServer returns the node that owns key.
func (r *Ring) PickServer(key string) (net.Addr, error) {
	if i := strings.LastIndexByte(key, tagSep); i >= 0 {
		key = key[:i]
	}
	return r.pickTag(key)
}

// pickTag returns the node that owns the keys whose part before the last
// '|' is tag.
func (r *Ring) pickTag(tag string) (net.Addr, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	switch len(r.nodes) {
	case 0:
		return nil, memcache.ErrNoServers
	case 1:
		return r.nodes[0], nil
	}
	h := hashKey(tag)
	i, _ := slices.BinarySearchFunc(r.points, h, func(p point, h uint32) int {
		if p.hash < h {
			return -1
		}
		if p.hash > h {
			return 1
		}
		return 0
	})
	if i == len(r.points) {
		i = 0
	}
	return r.points[i].addr, nil
}

func hashKey(key string) uint32 {
	d := md5.Sum([]byte(key))
	return binary.LittleEndian.Uint32(d[:4])
}

// Each calls f for every node, stopping at the first error.
func (r *Ring) Each(f func(net.Addr) error) error {
	r.mu.RLock()
	nodes := r.nodes
	r.mu.RUnlock()
	if len(nodes) == 0 {
		return memcache.ErrNoServers
	}
	for _, a := range nodes {
		if err := f(a); err != nil {
			return err
		}
	}
	return nil
}
