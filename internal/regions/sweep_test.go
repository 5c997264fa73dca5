package regions

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// gatedReads is a TableClient whose GetItems (the wants indexes' reads)
// each wait until want of them are in flight together, or their context
// ends; it answers every read with no item and every update with nothing.
type gatedReads struct {
	want int
	mu   sync.Mutex
	in   int
	peak int
	all  chan struct{} // closed when want reads were in flight at once
}

func (g *gatedReads) GetItem(ctx context.Context, _ *dynamodb.GetItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	g.mu.Lock()
	g.in++
	g.peak = max(g.peak, g.in)
	if g.in == g.want {
		close(g.all)
	}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.in--
		g.mu.Unlock()
	}()
	select {
	case <-g.all:
		return &dynamodb.GetItemOutput{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (g *gatedReads) UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return &dynamodb.UpdateItemOutput{}, nil
}

// TestSweepReadsAtOnce: a sweep's reads (the other two regions' wants
// indexes, and this region's own for its first prune) go out together,
// not one after another: under a decision's deadline an in-line sweep has
// half of it for each request, and reads made in turn spend it before any
// tick starts. The client holds each read until all three are in flight:
// reads made in turn would wait out their bound one by one and fail.
func TestSweepReadsAtOnce(t *testing.T) {
	g := &gatedReads{want: 3, all: make(chan struct{})}
	k, err := NewKeys(KeysConfig{Config: Config{Regions: 3, Limit: 300, Window: time.Second, SubWindows: 10},
		Table:  Table{Client: g, Table: "sluice", Region: 0, Deadline: 5 * time.Second},
		Prefix: "sweep:", Store: memStore(t), Holder: "r0"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := k.Sweep(t.Context(), time.Now())
	if err != nil {
		t.Fatalf("sweep: %v (%+v)", err, st)
	}
	g.mu.Lock()
	peak := g.peak
	g.mu.Unlock()
	if peak != 3 || st.IndexReads != 2 || st.IndexErrors != 0 || st.Prunes != 1 || st.PruneErrors != 0 {
		t.Fatalf("reads in flight at once %d (want 3); sweep %+v", peak, st)
	}
}
