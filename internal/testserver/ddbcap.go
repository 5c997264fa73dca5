package testserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The figures real DynamoDB enforces and the proxy emulates, per second.
const (
	// PartitionWriteUnits and PartitionReadUnits: a partition serves at most
	// 1,000 write units and 3,000 read units a second, in every capacity
	// mode, and one item is never split across partitions
	// (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/burst-adaptive-capacity.html,
	// https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html).
	PartitionWriteUnits = 1000
	PartitionReadUnits  = 3000
	// TableWriteUnits and TableReadUnits: a new on-demand table sustains up
	// to 4,000 write and 12,000 read units a second (its warm throughput;
	// https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/on-demand-capacity-mode.html,
	// .../warm-throughput-scenarios.html). DynamoDB then grows it to twice
	// the previous peak within 30 minutes; the proxy keeps the start, as a
	// test is far shorter than that.
	TableWriteUnits = 4000
	TableReadUnits  = 12000
)

// Throttling reasons the proxy answers with (ResourceType + OperationType
// + LimitType, https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_ThrottlingReason.html).
// DynamoDB documents four limit types (KeyRangeThroughputExceeded,
// ProvisionedThroughputExceeded, AccountLimitExceeded,
// MaxOnDemandThroughputExceeded) and none for an on-demand table going past
// its warm throughput, which is the capacity of the partitions it has so
// far: the proxy reports that as key-range throttling too, with a message
// saying which cap it was.
const (
	ReasonWriteKeyRange = "TableWriteKeyRangeThroughputExceeded"
	ReasonReadKeyRange  = "TableReadKeyRangeThroughputExceeded"
)

// throttleType is the error type of a throttled request, as DynamoDB
// writes it in __type (the SDK strips the namespace).
const throttleType = "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"

// CapConfig configures a [CapProxy].
type CapConfig struct {
	// Scale multiplies every cap (0 means 1): 0.25 serves a partition 250
	// write units a second, so a test on 2 cores reaches the caps with its
	// limits scaled alike.
	Scale float64
	// Record keeps every request, as [HTTPProxy] does (Len, Since).
	Record bool
	// Log, if set, gets a line for each throttled request (when, which
	// operation, tables and keys, reasons).
	Log io.Writer
}

// CapProxy is a reverse proxy in front of DynamoDB Local that enforces real
// DynamoDB's throughput limits and counts capacity units as DynamoDB bills
// them. Per partition-key value of a table (learned with DescribeTable) it
// admits at most PartitionWriteUnits write units and PartitionReadUnits read
// units a second, and per table TableWriteUnits and TableReadUnits, as token
// buckets whose burst is one second of rate, all times Scale. A request past
// a cap is answered without being forwarded, with HTTP 400 and the body of
// a ProvisionedThroughputExceededException with its ThrottlingReasons, and
// consumes nothing. It closes when the test that made it ends (the shared
// one when the process exits). Safe for concurrent use.
//
// Units are exact for GetItem, PutItem, UpdateItem, DeleteItem,
// TransactWriteItems, BatchWriteItem and BatchGetItem (how: writeItem).
// Where it differs from DynamoDB: Query and Scan are billed on the items
// returned (a FilterExpression undercounts), a Scan or an index Query only
// on the table's cap; BatchWriteItem and BatchGetItem are throttled whole
// (DynamoDB returns the throttled part as UnprocessedItems/Keys); PartiQL
// and control-plane requests are forwarded unmetered (and PartiQL writes
// bypass the item sizes the proxy keeps); indexes are not modelled; the
// table's cap does not grow with traffic. An item's single-item writes go
// to the server as they come, as DynamoDB takes them; an UpdateItem in
// flight with other writes of its item is billed on the largest size the
// item may have had before it, as the proxy cannot see the server's order
// (CapStats.Overlaps and UncertainUnits say how often and how much: 0
// units on items that stay within one KB). Transactions, batches and
// writes that must read their item first hold it alone (CapStats.ItemWaits).
type CapProxy struct {
	srv    *httptest.Server
	target string
	client *http.Client
	scale  float64
	record bool
	log    io.Writer
	reg    *registry

	mu      sync.Mutex
	buckets map[string]*bucket // "w" or "r" + table + "\x00" + partition ("" for the table)
	tables  map[string]*CapCounts
	keys    map[string]*CapCounts // table + "\x00" + partition key value
	ops     map[string]*OpCounts
	probes  int64
	// itemWaits counts writes that waited for another write of their
	// item, itemWait their waits' sum; overlaps, writes in flight with
	// another of their item; uncertain*, bills on candidate befores.
	itemWaits       int64
	itemWait        time.Duration
	overlaps        int64
	uncertainWrites int64
	uncertainUnits  float64

	ctx    context.Context // the writes' forwards: ended by Close
	cancel context.CancelFunc

	requestLog // with CapConfig.Record; throttled requests have Status 400 and were never forwarded
}

// CapCounts is what a [CapProxy] counted for a key, a table or in all.
// Units are capacity units as DynamoDB bills them.
type CapCounts struct {
	// Requests forwarded to the server, and the units they consumed.
	Requests              int64
	WriteUnits, ReadUnits float64
	// Throttled requests (answered by the proxy, never forwarded), and the
	// units they asked for when they were refused.
	Throttled                               int64
	ThrottledWriteUnits, ThrottledReadUnits float64
}

// OpCounts is what a [CapProxy] counted for one operation.
type OpCounts struct {
	Forwarded, Throttled int64
}

// CapStats is a snapshot of a [CapProxy]'s counts.
type CapStats struct {
	CapCounts
	// Ops counts requests per operation (X-Amz-Target after its last '.').
	Ops map[string]OpCounts
	// Probes are the proxy's own reads of an item's size, sent to the
	// server and counted nowhere else (see ddbcap.go: rare).
	Probes int64
	// ItemWaits counts writes that waited in the proxy for other writes
	// of the same item to come back from the server, and ItemWait is the
	// time they waited in all: only writes that need the item alone wait
	// (ddbitem.go: a transaction, a batch, an UpdateItem whose before is
	// unknown); single-item writes go to the server at once, as DynamoDB
	// takes them.
	ItemWaits int64
	ItemWait  time.Duration
	// Overlaps counts writes that were in flight at the server with
	// another write of their item. An UpdateItem among them is billed on
	// the largest size its item may have had before it (the server's order
	// is not the proxy's to see): UncertainWrites counts those whose
	// candidates differ in units, UncertainUnits the units billed above
	// the least candidate (0: every bill is exact; DynamoDB billed between
	// WriteUnits - UncertainUnits and WriteUnits).
	Overlaps        int64
	UncertainWrites int64
	UncertainUnits  float64
}

