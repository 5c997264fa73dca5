package limitertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

var _ storage.Fencer = (*DelayStore)(nil)

// AddFenced implements [storage.Fencer] as Add does, forwarding to the
// inner store (an error wrapping storage.ErrUnsupported when it is not a
// Fencer).
func (s *DelayStore) AddFenced(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration, fence int64) (storage.Counts, error) {
	f, ok := s.inner.(storage.Fencer)
	if !ok {
		return storage.Counts{}, fmt.Errorf("limitertest: %w: %T is not a storage.Fencer", storage.ErrUnsupported, s.inner)
	}
	if err := s.delay(ctx); err != nil {
		return storage.Counts{}, fmt.Errorf("limitertest: delay: %w", err)
	}
	if n > 0 {
		defer s.leave(s.arrive(ctx, k, cur, true, false, int64(span), 0, false))
	}
	return f.AddFenced(ctx, k, cur, span, n, ttl, fence)
}

// RaiseFence implements [storage.Fencer], forwarding to the inner store
// at once (it is the call a fence test times).
func (s *DelayStore) RaiseFence(ctx context.Context, k storage.Key, f int64, ttl time.Duration) error {
	fs, ok := s.inner.(storage.Fencer)
	if !ok {
		return fmt.Errorf("limitertest: %w: %T is not a storage.Fencer", storage.ErrUnsupported, s.inner)
	}
	return fs.RaiseFence(ctx, k, f, ttl)
}

var _ storage.BucketFencer = (*DelayStore)(nil)

// UpdateBucketFenced implements [storage.BucketFencer] as UpdateBucket
// does, forwarding to the inner store (an error wrapping
// storage.ErrUnsupported when it is not a BucketFencer).
func (s *DelayStore) UpdateBucketFenced(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration, fence int64) (storage.Decision, error) {
	f, ok := s.inner.(storage.BucketFencer)
	if !ok {
		return storage.Decision{}, fmt.Errorf("limitertest: %w: %T is not a storage.BucketFencer", storage.ErrUnsupported, s.inner)
	}
	if err := s.delay(ctx); err != nil {
		return storage.Decision{}, fmt.Errorf("limitertest: delay: %w", err)
	}
	defer s.leave(s.arrive(ctx, k, op.Now, false, false, 0, ttl/2, false))
	return f.UpdateBucketFenced(ctx, k, op, ttl, fence)
}

// fenceTTL is the TTL of the fence tests' counters and fences.
const fenceTTL = time.Minute

// fenceStep is one step of RunFence: a fenced add (n > 0), a read (n 0),
// a refund (sub) or a raise.
type fenceStep struct {
	what  string
	raise int64 // RaiseFence to raise (0: an add, read or sub)
	sub   int64 // Sub of sub units
	n     int64
	fence int64
	// fenced: the add is refused with ErrFenced; count is the key's count
	// after the step.
	fenced bool
	count  int64
}

var fenceSteps = []fenceStep{
	{what: "fenced add on a key without a fence", n: 1, fence: 7, count: 1},
	{what: "raise to 5", raise: 5, count: 1},
	{what: "add fenced below", n: 2, fence: 3, fenced: true, count: 1},
	{what: "add fenced at the fence", n: 2, fence: 5, count: 3},
	{what: "add fenced above", n: 1, fence: 6, count: 4},
	{what: "raise to 2 (lower: no change)", raise: 2, count: 4},
	{what: "add fenced below the unlowered fence", n: 1, fence: 4, fenced: true, count: 4},
	{what: "unfenced add", n: 1, count: 5},
	{what: "read fenced below (reads are not fenced)", fence: 1, count: 5},
	{what: "refund", sub: 2, count: 3},
	{what: "raise to 5 again (equal: no change)", raise: 5, count: 3},
	{what: "add fenced at the fence again", n: 1, fence: 5, count: 4},
	{what: "raise to 9", raise: 9, count: 4},
	{what: "add fenced at the old fence", n: 1, fence: 5, fenced: true, count: 4},
}

// RunFence is the conformance suite of a [storage.Fencer]: a fenced add
// below the key's fence adds nothing and answers ErrFenced, one at or
// above it adds, fence 0 always adds, RaiseFence never lowers, reads and
// refunds are never fenced. It runs the steps through AddFenced and
// through the store's batch path (storage.AsBatcher: Step.Fence), then a
// batch of a fenced and an unfenced add on one key name (a store that
// merges them into one write must refuse only the fenced one).
func RunFence(t *testing.T, s Store) {
	fs, ok := s.(storage.Fencer)
	if !ok {
		t.Fatalf("%T is not a storage.Fencer", s)
	}
	name := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	runFencePaths(t, "fence-conformance", name, "AddFenced", len(fenceSteps), func(k storage.Key, batch bool) func(i int) (string, error) {
		return func(i int) (string, error) { return fenceSteps[i].what, runFenceStep(s, fs, k, fenceSteps[i], batch) }
	})
	t.Run("merged", func(t *testing.T) { runFenceMerged(t, s, fs, name+"-merged") })
}

