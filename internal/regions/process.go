package regions

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// Process is one process's limiter of its region's share that shares
// nothing with the region's agent but the table (a Lambda container): it
// decides against the entry the agent published in the region's item,
// read at most every Refresh, and never past the entry's validity, and
// adds the units it was offered to the item's demand counter, at most
// once a Flush, in the same request as a read. Safe for concurrent use.
type Process struct {
	cfg   Config
	t     Table
	store any
	w     *limiter.SlidingWindow // a window's

	mu      sync.Mutex
	entry   Entry
	has     bool
	fetched int64 // stamp of the read (0: none)
	flushed int64 // stamp of the last demand write (0: none)
	offered int64 // units not yet written
	buckets map[string]*limiter.TokenBucket
	dropped limiter.LeaseStats // the lease counts of buckets dropped

	reading sync.Mutex // one read at a time
	stats   struct{ reads, flushes, stale, waits, fenced, cached, unshared atomic.Int64 }
	// brokenNoWait (tests): a decision that finds no entry valid fails
	// at once, as before. brokenNoFenceWait (tests): a decision the
	// fence refused reads its entry again once, not until its number is
	// above the refused one (reread), as before.
	brokenNoWait, brokenNoFenceWait bool
}

// ProcessStats counts a process's requests to its region's item and the
// decisions it could not make for want of a valid entry; Waits is the
// reads made again waiting for one (counted in Reads too); Fenced the
// decisions refused by the store's fence (a window's lowering or a
// bucket's rebase published since the entry they used), each followed by
// a read of the entry (counted in Reads too) and a decision by it. Cached
// counts the decisions the deny cache denied, Unshared those the entry
// denied (a share or cap below the units asked), both without a store
// request; LeaseStats counts those answered from a lease.
type ProcessStats struct {
	Reads, Flushes, Stale, Waits, Fenced, Cached, Unshared int64
}

// NewProcess returns a process's limiter of region t.Region's share of
// cfg's key on store (the process's own: a storage.Counter for a window,
// a storage.BucketStore for a bucket), reading its entry through t.
func NewProcess(cfg Config, t Table, store any) (*Process, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	t = t.withDefaults()
	if err := t.validate(cfg.Regions); err != nil {
		return nil, err
	}
	p := &Process{cfg: cfg, t: t, store: store, buckets: map[string]*limiter.TokenBucket{}}
	if cfg.Bucket != nil {
		if _, ok := store.(storage.BucketStore); !ok {
			return nil, fmt.Errorf("%w: a bucket's store must be a storage.BucketStore, not %T", ErrInvalidConfig, store)
		}
		return p, nil
	}
	c, ok := store.(storage.Counter)
	if !ok {
		return nil, fmt.Errorf("%w: a window's store must be a storage.Counter, not %T", ErrInvalidConfig, store)
	}
	w, err := cfg.window(c, cfg.Leases)
	if err != nil {
		return nil, err
	}
	p.w = w
	return p, nil
}

// Stats returns the process's counts.
func (p *Process) Stats() ProcessStats {
	return ProcessStats{Reads: p.stats.reads.Load(), Flushes: p.stats.flushes.Load(), Stale: p.stats.stale.Load(), Waits: p.stats.waits.Load(),
		Fenced: p.stats.fenced.Load(), Cached: p.stats.cached.Load(), Unshared: p.stats.unshared.Load()}
}

