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
// (Add, Sub, UpdateBucket, UpdateLog), one goroutine each, so a batch costs
// the latency of its slowest step, one round trip when nothing conflicts.
// Each step is exactly as atomic as its single-step method; the batch is
// not all-or-nothing (a denied batch is refunded by the caller).
//
// Refunds (window Subs, bucket and log refund ops) are sent without waiting
// unless Config.WaitRefunds: Do returns at once for them, with a nil
// StepResult.Err, and the request runs detached from ctx's cancellation
// under a deadline of its own (Config.Timeout). At most Config.MaxDetached
// refunds are in flight per store; a refund over the bound is waited for. A
// later step of this store on the same key waits for the key's detached
// refunds first, so a process reads its own refunds. A detached refund that
// fails is lost: its units stay counted (never free), and are counted in
// Stats.LostRefunds.
func (s *Store) Do(ctx context.Context, steps []limiter.Step, out []limiter.StepResult) {
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	var wg sync.WaitGroup
	first := -1
	for i := range steps {
		st := &steps[i]
		if !s.cfg.WaitRefunds && isRefund(st) && s.detach(ctx, st) {
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
	if !isRefund(st) {
		if err := s.refunds.wait(ctx, itemKey(st.Key)); err != nil {
			return limiter.StepResult{Err: mapError(st.Kind.String()+" waiting for a refund", err)}
		}
	}
	return limiter.DoStep(ctx, s, st)
}

// isRefund reports whether st only gives back what an earlier step took.
func isRefund(st *limiter.Step) bool {
	switch st.Kind {
	case limiter.StepSub:
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
func (s *Store) detach(ctx context.Context, st *limiter.Step) bool {
	select {
	case s.detached <- struct{}{}:
	default:
		return false
	}
	step := *st
	pk := itemKey(step.Key)
	s.refunds.add(pk)
	timeout := s.cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	// Nothing of the caller's context applies: the request outlives the
	// call (its deadline, cancellation and values, such as a trace that
	// the caller reads once the call returns).
	dctx, cancel := context.WithTimeout(context.Background(), timeout)
	go func() {
		defer func() {
			cancel()
			s.refunds.done(pk)
			<-s.detached
		}()
		if r := limiter.DoStep(dctx, s, &step); r.Err != nil {
			s.counter.lostRefunds.Add(1)
		}
	}()
	return true
}

// WaitRefunds waits until every refund sent without waiting has landed (or
// failed), or ctx is done. A Lambda handler need not call it (see the
// package documentation); tests and a process about to exit may.
func (s *Store) WaitRefunds(ctx context.Context) error {
	return s.refunds.waitAll(ctx)
}

// pendingRefunds tracks the detached refunds per partition key.
type pendingRefunds struct {
	mu   sync.Mutex
	keys map[string]*pendingKey
	all  int
	idle chan struct{} // closed when all drops to 0; nil when all == 0
}

type pendingKey struct {
	n    int
	done chan struct{} // closed when n drops to 0
}

func (p *pendingRefunds) add(pk string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keys == nil {
		p.keys = map[string]*pendingKey{}
	}
	k := p.keys[pk]
	if k == nil {
		k = &pendingKey{done: make(chan struct{})}
		p.keys[pk] = k
	}
	k.n++
	if p.all == 0 {
		p.idle = make(chan struct{})
	}
	p.all++
}

func (p *pendingRefunds) done(pk string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k := p.keys[pk]; k != nil {
		if k.n--; k.n == 0 {
			close(k.done)
			delete(p.keys, pk)
		}
	}
	if p.all--; p.all == 0 {
		close(p.idle)
		p.idle = nil
	}
}

// wait waits for the detached refunds on pk, if any.
func (p *pendingRefunds) wait(ctx context.Context, pk string) error {
	p.mu.Lock()
	var ch chan struct{}
	if k := p.keys[pk]; k != nil {
		ch = k.done
	}
	p.mu.Unlock()
	return waitChan(ctx, ch)
}

func (p *pendingRefunds) waitAll(ctx context.Context) error {
	p.mu.Lock()
	ch := p.idle
	p.mu.Unlock()
	return waitChan(ctx, ch)
}

func waitChan(ctx context.Context, ch chan struct{}) error {
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
