package testserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Local stand-ins for DynamoDB global tables (docs/regions.md):
//
//   - [Regions], the default mode: one DynamoDB Local per region and a
//     replicator that reads each region's stream and puts every item
//     written there into the other regions after a lag, last writer wins;
//     a region can be cut off from replication and healed.
//   - [MRSC], multi-Region strong consistency: one DynamoDB Local (so every
//     write and read is linearizable across regions) reached through one
//     proxy per region that holds each request for a cross-region latency,
//     answers a write that meets another region's write of the item with
//     ReplicatedWriteConflictException, and can cut a region off from the
//     quorum (mrsc.go).

// DefaultLag is the replication lag of [Regions] when none is given:
// DynamoDB documents a global table's replication as "typically within a
// second".
const DefaultLag = time.Second

// RegionsConfig configures [StartRegions].
type RegionsConfig struct {
	// Regions is the number of regions (0 means 3).
	Regions int
	// Lag is how long after a write is seen in its region's stream it is
	// applied in the others (0 means DefaultLag), for the tables handed
	// to [Regions.Replicate] ([Regions.ReplicateLag] sets a table's own).
	Lag time.Duration
}

// Replication timing. A gated write nudges its region's replicator, which
// reads the stream pollGap later (a burst of writes is one read); with no
// write it reads every idlePoll (writes that bypass the gate: TTL deletes).
const (
	pollGap  = 5 * time.Millisecond
	idlePoll = 50 * time.Millisecond
)

// Regions is a local default-mode global table: one private DynamoDB Local
// per region, each reached through its own gate ([Regions.Endpoint]), and
// a replicator that applies each region's item writes to the others after
// [RegionsConfig.Lag], last writer wins, as DynamoDB's asynchronous
// replication does.
//
// How: each region's table has a stream (NEW_IMAGE); the region's
// replicator reads it, stamps each record with the time it read it (at
// most a few milliseconds after the write: the gate nudges it), and queues
// the new image (or the deletion) for every other region, due a lag after
// the stamp. A region applies what is due with a PutItem (DeleteItem) of
// the whole item, unless the item's version there is newer (a later stamp;
// equal stamps: the higher region index wins). While it applies, its gate
// holds the region's clients' writes back and its stream is read first, so
// a client's write is never overwritten by an older one between the check
// and the put. Its own puts come back in its stream and are recognised by
// their images (they are not replicated again). A conditional write is
// checked against its own region's copy only, as on DynamoDB.
//
// Differences from DynamoDB: a write is stamped when the replicator reads
// it, not when it commits (two writes of one item in two regions within a
// few milliseconds may be ordered either way); the lag is the same for
// every pair of regions and every write of a table; items written before
// [Regions.Replicate] are not replicated; replicated writes are not billed
// or throttled. Safe for concurrent use; stopped when the test ends.
type Regions struct {
	t      testing.TB
	rs     []*region
	lag    time.Duration
	client *http.Client
	stop   chan struct{}
	done   sync.WaitGroup

	mu    sync.Mutex // guards the regions' inboxes, polled, stats and err
	stats ReplicationStats
	err   error
}

// region is one region: its server, its gate and its replicator's state.
type region struct {
	i      int
	server *Server
	gate   *HTTPProxy
	// writes is shared by the clients' writes passing the gate and taken
	// whole by the replicator while it applies.
	writes sync.RWMutex
	nudge  chan struct{}
	cut    atomic.Bool

	// Guarded by Regions.mu: the changes of other regions waiting to be
	// applied here, those taken to be applied by the round under way, and
	// when the last completed read of the streams began.
	inbox    []change
	applying int
	polled   time.Time

	// step is held by the replicator for each round (and by Replicate):
	// it guards the rest.
	step    sync.Mutex
	streams []*stream
	version map[itemID]stamp  // the newest write of each item here
	expect  map[itemID]change // a replicated put whose record is yet to be read
}