// runFencePaths runs a fence suite's n steps on a key of space of its
// own, once through the store's fenced method (a subtest of that name)
// and once through its batch path ("Do"): steps makes the path's
// runner of step i, which answers the step's name and its error.
func runFencePaths(t *testing.T, space, name, method string, n int, steps func(k storage.Key, batch bool) func(i int) (string, error)) {
	for _, path := range []string{method, "Do"} {
		t.Run(path, func(t *testing.T) {
			step := steps(storage.Key{Space: space, Name: name + "-" + path}, path == "Do")
			for i := range n {
				if what, err := step(i); err != nil {
					t.Errorf("%s: %v", what, err)
				}
			}
		})
	}
}

// checkFenced reports a fenced op's answer err that the step does not
// expect: not ErrFenced when fenced (or ErrFenced as a conflict or an
// outage), an error when not.
func checkFenced(fenced bool, err error) error {
	switch {
	case fenced && !errors.Is(err, storage.ErrFenced):
		return fmt.Errorf("got %v, want an error wrapping ErrFenced", err)
	case fenced && (errors.Is(err, storage.ErrConflict) || errors.Is(err, storage.ErrUnavailable)):
		return fmt.Errorf("got %v: a fence is neither a conflict nor an outage", err)
	case !fenced && err != nil:
		return err
	}
	return nil
}

// raiseMergedFences makes the keys of a merged batch on one key name
// (spaces prefix-a, -b, -c) and raises the fences of the first two to 4.
func raiseMergedFences(ctx context.Context, t *testing.T, fs storage.Fencer, prefix, name string) []storage.Key {
	t.Helper()
	keys := []storage.Key{{Space: prefix + "-a", Name: name}, {Space: prefix + "-b", Name: name}, {Space: prefix + "-c", Name: name}}
	for _, k := range keys[:2] {
		if err := fs.RaiseFence(ctx, k, 4, fenceTTL); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

const fenceCur, fenceSpan = 1000, 3

func runFenceStep(s Store, fs storage.Fencer, k storage.Key, st fenceStep, batch bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var err error
	switch {
	case st.raise > 0:
		err = fs.RaiseFence(ctx, k, st.raise, fenceTTL)
	case st.sub > 0:
		err = s.Sub(ctx, k, fenceCur, st.sub)
	case batch:
		var out [1]storage.StepResult
		storage.AsBatcher(s).Do(ctx, []storage.Step{{Kind: storage.StepAdd, Key: k, Idx: fenceCur, Span: fenceSpan, N: st.n, TTL: fenceTTL, Fence: st.fence}}, out[:])
		err = out[0].Err
	default:
		_, err = fs.AddFenced(ctx, k, fenceCur, fenceSpan, st.n, fenceTTL, st.fence)
	}
	if err := checkFenced(st.fenced, err); err != nil {
		return err
	}
	c, err := s.Add(ctx, k, fenceCur, fenceSpan, 0, fenceTTL)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if c.C[0] != st.count {
		return fmt.Errorf("count %d after the step, want %d", c.C[0], st.count)
	}
	return nil
}

// runFenceMerged sends, in one batch, adds of three limits on one key
// name: one fenced below its key's fence, one fenced at it, one unfenced.
func runFenceMerged(t *testing.T, s Store, fs storage.Fencer, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	keys := raiseMergedFences(ctx, t, fs, "fence-merged", name)
	fences, want := []int64{3, 4, 0}, []int64{0, 1, 1}
	steps := make([]storage.Step, len(keys))
	for i, k := range keys {
		steps[i] = storage.Step{Kind: storage.StepAdd, Key: k, Idx: fenceCur, Span: fenceSpan, N: 1, TTL: fenceTTL, Fence: fences[i]}
	}
	out := make([]storage.StepResult, len(steps))
	storage.AsBatcher(s).Do(ctx, steps, out)
	for i, k := range keys {
		if fenced := errors.Is(out[i].Err, storage.ErrFenced); fenced != (want[i] == 0) || !fenced && out[i].Err != nil {
			t.Errorf("%s fenced at %d: %v", k.Space, fences[i], out[i].Err)
		}
		c, err := s.Add(ctx, k, fenceCur, fenceSpan, 0, fenceTTL)
		if err != nil {
			t.Fatal(err)
		}
		if c.C[0] != want[i] {
			t.Errorf("%s fenced at %d: count %d, want %d", k.Space, fences[i], c.C[0], want[i])
		}
	}
}
