package testserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// TestRegionsReplication runs the default-mode harness (three DynamoDB
// Locals, lag 1 s) once, and shows in turn that a write reaches the other
// regions no sooner than the lag and soon after it, that the last writer
// wins, that concurrent counters in two regions lose each other's
// increments (why a shared limit over-admits), and that a partitioned
// region neither sends nor receives until healed.
func TestRegionsReplication(t *testing.T) {
	if testing.Short() {
		t.Skip("three DynamoDB Locals")
	}
	DynamoDBLocal(t) // skip (or fail under make test) without the servers
	g := StartRegions(t, RegionsConfig{Lag: time.Second})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	table := fmt.Sprintf("sluice-regions-test-%d", time.Now().UnixNano())
	clients := make([]*dynamodb.Client, g.Len())
	for i := range clients {
		clients[i] = ddbClient(g.Endpoint(i))
	}
	r := regionsTest{t: t, ctx: ctx, g: g, table: table, clients: clients}
	r.create(table)
	if err := g.Replicate(ctx, table); err != nil {
		t.Fatal(err)
	}

	t.Run("lag", func(t *testing.T) {
		r.t = t
		start := time.Now()
		r.put(0, "lag", "a")
		for _, i := range []int{1, 2} {
			seen := r.waitFor(i, "lag", "a", g.Lag()+3*time.Second)
			// The write was read from region 0's stream after it
			// completed, and applied a lag after that.
			if d := seen.Sub(start); d < g.Lag() {
				t.Errorf("region %d had the write %v after it began, before the lag %v", i, d, g.Lag())
			}
			t.Logf("region %d had the write %v after it began", i, seen.Sub(start).Round(time.Millisecond))
		}
		st := g.Stats()
		if st.MinDelay < g.Lag() {
			t.Errorf("a write was applied %v after it was read, before the lag %v", st.MinDelay, g.Lag())
		}
		t.Logf("delays %v .. %v", st.MinDelay.Round(time.Millisecond), st.MaxDelay.Round(time.Millisecond))
	})

	t.Run("last-writer-wins", func(t *testing.T) {
		r.t = t
		before := g.Stats()
		r.put(0, "lww", "older")
		time.Sleep(300 * time.Millisecond)
		r.put(1, "lww", "newer")
		if err := g.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		// Without last-writer-wins region 1 would end with region 0's
		// older write (applied a lag after it, over region 1's), and
		// region 0 with region 1's: diverged.
		for i := range g.Len() {
			if v := r.get(i, "lww"); v != "newer" {
				t.Errorf("region %d holds %q, want the last write %q", i, v, "newer")
			}
		}
		after := g.Stats()
		if d := after.Superseded[0][1] - before.Superseded[0][1]; d != 1 {
			t.Errorf("region 1 refused %d older writes of region 0, want 1", d)
		}
		if d := after.Applied[1][0] - before.Applied[1][0]; d != 1 {
			t.Errorf("region 0 took %d writes of region 1, want 1", d)
		}
	})

	t.Run("counters-lose-increments", func(t *testing.T) {
		r.t = t
		const each = 20
		var wg sync.WaitGroup
		for _, i := range []int{0, 1} {
			wg.Go(func() {
				for range each {
					r.add(i, "counter")
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		if err := g.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		var vs []int
		for i := range g.Len() {
			vs = append(vs, r.count(i, "counter"))
		}
		t.Logf("after %d increments in each of regions 0 and 1, the regions hold %v", each, vs)
		for i, v := range vs {
			if v != vs[0] {
				t.Errorf("region %d holds %d, region 0 %d: not converged", i, v, vs[0])
			}
		}
		// The whole item is replicated: each region's count is its own
		// increments and whatever had arrived a lag late; the last one
		// wins. Within one lag, neither saw all of the other's.
		if vs[0] >= 2*each {
			t.Errorf("the regions hold %d of %d increments: none lost, where last-writer-wins of whole items loses some", vs[0], 2*each)
		}
	})

	t.Run("table-lag", func(t *testing.T) { r.t = t; r.tables(2 * g.Lag()) })

	t.Run("partition", func(t *testing.T) {
		r.t = t
		g.Partition(2)
		r.put(0, "p0", "x")
		r.put(2, "p2", "y")
		r.waitFor(1, "p0", "x", g.Lag()+3*time.Second)
		time.Sleep(300 * time.Millisecond) // well past the lag for region 2 too
		if v := r.get(2, "p0"); v != "" {
			t.Errorf("partitioned region 2 received %q", v)
		}
		for _, i := range []int{0, 1} {
			if v := r.get(i, "p2"); v != "" {
				t.Errorf("region %d received %q from partitioned region 2", i, v)
			}
		}
		if p := g.Stats().Pending; p < 3 {
			t.Errorf("%d writes wait for the partition, want 3 (p0 to region 2, p2 to regions 0 and 1)", p)
		}
		g.Heal(2)
		if err := g.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		for i := range g.Len() {
			if r.get(i, "p0") != "x" || r.get(i, "p2") != "y" {
				t.Errorf("region %d after healing: p0 %q, p2 %q; want x, y", i, r.get(i, "p0"), r.get(i, "p2"))
			}
		}
	})
	t.Logf("stats: %+v", g.Stats())
}

// regionsTest holds a test's clients of each region.
type regionsTest struct {
	t       *testing.T
	ctx     context.Context
	g       *Regions
	table   string
	clients []*dynamodb.Client
}

// create creates table in every region, the regions at once.
func (r *regionsTest) create(table string) {
	r.t.Helper()
	errs := make([]error, len(r.clients))
	var wg sync.WaitGroup
	for i, c := range r.clients {
		wg.Go(func() { _, errs[i] = c.CreateTable(r.ctx, createInput(table)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		r.t.Fatal(err)
	}
}

// tables shows a table's own lag (ReplicateLag, lag above the
// harness's) and Unreplicate, on two tables of their own: a write
// pending when its table is unreplicated is dropped, and a later one is
// not read. Both would be due before the write of the lagged table made
// after them, so their absence when it arrives shows it.
func (r *regionsTest) tables(lag time.Duration) {
	t, g := r.t, r.g
	lagged, gone := *r, *r
	lagged.table = r.table + "-lagged"
	gone.table = r.table + "-gone"
	r.create(lagged.table)
	r.create(gone.table)
	if err := g.ReplicateLag(r.ctx, lagged.table, lag); err != nil {
		t.Fatal(err)
	}
	if err := g.ReplicateLag(r.ctx, gone.table, lag); err != nil {
		t.Fatal(err)
	}
	local := g.Stats().Local[0]
	gone.put(0, "pending", "x")
	for deadline := time.Now().Add(5 * time.Second); g.Stats().Local[0] == local; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("region 0's write was not read from its stream within 5 s")
		}
	}
	pending := g.Stats().Pending
	g.Unreplicate(gone.table)
	if p := g.Stats().Pending; p != pending-2 {
		t.Errorf("%d writes pending after Unreplicate, %d before: want the table's 2 dropped", p, pending)
	}
	gone.put(0, "later", "y")
	time.Sleep(100 * time.Millisecond) // read (if it were) before the lagged write
	start := time.Now()
	lagged.put(0, "lag", "a")
	for _, i := range []int{1, 2} {
		seen := lagged.waitFor(i, "lag", "a", lag+3*time.Second)
		if d := seen.Sub(start); d < lag {
			t.Errorf("region %d had the write of a table at lag %v %v after it began (the harness's lag: %v)", i, lag, d, g.Lag())
		}
		t.Logf("region %d had the write of a table at lag %v %v after it began", i, lag, seen.Sub(start).Round(time.Millisecond))
		for _, pk := range []string{"pending", "later"} {
			if v := gone.get(i, pk); v != "" {
				t.Errorf("region %d received %s = %q of an unreplicated table", i, pk, v)
			}
		}
	}
}

func (r *regionsTest) put(i int, pk, v string) {
	r.t.Helper()
	if _, err := r.clients[i].PutItem(r.ctx, &dynamodb.PutItemInput{TableName: aws.String(r.table), Item: item{"pk": s(pk), "v": s(v)}}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *regionsTest) add(i int, pk string) {
	if _, err := r.clients[i].UpdateItem(r.ctx, &dynamodb.UpdateItemInput{TableName: aws.String(r.table), Key: item{"pk": s(pk)},
		UpdateExpression: aws.String("ADD c :one"), ExpressionAttributeValues: item{":one": n("1")}}); err != nil {
		r.t.Error(err)
	}
}

func (r *regionsTest) getItem(i int, pk string) item {
	r.t.Helper()
	out, err := r.clients[i].GetItem(r.ctx, &dynamodb.GetItemInput{TableName: aws.String(r.table), Key: item{"pk": s(pk)}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		r.t.Fatal(err)
	}
	return out.Item
}

// get returns the item's "v" in region i ("": no item).
func (r *regionsTest) get(i int, pk string) string {
	r.t.Helper()
	v, _ := r.getItem(i, pk)["v"].(*types.AttributeValueMemberS)
	if v == nil {
		return ""
	}
	return v.Value
}

// count returns the item's "c" in region i.
func (r *regionsTest) count(i int, pk string) int {
	r.t.Helper()
	v, _ := r.getItem(i, pk)["c"].(*types.AttributeValueMemberN)
	if v == nil {
		return 0
	}
	var c int
	fmt.Sscan(v.Value, &c)
	return c
}

// waitFor reads the item in region i until its "v" is want, and returns
// when it first was; it fails the test after within.
func (r *regionsTest) waitFor(i int, pk, want string, within time.Duration) time.Time {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for {
		now := time.Now()
		if r.get(i, pk) == want {
			return now
		}
		if now.After(deadline) {
			r.t.Fatalf("region %d: %s is not %q after %v", i, pk, want, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An MRSC region's requests pay the added latency, and what one region
// writes the next reads at once: one copy of every item.
func TestRegionsMRSC(t *testing.T) {
	const latency = 40 * time.Millisecond
	m := NewMRSC(t, DynamoDBLocal(t), latency)
	ctx := t.Context()
	table := capTable(t, DynamoDBLocal(t))
	c0, c1 := ddbClient(m.Endpoint(0)), ddbClient(m.Endpoint(1))
	start := time.Now()
	if _, err := c0.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item{"pk": s("k"), "v": s("a")}}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < latency {
		t.Errorf("a write took %v, less than the added latency %v", d, latency)
	}
	out, err := c1.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: item{"pk": s("k")}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := out.Item["v"].(*types.AttributeValueMemberS); v == nil || v.Value != "a" {
		t.Errorf("region 1 read %v right after region 0's write, want v=a", out.Item)
	}
	if n := m.Requests(); n != 2 {
		t.Errorf("the proxies passed %d requests, want 2", n)
	}
	for _, q := range append(m.Region(0).Since(0), m.Region(1).Since(0)...) {
		if d := q.End.Sub(q.Start); d < latency {
			t.Errorf("%s took %v at its proxy, less than %v", q.Op, d, latency)
		}
	}
}

// MRSC write conflicts: a write of an item from another region while one
// is in flight gets ReplicatedWriteConflictException (typed by the SDK,
// counted, the item untouched), for an UpdateItem, a BatchWriteItem and a
// TransactWriteItems; writes of other items, writes from the same region
// and writes after the first was answered pass; with conflicts off, none
// conflicts.
func TestRegionsMRSCConflicts(t *testing.T) {
	const latency = 300 * time.Millisecond // room for the second request to arrive while the first is in flight
	m := NewMRSC(t, DynamoDBLocal(t), latency)
	ctx := t.Context()
	table := capTable(t, DynamoDBLocal(t))
	noRetry := func(o *dynamodb.Options) { o.Retryer = aws.NopRetryer{} }
	c := []*dynamodb.Client{ddbClient(m.Endpoint(0), noRetry), ddbClient(m.Endpoint(1), noRetry), ddbClient(m.Endpoint(2), noRetry)}
	add := func(i int, pk string) error {
		_, err := c[i].UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: item{"pk": s(pk)},
			UpdateExpression: aws.String("ADD c :one"), ExpressionAttributeValues: item{":one": n("1")}})
		return err
	}
	// during runs first in region 0 on k and, once it is in flight there,
	// the others.
	during := func(first func() error, others ...func() error) []error {
		var wg sync.WaitGroup
		errs := make([]error, len(others)+1)
		wg.Go(func() { errs[0] = first() })
		time.Sleep(latency / 6)
		for i, f := range others {
			wg.Go(func() { errs[i+1] = f() })
		}
		wg.Wait()
		return errs
	}
	isConflict := func(err error) bool {
		var rc *types.ReplicatedWriteConflictException
		return errors.As(err, &rc)
	}
	errs := during(func() error { return add(0, "k") },
		func() error { return add(1, "k") }, // another region, same item: conflict
		func() error { return add(0, "k") }, // same region: serialized
		func() error { return add(2, "other") },
		func() error {
			_, err := c[2].BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{
				table: {{PutRequest: &types.PutRequest{Item: item{"pk": s("k"), "c": n("100")}}}}}})
			return err
		},
		func() error {
			_, err := c[1].TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
				{Put: &types.Put{TableName: aws.String(table), Item: item{"pk": s("t")}}},
				{Delete: &types.Delete{TableName: aws.String(table), Key: item{"pk": s("k")}}}}})
			return err
		})
	for i, want := range []bool{false, true, false, false, true, true} {
		if got := isConflict(errs[i]); got != want || (!want && errs[i] != nil) {
			t.Errorf("write %d: %v, want a conflict: %v", i, errs[i], want)
		}
	}
	var rc *types.ReplicatedWriteConflictException
	if errors.As(errs[1], &rc) && !strings.Contains(rc.ErrorMessage(), "another Region") {
		t.Errorf("message %q", rc.ErrorMessage())
	}
	out, err := c[1].GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: item{"pk": s("k")}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := out.Item["c"].(*types.AttributeValueMemberN); v == nil || v.Value != "2" {
		t.Errorf("k after region 0's two adds and three refused writes: %v, want c=2", out.Item)
	}
	if err := add(1, "k"); err != nil {
		t.Errorf("a write once the others were answered: %v", err)
	}
	if st := m.Stats(); !slices.Equal(st.Conflicts, []int64{0, 2, 1}) {
		t.Errorf("stats: %v, want conflicts [0 2 1]", st)
	}
	m.SetConflicts(false)
	errs = during(func() error { return add(0, "k") }, func() error { return add(1, "k") }, func() error { return add(2, "k") })
	for i, err := range errs {
		if err != nil {
			t.Errorf("conflicts off, write %d: %v", i, err)
		}
	}
}

// An MRSC region cut off from the quorum: its writes and strongly
// consistent reads hang until the client gives up (PartitionHang) or are
// refused with a 500 (PartitionRefuse), and change nothing; its eventually
// consistent reads and the other regions are served; after Heal it
// writes again.
func TestRegionsMRSCPartition(t *testing.T) {
	const latency = 20 * time.Millisecond
	m := NewMRSC(t, DynamoDBLocal(t), latency)
	ctx := t.Context()
	table := capTable(t, DynamoDBLocal(t))
	noRetry := func(o *dynamodb.Options) { o.Retryer = aws.NopRetryer{} }
	c0, c2 := ddbClient(m.Endpoint(0), noRetry), ddbClient(m.Endpoint(2), noRetry)
	put := func(c *dynamodb.Client, ctx context.Context, v string) error {
		_, err := c.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item{"pk": s("p"), "v": s(v)}})
		return err
	}
	get := func(c *dynamodb.Client, consistent bool) (string, error) {
		out, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: item{"pk": s("p")}, ConsistentRead: aws.Bool(consistent)})
		if err != nil {
			return "", err
		}
		v, _ := out.Item["v"].(*types.AttributeValueMemberS)
		if v == nil {
			return "", nil
		}
		return v.Value, nil
	}
	if err := put(c0, ctx, "before"); err != nil {
		t.Fatal(err)
	}
	m.Partition(2, PartitionHang)
	const deadline = 250 * time.Millisecond
	dctx, cancel := context.WithTimeout(ctx, deadline)
	start := time.Now()
	err := put(c2, dctx, "cut")
	cancel()
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took < deadline {
		t.Errorf("a write in the cut-off region: %v after %v, want the client's deadline (%v) exceeded", err, took, deadline)
	}
	dctx, cancel = context.WithTimeout(ctx, deadline)
	_, err = c2.GetItem(dctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: item{"pk": s("p")}, ConsistentRead: aws.Bool(true)})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a strongly consistent read in the cut-off region: %v, want the deadline exceeded", err)
	}
	if v, err := get(c2, false); err != nil || v != "before" {
		t.Errorf("an eventually consistent read in the cut-off region: %q, %v; want before", v, err)
	}
	if err := put(c0, ctx, "live"); err != nil {
		t.Errorf("a write in a live region: %v", err)
	}
	m.Partition(2, PartitionRefuse)
	start = time.Now()
	err = put(c2, ctx, "cut")
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "InternalServerError" || time.Since(start) < latency {
		t.Errorf("a write in the refusing region: %v after %v, want InternalServerError after the latency", err, time.Since(start))
	}
	m.Heal(2)
	if v, err := get(c2, true); err != nil || v != "live" {
		t.Errorf("after the partition: %q, %v; want live", v, err)
	}
	if err := put(c2, ctx, "healed"); err != nil {
		t.Errorf("a write after Heal: %v", err)
	}
	if st := m.Stats(); !slices.Equal(st.Cut, []int64{0, 0, 3}) {
		t.Errorf("stats: %v, want cut [0 0 3]", st)
	}
}