// stream is one table's stream in a region, and its shards.
type stream struct {
	table, arn string
	lag        time.Duration
	shards     map[string]*shard
}

// shard is where the replicator reads a shard: its iterator ("": the
// shard is closed and read to its end) and the sequence number of the
// last record it read ("": none yet).
type shard struct{ it, last string }

type itemID struct{ table, key string }

// stamp orders the writes of an item: when its region's replicator read
// it, then the region.
type stamp struct {
	at  time.Time
	src int
}

func (a stamp) after(b stamp) bool {
	return a.at.After(b.at) || a.at.Equal(b.at) && a.src > b.src
}

// change is a write to replicate: the item's new image (nil: deleted).
type change struct {
	id    itemID
	keys  attrs
	image json.RawMessage
	st    stamp
	due   time.Time
}

// ReplicationStats is what a [Regions]' replicator did. Matrices are
// indexed [from][to].
type ReplicationStats struct {
	// Local is the writes, per region, that its own clients made (read
	// from its stream).
	Local []int64
	// Applied is the writes put into another region. Superseded is those
	// another region did not take because it held a newer write of the
	// item (last writer wins); Coalesced those a newer write of the item,
	// due at the same time, replaced before they were applied.
	Applied, Superseded, Coalesced [][]int64
	// Echoes is the replicated puts read back from their destination's
	// stream (not replicated again).
	Echoes int64
	// Pending is the writes waiting for their lag or for a partition to
	// heal.
	Pending int
	// MinDelay and MaxDelay bound the time from a write being read in its
	// region to its being applied in another (0 before any).
	MinDelay, MaxDelay time.Duration
	// Holds is the times a gate held its region's writes back while the
	// replicator applied, and MaxHold the longest.
	Holds   int64
	MaxHold time.Duration
	// Trimmed is the shards read again after DynamoDB Local's
	// TrimmedDataAccessException (pollShard).
	Trimmed int64
}

// StartRegions starts cfg.Regions private DynamoDB Local servers (a JVM
// each, started at once: a few seconds, and their first requests are
// slow; start them only in tests that need them), each behind its gate,
// and their replicator. Tables are created through
// the regions' endpoints as in one region, then handed to
// [Regions.Replicate] while still empty.
func StartRegions(t testing.TB, cfg RegionsConfig) *Regions {
	t.Helper()
	n := cfg.Regions
	if n == 0 {
		n = 3
	}
	if n < 2 || cfg.Lag < 0 {
		t.Fatalf("testserver: regions: %d regions, lag %v: want 2 or more, and a lag of 0 or more", n, cfg.Lag)
	}
	g := &Regions{
		t:      t,
		lag:    orDefault(cfg.Lag, DefaultLag),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: time.Minute}},
		stop:   make(chan struct{}),
	}
	g.stats = ReplicationStats{Local: make([]int64, n), Applied: square(n), Superseded: square(n), Coalesced: square(n)}
	for i, server := range startDynamoDBLocals(t, n) {
		r := &region{i: i, server: server, nudge: make(chan struct{}, 1),
			version: map[itemID]stamp{}, expect: map[itemID]change{}}
		r.gate = newHTTPProxy(t, r.server.Endpoint(), r.hold)
		g.rs = append(g.rs, r)
	}
	for _, r := range g.rs {
		g.done.Go(func() { g.run(r) })
	}
	t.Cleanup(func() {
		close(g.stop)
		g.done.Wait()
		if err := g.Err(); err != nil {
			t.Errorf("testserver: regions: %v", err)
		}
	})
	return g
}

// SharedRegions is a [Regions] shared by the tests of a package: started
// by the first test that asks for it, stopped by Close (in TestMain, after
// m.Run), so the package starts and warms its three DynamoDB Locals once.
// Each test replicates tables of its own ([Regions.ReplicateLag], at its
// own lag) and unreplicates them when it ends; a test that partitions a
// region (Partition and Heal act on every table), counts the replicator's
// Stats or calls Settle while others run starts a harness of its own.
// Safe for concurrent use.
type SharedRegions struct {
	cfg   RegionsConfig
	mu    sync.Mutex
	owner *packageTB
	g     *Regions
}

