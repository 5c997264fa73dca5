package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// Item is one limit's part in a [Decide] batch.
type Item struct {
	// Limit is the limit to check. The package's limiters (*SlidingWindow,
	// *FixedWindow, *TokenBucket, *SlidingLog) are batched with the other
	// items on the same store; any other Limiter is asked with AllowN, in
	// parallel with the batch.
	Limit Limiter
	// Key is the caller's key.
	Key string
	// N is the cost (units).
	N int64
	// Shadow items are decided, counted and refunded like the others, but
	// their denial does not deny the batch, and they never decide it.
	Shadow bool
	// Fail is the decision to use when the store fails for this item (a
	// rule's fail mode): the failure is then reported in Outcome.Err and
	// Outcome.Failed and the batch goes on. With Fail nil a store failure
	// fails the whole batch: Decide refunds what was taken and returns the
	// error. A store that throttled the item's key (ErrThrottled) has not
	// failed: the item is denied, see Outcome.Throttled.
	Fail *Decision
	// Cap, if positive, lowers the limit for this decision alone: a
	// *SlidingWindow with sub-window counters judges it, lease takes
	// included, against min(Cap, Limit) on the same counters; any other
	// limit refuses it (ErrInvalidConfig). See cap.go.
	Cap int64
	// Fence, if positive, fences the item's take (lease takes included):
	// the store counts it only if the key's fence (SlidingWindow.RaiseFence,
	// TokenBucket.RaiseFence) is at most Fence. Refused, nothing is taken
	// and Decide returns an error wrapping storage.ErrFenced whatever Fail
	// says: the caller decided on an older state and must read it again.
	// It needs a *SlidingWindow with sub-window counters on a store
	// implementing storage.Fencer, or a *TokenBucket on one implementing
	// storage.BucketFencer too (else ErrInvalidConfig). See fence.go.
	Fence int64
}

// Outcome is what became of one [Item].
type Outcome struct {
	// Decision is the item's decision (zero when Skipped).
	Decision Decision
	// Err is the store's error (Failed reports whether Fail decided), or an
	// error wrapping ErrRefund when giving back failed (the decision stands).
	Err error
	// Failed reports that the store failed and the item's Fail decided.
	Failed bool
	// Cached reports a denial from the deny cache: no store request was
	// made for the batch.
	Cached bool
	// Skipped reports an item not checked because a denial decided the
	// batch: a cached one, or one the store made on the item's own key
	// before performing this item's step (StepResult.NotApplied).
	Skipped bool
	// Refunded reports that what the item took was given back because the
	// batch was denied.
	Refunded bool
	// Leased reports that the item was answered from a capacity lease
	// this process holds (see the limiters' Leases): no store request was
	// made for it.
	Leased bool
	// Throttled reports that the store refused the item's key for capacity
	// (an error wrapping ErrThrottled, kept in Err), or that the key was so
	// contended that its writes lost every race within their retries
	// (ErrConflict): the item is denied with RetryAfter
	// ThrottledRetryAfter, whatever its Fail, since its units were not
	// counted. It is not Failed.
	Throttled bool
}

// stepper is implemented by the package's limiters: how they turn a call
// into a Step and a Step's answer into a decision.
type stepper interface {
	// plan returns the step of taking n units for key at now, and the
	// store to send it to.
	plan(key string, now time.Time, n int64) (storage.Step, storage.Batcher, error)
	// refund returns the step of giving back n units taken for key at
	// now by an allowed take (the public Refund), and the store.
	refund(key string, now time.Time, n int64) (storage.Step, storage.Batcher, error)
	// storeErr wraps a store's error with the limit's kind and name.
	storeErr(err error) error
	// judge turns the answer into a decision. undo is the step that gives
	// back what was taken (Kind 0: nothing). When the item was denied,
	// undoNow reports that undo must be sent anyway (a window refunding its
	// own denied take); otherwise undo is sent only if the batch is denied.
	// t is now in Unix nanoseconds, n the item's cost (a window's step
	// that takes more is a lease take: see leaseNeed).
	judge(st *storage.Step, r *storage.StepResult, t, n int64) (d Decision, undo storage.Step, undoNow bool, err error)
	// denyCache returns the limit's deny cache, nil for none.
	denyCache() *denyCache
}

