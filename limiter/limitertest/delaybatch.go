package limitertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

var _ storage.Batcher = (*DelayStore)(nil)

// Do implements [storage.Batcher], so that a history on a batching store
// goes through the store's batch path: each step is held back on its own
// random delay, as a single-step call is, then handed to the inner store's
// Do as a batch of one (to its single-step method when the inner store does
// not batch), the steps of a batch concurrently. The delays are drawn before
// the steps start, on the caller's goroutine (see [WithDelayRand]).
func (s *DelayStore) Do(ctx context.Context, steps []storage.Step, out []storage.StepResult) {
	if s.whole && len(steps) > 1 {
		s.doWhole(ctx, steps, out)
		return
	}
	if len(steps) == 1 {
		out[0] = s.doStep(ctx, &steps[0], s.draw(ctx))
		return
	}
	delays := make([]time.Duration, len(steps))
	for i := range delays {
		delays[i] = s.draw(ctx)
	}
	var wg sync.WaitGroup
	for i := 1; i < len(steps); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = s.doStep(ctx, &steps[i], delays[i])
		}()
	}
	out[0] = s.doStep(ctx, &steps[0], delays[0])
	wg.Wait()
}

// draw draws one call's delay as delay does: zero for half of the calls,
// else uniform below the maximum.
func (s *DelayStore) draw(ctx context.Context) time.Duration {
	if s.maxDelay <= 0 {
		return 0
	}
	pick := func(r *rand.Rand) time.Duration {
		if r.IntN(2) == 0 {
			return time.Duration(r.Int64N(int64(s.maxDelay)))
		}
		return 0
	}
	if r, ok := ctx.Value(delayRandKey{}).(*rand.Rand); ok {
		return pick(r)
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return pick(s.rnd)
}

// doStep holds st back for d, then hands it to the inner store with the
// arrival bookkeeping of its single-step method.
func (s *DelayStore) doStep(ctx context.Context, st *storage.Step, d time.Duration) storage.StepResult {
	if err := sleepCtx(ctx, d); err != nil {
		return storage.StepResult{Err: fmt.Errorf("limitertest: delay: %w", err)}
	}
	c, ok := s.arriveStep(ctx, st)
	if ok {
		defer s.leave(c)
	}
	return s.forward(ctx, st)
}

// arriveStep does the arrival bookkeeping of st's single-step method, and
// reports false for a step that has none (a read).
func (s *DelayStore) arriveStep(ctx context.Context, st *storage.Step) (storeCall, bool) {
	switch st.Kind {
	case storage.StepAdd:
		if st.N == 0 {
			return storeCall{}, false
		}
		return s.arrive(ctx, st.Key, st.Idx, true, false, int64(st.Span), 0, false), true
	case storage.StepSub:
		return s.arrive(ctx, st.Key, st.Idx, true, true, 0, 0, false), true
	case storage.StepBucket:
		return s.arrive(ctx, st.Key, st.Bucket.Now, false, false, 0, st.TTL/2, false), true
	case storage.StepLog:
		return s.arrive(ctx, st.Key, st.Log.Now, false, false, int64(st.Log.Window), 0, false), true
	case storage.StepPackedAdd:
		return s.arrive(ctx, st.Key, st.Packed.Slot, true, false, (st.Packed.Keep+1)/2, 0, true), true
	case storage.StepPackedSub:
		return s.arrive(ctx, st.Key, st.Packed.Slot, true, true, 0, 0, true), true
	}
	return storeCall{}, false
}

// doWhole holds the whole batch back on one delay and hands it to the
// inner store's Do as it is (see [DelayStore.MergeBatches]).
func (s *DelayStore) doWhole(ctx context.Context, steps []storage.Step, out []storage.StepResult) {
	if err := sleepCtx(ctx, s.draw(ctx)); err != nil {
		for i := range steps {
			out[i] = storage.StepResult{Err: fmt.Errorf("limitertest: delay: %w", err)}
		}
		return
	}
	calls := make([]storeCall, 0, len(steps))
	for i := range steps {
		if c, ok := s.arriveStep(ctx, &steps[i]); ok {
			calls = append(calls, c)
		}
	}
	if b, ok := s.inner.(storage.Batcher); ok {
		b.Do(ctx, steps, out)
	} else {
		for i := range steps {
			out[i] = storage.DoStep(ctx, s.inner, &steps[i])
		}
	}
	for _, c := range calls {
		s.leave(c)
	}
}

// MergeBatches makes Do hold back each batch of several steps on one delay
// and hand it to the inner store whole, as one arrival: a store that
// merges the steps on one key into one write (DynamoDB) is then checked on
// its merged writes. By default each step is delayed on its own.
func (s *DelayStore) MergeBatches() { s.whole = true }

// forward hands st to the inner store: to its Do as a batch of one, or to
// its single-step method when it does not batch.
func (s *DelayStore) forward(ctx context.Context, st *storage.Step) storage.StepResult {
	b, ok := s.inner.(storage.Batcher)
	if !ok {
		return storage.DoStep(ctx, s.inner, st)
	}
	var out [1]storage.StepResult
	b.Do(ctx, []storage.Step{*st}, out[:])
	return out[0]
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