// LeaseStats sums the process's capacity lease counts: its window's, or
// its buckets' (of every item it decided on, those dropped included).
func (p *Process) LeaseStats() limiter.LeaseStats {
	if p.w != nil {
		return p.w.LeaseStats()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return bucketLeases(p.dropped, p.buckets)
}

// bucketLeases is base plus the lease counts of buckets.
func bucketLeases[K comparable](base limiter.LeaseStats, buckets map[K]*limiter.TokenBucket) limiter.LeaseStats {
	for _, tb := range buckets {
		base = base.Add(tb.LeaseStats())
	}
	return base
}

// AllowN decides n units of key at now (the wall clock) against the
// region's share in force at now, on the region's own item of the key.
// Its store requests end by now plus the table's Deadline. Without an
// entry valid at now it returns ErrStale.
func (p *Process) AllowN(ctx context.Context, key string, now time.Time, n int64) (limiter.Decision, error) {
	if key != p.cfg.Key {
		return limiter.Decision{}, fmt.Errorf("%w: %q, not %q", ErrKey, key, p.cfg.Key)
	}
	t := now.UnixNano()
	p.mu.Lock()
	p.offered += n
	p.mu.Unlock()
	e, err := p.current(ctx, t)
	if err != nil {
		p.stats.stale.Add(1)
		return limiter.Decision{}, err
	}
	ctx, cancel := context.WithDeadline(ctx, now.Add(p.t.Deadline))
	defer cancel()
	region := p.cfg.Key + "@" + strconv.Itoa(p.t.Region)
	if p.cfg.Bucket != nil {
		return p.decideFenced(ctx, e, now, n, p.bucketItem)
	}
	return p.decideFenced(ctx, e, now, n, p.windowItem(region))
}

// fencedTries is how many times a decision refused by the fence is
// decided again (each by an entry read since): one suffices unless
// lowerings or rebases follow each other faster than the reads.
const fencedTries = 3

// itemFor is the item a decision of n units stamped t makes by entry e
// (its fence number e.Fence), or, when e denies it without the store, the
// denial (ok false).
type itemFor func(e Entry, t, n int64) (it limiter.Item, denied limiter.Decision, ok bool, err error)

// windowItem decides on the region's counters, under the cap e shows at
// the decision's stamp.
func (p *Process) windowItem(region string) itemFor {
	return func(e Entry, t, n int64) (limiter.Item, limiter.Decision, bool, error) {
		c, ok := e.capAt(t)
		if !ok || c < n {
			return limiter.Item{}, limiter.Decision{Limit: max(c, 0), RetryAfter: p.cfg.Window / time.Duration(p.cfg.SubWindows)}, false, nil
		}
		return limiter.Item{Limit: p.w, Key: region, N: n, Cap: c, Fence: e.Fence}, limiter.Decision{}, true, nil
	}
}

// bucketItem decides on the bucket item e lists at the decision's stamp.
func (p *Process) bucketItem(e Entry, t, n int64) (limiter.Item, limiter.Decision, bool, error) {
	it := e.itemAt(t)
	if it == nil || it.Share < n {
		return limiter.Item{}, limiter.Decision{RetryAfter: rebaseAhead}, false, nil
	}
	tb, err := p.bucket(e, it)
	if err != nil {
		return limiter.Item{}, limiter.Decision{}, false, err
	}
	return limiter.Item{Limit: tb, Key: it.Key, N: n, Fence: e.Fence}, limiter.Decision{}, true, nil
}

// decideFenced decides n units at now by entry e, with e's fence number
// (a window's cap or a bucket's item: item): refused by the store's
// fence (the agent published a lowering or a rebase since e and raised
// the fence: the take was not made), it reads the entry again at once and
// decides by it, within the decision's deadline (ctx).
func (p *Process) decideFenced(ctx context.Context, e Entry, now time.Time, n int64, item itemFor) (limiter.Decision, error) {
	t := now.UnixNano()
	for try := 0; ; try++ {
		it, denied, ok, err := item(e, t, n)
		if err != nil || !ok {
			if err == nil {
				p.stats.unshared.Add(1)
			}
			return denied, err
		}
		var out [1]limiter.Outcome
		_, err = limiter.Decide(ctx, now, []limiter.Item{it}, out[:])
		if !errors.Is(err, storage.ErrFenced) {
			if err != nil {
				return limiter.Decision{}, err
			}
			if out[0].Cached {
				p.stats.cached.Add(1)
			}
			return out[0].Decision, out[0].Err
		}
		p.stats.fenced.Add(1)
		if try+1 >= fencedTries {
			return limiter.Decision{}, fmt.Errorf("%w: refused by the fence %d times (%v)", ErrStale, fencedTries, err)
		}
		if e, err = p.reread(ctx, t, e.Fence); err != nil {
			p.stats.stale.Add(1)
			return limiter.Decision{}, err
		}
	}
}

// reread reads the entry for a decision stamped t that the fence refused
// by an entry of fence number f (whatever its age): the entry another
// decision read meanwhile, if its fence number is higher, else a new
// read. A window's fence is raised only after the entry that carries it
// is published, so the read returns one with a higher number; a bucket's
// rebase raises the old item's fence first and publishes the entry that
// carries it after (rebaseTable), so a read in between returns f or
// less, which the fence refuses again: it reads again after short
// pauses (entryWait, doubling) until the number is above f, for at most
// fenceWait of pauses and within the decision's deadline (ctx), rather
// than spend its tries. An entry that does not come by then (its
// publisher stopped between the raise and the save: a successor
// publishes once the role lapses) fails the decision to its fail mode.
func (p *Process) reread(ctx context.Context, t, f int64) (Entry, error) {
	p.reading.Lock()
	defer p.reading.Unlock()
	p.mu.Lock()
	e, has := p.entry, p.has
	p.mu.Unlock()
	var waited time.Duration
	for pause := entryWait; !has || e.Fence <= f; pause *= 2 {
		if pause > entryWait {
			if p.brokenNoFenceWait {
				break
			}
			if waited >= fenceWait {
				return Entry{}, fmt.Errorf("%w (refused by the fence; no entry above fence number %d within %v)", ErrStale, f, fenceWait)
			}
			d := min(pause/2, fenceWait-waited)
			select {
			case <-ctx.Done():
				return Entry{}, fmt.Errorf("%w (refused by the fence; no entry above fence number %d: %v)", ErrStale, f, ctx.Err())
			case <-time.After(d):
			}
			waited += d
			p.stats.waits.Add(1)
		}
		if err := p.readEntry(ctx, t, 0); err != nil {
			return Entry{}, fmt.Errorf("%w (%v)", ErrStale, err)
		}
		p.mu.Lock()
		e, has = p.entry, p.has
		p.mu.Unlock()
	}
	if !has || t >= e.Until {
		return Entry{}, ErrStale
	}
	return e, nil
}

// Refund gives nothing back (see Limiter.Refund).
func (p *Process) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	return nil
}