// Decide checks every item at now, as one batch: the steps bound for the
// same store go in one [storage.Batcher.Do] (a store without one gets the
// plain loop, [storage.Steps]), stores in parallel. It is the one place that
// refunds and picks the deciding item:
//
//   - The batch is denied when an item that is not Shadow is denied (by the
//     store, by its Fail decision, by the deny cache, or because the store
//     throttled its key: Outcome.Throttled). Every item that
//     took units then gives them back, in one more batch per store.
//   - The decider is the first denied item that is not Shadow; when none is
//     denied, the allowing item with the least Remaining (the longer
//     ResetAfter on a tie), preferring items whose store answered over
//     Failed ones. It is -1 when no item is enforcing.
//   - Before any store request, each enforcing item's deny cache is asked:
//     a key its store denied at or before now, with a RetryAfter not yet
//     passed, denies the whole batch at once (Outcome.Cached; the others
//     Skipped). Denials are then remembered.
//
// out must hold len(items) outcomes. err is non-nil only when an item
// without Fail failed: everything taken was then given back and err wraps
// the store's error.
func Decide(ctx context.Context, now time.Time, items []Item, out []Outcome) (int, error) {
	out = out[:len(items)]
	clear(out)
	if len(items) == 0 {
		return -1, nil
	}
	t, terr := unixNano("", now) // on error, plan reports it per item
	// Capacity leases first: an item a live lease covers is decided here.
	var lr leaseRound
	leasing := terr == nil && lr.spendLeases(items, out, t)
	if leasing {
		defer lr.sendReturns(ctx)
	}
	if terr == nil {
		if i := cachedDenial(items, out, t, &lr); i >= 0 {
			return i, nil
		}
	}

	b := newBatch(len(items))
	defer b.release()
	planAll(b, items, now, t, &lr, leasing)
	lr.sending()
	run(ctx, now, b)
	lr.answered()
	denied, failErr := judgeAll(b, items, out, t)
	if leasing {
		lr.settle(items, out, b.es, t, denied || failErr != nil)
		if denied || failErr != nil {
			lr.unspendAll(items, out)
		}
	}
	if terr == nil {
		rememberDenials(b, items, out, t)
	}
	giveBackTakes(ctx, now, b, items, out, denied || failErr != nil)
	if failErr != nil {
		return -1, failErr
	}
	return decider(items, out), nil
}

// cachedDenial answers the batch from the deny cache: the index of the
// first enforcing item whose key a denial still covers (the others
// Skipped, what leases spent put back), or -1.
func cachedDenial(items []Item, out []Outcome, t int64, lr *leaseRound) int {
	for i, it := range items {
		s, ok := it.Limit.(stepper)
		if !ok || it.Shadow || lr.spent(i) {
			continue
		}
		if d, hit := s.denyCache().denied(it.Key, t, it.N); hit && !capRaised(s, &it, d) {
			lr.unspendAll(items, out)
			for j := range out {
				out[j] = Outcome{Skipped: true}
			}
			out[i] = Outcome{Decision: d, Cached: true}
			return i
		}
	}
	return -1
}

// planAll makes every item's step (a lease take for a hot key when
// leasing), or its error; an item answered from a lease has none.
func planAll(b batch, items []Item, now time.Time, t int64, lr *leaseRound, leasing bool) {
	for i, it := range items {
		e := &b.es[i]
		e.item, e.it = i, it
		s, ok := it.Limit.(stepper)
		if !ok {
			if it.Limit == nil {
				e.err = fmt.Errorf("%w: batch item %d has no limit", ErrInvalidConfig, i)
			}
			continue
		}
		e.s = s
		if e.leased = lr.spent(i); e.leased {
			continue
		}
		e.gen = s.denyCache().generation()
		b.steps[i], e.store, e.err = s.plan(it.Key, now, it.N)
		b.steps[i].Shadow = it.Shadow
		if leasing && e.err == nil {
			lr.planTake(i, &items[i], &b.steps[i], t)
		}
		if e.err == nil && it.Cap != 0 {
			e.err = capCheck(s, it.Cap)
		}
		if e.err == nil && it.Fence != 0 {
			e.err = fenceCheck(s, it.Fence)
			fenceStep(&b.steps[i], it.Fence)
		}
	}
}