// NewCapProxy starts a cap proxy in front of target (DynamoDB Local's
// http:// URL; see [DynamoDBLocal]) and closes it when the test ends.
func NewCapProxy(t testing.TB, target string, cfg CapConfig) *CapProxy {
	t.Helper()
	p, err := newCapProxy(target, cfg)
	if err != nil {
		t.Fatalf("testserver: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

func newCapProxy(target string, cfg CapConfig) (*CapProxy, error) {
	target = strings.TrimRight(target, "/")
	if !strings.HasPrefix(target, "http://") {
		return nil, fmt.Errorf("cap proxy target %q is not an http:// URL", target)
	}
	if cfg.Scale < 0 {
		return nil, fmt.Errorf("cap proxy scale %v is negative", cfg.Scale)
	}
	scale := cfg.Scale
	if scale == 0 {
		scale = 1
	}
	p := &CapProxy{
		target: target,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute}},
		scale:  scale,
		record: cfg.Record,
		log:    cfg.Log,
		reg:    registryFor(target),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.resetLocked()
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	return p, nil
}

// URL returns the proxy's endpoint URL.
func (p *CapProxy) URL() string { return p.srv.URL }

// Close stops the proxy.
func (p *CapProxy) Close() {
	p.cancel()
	p.srv.Close()
}

// Scale returns the factor applied to every cap.
func (p *CapProxy) Scale() float64 { return p.scale }

// Reset zeroes the counts, fills every bucket and forgets the recorded
// requests.
func (p *CapProxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resetLocked()
}

func (p *CapProxy) resetLocked() {
	p.buckets = map[string]*bucket{}
	p.tables = map[string]*CapCounts{}
	p.keys = map[string]*CapCounts{}
	p.ops = map[string]*OpCounts{}
	p.probes = 0
	p.itemWaits, p.itemWait = 0, 0
	p.overlaps, p.uncertainWrites, p.uncertainUnits = 0, 0, 0
	p.reset()
}

// Stats returns the counts over every table.
func (p *CapProxy) Stats() CapStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := CapStats{Ops: map[string]OpCounts{}, Probes: p.probes, ItemWaits: p.itemWaits, ItemWait: p.itemWait,
		Overlaps: p.overlaps, UncertainWrites: p.uncertainWrites, UncertainUnits: p.uncertainUnits}
	for _, c := range p.tables {
		s.Requests += c.Requests
		s.WriteUnits += c.WriteUnits
		s.ReadUnits += c.ReadUnits
		s.Throttled += c.Throttled
		s.ThrottledWriteUnits += c.ThrottledWriteUnits
		s.ThrottledReadUnits += c.ThrottledReadUnits
	}
	for op, c := range p.ops {
		s.Ops[op] = *c
	}
	return s
}

// TableStats returns the counts of one table's metered requests.
func (p *CapProxy) TableStats(table string) CapCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.tables[table]; c != nil {
		return *c
	}
	return CapCounts{}
}

// KeyStats returns the counts of one partition-key value of a table (the
// string, number or base64 text of the key, e.g. a store's "pk"). A
// request touching several keys counts once for each.
func (p *CapProxy) KeyStats(table, pk string) CapCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, typ := range []string{"S:", "N:", "B:"} {
		if c := p.keys[table+"\x00"+typ+pk]; c != nil {
			return *c
		}
	}
	return CapCounts{}
}

// --- token buckets --------------------------------------------------------

// bucket is a token bucket: rate tokens a second, at most rate (one second
// of burst), starting full. Tokens go below zero when a request turns out
// to cost more than it was admitted for (a debt later requests wait out).
type bucket struct {
	rate, tokens float64
	last         time.Time
}

func (b *bucket) refill(now time.Time) {
	if d := now.Sub(b.last).Seconds(); d > 0 {
		b.tokens = min(b.rate, b.tokens+d*b.rate)
	}
	b.last = now
}

// has reports whether units can be taken now; a request costing more than
// the whole burst is admitted from a full bucket (a scaled-down cap must not
// refuse a large item forever).
func (b *bucket) has(units float64) bool { return b.tokens >= min(units, b.rate) }

// charge is one request's units on one bucket.
type charge struct {
	write     bool
	table     string
	partition string // "" for a table-level charge only (Scan, index Query)
	units     float64
}

func (p *CapProxy) bucketLocked(write bool, table, partition string, now time.Time) *bucket {
	k := "r"
	rate := float64(PartitionReadUnits)
	if write {
		k, rate = "w", PartitionWriteUnits
	}
	if partition == "" {
		rate = TableReadUnits
		if write {
			rate = TableWriteUnits
		}
	}
	k += table + "\x00" + partition
	b := p.buckets[k]
	if b == nil {
		rate *= p.scale
		b = &bucket{rate: rate, tokens: rate, last: now}
		p.buckets[k] = b
	}
	b.refill(now)
	return b
}