// NewSharedRegions returns a shared harness of cfg, not started yet.
func NewSharedRegions(cfg RegionsConfig) *SharedRegions { return &SharedRegions{cfg: cfg} }

// Get returns the harness, started by the first call: a start that
// failed (or skipped: no servers) fails (skips) every test that asks.
// The replicator's errors are reported to the test that was running
// when they began, and by Close.
func (s *SharedRegions) Get(t testing.TB) *Regions {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.owner == nil {
		s.owner = &packageTB{}
		done := make(chan struct{})
		go func() { // StartRegions ends it with runtime.Goexit on a failure
			defer close(done)
			s.g = StartRegions(s.owner, s.cfg)
		}()
		<-done
	}
	if msg := s.owner.skipped(); msg != "" {
		t.Skipf("shared regions: %s", msg)
	}
	if s.g == nil {
		t.Fatalf("shared regions: %v", s.owner.err())
	}
	g, before := s.g, s.g.Err()
	t.Cleanup(func() {
		if err := g.Err(); err != nil && before == nil {
			t.Errorf("testserver: shared regions: %v", err)
		}
	})
	return g
}

// Close stops the harness, if it was started, and returns the errors
// reported in it after its start (the replicator's).
func (s *SharedRegions) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.owner == nil {
		return nil
	}
	s.owner.cleanup()
	return s.owner.err()
}

// packageTB is the testing.TB a [SharedRegions] starts its harness with:
// it outlives the tests, and its cleanups (servers, proxies, temporary
// directories) run at Close. It implements the methods the harness's
// start calls; any other (through the embedded nil TB) panics.
type packageTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	errs     []error
	skip     string
}

func (p *packageTB) Helper()      {}
func (p *packageTB) Name() string { return "SharedRegions" }

func (p *packageTB) Cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}

func (p *packageTB) TempDir() string {
	dir, err := os.MkdirTemp("", "sluice-regions-")
	if err != nil {
		p.Fatalf("testserver: %v", err)
	}
	p.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (p *packageTB) Errorf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, fmt.Errorf(format, args...))
}

// Fatalf records the error and ends the goroutine, as testing's does.
func (p *packageTB) Fatalf(format string, args ...any) {
	p.Errorf(format, args...)
	runtime.Goexit()
}

// Skipf records why and ends the goroutine.
func (p *packageTB) Skipf(format string, args ...any) {
	p.mu.Lock()
	p.skip = fmt.Sprintf(format, args...)
	p.mu.Unlock()
	runtime.Goexit()
}

func (p *packageTB) skipped() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.skip
}

func (p *packageTB) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return errors.Join(p.errs...)
}

