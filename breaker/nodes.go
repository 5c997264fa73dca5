package breaker

import (
	"slices"
	"strings"
	"sync"
)

// Nodes is a breaker per node of one backend (a memcached node's
// address), each made with the set's [Config] and that node as
// Config.Node on the node's first call, so that a dead node fails its own
// keys fast while the other nodes' keys stay on the backend. A nil *Nodes
// has no breakers: Get returns nil. Safe for concurrent use.
type Nodes struct {
	cfg Config
	on  func(node string, from, to State)

	mu sync.Mutex
	m  map[string]*Breaker
}

// NodeStats is one node's [Stats].
type NodeStats struct {
	Node string
	Stats
}

// NewNodes returns an empty set of node breakers configured by cfg
// (Config.Node and Config.OnChange are set per node). onChange, when not
// nil, is called after each transition of a node's breaker, outside its
// lock.
func NewNodes(cfg Config, onChange func(node string, from, to State)) (*Nodes, error) {
	if _, err := New(cfg); err != nil { // the same checks as each node's
		return nil, err
	}
	cfg.OnChange = nil
	return &Nodes{cfg: cfg, on: onChange, m: make(map[string]*Breaker)}, nil
}

// Get returns node's breaker, made on the first call; nil when n is nil.
func (n *Nodes) Get(node string) *Breaker {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	b := n.m[node]
	if b == nil {
		cfg := n.cfg
		cfg.Node = node
		if n.on != nil {
			cfg.OnChange = func(_ string, from, to State) { n.on(node, from, to) }
		}
		b, _ = New(cfg) // cfg was checked by NewNodes
		n.m[node] = b
	}
	return b
}

// Retain forgets the breakers of nodes not in nodes (nodes that left the
// ring on an auto-discovery refresh), so a cluster that replaces its
// nodes over months does not keep a breaker per node it ever had. A node
// that comes back starts with a new, closed breaker.
func (n *Nodes) Retain(nodes []string) {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for node := range n.m {
		if !slices.Contains(nodes, node) {
			delete(n.m, node)
		}
	}
}

// Stats returns every node breaker's stats, sorted by node; nil when n is
// nil.
func (n *Nodes) Stats() []NodeStats {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	out := make([]NodeStats, 0, len(n.m))
	for node, b := range n.m {
		out = append(out, NodeStats{Node: node, Stats: b.Stats()})
	}
	n.mu.Unlock()
	slices.SortFunc(out, func(a, b NodeStats) int { return strings.Compare(a.Node, b.Node) })
	return out
}
