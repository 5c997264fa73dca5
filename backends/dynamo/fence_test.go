package dynamo_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestFence runs the fence conformance suite (limitertest.RunFence) on
// DynamoDB Local, through the batch path too, merged writes included.
func TestFence(t *testing.T) {
	s, _, _ := newStore(t, dynamo.Config{})
	limitertest.RunFence(t, s)
}

// TestFenceHistory: 16 goroutines add with the old fence, arrivals
// reordered, while the fence is raised; no add with the old fence lands
// after RaiseFence returned, and every add answered nil is counted.
func TestFenceHistory(t *testing.T) {
	s, r, _ := newStore(t, dynamo.Config{})
	seed, err := limitertest.HistorySeed()
	if err != nil {
		t.Fatal(err)
	}
	h, err := limitertest.RunFenceHistory(testCtx(t), s, limitertest.FenceHistoryOptions{Seed: seed, Duration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d: %+v; %d requests, %d conflicts", seed, h, r.load(), s.Stats().Conflicts)
	if err := h.Err(); err != nil {
		t.Error(err)
	}
}

// TestFenceHistoryFailsBroken: the same history on a store whose fenced
// adds have no condition on the fence (dynamo.BreakFence) fails.
func TestFenceHistoryFailsBroken(t *testing.T) {
	s, _, _ := newStore(t, dynamo.Config{})
	dynamo.BreakFence(s)
	h, err := limitertest.RunFenceHistory(testCtx(t), s, limitertest.FenceHistoryOptions{Seed: 1, Duration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Err()
	t.Logf("broken store: %+v: %v", h, err)
	if err == nil {
		t.Error("the history of a store that ignores the fence passed")
	}
}

// TestFenceWire measures at the cap proxy what a fenced add costs: as
// many requests and write units as an unfenced one (one UpdateItem, one
// unit, on a small item), and a refused one one request.
func TestFenceWire(t *testing.T) {
	proxy := testserver.DynamoDBCap(t)
	if proxy == nil {
		t.Skip("the cap proxy is off")
	}
	s, r, _ := newStore(t, dynamo.Config{})
	ctx := testCtx(t)
	const adds = 20
	name := "fence-wire-" + time.Now().Format("150405.000000")
	plain, fenced := storage.Key{Space: "fw-plain", Name: name + "-p"}, storage.Key{Space: "fw-fenced", Name: name + "-f"}
	if err := s.RaiseFence(ctx, fenced, 5, time.Minute); err != nil {
		t.Fatal(err)
	}
	raise := proxy.KeyStats(tableName, dynamo.ItemKey(fenced))
	cost := func(k storage.Key, fence int64) (testserver.CapCounts, int64) {
		before, req := proxy.KeyStats(tableName, dynamo.ItemKey(k)), r.load()
		for range adds {
			var out [1]storage.StepResult
			s.Do(ctx, []storage.Step{{Kind: storage.StepAdd, Key: k, Idx: 100, Span: 3, N: 1, TTL: time.Minute, Fence: fence}}, out[:])
			if err := out[0].Err; err != nil && !(fence < 5 && errors.Is(err, storage.ErrFenced)) {
				t.Fatal(err)
			}
		}
		after := proxy.KeyStats(tableName, dynamo.ItemKey(k))
		return testserver.CapCounts{Requests: after.Requests - before.Requests, WriteUnits: after.WriteUnits - before.WriteUnits}, r.load() - req
	}
	p, preq := cost(plain, 0)
	f, freq := cost(fenced, 5)
	x, xreq := cost(fenced, 4)
	t.Logf("%d adds: unfenced %d requests (%d sent) %.1f WCU; fenced %d (%d) %.1f WCU; refused %d (%d) %.1f WCU; the raise %d request %.1f WCU",
		adds, p.Requests, preq, p.WriteUnits, f.Requests, freq, f.WriteUnits, x.Requests, xreq, x.WriteUnits, raise.Requests, raise.WriteUnits)
	if f.Requests != adds || freq != adds || f.WriteUnits != p.WriteUnits || x.Requests != adds {
		t.Errorf("a fenced add costs more than an unfenced one, or a refused one more than one request")
	}
}

// TestFenceDecide: a window on DynamoDB decides a fenced item through the
// store's batch path: below the raised fence Decide returns ErrFenced and
// nothing is counted (Peek), at it the item is decided.
func TestFenceDecide(t *testing.T) {
	s, _, _ := newStore(t, dynamo.Config{})
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "fence", Limit: 100, Window: time.Minute, Representation: limiter.SubWindowCounters})
	if err != nil {
		t.Fatal(err)
	}
	ctx, key, now := testCtx(t), "fence-decide-"+time.Now().Format("150405.000000"), time.Now()
	decide := func(fence int64) error {
		var out [1]limiter.Outcome
		_, err := limiter.Decide(ctx, now, []limiter.Item{{Limit: w, Key: key, N: 10, Fence: fence}}, out[:])
		if err == nil && !out[0].Decision.Allowed {
			err = errors.New("denied")
		}
		return err
	}
	if err := decide(1); err != nil {
		t.Fatal(err)
	}
	if err := w.RaiseFence(ctx, key, 2); err != nil {
		t.Fatal(err)
	}
	if err := decide(1); !errors.Is(err, storage.ErrFenced) {
		t.Errorf("fence 1 after a raise to 2: %v, want ErrFenced", err)
	}
	if err := decide(2); err != nil {
		t.Errorf("fence 2: %v", err)
	}
	if d, err := w.Peek(ctx, key, now); err != nil || d.Remaining != 80 {
		t.Errorf("peek: %v remaining %d, want 80 (two takes of 10 counted, the fenced one not)", err, d.Remaining)
	}
}

// TestBucketFence runs the bucket fence conformance suite
// (limitertest.RunBucketFence) on DynamoDB Local: plain and lease takes
// (the lease ring's writes) fenced, reads, refunds and returns not,
// through the batch path and merged writes too.
func TestBucketFence(t *testing.T) {
	s, _, _ := newStore(t, dynamo.Config{})
	limitertest.RunBucketFence(t, s)
}

// TestBucketFenceHistory: 16 goroutines take from a bucket with the old
// fence (plain and lease takes), arrivals reordered, while the fence is
// raised; no take with the old fence lands after RaiseFence returned, and
// every token answered is taken from the bucket.
//
// With leases every write of the bucket is a lease ring's (bucketring.go)
// from the first lease take on; without, the plain writes (bucket.go).
func TestBucketFenceHistory(t *testing.T) {
	for _, noLeases := range []bool{false, true} {
		t.Run(map[bool]string{false: "leases", true: "plain"}[noLeases], func(t *testing.T) {
			s, r, _ := newStore(t, dynamo.Config{})
			seed, err := limitertest.HistorySeed()
			if err != nil {
				t.Fatal(err)
			}
			h, err := limitertest.RunBucketFenceHistory(testCtx(t), s, limitertest.FenceHistoryOptions{Seed: seed, Duration: 2 * time.Second, NoLeases: noLeases})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("seed %d: %+v; %d requests, %d conflicts", seed, h, r.load(), s.Stats().Conflicts)
			if err := h.Err(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestBucketFenceHistoryFailsBroken: the same history on a store whose
// fenced takes have no condition on the fence (dynamo.BreakFence) fails.
func TestBucketFenceHistoryFailsBroken(t *testing.T) {
	for _, noLeases := range []bool{false, true} {
		t.Run(map[bool]string{false: "leases", true: "plain"}[noLeases], func(t *testing.T) {
			s, _, _ := newStore(t, dynamo.Config{})
			dynamo.BreakFence(s)
			h, err := limitertest.RunBucketFenceHistory(testCtx(t), s, limitertest.FenceHistoryOptions{Seed: 1, Duration: 2 * time.Second, NoLeases: noLeases})
			if err != nil {
				t.Fatal(err)
			}
			err = h.Err()
			t.Logf("broken store: %+v: %v", h, err)
			if err == nil {
				t.Error("the history of a store that ignores the fence passed")
			}
		})
	}
}

// TestBucketFenceWire measures at the cap proxy what a fenced bucket take
// costs: as many requests and write units as an unfenced one, and a
// refused one one request.
func TestBucketFenceWire(t *testing.T) {
	proxy := testserver.DynamoDBCap(t)
	if proxy == nil {
		t.Skip("the cap proxy is off")
	}
	s, r, _ := newStore(t, dynamo.Config{})
	ctx := testCtx(t)
	const takes = 20
	name := "bucket-fence-wire-" + time.Now().Format("150405.000000")
	plain, fenced := storage.Key{Space: "bfw-plain", Name: name + "-p"}, storage.Key{Space: "bfw-fenced", Name: name + "-f"}
	if err := s.RaiseFence(ctx, fenced, 5, time.Minute); err != nil {
		t.Fatal(err)
	}
	raise := proxy.KeyStats(tableName, dynamo.ItemKey(fenced))
	now := time.Now().UnixNano()
	cost := func(k storage.Key, fence int64) (testserver.CapCounts, int64) {
		before, req := proxy.KeyStats(tableName, dynamo.ItemKey(k)), r.load()
		for range takes {
			var out [1]storage.StepResult
			op := storage.BucketOp{MaxAmount: 1000, RefillTime: time.Hour, RefillAmount: 1, Now: now, N: 1}
			s.Do(ctx, []storage.Step{{Kind: storage.StepBucket, Key: k, Bucket: op, TTL: time.Minute, Fence: fence}}, out[:])
			if err := out[0].Err; err != nil && !(fence < 5 && errors.Is(err, storage.ErrFenced)) {
				t.Fatal(err)
			}
		}
		after := proxy.KeyStats(tableName, dynamo.ItemKey(k))
		return testserver.CapCounts{Requests: after.Requests - before.Requests, WriteUnits: after.WriteUnits - before.WriteUnits}, r.load() - req
	}
	p, preq := cost(plain, 0)
	f, freq := cost(fenced, 5)
	x, xreq := cost(fenced, 4)
	t.Logf("%d takes: unfenced %d requests (%d sent) %.1f WCU; fenced %d (%d) %.1f WCU; refused %d (%d) %.1f WCU; the raise %d request %.1f WCU",
		takes, p.Requests, preq, p.WriteUnits, f.Requests, freq, f.WriteUnits, x.Requests, xreq, x.WriteUnits, raise.Requests, raise.WriteUnits)
	if f.Requests != p.Requests || freq != preq || f.WriteUnits != p.WriteUnits || x.Requests != takes {
		t.Errorf("a fenced take costs more than an unfenced one, or a refused one more than one request")
	}
}

// TestBucketFenceDecide: a bucket on DynamoDB decides a fenced
// item through the store's batch path: below the raised fence Decide
// returns ErrFenced and nothing is taken (Get), at it the item is decided.
func TestBucketFenceDecide(t *testing.T) {
	s, _, _ := newStore(t, dynamo.Config{})
	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "bfence", MaxAmount: 100, RefillTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, key, now := testCtx(t), "bucket-fence-decide-"+time.Now().Format("150405.000000"), time.Now()
	decide := func(fence int64) error {
		var out [1]limiter.Outcome
		_, err := limiter.Decide(ctx, now, []limiter.Item{{Limit: b, Key: key, N: 10, Fence: fence}}, out[:])
		if err == nil && !out[0].Decision.Allowed {
			err = errors.New("denied")
		}
		return err
	}
	if err := decide(1); err != nil {
		t.Fatal(err)
	}
	if err := b.RaiseFence(ctx, key, 2); err != nil {
		t.Fatal(err)
	}
	if err := decide(1); !errors.Is(err, storage.ErrFenced) {
		t.Errorf("fence 1 after a raise to 2: %v, want ErrFenced", err)
	}
	if err := decide(2); err != nil {
		t.Errorf("fence 2: %v", err)
	}
	if d, err := b.Get(ctx, key, now); err != nil || d.Remaining != 80 {
		t.Errorf("get: %v remaining %d, want 80 (two takes of 10, the fenced one not)", err, d.Remaining)
	}
}