// cleanup runs the cleanups, last registered first.
func (p *packageTB) cleanup() {
	p.mu.Lock()
	fs := p.cleanups
	p.cleanups = nil
	p.mu.Unlock()
	for _, f := range slices.Backward(fs) {
		f()
	}
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func square(n int) [][]int64 {
	m := make([][]int64, n)
	for i := range m {
		m[i] = make([]int64, n)
	}
	return m
}

// gatedOps are the operations that write items: the gate holds them back
// while the replicator applies.
var gatedOps = map[string]bool{
	"PutItem": true, "UpdateItem": true, "DeleteItem": true, "BatchWriteItem": true, "TransactWriteItems": true,
	"ExecuteStatement": true, "BatchExecuteStatement": true, "ExecuteTransaction": true,
}

// hold is the gate: a write passes while the replicator is not applying,
// and nudges it once answered.
func (r *region) hold(op string) func() {
	if !gatedOps[op] {
		return func() {}
	}
	r.writes.RLock()
	return func() {
		r.writes.RUnlock()
		select {
		case r.nudge <- struct{}{}:
		default:
		}
	}
}

// Len returns the number of regions.
func (g *Regions) Len() int { return len(g.rs) }

// Lag returns the replication lag of the tables handed to
// [Regions.Replicate].
func (g *Regions) Lag() time.Duration { return g.lag }

// Endpoint returns region i's endpoint URL (its gate) for clients.
func (g *Regions) Endpoint(i int) string { return g.rs[i].gate.URL() }

// Gate returns region i's gate, which records its clients' requests (Len,
// Since).
func (g *Regions) Gate(i int) *HTTPProxy { return g.rs[i].gate }

// Partition cuts region i off: its writes are not applied elsewhere, and
// nothing is applied to it, until Heal; they wait (Pending).
func (g *Regions) Partition(i int) { g.rs[i].cut.Store(true) }

// Heal ends region i's partition: what waited is applied at once (its lag
// has passed), last writer wins.
func (g *Regions) Heal(i int) {
	g.rs[i].cut.Store(false)
	for _, r := range g.rs {
		r.poke()
	}
}

func (r *region) poke() {
	select {
	case r.nudge <- struct{}{}:
	default:
	}
}

// Err returns the replicator's first error (a stream or a put that
// failed), also reported as a test error when the test ends.
func (g *Regions) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

func (g *Regions) fail(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		g.err = err
	}
}

// Stats returns a snapshot of the replicator's counts.
func (g *Regions) Stats() ReplicationStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.stats
	s.Local = slices.Clone(s.Local)
	clone := func(m [][]int64) [][]int64 {
		c := make([][]int64, len(m))
		for i := range m {
			c[i] = slices.Clone(m[i])
		}
		return c
	}
	s.Applied, s.Superseded, s.Coalesced = clone(s.Applied), clone(s.Superseded), clone(s.Coalesced)
	for _, r := range g.rs {
		s.Pending += len(r.inbox)
	}
	return s
}

