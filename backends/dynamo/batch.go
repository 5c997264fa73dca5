package dynamo

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

var _ storage.Batcher = (*Store)(nil)

// DefaultMaxDetached is the default of Config.MaxDetached.
const DefaultMaxDetached = 64

// Do implements [storage.Batcher]: the steps of a batch on the same key
// name (storage.Key.Name) go to their one item in ONE conditional
// UpdateItem whose expression is the union of what each step's
// single-step method sends (Add, Sub, AddPacked, SubPacked, UpdateBucket,
// UpdateLog), the conditions ANDed, retried in the store's
// conditional-write loop from the item a failed condition returns. Items
// are written in parallel, one goroutine each, so a batch costs one round
// trip of latency and one write per key name when nothing conflicts. Each
// step is exactly as atomic as its single-step method (and the steps on
// one item together); the batch is not all-or-nothing across items. When a
// take that is not Shadow is denied on the store's state (a bucket or a
// log), the takes on the same item that were not written yet are not
// sent: StepResult.NotApplied. Two steps of the same limit and key go in
// separate writes. Reads (a window Add of 0, a packed op that adds
// nothing) are single requests.
//
// Refunds (window Subs and SubPackeds, bucket and log refund ops) are sent
// without waiting unless Config.WaitRefunds or Step.Sync (a Sync step goes
// by its single-step method), merged per item the same way:
// Do returns at once for them, with a nil StepResult.Err, and the request
// runs detached from ctx's cancellation under a deadline of its own
// (Config.Timeout). At most Config.MaxDetached refund writes are in flight
// per store; one over the bound is waited for. A later step of this store
// on the same key name waits for the key's detached refunds first, so a
// process reads its own refunds. A detached refund that fails is lost: its
// units stay counted (never free), and are counted in Stats.LostRefunds.
func (s *Store) Do(ctx context.Context, steps []storage.Step, out []storage.StepResult) {
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	var (
		groups   []*itemGroup
		detached []*itemGroup
		single   []int
	)
	for i := range steps {
		st := &steps[i]
		out[i] = storage.StepResult{}
		if st.Sync {
			single = append(single, i) // a public Refund's: its single-step method, which waits
			continue
		}
		a, err := s.attrsOf(st.Key)
		if err != nil {
			out[i].Err = err
			continue
		}
		p, err := s.stepPart(a, st)
		switch {
		case err != nil:
			out[i].Err = err
			continue
		case p == nil && st.Kind == storage.StepSub:
			continue // a refund of nothing
		case p == nil:
			single = append(single, i)
			continue
		}
		list := &groups
		if !s.cfg.WaitRefunds && isRefund(st) {
			list = &detached
		}
		*list = addToGroup(*list, a, i, p)
	}
	for _, g := range detached {
		if !s.detach(g) {
			groups = append(groups, g) // over the bound: waited for
		}
	}
	var wg sync.WaitGroup
	for _, i := range single {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = storage.DoStep(ctx, s, &steps[i])
		}()
	}
	for j, g := range groups {
		if j == len(groups)-1 {
			g.run(ctx, s, out)
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.run(ctx, s, out)
		}()
	}
	wg.Wait()
}

// itemGroup is the steps of a batch written to one item in one write.
type itemGroup struct {
	pk    string
	pres  []string // the attribute prefixes: one step per limit
	idx   []int    // the steps' indices in the batch
	parts []part
}

// addToGroup adds step i (part p, attributes a) to the first group of its
// item that has no step of the same limit.
func addToGroup(gs []*itemGroup, a attrs, i int, p part) []*itemGroup {
	for _, g := range gs {
		if g.pk == a.pk && !slices.Contains(g.pres, a.pre) {
			g.pres, g.idx, g.parts = append(g.pres, a.pre), append(g.idx, i), append(g.parts, p)
			return gs
		}
	}
	return append(gs, &itemGroup{pk: a.pk, pres: []string{a.pre}, idx: []int{i}, parts: []part{p}})
}

