package limitertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// CompanionStore wraps a batching store so that every batch it is given
// reaches the inner store with a companion step before each of its steps:
// a window's add of 1 unit on a key of its own, whose reads (three
// sub-windows and the two ahead of it) share the batch with the step's.
// A history run on it (RunHistory wraps it in a DelayStore, which hands
// each call to Do as a batch of one) then checks, under concurrency and
// reordered arrivals, what a store does with several steps in one batch:
// memcached's single read of every step's keys, handed back item by item
// (DynamoDB sends a batch's steps as independent requests; the memory
// store does not batch).
// The companions' answers are dropped, and their counters are never
// refunded (they belong to no limit).
type CompanionStore struct {
	Store
	b storage.Batcher
}

// NewCompanionStore wraps s, which must implement storage.Batcher.
func NewCompanionStore(s Store) (*CompanionStore, error) {
	b, ok := s.(storage.Batcher)
	if !ok {
		return nil, fmt.Errorf("limitertest: %T does not implement storage.Batcher", s)
	}
	return &CompanionStore{Store: s, b: b}, nil
}

// companionSpan is the companion window's view: its sub-window and two
// older ones, and two newer ones read as Later.
const companionSpan = 3

// Do implements [storage.Batcher].
func (c *CompanionStore) Do(ctx context.Context, steps []storage.Step, out []storage.StepResult) {
	all := make([]storage.Step, 0, 2*len(steps))
	idx := time.Now().UnixNano() / int64(time.Second)
	for _, st := range steps {
		all = append(all, storage.Step{
			Kind: storage.StepAdd,
			Key:  storage.Key{Space: "companion", Name: st.Key.Space + "/" + st.Key.Name},
			Idx:  idx, Span: companionSpan, N: 1, TTL: time.Minute,
		}, st)
	}
	res := make([]storage.StepResult, len(all))
	c.b.Do(ctx, all, res)
	for i := range steps {
		out[i] = res[2*i+1]
	}
}

// ServesPacked reports whether the inner store serves packed windows.
func (c *CompanionStore) ServesPacked() bool { return storage.ServesPacked(c.Store) }

// AddPacked forwards to the inner store (an error if it does not serve
// packed windows).
func (c *CompanionStore) AddPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) (storage.PackedCounts, error) {
	p, ok := c.Store.(storage.PackedCounter)
	if !ok {
		return storage.PackedCounts{}, fmt.Errorf("limitertest: %T does not implement storage.PackedCounter", c.Store)
	}
	return p.AddPacked(ctx, k, op)
}

// SubPacked forwards to the inner store.
func (c *CompanionStore) SubPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) error {
	p, ok := c.Store.(storage.PackedCounter)
	if !ok {
		return fmt.Errorf("limitertest: %T does not implement storage.PackedCounter", c.Store)
	}
	return p.SubPacked(ctx, k, op)
}

// RunHistoryBatched runs RunHistory on NewCompanionStore(s) (s must batch)
// for the sliding window (20 sub-windows), the packed window (when s serves
// it) and the token bucket, 2 s each on the shared clock.
func RunHistoryBatched(t *testing.T, s Store) {
	t.Helper()
	cs, err := NewCompanionStore(s)
	if err != nil {
		t.Fatal(err)
	}
	scs := DefaultScenarios()
	if storage.ServesPacked(s) {
		scs = append(scs, PackedScenario())
	}
	var run []Scenario
	for _, sc := range scs {
		if sc.Name == "SlidingWindow" || sc.Name == "SlidingWindowPacked" || sc.Name == "TokenBucket" {
			sc.Duration = min(sc.Duration, 2*time.Second)
			run = append(run, sc)
		}
	}
	RunHistory(t, cs, HistoryOptions{Scenarios: run, Clocks: []Clock{SharedClock}})
}