var _ limiter.Limiter = (*Process)(nil)

// current returns the entry to decide a decision stamped t by: the one
// read less than Refresh ago, else a new read (one decision reads while
// the others use the entry they have, if it is valid at their stamps).
func (p *Process) current(ctx context.Context, t int64) (Entry, error) {
	p.mu.Lock()
	e, has, fresh := p.entry, p.has, t-p.fetched < int64(p.t.Refresh)
	p.mu.Unlock()
	valid := has && t < e.Until
	if valid && fresh {
		return e, nil
	}
	if valid {
		if !p.reading.TryLock() {
			return e, nil
		}
	} else {
		p.reading.Lock()
	}
	defer p.reading.Unlock()
	p.mu.Lock()
	if p.has && t < p.entry.Until && t-p.fetched < int64(p.t.Refresh) {
		e := p.entry // read by another meanwhile
		p.mu.Unlock()
		return e, nil
	}
	var flush int64
	if t-p.flushed >= int64(p.t.Flush) {
		flush = p.offered
	}
	p.mu.Unlock()

	rctx, cancel := context.WithTimeout(ctx, p.t.Deadline)
	defer cancel()
	err := p.readEntry(rctx, t, flush)
	// No entry valid at t, yet the table answered: another process may be
	// publishing one (a new key's first tick, or a role taken over from a
	// holder that stopped ticking, whose tick this process's own did not
	// win). Read again after short pauses until one is valid or the
	// deadline comes, rather than fail the decision at once.
	for pause := entryWait; err == nil && !p.valid(t) && !p.brokenNoWait; pause *= 2 {
		select {
		case <-rctx.Done():
			return Entry{}, fmt.Errorf("%w (%v)", ErrStale, rctx.Err())
		case <-time.After(pause):
		}
		p.stats.waits.Add(1)
		err = p.readEntry(rctx, t, 0)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.has && t < p.entry.Until {
		return p.entry, nil
	}
	if err != nil {
		return Entry{}, fmt.Errorf("%w (%v)", ErrStale, err)
	}
	return Entry{}, ErrStale
}

// fenceWait bounds the pauses of a decision the fence refused, waiting
// for the entry above the refused number (reread): a bucket rebase
// publishes it one save after the raise.
const fenceWait = 500 * time.Millisecond

// entryWait is the first pause before a process reads its entry again
// for a decision that found none valid (doubling each time, within the
// table's Deadline).
const entryWait = 5 * time.Millisecond

// readEntry reads the region's entry for a decision stamped t, writing
// flush offered units with it, and keeps it if newer than the one held.
func (p *Process) readEntry(ctx context.Context, t, flush int64) error {
	got, found, err := p.t.read(ctx, flush)
	p.stats.reads.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil && flush > 0 {
		p.stats.flushes.Add(1)
		p.offered -= flush
		p.flushed = t
	}
	if err == nil && found && (!p.has || got.Seq >= p.entry.Seq) {
		p.entry, p.has, p.fetched = got, true, t
	}
	return err
}

// valid reports whether the process holds an entry valid at t.
func (p *Process) valid(t int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.has && t < p.entry.Until
}

// bucket returns the process's bucket of item it (dropping those of items
// e no longer lists: their leases lapse in the store).
func (p *Process) bucket(e Entry, it *ItemStep) (*limiter.TokenBucket, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if tb := p.buckets[it.Key]; tb != nil {
		return tb, nil
	}
	for k := range p.buckets {
		listed := false
		for _, o := range e.Items {
			listed = listed || o.Key == k
		}
		if !listed {
			p.dropped = p.dropped.Add(p.buckets[k].LeaseStats())
			delete(p.buckets, k)
		}
	}
	tb, err := limiter.NewTokenBucket(p.store.(storage.BucketStore), p.cfg.bucketFor(it.Share, p.cfg.Leases))
	if err != nil {
		return nil, err
	}
	p.buckets[it.Key] = tb
	return tb, nil
}