// judgeAll turns the answers into outcomes: it reports whether an
// enforcing item was denied, and the first error of an item without a
// Fail decision (the batch then fails).
func judgeAll(b batch, items []Item, out []Outcome, t int64) (denied bool, failErr error) {
	for i := range b.es {
		e := &b.es[i]
		it, o := &items[i], &out[i]
		if e.leased {
			continue
		}
		err := e.err
		if err == nil && e.s != nil && b.res[i].NotApplied && !it.Shadow {
			o.Skipped = true // another item's denial decided: nothing taken
			continue
		}
		if err == nil {
			if e.s != nil {
				c := capCounts(e.s, it.Cap, &b.res[i])
				o.Decision, e.undo, e.undoNow, err = e.s.judge(&b.steps[i], &b.res[i], t, it.N)
				o.Decision.Limit = min(o.Decision.Limit, c)
			} else {
				o.Decision, err = e.foreign, b.res[i].Err
				if errors.Is(err, ErrRefund) && o.Decision.Limit != 0 {
					o.Err, err = err, nil // its own refund failed; the decision stands
				}
			}
		}
		if err != nil {
			o.Err = err
			e.undo = storage.Step{}
			if errors.Is(err, storage.ErrFenced) {
				failErr = fencedErr(failErr, err) // not an outage: never Fail
				continue
			}
			if throttled(err) {
				// The store refused this key for capacity: deny it (its
				// units were not counted, so admitting it would be free),
				// whatever the fail mode, which is for a failing store.
				o.Throttled, o.Decision = true, throttledDecision(it.Limit)
				denied = denied || !it.Shadow
				continue
			}
			if it.Fail == nil {
				if failErr == nil {
					failErr = err
				}
				continue
			}
			o.Failed = true
			o.Decision = *it.Fail
		}
		if !o.Decision.Allowed && !it.Shadow {
			denied = true
		}
	}
	return denied, failErr
}

// fencedErr is the batch's error once an item was fenced (err): the
// first fenced error is always in it, with the first error before it.
func fencedErr(failErr, err error) error {
	switch {
	case failErr == nil:
		return err
	case errors.Is(failErr, storage.ErrFenced):
		return failErr
	}
	return errors.Join(failErr, err)
}

// rememberDenials puts the store's denials in the deny caches, before
// anything is given back (a give-back bumps a cache's generation).
func rememberDenials(b batch, items []Item, out []Outcome, t int64) {
	for i, it := range items {
		o := &out[i]
		if b.es[i].s == nil || o.Skipped || o.Failed || errors.Is(o.Err, storage.ErrFenced) || o.Decision.Allowed || o.Decision.RetryAfter <= 0 {
			continue
		}
		b.es[i].s.denyCache().remember(it.Key, t, it.N, o.Decision, b.es[i].gen)
	}
}