// Settle waits until every write made before it was called has been
// applied in every region, or superseded there (none waits on a
// partition), or until ctx ends.
func (g *Regions) Settle(ctx context.Context) error {
	mark := time.Now()
	for {
		for _, r := range g.rs {
			r.poke()
		}
		g.mu.Lock()
		done := true
		for _, r := range g.rs {
			if !r.polled.After(mark) || len(r.inbox) > 0 || r.applying > 0 {
				done = false
			}
		}
		g.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testserver: regions: settle: %w (%d writes pending)", ctx.Err(), g.Stats().Pending)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Replicate starts replicating table, which exists (empty) in every
// region, at the harness's lag ([RegionsConfig.Lag]): it enables the
// table's stream (NEW_IMAGE) in each (the regions at once) and reads it
// from its start.
func (g *Regions) Replicate(ctx context.Context, table string) error {
	return g.ReplicateLag(ctx, table, g.lag)
}

// ReplicateLag is [Regions.Replicate] at a lag of the table's own (0
// means DefaultLag): the writes of each table are applied in the other
// regions its lag after they were read, whatever the other tables' lags.
func (g *Regions) ReplicateLag(ctx context.Context, table string, lag time.Duration) error {
	if lag < 0 {
		return fmt.Errorf("testserver: regions: table %s: lag %v: want 0 or more", table, lag)
	}
	lag = orDefault(lag, DefaultLag)
	errs := make([]error, len(g.rs))
	var wg sync.WaitGroup
	for i, r := range g.rs {
		wg.Go(func() { errs[i] = g.replicate(ctx, r, table, lag) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Unreplicate stops replicating table: its streams are no longer read
// (no more requests for it), and its writes not yet applied are dropped.
// A test on a shared harness ([SharedRegions]) calls it when it ends.
func (g *Regions) Unreplicate(table string) {
	for _, r := range g.rs {
		r.step.Lock()
		r.streams = slices.DeleteFunc(r.streams, func(s *stream) bool { return s.table == table })
		maps.DeleteFunc(r.version, func(id itemID, _ stamp) bool { return id.table == table })
		maps.DeleteFunc(r.expect, func(id itemID, _ change) bool { return id.table == table })
		r.step.Unlock()
		g.mu.Lock()
		r.inbox = slices.DeleteFunc(r.inbox, func(c change) bool { return c.id.table == table })
		g.mu.Unlock()
	}
}

// replicate is Replicate in region r.
func (g *Regions) replicate(ctx context.Context, r *region, table string, lag time.Duration) error {
	target := r.server.Endpoint()
	var desc struct {
		Table struct {
			StreamSpecification struct{ StreamEnabled bool }
			LatestStreamArn     string
		}
	}
	if err := g.call(ctx, target, "DynamoDB_20120810.DescribeTable", map[string]string{"TableName": table}, &desc); err != nil {
		return err
	}
	if !desc.Table.StreamSpecification.StreamEnabled {
		var upd struct {
			TableDescription struct{ LatestStreamArn string }
		}
		spec := map[string]any{"TableName": table, "StreamSpecification": map[string]any{"StreamEnabled": true, "StreamViewType": "NEW_IMAGE"}}
		if err := g.call(ctx, target, "DynamoDB_20120810.UpdateTable", spec, &upd); err != nil {
			return err
		}
		desc.Table.LatestStreamArn = upd.TableDescription.LatestStreamArn
	}
	s := &stream{table: table, arn: desc.Table.LatestStreamArn, lag: lag, shards: map[string]*shard{}}
	r.step.Lock()
	defer r.step.Unlock()
	if err := g.describe(ctx, r, s); err != nil {
		return err
	}
	r.streams = append(r.streams, s)
	return nil
}

// describe adds the stream's shards it does not know yet, read from
// their start. r.step is held.
func (g *Regions) describe(ctx context.Context, r *region, s *stream) error {
	var out struct {
		StreamDescription struct {
			Shards []struct{ ShardId string }
		}
	}
	if err := g.call(ctx, r.server.Endpoint(), "DynamoDBStreams_20120810.DescribeStream", map[string]string{"StreamArn": s.arn}, &out); err != nil {
		return err
	}
	for _, sh := range out.StreamDescription.Shards {
		if _, ok := s.shards[sh.ShardId]; ok {
			continue
		}
		it, err := g.iterator(ctx, r, s, sh.ShardId, "")
		if err != nil {
			return err
		}
		s.shards[sh.ShardId] = &shard{it: it}
	}
	return nil
}

// iterator returns an iterator of s's shard id in r: past the record
// numbered last, or from the shard's start (last "").
func (g *Regions) iterator(ctx context.Context, r *region, s *stream, id, last string) (string, error) {
	in := map[string]string{"StreamArn": s.arn, "ShardId": id, "ShardIteratorType": "TRIM_HORIZON"}
	if last != "" {
		in["ShardIteratorType"], in["SequenceNumber"] = "AFTER_SEQUENCE_NUMBER", last
	}
	var out struct{ ShardIterator string }
	err := g.call(ctx, r.server.Endpoint(), "DynamoDBStreams_20120810.GetShardIterator", in, &out)
	return out.ShardIterator, err
}

// call sends one request of the replicator's own to a region's server.
func (g *Regions) call(ctx context.Context, target, op string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	u, err := post(ctx, g.client, target, localHeader(op), body)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if u.status != http.StatusOK {
		return fmt.Errorf("%s: %d %s", op, u.status, u.body)
	}
	if out != nil {
		if err := json.Unmarshal(u.body, out); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	return nil
}

// run is region r's replicator: a round after each nudge (pollGap later),
// when a change is due, and every idlePoll.
func (g *Regions) run(r *region) {
	timer := time.NewTimer(idlePoll)
	defer timer.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-r.nudge:
			select {
			case <-g.stop:
				return
			case <-time.After(pollGap):
			}
		case <-timer.C:
		}
		g.round(r)
		wait := idlePoll
		if due, ok := g.nextDue(r); ok {
			wait = min(wait, max(time.Until(due), 0))
		}
		timer.Reset(wait)
	}
}

// round reads r's streams, then applies what is due in r: with the gate
// closed, after reading the streams again, so that every write of r's
// clients that completed is known (and newer) before an older one is put.
func (g *Regions) round(r *region) {
	r.step.Lock()
	defer r.step.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := g.poll(ctx, r); err != nil {
		g.fail(err)
		return
	}
	g.mu.Lock()
	r.polled = start
	g.mu.Unlock()
	due := g.takeDue(r, time.Now())
	if len(due) == 0 {
		return
	}
	r.writes.Lock()
	held := time.Now()
	if err := g.poll(ctx, r); err != nil {
		g.fail(err)
	}
	g.apply(ctx, r, due)
	r.writes.Unlock()
	g.mu.Lock()
	r.applying = 0
	g.stats.Holds++
	g.stats.MaxHold = max(g.stats.MaxHold, time.Since(held))
	g.mu.Unlock()
}

// streamRecord is the part of a stream record the replicator reads.
type streamRecord struct {
	EventName string `json:"eventName"`
	Dynamodb  struct {
		Keys           attrs
		NewImage       json.RawMessage
		SequenceNumber string
	} `json:"dynamodb"`
}

// getRecordsLimit is GetRecords' largest page.
const getRecordsLimit = 1000

// poll reads r's streams to their ends. r.step is held.
func (g *Regions) poll(ctx context.Context, r *region) error {
	for _, s := range r.streams {
		closed := false
		for id, sh := range s.shards {
			open := sh.it != ""
			if err := g.pollShard(ctx, r, s, id, sh); err != nil {
				return fmt.Errorf("region %d, table %s: %w", r.i, s.table, err)
			}
			closed = closed || open && sh.it == ""
		}
		if closed {
			// A closed shard has children: read them from their start.
			if err := g.describe(ctx, r, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// pollShard reads s's shard id in r to its end (or to what it holds).
//
// DynamoDB Local answers TrimmedDataAccessException (nothing is trimmed
// in a test's minutes) to an iterator of a table's shard taken before
// another table of the server had a write and this one its first: a
// table replicated empty while another is written to (a shared harness).
// The shard is read again from past its last record read (or from its
// start): once, then the error is the replicator's.
func (g *Regions) pollShard(ctx context.Context, r *region, s *stream, id string, sh *shard) error {
	again := true
	for sh.it != "" {
		var out struct {
			Records           []streamRecord
			NextShardIterator string
		}
		err := g.call(ctx, r.server.Endpoint(), "DynamoDBStreams_20120810.GetRecords", map[string]any{"ShardIterator": sh.it, "Limit": getRecordsLimit}, &out)
		if err != nil && again && strings.Contains(err.Error(), "TrimmedDataAccessException") {
			again = false
			it, err := g.iterator(ctx, r, s, id, sh.last)
			if err != nil {
				return err
			}
			sh.it = it
			g.mu.Lock()
			g.stats.Trimmed++
			g.mu.Unlock()
			continue
		}
		if err != nil {
			return err
		}
		now := time.Now()
		for _, rec := range out.Records {
			if err := g.record(r, s, rec, now); err != nil {
				return err
			}
			sh.last = rec.Dynamodb.SequenceNumber
		}
		sh.it = out.NextShardIterator
		if len(out.Records) < getRecordsLimit {
			break
		}
	}
	return nil
}

// record takes one record of r's stream s, read at now: the echo of a
// replicated put, or a write of r's clients, queued for the others.
func (g *Regions) record(r *region, s *stream, rec streamRecord, now time.Time) error {
	key, err := keyID(rec.Dynamodb.Keys)
	if err != nil {
		return fmt.Errorf("region %d, table %s: %w", r.i, s.table, err)
	}
	id := itemID{s.table, key}
	var image json.RawMessage
	if rec.EventName != "REMOVE" {
		image = rec.Dynamodb.NewImage
	}
	if exp, ok := r.expect[id]; ok {
		// The first record of the item after a replicated put is the put
		// itself, or (a put that changed nothing has no record) a
		// client's later write, which changed the item.
		delete(r.expect, id)
		if sameImage(exp.image, image) {
			g.mu.Lock()
			g.stats.Echoes++
			g.mu.Unlock()
			return nil
		}
	}
	st := stamp{now, r.i}
	r.version[id] = st
	c := change{id: id, keys: rec.Dynamodb.Keys, image: image, st: st, due: now.Add(s.lag)}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stats.Local[r.i]++
	for _, o := range g.rs {
		if o != r {
			o.inbox = append(o.inbox, c)
		}
	}
	return nil
}

// keyID is an item's identity in its table from its key attributes.
func keyID(keys attrs) (string, error) {
	names := make([]string, 0, len(keys))
	for n := range keys {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		v, err := keyString(keys[n])
		if err != nil {
			return "", err
		}
		b.WriteString(n + "=" + v + "\x00")
	}
	return b.String(), nil
}

// sameImage reports whether two item images (nil: none) hold the same
// attributes, whatever their order.
func sameImage(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// takeDue removes from r's inbox the changes due at now whose source is
// not cut off (none when r is).
func (g *Regions) takeDue(r *region, now time.Time) []change {
	g.mu.Lock()
	defer g.mu.Unlock()
	if r.cut.Load() {
		return nil
	}
	var due []change
	keep := r.inbox[:0]
	for _, c := range r.inbox {
		if !c.due.After(now) && !g.rs[c.st.src].cut.Load() {
			due = append(due, c)
		} else {
			keep = append(keep, c)
		}
	}
	clear(r.inbox[len(keep):])
	r.inbox = keep
	r.applying = len(due)
	return due
}

// nextDue is when the next change r may apply is due.
func (g *Regions) nextDue(r *region) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if r.cut.Load() {
		return time.Time{}, false
	}
	var next time.Time
	for _, c := range r.inbox {
		if !g.rs[c.st.src].cut.Load() && (next.IsZero() || c.due.Before(next)) {
			next = c.due
		}
	}
	return next, !next.IsZero()
}

// apply puts the newest due change of each item into r, unless r holds a
// newer write of it. r.step and r's gate are held.
func (g *Regions) apply(ctx context.Context, r *region, due []change) {
	best := map[itemID]change{}
	var order []itemID
	for _, c := range due {
		b, ok := best[c.id]
		switch {
		case !ok:
			best[c.id] = c
			order = append(order, c.id)
			continue
		case c.st.after(b.st):
			best[c.id] = c
			c = b
		}
		g.mu.Lock()
		g.stats.Coalesced[c.st.src][r.i]++
		g.mu.Unlock()
	}
	for _, id := range order {
		c := best[id]
		if v, ok := r.version[id]; ok && !c.st.after(v) {
			g.mu.Lock()
			g.stats.Superseded[c.st.src][r.i]++
			g.mu.Unlock()
			continue
		}
		var err error
		if c.image == nil {
			err = g.call(ctx, r.server.Endpoint(), "DynamoDB_20120810.DeleteItem", map[string]any{"TableName": id.table, "Key": c.keys}, nil)
		} else {
			err = g.call(ctx, r.server.Endpoint(), "DynamoDB_20120810.PutItem", map[string]any{"TableName": id.table, "Item": c.image}, nil)
		}
		if err != nil {
			g.fail(fmt.Errorf("apply in region %d: %w", r.i, err))
			continue
		}
		r.version[id] = c.st
		r.expect[id] = c
		delay := time.Since(c.st.at)
		g.mu.Lock()
		g.stats.Applied[c.st.src][r.i]++
		if g.stats.MinDelay == 0 || delay < g.stats.MinDelay {
			g.stats.MinDelay = delay
		}
		g.stats.MaxDelay = max(g.stats.MaxDelay, delay)
		g.mu.Unlock()
	}
}