// admit takes the charges from their partitions' and tables' buckets if
// every bucket has them, and returns the throttling reasons otherwise
// (taking nothing).
func (p *CapProxy) admit(op string, cs []charge) []throttleReason {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	var reasons []throttleReason
	// One request's charges on one bucket add up.
	type need struct {
		b     *bucket
		units float64
		write bool
		table string
		part  bool
	}
	needs := map[*bucket]*need{}
	var order []*need
	add := func(b *bucket, c charge, part bool) {
		n := needs[b]
		if n == nil {
			n = &need{b: b, write: c.write, table: c.table, part: part}
			needs[b] = n
			order = append(order, n)
		}
		n.units += c.units
	}
	for _, c := range cs {
		if c.partition != "" {
			add(p.bucketLocked(c.write, c.table, c.partition, now), c, true)
		}
		add(p.bucketLocked(c.write, c.table, "", now), c, false)
	}
	for _, n := range order {
		if !n.b.has(n.units) {
			reasons = appendReason(reasons, throttleReason{write: n.write, table: n.table, partition: n.part})
		}
	}
	if len(reasons) > 0 {
		p.countLocked(op, cs, false)
		if p.log != nil {
			var keys []string
			for _, c := range cs {
				keys = append(keys, fmt.Sprintf("%s/%s:%g", c.table, c.partition, c.units))
			}
			var rs []string
			for _, r := range reasons {
				rs = append(rs, fmt.Sprintf("%s(partition=%v)", r.table, r.partition))
			}
			fmt.Fprintf(p.log, "%s pid=%d throttled %s keys=%v over=%v\n", now.Format(time.RFC3339Nano), os.Getpid(), op, keys, rs)
		}
		return reasons
	}
	for _, n := range order {
		n.b.tokens -= n.units
	}
	return nil
}

// settle adds delta (what the request turned out to cost minus what it was
// admitted for; negative for a refund) to the buckets and counts the
// forwarded request's final charges.
func (p *CapProxy) settle(op string, admitted, final []charge) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range admitted {
		if c.partition != "" {
			p.bucketLocked(c.write, c.table, c.partition, now).tokens += c.units
		}
		p.bucketLocked(c.write, c.table, "", now).tokens += c.units
	}
	for _, c := range final {
		if c.partition != "" {
			p.bucketLocked(c.write, c.table, c.partition, now).tokens -= c.units
		}
		p.bucketLocked(c.write, c.table, "", now).tokens -= c.units
	}
	p.countLocked(op, final, true)
}

// countLocked counts one request (forwarded or throttled) on its op, its
// tables and its keys, with its charges.
func (p *CapProxy) countLocked(op string, cs []charge, forwarded bool) {
	o := p.ops[op]
	if o == nil {
		o = &OpCounts{}
		p.ops[op] = o
	}
	if forwarded {
		o.Forwarded++
	} else {
		o.Throttled++
	}
	seen := map[*CapCounts]bool{}
	apply := func(c *CapCounts, ch *charge) {
		if !seen[c] {
			seen[c] = true
			if forwarded {
				c.Requests++
			} else {
				c.Throttled++
			}
		}
		if ch == nil {
			return
		}
		switch {
		case forwarded && ch.write:
			c.WriteUnits += ch.units
		case forwarded:
			c.ReadUnits += ch.units
		case ch.write:
			c.ThrottledWriteUnits += ch.units
		default:
			c.ThrottledReadUnits += ch.units
		}
	}
	for i := range cs {
		ch := &cs[i]
		if ch.table == "" {
			continue
		}
		tc := p.tables[ch.table]
		if tc == nil {
			tc = &CapCounts{}
			p.tables[ch.table] = tc
		}
		apply(tc, ch)
		if ch.partition != "" {
			k := ch.table + "\x00" + ch.partition
			kc := p.keys[k]
			if kc == nil {
				kc = &CapCounts{}
				p.keys[k] = kc
			}
			apply(kc, ch)
		}
	}
}

// --- throttle answers -----------------------------------------------------

type throttleReason struct {
	write, partition bool
	table            string
}

// appendReason adds one reason per (operation type, table): a partition
// and its table both over their caps are one reason, the partition's.
func appendReason(rs []throttleReason, r throttleReason) []throttleReason {
	for i := range rs {
		if rs[i].write == r.write && rs[i].table == r.table {
			rs[i].partition = rs[i].partition || r.partition
			return rs
		}
	}
	return append(rs, r)
}

// writeThrottle answers a request as DynamoDB answers a throttled one:
// HTTP 400, the error type in X-Amzn-ErrorType and __type, a message and
// one ThrottlingReason per (reason, table): the field names and shapes of
// the API's ProvisionedThroughputExceededException and ThrottlingReason
// (aws-sdk-go-v2 service/dynamodb v1.73.0 schemas: "message",
// "ThrottlingReasons", "reason", "resource"). Real DynamoDB sends
// x-amz-crc32 on every answer; the proxy does too.
func (p *CapProxy) writeThrottle(w http.ResponseWriter, rs []throttleReason) {
	type reason struct {
		Reason   string `json:"reason"`
		Resource string `json:"resource"`
	}
	body := struct {
		Type    string   `json:"__type"`
		Message string   `json:"message"`
		Reasons []reason `json:"ThrottlingReasons"`
	}{Type: throttleType}
	msg := "Throughput exceeds the current capacity of your table or index. DynamoDB is automatically scaling your table or index so please try again shortly. If exceptions persist, check if you have a hot key: https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html"
	for _, r := range rs {
		name := ReasonReadKeyRange
		if r.write {
			name = ReasonWriteKeyRange
		}
		if !r.partition && len(rs) == 1 {
			msg = "Throughput exceeds the current capacity of your table (a new on-demand table's warm throughput). DynamoDB is automatically scaling your table or index so please try again shortly."
		}
		body.Reasons = append(body.Reasons, reason{Reason: name, Resource: p.reg.arn(r.table)})
	}
	body.Message = msg
	b, _ := json.Marshal(body)
	h := w.Header()
	h.Set("Content-Type", "application/x-amz-json-1.0")
	h.Set("X-Amzn-ErrorType", "ProvisionedThroughputExceededException")
	h.Set("x-amzn-RequestId", requestID())
	h.Set("x-amz-crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(b)), 10))
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusBadRequest)
	w.Write(b)
}

func requestID() string {
	var b [16]byte
	rand.Read(b[:])
	return strings.ToUpper(hex.EncodeToString(b[:]))
}

// --- serving --------------------------------------------------------------

// upstream is one answer of the server, as the client would have seen it.
type upstream struct {
	status int
	header http.Header
	body   []byte
}

// errorType is the server's error type without its namespace, "" on 2xx.
func (u *upstream) errorType() string {
	if u.status < 300 {
		return ""
	}
	var e struct {
		Type string `json:"__type"`
	}
	json.Unmarshal(u.body, &e)
	_, t, _ := strings.Cut(e.Type, "#")
	return t
}

// forward sends body to the server with the client's headers.
func (p *CapProxy) forward(ctx context.Context, h http.Header, body []byte) (*upstream, error) {
	return post(ctx, p.client, p.target, h, body)
}