// giveBackTakes gives back a denied window's own take always, and every
// take when the batch was denied or failed (undo), in one more round.
func giveBackTakes(ctx context.Context, now time.Time, b batch, items []Item, out []Outcome, undo bool) {
	refunding := false
	for i := range b.es {
		e, o := &b.es[i], &out[i]
		batchUndo := undo && o.Decision.Allowed && !o.Failed && o.Err == nil
		switch {
		case e.s == nil:
			e.fallbackUndo = batchUndo
			o.Refunded = batchUndo
		case e.undo.Kind == 0:
		case e.undoNow:
			e.refund = true
		case batchUndo:
			e.refund = true
			o.Refunded = true
		}
		if e.refund || e.fallbackUndo {
			e.refund = true
			b.steps[i], b.res[i] = e.undo, storage.StepResult{}
			refunding = true
		}
	}
	if !refunding {
		return
	}
	run(ctx, now, b)
	for i := range b.es {
		e := &b.es[i]
		if !e.refund {
			continue
		}
		if err := b.res[i].Err; err != nil {
			out[i].Refunded = false
			if !errors.Is(err, ErrRefund) {
				err = fmt.Errorf("limiter: %q: %w: %w", out[i].Decision.Name, ErrRefund, err)
			}
			out[i].Err = errors.Join(out[i].Err, err)
		}
		switch {
		case e.s == nil || b.res[i].Err != nil:
		case out[i].Refunded:
			// A batch's take given back (or sent): a denial of this
			// limit decided meanwhile may have seen it, so it is not
			// kept, nor one cached since.
			e.s.denyCache().forget(items[i].Key)
		default:
			// A denied window's own take: the same for the others'
			// denials in flight, but this denial, made without it,
			// stands.
			e.s.denyCache().bump()
		}
	}
}

// giveBack gives back the N units each item took at now, as one batch: the
// undo steps bound for the same store in one [storage.Batcher.Do], stores in
// parallel, a foreign limiter by its own Refund; errs[i] is item i's
// error (len(errs) >= len(items)). Each limit's deny cache forgets the
// key. It is the public Refund of the package's limiters (a batch of one)
// and of a [Stack].
func giveBack(ctx context.Context, now time.Time, items []Item, errs []error) {
	if len(items) == 0 {
		return
	}
	b := newBatch(len(items))
	defer b.release()
	es := b.es
	for i, it := range items {
		e := &es[i]
		e.item, e.it = i, it
		if s, ok := it.Limit.(stepper); ok {
			e.s = s
			b.steps[i], e.store, e.err = s.refund(it.Key, now, it.N)
			b.steps[i].Sync = true
		} else if it.Limit == nil {
			e.err = fmt.Errorf("%w: batch item %d has no limit", ErrInvalidConfig, i)
		}
		e.refund = e.err == nil
	}
	run(ctx, now, b)
	for i := range es {
		e := &es[i]
		errs[i] = e.err
		if r := &b.res[i]; e.err == nil && r.Err != nil {
			errs[i] = r.Err
			if e.s != nil {
				errs[i] = e.s.storeErr(r.Err)
			}
		}
		if e.s != nil {
			e.s.denyCache().forget(items[i].Key) // after the give-back: see denyCache.gen
		}
	}
}

// refundOne is a give-back of one: the public Refund of the package's
// limiters.
func refundOne(ctx context.Context, l Limiter, key string, now time.Time, n int64) error {
	items := [1]Item{{Limit: l, Key: key, N: n}}
	var errs [1]error
	giveBack(ctx, now, items[:], errs[:])
	return errs[0]
}

// decider picks the deciding item (see Decide).
func decider(items []Item, out []Outcome) int {
	best := -1
	for i := range out {
		if items[i].Shadow || out[i].Skipped {
			continue
		}
		if best < 0 || Tighter(&out[i], &out[best], false) {
			best = i
		}
	}
	return best
}

// Tighter is the rule that picks which limit decides, shared by [Decide]
// and the policy: it reports whether outcome a decides over b, the one
// chosen so far among the outcomes taken in order. The first denial
// decides (b denied: false; a denied: true); among allowing outcomes, a
// Failed one (its fail mode decided) loses to one whose store answered,
// or wins when failedFirst (a rule partly failed is decided by its fail
// mode); then the least Remaining, and the longer ResetAfter on a tie.
func Tighter(a, b *Outcome, failedFirst bool) bool {
	switch {
	case !b.Decision.Allowed:
		return false
	case !a.Decision.Allowed:
		return true
	case a.Failed != b.Failed:
		return a.Failed == failedFirst
	}
	return a.Decision.Remaining < b.Decision.Remaining ||
		a.Decision.Remaining == b.Decision.Remaining && a.Decision.ResetAfter > b.Decision.ResetAfter
}