// The replicator's pieces on their own: stamps order writes, images
// compare whatever the order of their attributes, keys name items.
func TestRegionsReplicatorParts(t *testing.T) {
	t0 := time.Unix(100, 0)
	steps := []struct {
		name string
		a, b stamp
		want bool
	}{
		{"later", stamp{t0.Add(time.Millisecond), 0}, stamp{t0, 2}, true},
		{"earlier", stamp{t0, 2}, stamp{t0.Add(time.Millisecond), 0}, false},
		{"tie, higher region", stamp{t0, 2}, stamp{t0, 1}, true},
		{"tie, lower region", stamp{t0, 1}, stamp{t0, 2}, false},
		{"itself", stamp{t0, 1}, stamp{t0, 1}, false},
	}
	for _, s := range steps {
		if got := s.a.after(s.b); got != s.want {
			t.Errorf("%s: after = %v, want %v", s.name, got, s.want)
		}
	}
	a := json.RawMessage(`{"pk":{"S":"k"},"c":{"N":"1"},"m":{"M":{"x":{"N":"1"},"y":{"S":"z"}}}}`)
	b := json.RawMessage(`{"m":{"M":{"y":{"S":"z"},"x":{"N":"1"}}},"c":{"N":"1"},"pk":{"S":"k"}}`)
	c := json.RawMessage(`{"pk":{"S":"k"},"c":{"N":"2"},"m":{"M":{"x":{"N":"1"},"y":{"S":"z"}}}}`)
	if !sameImage(a, b) || sameImage(a, c) || sameImage(a, nil) || !sameImage(nil, nil) {
		t.Errorf("sameImage: reordered %v, changed %v, against none %v, none and none %v; want true, false, false, true",
			sameImage(a, b), sameImage(a, c), sameImage(a, nil), sameImage(nil, nil))
	}
	k1, err1 := keyID(attrs{"pk": json.RawMessage(`{"S":"a"}`), "sk": json.RawMessage(`{"N":"1"}`)})
	k2, err2 := keyID(attrs{"sk": json.RawMessage(`{"N":"1"}`), "pk": json.RawMessage(`{"S":"a"}`)})
	k3, _ := keyID(attrs{"pk": json.RawMessage(`{"S":"a"}`), "sk": json.RawMessage(`{"N":"2"}`)})
	if err1 != nil || err2 != nil || k1 != k2 || k1 == k3 {
		t.Errorf("keyID: %q, %q (%v, %v), other %q", k1, k2, err1, err2, k3)
	}
	if _, err := keyID(attrs{"pk": json.RawMessage(`"a"`)}); err == nil {
		t.Error("keyID took a key value without a type")
	}
}

// TestSharedRegionsStartFails: a shared harness whose start failed fails
// every test that asks for it (not only the first), and Close reports it.
func TestSharedRegionsStartFails(t *testing.T) {
	s := NewSharedRegions(RegionsConfig{Regions: 1})
	for i := range 2 {
		asker := &packageTB{} // a test's TB: records its failure
		done := make(chan struct{})
		go func() {
			defer close(done)
			if g := s.Get(asker); g != nil {
				t.Errorf("test %d: got a harness", i)
			}
		}()
		<-done
		if err := asker.err(); err == nil || !strings.Contains(err.Error(), "want 2 or more") {
			t.Errorf("test %d: failed with %v, want the start's error", i, err)
		}
	}
	if err := s.Close(); err == nil || !strings.Contains(err.Error(), "want 2 or more") {
		t.Errorf("Close: %v, want the start's error", err)
	}
}
