package testserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// MRSCRegions is the number of regions of an MRSC table: exactly three.
const MRSCRegions = 3

// MRSC is a local multi-Region strongly consistent global table: one
// DynamoDB Local (one copy of each item, so that every conditional write
// and every read is linearizable across the regions) reached through one
// proxy per region that holds every request for the cross-region latency,
// as an MRSC write (a cross-region quorum) and a strongly consistent read
// pay it. Each region's proxy records its requests ([MRSC.Region]).
//
// Write conflicts (on unless [MRSC.SetConflicts] turns them off): a write
// of an item (PutItem, UpdateItem, DeleteItem, and each item of a
// TransactWriteItems or BatchWriteItem) that arrives at its region's proxy
// while a write of the same item from another region is in flight there
// (arrived at its own region's proxy, not yet answered) is not forwarded:
// it is answered, after the latency, with HTTP 400 and
// ReplicatedWriteConflictException, which DynamoDB documents as "The
// request was rejected because one or more items in the request are being
// modified by a request in another Region" (a client fault, safe to
// retry). AWS documents nothing more (not when the check is made, nor how
// long a write stays in flight), so the model is the plainest one that
// fits the sentence: a write is in flight from its arrival in its region
// until its answer, that is for the cross-region latency and the server's
// time; the first writer of an item wins and a later writer from another
// region loses while the first is in flight; a rejected write modifies
// nothing, so it blocks no one; writes from one region never conflict
// with one another (the region orders them). Items are named by the
// table's key attributes, learned with DescribeTable (the registry the cap
// proxies share). PartiQL writes are not checked.
//
// Partitions ([MRSC.Partition]): a region cut off from the others cannot
// reach a quorum, so its writes and strongly consistent reads are not
// carried out; what its clients see is the mode's (hang or 500).
// Eventually consistent reads and control-plane requests are served (from
// the one copy: fresh, where a real cut-off replica may serve stale
// items).
//
// Other differences from DynamoDB: eventually consistent reads pay the
// latency too (DynamoDB answers them in the region); transactions are
// forwarded (DynamoDB does not support them on MRSC tables). Safe for
// concurrent use; closed when the test ends.
type MRSC struct {
	target    string
	client    *http.Client
	reg       *registry
	latency   time.Duration
	conflicts atomic.Bool
	regions   []*MRSCRegion

	mu       sync.Mutex
	inflight map[string]*[MRSCRegions]int // table + "\x00" + item: writes in flight per region
	stats    MRSCStats
}

// MRSCRegion is one region of an [MRSC]: its proxy and what it recorded.
type MRSCRegion struct {
	m   *MRSC
	i   int
	srv *httptest.Server

	mu   sync.Mutex
	cut  PartitionMode
	heal chan struct{} // closed by Heal

	requestLog
}

// PartitionMode is what a client of a region cut off from the quorum sees
// when it writes or reads strongly consistently there.
type PartitionMode int

const (
	// PartitionHang: the request is held until its client gives up (its
	// deadline) or the partition heals, when it is carried out. This is
	// the default: a write waits for a quorum's acknowledgement, and the
	// region cannot tell a lost peer from a slow one before an internal
	// timeout AWS does not publish, which a limiter's deadline (well
	// under a second) comes before.
	PartitionHang PartitionMode = iota + 1
	// PartitionRefuse: the request is answered after the latency with
	// HTTP 500 InternalServerError (a server fault, which the SDK
	// retries), as a region that gave up on its quorum at once would.
	PartitionRefuse
)

// MRSCStats is what an [MRSC]'s regions did, per region.
type MRSCStats struct {
	// Requests is the requests answered (or abandoned by their clients).
	Requests []int64
	// Writes is the item writes forwarded to the server.
	Writes []int64
	// Conflicts is the writes answered with
	// ReplicatedWriteConflictException.
	Conflicts []int64
	// Cut is the requests a partitioned region did not carry out: refused,
	// or held until their clients gave up.
	Cut []int64
}

// mrscWrites are the operations that write items (and are checked for
// conflicts); the PartiQL ones are cut off by a partition but not checked.
var mrscWrites = map[string]bool{
	"PutItem": true, "UpdateItem": true, "DeleteItem": true, "BatchWriteItem": true, "TransactWriteItems": true,
	"ExecuteStatement": true, "BatchExecuteStatement": true, "ExecuteTransaction": true,
}