// post sends body to a DynamoDB endpoint (target, an http:// URL) with the
// headers h (a client's, or localHeader's).
func post(ctx context.Context, client *http.Client, target string, h http.Header, body []byte) (*upstream, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range h {
		switch http.CanonicalHeaderKey(k) {
		case "Content-Length", "Host", "Connection", "Accept-Encoding":
			continue
		}
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &upstream{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// reply passes an answer back; changed says the proxy edited the body (to
// restore what the client asked for), so its checksum is computed again.
func reply(w http.ResponseWriter, u *upstream, changed bool) {
	h := w.Header()
	for k, vs := range u.header {
		if k == "Content-Length" {
			continue
		}
		h[k] = vs
	}
	if changed && h.Get("x-amz-crc32") != "" {
		h.Set("x-amz-crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(u.body)), 10))
	}
	h.Set("Content-Length", strconv.Itoa(len(u.body)))
	w.WriteHeader(u.status)
	w.Write(u.body)
}

func (p *CapProxy) serve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	op := r.Header.Get("X-Amz-Target")
	if i := strings.LastIndexByte(op, '.'); i >= 0 {
		op = op[i+1:]
	}
	status := 0
	defer func() {
		if p.record {
			p.add(HTTPRequest{Op: op, Start: start, End: time.Now(), Status: status})
		}
	}()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	x := &exchange{p: p, w: w, r: r, op: op, body: body}
	switch op {
	case "GetItem":
		err = x.getItem()
	case "PutItem", "DeleteItem", "UpdateItem":
		err = x.writeItem()
	case "TransactWriteItems":
		err = x.transactWrite()
	case "BatchWriteItem":
		err = x.batchWrite()
	case "BatchGetItem":
		err = x.batchGet()
	case "Query", "Scan":
		err = x.queryScan()
	default:
		err = x.passThrough()
	}
	if err != nil && !x.replied {
		// A malformed request, a table the server does not know, a
		// failed forward: pass the request on untouched, uncapped (the
		// server says what is wrong with it); a forward that failed is a
		// 502 as from any reverse proxy.
		if x.forwarded {
			http.Error(w, "testserver: cap proxy: "+err.Error(), http.StatusBadGateway)
			x.status = http.StatusBadGateway
		} else if perr := x.passThrough(); perr != nil {
			http.Error(w, "testserver: cap proxy: "+perr.Error(), http.StatusBadGateway)
			x.status = http.StatusBadGateway
		}
	}
	status = x.status
}

// exchange is one client request and its answer.
type exchange struct {
	p         *CapProxy
	w         http.ResponseWriter
	r         *http.Request
	op        string
	body      []byte
	replied   bool
	forwarded bool
	status    int
	detach    bool // forwarded on the proxy's context (ctx)
}

// admitAndSend charges adm against the caps and, if they admit it,
// forwards body. sent is false when the request was not forwarded: it was
// throttled (answered already, err nil) or the server could not be
// reached (err, its charge settled to nothing).
func (x *exchange) admitAndSend(adm []charge, body []byte) (u *upstream, sent bool, err error) {
	if rs := x.p.admit(x.op, adm); rs != nil {
		x.throttle(rs)
		return nil, false, nil
	}
	if u, err = x.send(body); err != nil {
		x.p.settle(x.op, adm, nil)
		return nil, false, err
	}
	return u, true, nil
}

func (x *exchange) send(body []byte) (*upstream, error) {
	x.forwarded = true
	return x.p.forward(x.ctx(), x.r.Header, body)
}

// ctx is the context of the exchange's requests to the server: a write's
// is the proxy's (DynamoDB applies a write whose client went away, and
// the proxy must learn its after), a read's its client's.
func (x *exchange) ctx() context.Context {
	if x.detach {
		return x.p.ctx
	}
	return x.r.Context()
}

func (x *exchange) reply(u *upstream, changed bool) {
	reply(x.w, u, changed)
	x.replied, x.status = true, u.status
}

func (x *exchange) throttle(rs []throttleReason) {
	x.p.writeThrottle(x.w, rs)
	x.replied, x.status = true, http.StatusBadRequest
}

// passThrough forwards the request unmetered (control plane, PartiQL) and
// keeps the registry right about tables created and deleted.
func (x *exchange) passThrough() error {
	u, err := x.send(x.body)
	if err != nil {
		return err
	}
	var in struct{ TableName string }
	json.Unmarshal(x.body, &in)
	if u.status == http.StatusOK && in.TableName != "" {
		switch x.op {
		case "CreateTable":
			x.p.reg.created(in.TableName)
		case "DeleteTable":
			x.p.reg.deleted(in.TableName)
		}
	}
	x.p.mu.Lock()
	x.p.countLocked(x.op, []charge{{table: in.TableName}}, true)
	x.p.mu.Unlock()
	x.reply(u, false)
	return nil
}

type attrs = map[string]json.RawMessage

// getItem: one read on the item's partition, billed on the item's size
// (the whole item's, known from the registry, when a projection returns
// part of it).
func (x *exchange) getItem() error {
	var in struct {
		TableName      string
		Key            attrs
		ConsistentRead bool
	}
	if err := json.Unmarshal(x.body, &in); err != nil {
		return err
	}
	t, err := x.p.reg.table(x.r.Context(), x.p, in.TableName)
	if err != nil {
		return err
	}
	part, item, err := t.keys(in.Key)
	if err != nil {
		return err
	}
	est := readUnits(0, in.ConsistentRead)
	if s, ok := t.size(item); ok {
		est = readUnits(s, in.ConsistentRead)
	}
	adm := []charge{{table: in.TableName, partition: part, units: est}}
	u, sent, err := x.admitAndSend(adm, x.body)
	if !sent {
		return err
	}
	final := []charge{{table: in.TableName, partition: part}}
	if u.status == http.StatusOK {
		var out struct{ Item attrs }
		json.Unmarshal(u.body, &out)
		s, _ := itemSize(out.Item)
		if full, ok := t.size(item); ok && full > s {
			s = full
		}
		final[0].units = readUnits(s, in.ConsistentRead)
	}
	x.p.settle(x.op, adm, final)
	x.reply(u, false)
	return nil
}

// writeItem meters PutItem, DeleteItem and UpdateItem:
//
// The registry keeps each item's possible sizes after the writes the cap
// proxies of the process passed (they share one registry per server), and
// the item's writes in flight (ddbitem.go: several at once, as DynamoDB
// serves them). The "after" comes from the server's own answer: the
// request is forwarded with ReturnValues=ALL_NEW (UpdateItem) or ALL_OLD
// (PutItem, DeleteItem: the before; the after is the request's item, or
// nothing) and ReturnValuesOnConditionCheckFailure=ALL_OLD (a failed
// condition is billed on the item it returns, as DynamoDB bills it), and
// the answer is given back as the client asked for it: the members the
// proxy added are cut from the JSON byte for byte (the server writes a
// member or leaves it out, nothing else changes; ddbcap_test.go compares
// the bytes with the server's own answer) and x-amz-crc32 computed again.
// An UpdateItem's before is the registry's size: exact when no other write
// of the item overlapped it, else the largest candidate (ddbitem.go). A
// before the registry does not know (a table this process did not
// create) is read with a consistent GetItem (a probe) holding the item
// alone, as is the after of an UpdateItem whose client asked for other
// ReturnValues than NONE or ALL_NEW. A write is forwarded on the proxy's
// context, not its client's: DynamoDB applies and bills a write whose
// client went away, and the proxy learns its after. Exact unless
// something bypasses every cap proxy of the process (a raw client, a
// server restart, TTL deletion): then a before may be stale until the
// item's next failed condition.
func (x *exchange) writeItem() error {
	var in writeRequest
	if err := json.Unmarshal(x.body, &in); err != nil {
		return err
	}
	t, err := x.p.reg.table(x.r.Context(), x.p, in.TableName)
	if err != nil {
		return err
	}
	key := in.Key
	if x.op == "PutItem" {
		key = in.Item
	}
	part, item, err := t.keys(key)
	if err != nil {
		return err
	}
	x.detach = true
	w := &itemWrite{in: &in, t: t, key: key, item: item}
	body, err := w.ask(x.op, x.body)
	if err != nil {
		return err
	}
	_, known := t.size(item)
	w.excl = brokenSerial || w.afterProbe || x.op == "UpdateItem" && !known
	f, err := x.begin(t, item, w.excl)
	if err != nil {
		return err
	}
	before, after, err := w.sizes(x)
	if err != nil {
		t.withdraw(item, f)
		return err
	}
	adm := []charge{{write: true, table: in.TableName, partition: part, units: writeUnits(max(before, after))}}
	u, sent, err := x.admitAndSend(adm, body)
	if !sent {
		if err != nil { // maybe applied
			t.end(item, f, true, -1, nil)
		} else {
			t.withdraw(item, f)
		}
		return err
	}
	o, changed := w.settle(x, u, before, after)
	var bill *overlapBill
	if o.candidates {
		bill = &overlapBill{p: x.p, op: x.op, ch: charge{write: true, table: in.TableName, partition: part}, after: o.after}
	}
	e := t.end(item, f, o.state, o.after, bill)
	if bill != nil {
		o.units = e.units
	}
	x.p.settle(x.op, adm, []charge{{write: true, table: in.TableName, partition: part, units: o.units}})
	x.p.ended(e)
	x.reply(u, changed)
	return nil
}

// begin registers a write of item in flight (alone if excl), counting its
// wait in ItemWaits. A wait the client gave up is answered here, so the
// request is not passed on unmetered.
func (x *exchange) begin(t *tableInfo, item string, excl bool) (*flight, error) {
	f, waited, err := t.begin(x.r.Context(), item, excl)
	if err != nil {
		http.Error(x.w, "testserver: cap proxy: "+err.Error(), http.StatusServiceUnavailable)
		x.replied, x.status = true, http.StatusServiceUnavailable
		return nil, err
	}
	if waited > 0 {
		x.p.mu.Lock()
		x.p.itemWaits++
		x.p.itemWait += waited
		x.p.mu.Unlock()
	}
	return f, nil
}

// writeRequest is what the proxy reads of a PutItem, UpdateItem or
// DeleteItem request.
type writeRequest struct {
	TableName                           string
	Key, Item                           attrs
	ReturnValues                        string
	ReturnValuesOnConditionCheckFailure string
}

// itemWrite is one PutItem, UpdateItem or DeleteItem through the proxy,
// with what the proxy added to the request.
type itemWrite struct {
	in                    *writeRequest
	t                     *tableInfo
	key                   attrs
	item                  string
	addedAttrs, addedItem bool // the proxy asked for Attributes, or for Item on a failed condition
	afterProbe            bool // an UpdateItem's after is read with a probe
	excl                  bool // it holds the item alone
}

// ask returns body asking for the item's before or after and, on a
// failed condition, the item as it is.
func (w *itemWrite) ask(op string, body []byte) ([]byte, error) {
	var err error
	switch op {
	case "UpdateItem":
		switch w.in.ReturnValues {
		case "", "NONE":
			w.addedAttrs = true
			body, err = setMember(body, "ReturnValues", `"ALL_NEW"`)
		case "ALL_NEW":
		default:
			w.afterProbe = true
		}
	default:
		switch w.in.ReturnValues {
		case "", "NONE":
			w.addedAttrs = true
			body, err = setMember(body, "ReturnValues", `"ALL_OLD"`)
		}
	}
	if err != nil {
		return nil, err
	}
	if v := w.in.ReturnValuesOnConditionCheckFailure; v == "" || v == "NONE" {
		w.addedItem = true
		return setMember(body, "ReturnValuesOnConditionCheckFailure", `"ALL_OLD"`)
	}
	return body, nil
}

// writeOutcome is what a forwarded write did to its item: left a state
// (its after; -1 unknown) or not, and its bill, unless it is billed on
// candidate befores (an UpdateItem that overlapped others: ddbitem.go).
type writeOutcome struct {
	state      bool
	after      int64
	units      float64
	candidates bool
}

// sizes returns the item's before and after as known before the write is
// sent (the admission's estimate; settle has the server's): an UpdateItem
// holding its item alone reads an unknown or ambiguous before (a probe).
func (w *itemWrite) sizes(x *exchange) (before, after int64, err error) {
	if x.op == "PutItem" {
		if after, err = itemSize(w.in.Item); err != nil {
			return 0, 0, err
		}
	}
	before, _ = w.t.size(w.item)
	if w.excl && x.op == "UpdateItem" && w.in.ReturnValues != "ALL_OLD" {
		if s, ok := w.t.exact(w.item); ok {
			before = s
		} else if before, err = x.probe(w.t, w.key); err != nil {
			return 0, 0, err
		}
	}
	return before, after, nil
}

// settle reads the server's answer u: the write's outcome, and u without
// what the proxy added (changed).
func (w *itemWrite) settle(x *exchange, u *upstream, before, after int64) (o writeOutcome, changed bool) {
	switch u.errorType() {
	case "":
		var out struct{ Attributes attrs }
		json.Unmarshal(u.body, &out)
		ret, err := itemSize(out.Attributes)
		switch {
		case err != nil:
		case x.op == "UpdateItem" && w.afterProbe:
			if w.in.ReturnValues == "ALL_OLD" {
				before = ret
			}
			after, err = x.probe(w.t, w.key)
		case x.op == "UpdateItem":
			after, o.candidates = ret, !w.excl
		default: // PutItem, DeleteItem: ALL_OLD
			before = ret
		}
		o.state, o.after, o.units = true, after, writeUnits(max(before, after))
		if err != nil { // cannot happen with DynamoDB Local's answers
			o.after, o.candidates = -1, false
		}
		if w.addedAttrs {
			u.body, changed = removeMember(u.body, "Attributes")
		}
	case "ConditionalCheckFailedException":
		var out struct{ Item attrs }
		json.Unmarshal(u.body, &out)
		o.state, o.units = true, writeUnits(max(before, after))
		if cur, err := itemSize(out.Item); err != nil {
			o.after = -1
		} else {
			o.after, o.units = cur, writeUnits(cur)
		}
		if w.addedItem {
			u.body, changed = removeMember(u.body, "Item")
		}
	default:
		// Refused by the server (validation, a missing table...): not
		// billed. Whether anything was written is the server's to say;
		// an error after the write is not one DynamoDB Local gives.
		if u.status >= 500 {
			o.state, o.after = true, -1
		}
	}
	return o, changed
}

// probe reads an item's size with a consistent GetItem, for the proxy
// itself (the item's lock is held).
func (x *exchange) probe(t *tableInfo, key attrs) (int64, error) {
	k := attrs{t.hash: key[t.hash]}
	if t.rng != "" {
		k[t.rng] = key[t.rng]
	}
	req, _ := json.Marshal(struct {
		TableName      string
		Key            attrs
		ConsistentRead bool
	}{t.name, k, true})
	h := x.r.Header.Clone()
	h.Set("X-Amz-Target", "DynamoDB_20120810.GetItem")
	u, err := x.p.forward(x.ctx(), h, req)
	if err != nil {
		return 0, err
	}
	if u.status != http.StatusOK {
		return 0, fmt.Errorf("probe GetItem: %d %s", u.status, u.body)
	}
	x.p.mu.Lock()
	x.p.probes++
	x.p.mu.Unlock()
	var out struct{ Item attrs }
	if err := json.Unmarshal(u.body, &out); err != nil {
		return 0, err
	}
	return itemSize(out.Item)
}

// txItem is one item of a TransactWriteItems or BatchWriteItem request.
type txItem struct {
	t             *tableInfo
	key           attrs
	part, item    string
	before, after int64
	update        bool // after known only once written (probe)
	f             *flight
	dup           bool // another action on the same item: its flight is the other's
}

// writeSet takes the items of a multi-item write alone, in one global
// order (no deadlock), and reads the befores it does not know exactly. On
// an error the items are released.
func (x *exchange) writeSet(items []*txItem) error {
	x.detach = true
	slices.SortFunc(items, func(a, b *txItem) int { return strings.Compare(a.t.name+"\x00"+a.item, b.t.name+"\x00"+b.item) })
	for i, it := range items {
		if i > 0 && items[i-1].t == it.t && items[i-1].item == it.item {
			it.dup = true // the server refuses two actions on one item
			continue
		}
		f, err := x.begin(it.t, it.item, true)
		if err != nil {
			endSet(items[:i], nil)
			return err
		}
		it.f = f
	}
	for _, it := range items {
		s, ok := it.t.exact(it.item)
		if !ok {
			var err error
			if s, err = x.probe(it.t, it.key); err != nil {
				endSet(items, nil)
				return err
			}
		}
		it.before = s
		if !it.update && it.after < 0 { // ConditionCheck: unchanged
			it.after = s
		}
	}
	return nil
}

// endSet ends the writes of a writeSet: state says whether each left its
// after (-1: unknown), nil that none did.
func endSet(items []*txItem, state func(*txItem) (bool, int64)) {
	for _, it := range items {
		if it.dup || it.f == nil {
			continue
		}
		if state == nil {
			it.t.withdraw(it.item, it.f)
			continue
		}
		ok, after := state(it)
		it.t.end(it.item, it.f, ok, after, nil)
	}
}

// unknown is the state of items whose write may or may not have been
// applied.
func unknown(*txItem) (bool, int64) { return true, -1 }

// transactWrite: 2 write units per started KB of each item (the larger of
// before and after) on the item's partition. A ConditionCheck is billed as
// a write of the item. A transaction the server cancels (a failed
// condition, a conflict) is billed the same: DynamoDB charges the
// prepare phase of a cancelled transaction. An Update's after is probed
// once the transaction has been applied.
func (x *exchange) transactWrite() error {
	items, err := x.txItems()
	if err != nil {
		return err
	}
	if err := x.writeSet(items); err != nil {
		return err
	}
	charges := func() []charge {
		var cs []charge
		for _, it := range items {
			cs = append(cs, charge{write: true, table: it.t.name, partition: it.part, units: 2 * writeUnits(max(it.before, it.after))})
		}
		return cs
	}
	adm := charges()
	u, sent, err := x.admitAndSend(adm, x.body)
	if !sent {
		if err != nil {
			endSet(items, unknown)
		} else {
			endSet(items, nil)
		}
		return err
	}
	switch u.errorType() {
	case "":
		probed := map[*txItem]bool{}
		for _, it := range items {
			if it.update {
				if it.after, err = x.probe(it.t, it.key); err != nil {
					it.after = it.before
				} else {
					probed[it] = true
				}
			}
		}
		endSet(items, func(it *txItem) (bool, int64) {
			if it.update && !probed[it] {
				return true, -1
			}
			return true, it.after
		})
	case "TransactionCanceledException", "TransactionConflictException":
		for _, it := range items { // nothing was written
			it.after = max(it.after, 0)
		}
		endSet(items, nil)
	default:
		endSet(items, nil)
		x.p.settle(x.op, adm, nil)
		x.reply(u, false)
		return nil
	}
	x.p.settle(x.op, adm, charges())
	x.reply(u, false)
	return nil
}

// txItems resolves the items of a TransactWriteItems request: an item's
// after is known for a Put (its size) and a Delete (0), once written for
// an Update, and is its before for a ConditionCheck.
func (x *exchange) txItems() ([]*txItem, error) {
	type action struct {
		TableName string
		Key, Item attrs
	}
	var in struct {
		TransactItems []struct{ ConditionCheck, Put, Delete, Update *action }
	}
	if err := json.Unmarshal(x.body, &in); err != nil {
		return nil, err
	}
	var items []*txItem
	for _, a := range in.TransactItems {
		it := &txItem{after: -1}
		var act *action
		switch {
		case a.Put != nil:
			act = a.Put
			s, err := itemSize(act.Item)
			if err != nil {
				return nil, err
			}
			it.after, it.key = s, act.Item
		case a.Delete != nil:
			act, it.after = a.Delete, 0
		case a.Update != nil:
			act, it.update = a.Update, true
		case a.ConditionCheck != nil:
			act = a.ConditionCheck
		default:
			return nil, errors.New("empty transaction item")
		}
		t, err := x.p.reg.table(x.r.Context(), x.p, act.TableName)
		if err != nil {
			return nil, err
		}
		if it.key == nil {
			it.key = act.Key
		}
		it.t = t
		if it.part, it.item, err = t.keys(it.key); err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	return items, nil
}

// batchWrite: each put or delete billed as a write of its item. Unlike
// DynamoDB, which returns throttled items as UnprocessedItems, the proxy
// throttles the whole request when one of its partitions is over its cap.
func (x *exchange) batchWrite() error {
	var in struct {
		RequestItems map[string][]struct {
			PutRequest    *struct{ Item attrs }
			DeleteRequest *struct{ Key attrs }
		}
	}
	if err := json.Unmarshal(x.body, &in); err != nil {
		return err
	}
	var items []*txItem
	for table, reqs := range in.RequestItems {
		t, err := x.p.reg.table(x.r.Context(), x.p, table)
		if err != nil {
			return err
		}
		for _, r := range reqs {
			it := &txItem{t: t}
			switch {
			case r.PutRequest != nil:
				s, err := itemSize(r.PutRequest.Item)
				if err != nil {
					return err
				}
				it.key, it.after = r.PutRequest.Item, s
			case r.DeleteRequest != nil:
				it.key = r.DeleteRequest.Key
			default:
				return errors.New("empty batch write request")
			}
			if it.part, it.item, err = t.keys(it.key); err != nil {
				return err
			}
			items = append(items, it)
		}
	}
	if err := x.writeSet(items); err != nil {
		return err
	}
	var adm []charge
	for _, it := range items {
		adm = append(adm, charge{write: true, table: it.t.name, partition: it.part, units: writeUnits(max(it.before, it.after))})
	}
	u, sent, err := x.admitAndSend(adm, x.body)
	if !sent {
		if err != nil {
			endSet(items, unknown)
		} else {
			endSet(items, nil)
		}
		return err
	}
	if u.status != http.StatusOK {
		endSet(items, nil)
		x.p.settle(x.op, adm, nil)
		x.reply(u, false)
		return nil
	}
	// DynamoDB Local processes every item (no UnprocessedItems).
	endSet(items, func(it *txItem) (bool, int64) { return true, it.after })
	x.p.settle(x.op, adm, adm)
	x.reply(u, false)
	return nil
}

// batchGet: each item read on its partition, rounded up on its own. Unlike
// DynamoDB (UnprocessedKeys), a request with one partition over its cap is
// throttled whole.
func (x *exchange) batchGet() error {
	var in struct {
		RequestItems map[string]struct {
			Keys           []attrs
			ConsistentRead bool
		}
	}
	if err := json.Unmarshal(x.body, &in); err != nil {
		return err
	}
	type read struct {
		t          *tableInfo
		consistent bool
	}
	tables := map[string]read{}
	var adm []charge
	for table, r := range in.RequestItems {
		t, err := x.p.reg.table(x.r.Context(), x.p, table)
		if err != nil {
			return err
		}
		tables[table] = read{t, r.ConsistentRead}
		for _, k := range r.Keys {
			part, _, err := t.keys(k)
			if err != nil {
				return err
			}
			adm = append(adm, charge{table: table, partition: part, units: readUnits(0, r.ConsistentRead)})
		}
	}
	u, sent, err := x.admitAndSend(adm, x.body)
	if !sent {
		return err
	}
	var final []charge
	if u.status == http.StatusOK {
		var out struct{ Responses map[string][]attrs }
		json.Unmarshal(u.body, &out)
		found := map[string]bool{}
		for table, items := range out.Responses {
			r := tables[table]
			for _, it := range items {
				part, item, err := r.t.keys(it)
				if err != nil {
					continue
				}
				found[table+"\x00"+item] = true
				s, _ := itemSize(it)
				final = append(final, charge{table: table, partition: part, units: readUnits(s, r.consistent)})
			}
		}
		for table, rq := range in.RequestItems { // a missing item costs the minimum
			r := tables[table]
			for _, k := range rq.Keys {
				part, item, err := r.t.keys(k)
				if err == nil && !found[table+"\x00"+item] {
					final = append(final, charge{table: table, partition: part, units: readUnits(0, r.consistent)})
				}
			}
		}
	}
	x.p.settle(x.op, adm, final)
	x.reply(u, false)
	return nil
}

// keyCond finds "name = :value" terms of a KeyConditionExpression.
var keyCond = regexp.MustCompile(`(#?[A-Za-z0-9_]+)\s*=\s*(:[A-Za-z0-9_]+)`)

// queryScan: a Query on the table is one read on its partition (the
// partition key's value from the KeyConditionExpression), a Scan or a
// Query on an index a read on the table only; billed on the total size of
// the items returned (DynamoDB bills the items read before a filter: a
// FilterExpression makes this an undercount).
func (x *exchange) queryScan() error {
	var in struct {
		TableName, IndexName      string
		KeyConditionExpression    string
		ExpressionAttributeNames  map[string]string
		ExpressionAttributeValues attrs
		ConsistentRead            bool
	}
	if err := json.Unmarshal(x.body, &in); err != nil {
		return err
	}
	t, err := x.p.reg.table(x.r.Context(), x.p, in.TableName)
	if err != nil {
		return err
	}
	part := ""
	if x.op == "Query" && in.IndexName == "" {
		for _, m := range keyCond.FindAllStringSubmatch(in.KeyConditionExpression, -1) {
			name := m[1]
			if n, ok := in.ExpressionAttributeNames[name]; ok {
				name = n
			}
			if v, ok := in.ExpressionAttributeValues[m[2]]; ok && name == t.hash {
				if part, err = keyString(v); err != nil {
					return err
				}
			}
		}
	}
	adm := []charge{{table: in.TableName, partition: part, units: readUnits(0, in.ConsistentRead)}}
	u, sent, err := x.admitAndSend(adm, x.body)
	if !sent {
		return err
	}
	final := []charge{{table: in.TableName, partition: part}}
	if u.status == http.StatusOK {
		var out struct{ Items []attrs }
		json.Unmarshal(u.body, &out)
		var total int64
		for _, it := range out.Items {
			s, _ := itemSize(it)
			total += s
		}
		final[0].units = readUnits(total, in.ConsistentRead)
	}
	x.p.settle(x.op, adm, final)
	x.reply(u, false)
	return nil
}

// --- the registry: key schemas and item sizes, per server -------------------

// registry is what every cap proxy of the process in front of one server
// knows: each table's key schema and ARN (DescribeTable, once), and each
// item's size after the last write a proxy passed, with a lock per item.
type registry struct {
	mu     sync.Mutex
	tables map[string]*tableInfo
	// complete: tables this process created through a proxy; an item of
	// one that the registry does not hold does not exist.
	complete map[string]bool
}

var (
	registriesMu sync.Mutex
	registries   = map[string]*registry{}
)

func registryFor(target string) *registry {
	registriesMu.Lock()
	defer registriesMu.Unlock()
	r := registries[target]
	if r == nil {
		r = &registry{tables: map[string]*tableInfo{}, complete: map[string]bool{}}
		registries[target] = r
	}
	return r
}

type tableInfo struct {
	name, arn string
	hash, rng string
	complete  bool

	mu    sync.Mutex // guards items and every item's state
	items map[string]*itemState
}

func (r *registry) arn(table string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t := r.tables[table]; t != nil && t.arn != "" {
		return t.arn
	}
	return "arn:aws:dynamodb:ddblocal:000000000000:table/" + table
}

// created marks a table as made through a proxy of this process: empty.
func (r *registry) created(table string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.complete[table] = true
	delete(r.tables, table)
}

func (r *registry) deleted(table string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.complete, table)
	delete(r.tables, table)
}

// table returns a table's key schema, asking the server once.
func (r *registry) table(ctx context.Context, p *CapProxy, name string) (*tableInfo, error) {
	return r.tableAt(ctx, p.client, p.target, name)
}

// tableAt is table for any proxy: client asks target (the MRSC regions'
// proxies use it too).
func (r *registry) tableAt(ctx context.Context, client *http.Client, target, name string) (*tableInfo, error) {
	r.mu.Lock()
	t := r.tables[name]
	r.mu.Unlock()
	if t != nil {
		return t, nil
	}
	body, _ := json.Marshal(map[string]string{"TableName": name})
	u, err := post(ctx, client, target, localHeader("DynamoDB_20120810.DescribeTable"), body)
	if err != nil {
		return nil, err
	}
	if u.status != http.StatusOK {
		return nil, fmt.Errorf("describe table %q: %d %s", name, u.status, u.body)
	}
	var out struct {
		Table struct {
			TableArn  string
			KeySchema []struct{ AttributeName, KeyType string }
		}
	}
	if err := json.Unmarshal(u.body, &out); err != nil {
		return nil, err
	}
	t = &tableInfo{name: name, arn: out.Table.TableArn, items: map[string]*itemState{}}
	for _, k := range out.Table.KeySchema {
		if k.KeyType == "HASH" {
			t.hash = k.AttributeName
		} else {
			t.rng = k.AttributeName
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.tables[name]; old != nil {
		return old, nil
	}
	t.complete = r.complete[name]
	r.tables[name] = t
	return t, nil
}

// localHeader is the headers of the test servers' own requests to DynamoDB
// Local (it accepts any credentials): target is the X-Amz-Target, e.g.
// "DynamoDB_20120810.GetItem".
func localHeader(target string) http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/x-amz-json-1.0")
	h.Set("X-Amz-Target", target)
	h.Set("Authorization", "AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=00")
	return h
}

// keys returns an item's partition (its partition key's identity) and its
// identity in the table, from its key or a whole item.
func (t *tableInfo) keys(item attrs) (part, id string, err error) {
	h, ok := item[t.hash]
	if !ok {
		return "", "", fmt.Errorf("table %q: item without its partition key %q", t.name, t.hash)
	}
	if part, err = keyString(h); err != nil {
		return "", "", err
	}
	id = part
	if t.rng != "" {
		s, ok := item[t.rng]
		if !ok {
			return "", "", fmt.Errorf("table %q: item without its sort key %q", t.name, t.rng)
		}
		ss, err := keyString(s)
		if err != nil {
			return "", "", err
		}
		id += "\x00" + ss
	}
	return part, id, nil
}

func (t *tableInfo) state(id string) *itemState {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.items[id]
	if s == nil {
		s = newItemState(t.complete)
		t.items[id] = s
	}
	return s
}