// run writes the group (after the detached refunds on its item) and puts
// each step's answer in out.
func (g *itemGroup) run(ctx context.Context, s *Store, out []storage.StepResult) {
	errs := make([]error, len(g.parts))
	if err := s.waitRefunds(ctx, g.pk); err != nil {
		for j := range errs {
			errs[j] = err
		}
	} else {
		if len(g.parts) > 1 {
			for _, p := range g.parts {
				if b, ok := p.(*bucketPart); ok {
					b.merged = true
				}
			}
		}
		s.writeItem(ctx, g.pk, g.parts, errs)
	}
	for j, i := range g.idx {
		if errs[j] != nil {
			out[i] = storage.StepResult{Err: errs[j]}
			continue
		}
		out[i] = g.parts[j].result()
	}
}

// stepPart returns the part of st on its item (a), nil for a step that is
// not a write (a read, sent on its own; or a Sub of nothing), or the error
// its single-step method would return for a bad op.
func (s *Store) stepPart(a attrs, st *storage.Step) (part, error) {
	switch st.Kind {
	case storage.StepAdd:
		if st.Span < 1 || st.Span > storage.MaxSpan || st.N < 0 {
			return nil, fmt.Errorf("dynamo: bad window add (span %d, n %d)", st.Span, st.N)
		}
		if st.N == 0 {
			return nil, nil
		}
		return &windowAdd{s: s, a: a, cur: st.Idx, span: st.Span, n: st.N, ttl: st.TTL, fence: st.Fence, shadow: st.Shadow}, nil
	case storage.StepSub:
		if st.N < 0 {
			return nil, fmt.Errorf("dynamo: bad window sub (n %d)", st.N)
		}
		if st.N == 0 {
			return nil, nil
		}
		return &windowSub{a: a, name: a.pre + slotName(st.Idx), n: st.N, take: st.N}, nil
	case storage.StepBucket:
		if err := validBucket(st.Bucket); err != nil {
			return nil, err
		}
		p := s.newBucketPart(a, st.Bucket, st.TTL)
		p.shadow = st.Shadow
		p.fenceAt(st.Fence)
		return p, nil
	case storage.StepLog:
		if err := validLog(st.Log); err != nil {
			return nil, err
		}
		p := s.newLogPart(a, st.Log, st.TTL)
		p.shadow = st.Shadow
		return p, nil
	case storage.StepPackedAdd:
		if err := validPacked(&st.Packed); err != nil {
			return nil, err
		}
		if !packedAdds(&st.Packed) {
			return nil, nil
		}
		return &packedAdd{s: s, a: a, op: &st.Packed, shadow: st.Shadow}, nil
	case storage.StepPackedSub:
		if err := validPacked(&st.Packed); err != nil {
			return nil, err
		}
		return newPackedSub(a, &st.Packed, math.MinInt64), nil
	}
	return nil, fmt.Errorf("%w: dynamo: unknown step kind %s", limiter.ErrInvalidConfig, st.Kind)
}

// isRefund reports whether st only gives back what an earlier step took.
func isRefund(st *storage.Step) bool {
	switch st.Kind {
	case storage.StepSub, storage.StepPackedSub:
		return true
	case storage.StepBucket:
		return st.Bucket.Refund()
	case storage.StepLog:
		return st.Log.Refund()
	}
	return false
}

// detach writes the refunds of g without waiting, and reports false
// (write them yourself) when MaxDetached refund writes are already in
// flight. Each refund whose write fails is counted in Stats.LostRefunds.
func (s *Store) detach(g *itemGroup) bool {
	timeout := s.cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return s.refunds.Go(g.pk, timeout, func(ctx context.Context) error {
		errs := make([]error, len(g.parts))
		s.writeItem(context.WithValue(ctx, detachedRefund{}, true), g.pk, g.parts, errs)
		for _, err := range errs {
			if err != nil {
				s.counter.lostRefunds.Add(1)
			}
		}
		return nil
	}, nil)
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