// NewMRSC starts the three regions' proxies in front of target (a
// DynamoDB Local's URL: the shared one serves) with latency added to every
// request, write conflicts on; they close when the test ends.
func NewMRSC(t testing.TB, target string, latency time.Duration) *MRSC {
	t.Helper()
	if latency < 0 {
		t.Fatalf("testserver: mrsc: latency %v is negative", latency)
	}
	target = strings.TrimRight(target, "/")
	m := &MRSC{
		target:   target,
		client:   &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}},
		reg:      registryFor(target),
		latency:  latency,
		inflight: map[string]*[MRSCRegions]int{},
		stats: MRSCStats{Requests: make([]int64, MRSCRegions), Writes: make([]int64, MRSCRegions),
			Conflicts: make([]int64, MRSCRegions), Cut: make([]int64, MRSCRegions)},
	}
	m.conflicts.Store(true)
	for i := range MRSCRegions {
		r := &MRSCRegion{m: m, i: i}
		r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
		t.Cleanup(r.srv.Close)
		m.regions = append(m.regions, r)
	}
	return m
}

// Endpoint returns region i's endpoint URL.
func (m *MRSC) Endpoint(i int) string { return m.regions[i].srv.URL }

// Region returns region i (its recorded requests: Len, Since).
func (m *MRSC) Region(i int) *MRSCRegion { return m.regions[i] }

// Latency returns the latency added to every request.
func (m *MRSC) Latency() time.Duration { return m.latency }

// SetConflicts turns the emulation of ReplicatedWriteConflictException on
// or off (on by default): off, concurrent writes of an item from two
// regions are serialized by the one server, as if they never met.
func (m *MRSC) SetConflicts(on bool) { m.conflicts.Store(on) }

// Partition cuts region i off from the quorum until Heal: its writes and
// strongly consistent reads get mode's answer.
func (m *MRSC) Partition(i int, mode PartitionMode) {
	r := m.regions[i]
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cut == 0 {
		r.heal = make(chan struct{})
	}
	r.cut = mode
}

// Heal ends region i's partition: requests it holds are carried out.
func (m *MRSC) Heal(i int) {
	r := m.regions[i]
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cut != 0 {
		close(r.heal)
		r.cut = 0
	}
}

// Requests returns the requests the regions answered so far.
func (m *MRSC) Requests() int {
	n := 0
	for _, r := range m.regions {
		n += r.Len()
	}
	return n
}

// Stats returns a snapshot of the regions' counts.
func (m *MRSC) Stats() MRSCStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.Requests, s.Writes, s.Conflicts, s.Cut = slices.Clone(s.Requests), slices.Clone(s.Writes), slices.Clone(s.Conflicts), slices.Clone(s.Cut)
	return s
}

// URL returns the region's endpoint URL.
func (r *MRSCRegion) URL() string { return r.srv.URL }

// partition returns the region's partition mode (0: connected) and the
// channel closed when it heals.
func (r *MRSCRegion) partition() (PartitionMode, chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cut, r.heal
}

func (r *MRSCRegion) serve(w http.ResponseWriter, req *http.Request) {
	m := r.m
	start := time.Now()
	op := req.Header.Get("X-Amz-Target")
	if i := strings.LastIndexByte(op, '.'); i >= 0 {
		op = op[i+1:]
	}
	status := 0
	defer func() {
		r.add(HTTPRequest{Op: op, Start: start, End: time.Now(), Status: status})
		m.count(func(s *MRSCStats) { s.Requests[r.i]++ })
	}()
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		status = http.StatusBadRequest
		return
	}
	ctx := req.Context()
	write := mrscWrites[op]
	if mode, heal := r.partition(); mode != 0 && (write || consistentRead(op, body)) {
		if mode == PartitionRefuse {
			if sleep(ctx, m.latency) {
				status = writeAPIError(w, http.StatusInternalServerError, "InternalServerError", "Internal server error")
			}
			m.count(func(s *MRSCStats) { s.Cut[r.i]++ })
			return
		}
		select {
		case <-ctx.Done():
			m.count(func(s *MRSCStats) { s.Cut[r.i]++ })
			return
		case <-heal: // carried out now
		}
	}
	if write && m.conflicts.Load() {
		// A request whose items the proxy cannot name (malformed, a
		// missing table) is forwarded unchecked: the server says what is
		// wrong with it.
		if items, err := m.items(ctx, op, body); err == nil {
			if !m.enter(r.i, items) {
				if sleep(ctx, m.latency) {
					status = writeAPIError(w, http.StatusBadRequest, "ReplicatedWriteConflictException",
						"The request was rejected because one or more items in the request are being modified by a request in another Region.")
				}
				m.count(func(s *MRSCStats) { s.Conflicts[r.i]++ })
				return
			}
			defer m.leave(r.i, items)
		}
	}
	if !sleep(ctx, m.latency) {
		return
	}
	u, err := post(ctx, m.client, m.target, req.Header, body)
	if err != nil {
		http.Error(w, "testserver: mrsc: "+err.Error(), http.StatusBadGateway)
		status = http.StatusBadGateway
		return
	}
	reply(w, u, false)
	status = u.status
	if write {
		m.count(func(s *MRSCStats) { s.Writes[r.i]++ })
	}
}

