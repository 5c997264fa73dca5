package dynamo

import (
	"context"
	"sync"

	"github.com/sluicehq/sluice/limiter"
)

var _ limiter.Batcher = (*Store)(nil)

// DefaultMaxDetached is the default of Config.MaxDetached.
const DefaultMaxDetached = 64

// Do implements [limiter.Batcher]: the steps of a batch are sent at once,
// each as the request (or conditional-write loop) of its single-step method
// (Add, Sub, AddPacked, SubPacked, UpdateBucket, UpdateLog), one goroutine
// each, so a batch costs the latency of its slowest step, one round trip
// when nothing conflicts. Each step is exactly as atomic as its
// single-step method; the batch is not all-or-nothing (a denied batch is
// refunded by the caller).
//
// Refunds (window Subs and SubPackeds, bucket and log refund ops) are sent
// without waiting unless Config.WaitRefunds: Do returns at once for them,
// with a nil StepResult.Err, and the request runs detached from ctx's
// cancellation under a deadline of its own (Config.Timeout). At most
// Config.MaxDetached refunds are in flight per store; a refund over the
// bound is waited for. A later step of this store on the same key waits
// for the key's detached refunds first, so a process reads its own
// refunds. A detached refund that fails is lost: its units stay counted
// (never free), and are counted in Stats.LostRefunds.
func (s *Store) Do(ctx context.Context, steps []limiter.Step, out []limiter.StepResult) {
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	var wg sync.WaitGroup
	first := -1
	for i := range steps {
		st := &steps[i]
		if !s.cfg.WaitRefunds && isRefund(st) && s.detach(st) {
			out[i] = limiter.StepResult{}
			continue
		}
		if first < 0 {
			first = i // run on this goroutine, after starting the others
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = s.doStep(ctx, st)
		}()
	}
	if first >= 0 {
		out[first] = s.doStep(ctx, &steps[first])
	}
	wg.Wait()
}

// doStep runs one step with its single-step method, once the detached
// refunds on its key have landed.
func (s *Store) doStep(ctx context.Context, st *limiter.Step) limiter.StepResult {
	return limiter.DoStep(ctx, s, st)
}

// isRefund reports whether st only gives back what an earlier step took.
func isRefund(st *limiter.Step) bool {
	switch st.Kind {
	case limiter.StepSub, limiter.StepPackedSub:
		return true
	case limiter.StepBucket:
		return st.Bucket.Refund()
	case limiter.StepLog:
		return st.Log.Refund()
	}
	return false
}

// detach sends the refund st without waiting, and reports false (send it
// yourself) when MaxDetached refunds are already in flight.
func (s *Store) detach(st *limiter.Step) bool {
	step := *st
	timeout := s.cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return s.refunds.Go(itemKey(step.Key), timeout, func(ctx context.Context) error {
		return limiter.DoStep(context.WithValue(ctx, detachedRefund{}, true), s, &step).Err
	}, func() { s.counter.lostRefunds.Add(1) })
}

// detachedRefund marks the context of a refund sent without waiting: it
// does not wait for the refunds on its own key (itself among them).
type detachedRefund struct{}

// waitRefunds waits for the refunds sent without waiting on pk, so that a
// process reads its own refunds (Add, UpdateBucket, UpdateLog, whether
// called by Do or directly).
func (s *Store) waitRefunds(ctx context.Context, pk string) error {
	if ctx.Value(detachedRefund{}) != nil {
		return nil
	}
	if err := s.refunds.Wait(ctx, pk); err != nil {
		return mapError("waiting for a refund", err)
	}
	return nil
}

// WaitRefunds waits until every refund sent without waiting has landed (or
// failed), or ctx is done. A Lambda handler need not call it (see the
// package documentation); tests and a process about to exit may.
func (s *Store) WaitRefunds(ctx context.Context) error {
	return s.refunds.WaitAll(ctx)
}