// entry is one item on its way through Decide (its step and answer are
// the batch's steps and res at the same index).
type entry struct {
	item         int
	it           Item // items[item], for a foreign limiter's calls
	s            stepper
	leased       bool // answered from a lease: no step
	store        storage.Batcher
	err          error // from plan
	undo         storage.Step
	undoNow      bool
	refund       bool     // this round sends undo
	fallbackUndo bool     // a foreign limiter's Refund
	foreign      Decision // a foreign limiter's AllowN
	gen          uint64
	group        int // run's group of this round
}

// batch is the working memory of one Decide or giveBack: item i's entry,
// step and answer are es[i], steps[i] and res[i], so that the steps of a
// store whose items are contiguous go to its Do in place.
type batch struct {
	es    []entry
	steps []storage.Step
	res   []storage.StepResult
	sc    *batchScratch // the pooled memory they live in, if any
}

// scratchItems is the largest batch whose working memory is pooled.
const scratchItems = 4

// batchScratch is the working memory of a batch of up to scratchItems
// items, pooled so that the common batch of one to a few items allocates
// none: its entries, steps and answers, and the gathered steps and
// answers of run's groups whose items are not contiguous.
type batchScratch struct {
	es     [scratchItems]entry
	steps  [scratchItems]storage.Step
	res    [scratchItems]storage.StepResult
	gsteps [scratchItems]storage.Step
	gres   [scratchItems]storage.StepResult
}

var scratchPool = sync.Pool{New: func() any { return new(batchScratch) }}

// newBatch returns the working memory of a batch of n > 0 items: pooled
// when n <= scratchItems.
func newBatch(n int) batch {
	if n > scratchItems {
		return batch{es: make([]entry, n), steps: make([]storage.Step, n), res: make([]storage.StepResult, n)}
	}
	sc := scratchPool.Get().(*batchScratch)
	return batch{es: sc.es[:n], steps: sc.steps[:n], res: sc.res[:n], sc: sc}
}

// release clears what b used (nothing is kept alive by the pool) and
// returns its pooled memory. Every goroutine of the batch has returned by
// then.
func (b batch) release() {
	sc := b.sc
	if sc == nil {
		return
	}
	n := len(b.es)
	clear(sc.es[:n])
	clear(sc.steps[:n])
	clear(sc.res[:n])
	clear(sc.gsteps[:n])
	clear(sc.gres[:n])
	scratchPool.Put(sc)
}

// groups is run's plan of one round: the active entries of es, in order,
// grouped by store (group g is order[start(g):ends[g]] and goes to
// stores[g]), then the foreign limiters' entries.
type groups struct {
	refund bool
	stores []storage.Batcher
	ends   []int
	order  []int
}

func (g *groups) start(j int) int {
	if j == 0 {
		return 0
	}
	return g.ends[j-1]
}

// run performs the steps of b (those of entries without an error, or, in
// a refund round, those marked refund) grouped by store, stores in
// parallel, and calls the foreign limiters' own AllowN (Refund in a refund
// round) at now.
func run(ctx context.Context, now time.Time, b batch) {
	var (
		storeBuf [scratchItems]storage.Batcher
		endBuf   [scratchItems]int
		orderBuf [scratchItems]int
	)
	g := groups{stores: storeBuf[:0], ends: endBuf[:0], order: orderBuf[:0]}
	gather, nforeign := g.build(b.es)
	jobs := len(g.stores) + nforeign
	if jobs == 0 {
		return
	}
	// The groups' steps and answers gathered, aligned with order, when
	// some group's items are not contiguous; else nil.
	var gs gathered
	if gather {
		if nb := g.start(len(g.stores)); b.sc != nil {
			gs.steps, gs.res = b.sc.gsteps[:nb], b.sc.gres[:nb]
		} else {
			gs.steps, gs.res = make([]storage.Step, nb), make([]storage.StepResult, nb)
		}
	}
	if jobs == 1 {
		runJob(ctx, now, b, &g, gs, 0)
		return
	}
	runParallel(ctx, now, b, g.clone(), gs, jobs)
}