func (m *MRSC) count(f func(*MRSCStats)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(&m.stats)
}

// sleep waits d, or until ctx is done (false).
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// enter registers region i's write of items as in flight, unless one of
// them is in flight from another region (false: a conflict).
func (m *MRSC) enter(i int, items []string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, it := range items {
		if f := m.inflight[it]; f != nil {
			for j, n := range f {
				if j != i && n > 0 {
					return false
				}
			}
		}
	}
	for _, it := range items {
		f := m.inflight[it]
		if f == nil {
			f = &[MRSCRegions]int{}
			m.inflight[it] = f
		}
		f[i]++
	}
	return true
}

// leave ends region i's write of items.
func (m *MRSC) leave(i int, items []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, it := range items {
		if f := m.inflight[it]; f != nil {
			if f[i]--; *f == ([MRSCRegions]int{}) {
				delete(m.inflight, it)
			}
		}
	}
}

// items names the items a write request modifies: table + "\x00" + the
// item's identity from its key attributes.
func (m *MRSC) items(ctx context.Context, op string, body []byte) ([]string, error) {
	type keyed struct {
		TableName string
		Key, Item attrs
	}
	var keys []keyed
	switch op {
	case "PutItem", "UpdateItem", "DeleteItem":
		var in keyed
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, err
		}
		keys = append(keys, in)
	case "TransactWriteItems":
		var in struct {
			TransactItems []struct{ ConditionCheck, Put, Delete, Update *keyed }
		}
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, err
		}
		for _, a := range in.TransactItems {
			for _, k := range []*keyed{a.Put, a.Update, a.Delete, a.ConditionCheck} {
				if k != nil {
					keys = append(keys, *k)
				}
			}
		}
	case "BatchWriteItem":
		var in struct {
			RequestItems map[string][]struct {
				PutRequest    *struct{ Item attrs }
				DeleteRequest *struct{ Key attrs }
			}
		}
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, err
		}
		for table, reqs := range in.RequestItems {
			for _, q := range reqs {
				switch {
				case q.PutRequest != nil:
					keys = append(keys, keyed{TableName: table, Item: q.PutRequest.Item})
				case q.DeleteRequest != nil:
					keys = append(keys, keyed{TableName: table, Key: q.DeleteRequest.Key})
				}
			}
		}
	default:
		return nil, errors.New("not checked")
	}
	var items []string
	for _, k := range keys {
		t, err := m.reg.tableAt(ctx, m.client, m.target, k.TableName)
		if err != nil {
			return nil, err
		}
		key := k.Key
		if key == nil {
			key = k.Item
		}
		_, id, err := t.keys(key)
		if err != nil {
			return nil, err
		}
		items = append(items, k.TableName+"\x00"+id)
	}
	return items, nil
}

// consistentRead reports whether a read request is strongly consistent
// (a transaction's reads are).
func consistentRead(op string, body []byte) bool {
	var in struct {
		ConsistentRead bool
		RequestItems   map[string]struct{ ConsistentRead bool }
	}
	switch op {
	case "TransactGetItems":
		return true
	case "GetItem", "Query", "Scan", "BatchGetItem":
	default:
		return false
	}
	if json.Unmarshal(body, &in) != nil {
		return false
	}
	for _, t := range in.RequestItems {
		in.ConsistentRead = in.ConsistentRead || t.ConsistentRead
	}
	return in.ConsistentRead
}

// writeAPIError answers as DynamoDB answers an error: status, the error
// type in X-Amzn-ErrorType and __type, a message, x-amz-crc32. It returns
// status.
func writeAPIError(w http.ResponseWriter, status int, typ, msg string) int {
	b, _ := json.Marshal(struct {
		Type    string `json:"__type"`
		Message string `json:"message"`
	}{"com.amazonaws.dynamodb.v20120810#" + typ, msg})
	h := w.Header()
	h.Set("Content-Type", "application/x-amz-json-1.0")
	h.Set("X-Amzn-ErrorType", typ)
	h.Set("x-amzn-RequestId", requestID())
	h.Set("x-amz-crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(b)), 10))
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
	return status
}

// String describes the counts in one line.
func (s MRSCStats) String() string {
	return fmt.Sprintf("requests %v, writes %v, conflicts %v, cut %v", s.Requests, s.Writes, s.Conflicts, s.Cut)
}