// build groups the active entries of es by store (a refund round when
// any entry is marked refund): it reports whether some group's items are
// not contiguous, and the number of foreign limiters' entries (last in
// order).
func (g *groups) build(es []entry) (gather bool, nforeign int) {
	for i := range es {
		if es[i].refund {
			g.refund = true
			break
		}
	}
	active := func(e *entry) bool {
		if g.refund {
			return e.refund
		}
		return e.err == nil && !e.leased
	}
	for i := range es {
		e := &es[i]
		if !active(e) {
			continue
		}
		if e.s == nil {
			nforeign++
			continue
		}
		e.group = -1
		for j, s := range g.stores {
			if s == e.store {
				e.group = j
				break
			}
		}
		if e.group < 0 {
			g.stores = append(g.stores, e.store)
			e.group = len(g.stores) - 1
		}
	}
	for j := range g.stores {
		lo := len(g.order)
		for i := range es {
			if e := &es[i]; e.s != nil && active(e) && e.group == j {
				gather = gather || len(g.order) > lo && g.order[len(g.order)-1] != i-1
				g.order = append(g.order, i)
			}
		}
		g.ends = append(g.ends, len(g.order))
	}
	for i := range es {
		if e := &es[i]; e.s == nil && active(e) {
			g.order = append(g.order, i)
		}
	}
	return gather, nforeign
}

// gathered holds the steps and answers of run's groups, aligned with
// groups.order, when some group's items are not contiguous (nil slices
// otherwise).
type gathered struct {
	steps []storage.Step
	res   []storage.StepResult
}

// clone copies g's plan off the caller's stack, for goroutines.
func (g *groups) clone() groups {
	return groups{refund: g.refund, stores: slices.Clone(g.stores), ends: slices.Clone(g.ends), order: slices.Clone(g.order)}
}

// runParallel runs g's jobs, all but the first on their own goroutines.
func runParallel(ctx context.Context, now time.Time, b batch, g groups, gs gathered, jobs int) {
	var wg sync.WaitGroup
	for j := 1; j < jobs; j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runJob(ctx, now, b, &g, gs, j)
		}()
	}
	runJob(ctx, now, b, &g, gs, 0)
	wg.Wait()
}

// runJob runs job j of g: a store's group, or a foreign limiter's call.
func runJob(ctx context.Context, now time.Time, b batch, g *groups, gs gathered, j int) {
	if j < len(g.stores) {
		lo, hi := g.start(j), g.ends[j]
		if gs.steps != nil {
			gs.steps, gs.res = gs.steps[lo:hi], gs.res[lo:hi]
		}
		runGroup(ctx, g.stores[j], b, g.order[lo:hi], gs.steps, gs.res)
		return
	}
	i := g.order[g.start(len(g.stores))+j-len(g.stores)]
	e, r := &b.es[i], &b.res[i]
	if g.refund {
		r.Err = e.it.Limit.Refund(ctx, e.it.Key, now, e.it.N)
		return
	}
	// Not one of ours: its own AllowN.
	e.foreign, r.Err = e.it.Limit.AllowN(ctx, e.it.Key, now, e.it.N)
}

// runGroup sends the steps of the items idx (ascending) to store in one
// Do: in place when steps is nil (every group's items are contiguous),
// else gathered in steps and answered in res (len(idx) each).
func runGroup(ctx context.Context, store storage.Batcher, b batch, idx []int, steps []storage.Step, res []storage.StepResult) {
	if steps == nil {
		first := idx[0]
		store.Do(ctx, b.steps[first:first+len(idx)], b.res[first:first+len(idx)])
		return
	}
	for k, i := range idx {
		steps[k] = b.steps[i]
	}
	clear(res)
	store.Do(ctx, steps, res)
	for k, i := range idx {
		b.res[i] = res[k]
	}
}

// decideOne is a batch of one: the single-limit AllowN of the package's
// limiters.
func decideOne(ctx context.Context, l Limiter, key string, now time.Time, n int64) (Decision, error) {
	var out [1]Outcome
	items := [1]Item{{Limit: l, Key: key, N: n}}
	if _, err := Decide(ctx, now, items[:], out[:]); err != nil {
		return Decision{}, err
	}
	return out[0].Decision, out[0].Err
}
