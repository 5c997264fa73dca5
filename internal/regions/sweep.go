package regions

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Sweep defaults.
const (
	defaultSweepKeys = 64
	// sweepParallel bounds the ticks a sweep runs at once.
	sweepParallel = 8
)

// sweeper is a Keys' sweep state: when it last swept, and its counts.
type sweeper struct {
	running sync.Mutex // one sweep at a time
	mu      sync.Mutex
	swept   int64 // stamp of the last sweep started (0: none)
	pruned  int64 // stamp of the last prune of this region's index (0: none)
	stats   SweepStats
}

// SweepStats counts sweeps: the other regions' wants index items read
// (and failed), the keys they listed in force (summed over sweeps) and
// out of force (Expired: listed more than WantsLife ago, not ticked), the
// ticks run for them (and failed), the keys listed but not ticked for
// SweepKeys; and the prunes of this region's own index (every WantsLife:
// Prunes, PruneErrors) with the listings out of force they removed.
type SweepStats struct {
	Sweeps, IndexReads, IndexErrors int64
	Wanted, Expired                 int64
	Ticks, TickErrors               int64
	Skipped                         int64
	Prunes, Pruned, PruneErrors     int64
}

func (s *SweepStats) add(o SweepStats) {
	s.Sweeps += o.Sweeps
	s.IndexReads += o.IndexReads
	s.IndexErrors += o.IndexErrors
	s.Wanted += o.Wanted
	s.Expired += o.Expired
	s.Ticks += o.Ticks
	s.TickErrors += o.TickErrors
	s.Skipped += o.Skipped
	s.Prunes += o.Prunes
	s.Pruned += o.Pruned
	s.PruneErrors += o.PruneErrors
}

// SweepStats returns the counts of the process's sweeps.
func (k *Keys) SweepStats() SweepStats {
	k.sweep.mu.Lock()
	defer k.sweep.mu.Unlock()
	return k.sweep.stats
}

// sweepDue reports whether an in-line sweep is due at t (every
// SweepEvery), marking it started.
func (k *Keys) sweepDue(t int64) bool {
	k.sweep.mu.Lock()
	defer k.sweep.mu.Unlock()
	if k.sweep.swept != 0 && t-k.sweep.swept < int64(k.cfg.SweepEvery) {
		return false
	}
	k.sweep.swept = t
	return true
}

// Sweep reads the other regions' wants indexes of the limit (a GetItem
// each, from this region's replica) and ticks this region's agents of the
// keys they list: at most SweepKeys keys, those ticked longest ago first,
// each at most every Tick while this process holds its role, else every
// LockLife (a tick that finds the role held elsewhere only reads; one
// that finds it lapsed takes it, as a decision's tick does). A process
// sweeps in line with its decisions (AllowN, every SweepEvery); a keeper
// ([Keeper]) sweeps for a region without traffic. A sweep already under
// way makes Sweep return at once.
func (k *Keys) Sweep(ctx context.Context, now time.Time) (SweepStats, error) {
	return k.sweepBy(ctx, now, k.cfg.Table.Deadline)
}

// sweepBy is Sweep with each request (an index read, the prune, a
// tick's) bounded by bound.
func (k *Keys) sweepBy(ctx context.Context, now time.Time, bound time.Duration) (SweepStats, error) {
	var st SweepStats
	if !k.sweep.running.TryLock() {
		return st, nil
	}
	defer k.sweep.running.Unlock()
	t := now.UnixNano()
	k.sweep.mu.Lock()
	k.sweep.swept = max(k.sweep.swept, t)
	k.sweep.mu.Unlock()
	st.Sweeps = 1
	wanted, firstErr := k.readIndexes(ctx, t, bound, &st)
	// A grant under way here is finished whether or not its key is still
	// listed: a giver that withheld units (or rebased) and is not ticked
	// again would keep them from every region.
	wanted = append(wanted, k.givingUnderWay(wanted)...)
	type due struct {
		ks    *keyShare
		tried int64
	}
	var dues []due
	for _, key := range wanted {
		ks, err := k.get(key)
		if err != nil {
			st.TickErrors++
			firstErr = cmp(firstErr, err)
			continue
		}
		ks.mu.Lock()
		tried := ks.tried
		ks.mu.Unlock()
		every := k.cfg.Table.LockLife
		if ks.agent.Holds() {
			every = k.cfg.Tick
		}
		if tried == 0 || t-tried >= int64(every) {
			dues = append(dues, due{ks, tried})
		}
	}
	slices.SortFunc(dues, func(a, b due) int { return int(min(max(a.tried-b.tried, -1), 1)) })
	if len(dues) > k.cfg.SweepKeys {
		st.Skipped = int64(len(dues) - k.cfg.SweepKeys)
		dues = dues[:k.cfg.SweepKeys]
	}
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		sem = make(chan struct{}, sweepParallel)
	)
	for _, d := range dues {
		if !d.ks.ticking.TryLock() {
			continue // a decision ticks it
		}
		d.ks.mu.Lock()
		d.ks.tried = t
		d.ks.mu.Unlock()
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			defer d.ks.ticking.Unlock()
			tctx, cancel := context.WithTimeout(ctx, bound)
			err := k.tick(tctx, d.ks, now)
			cancel()
			mu.Lock()
			defer mu.Unlock()
			st.Ticks++
			if err != nil {
				st.TickErrors++
				firstErr = cmp(firstErr, err)
			}
		})
	}
	wg.Wait()
	k.swept(now, st)
	return st, firstErr
}

// swept counts a sweep's stats, and reports the counts if due.
func (k *Keys) swept(now time.Time, st SweepStats) {
	k.sweep.mu.Lock()
	k.sweep.stats.add(st)
	k.sweep.mu.Unlock()
	k.count(Counts{Sweeps: 1, Expired: st.Expired, Wanted: st.Wanted})
	k.reportDue(now)
}

// givingUnderWay is the keys, not in listed, whose agents in this
// process hold the role with a grant under way.
func (k *Keys) givingUnderWay(listed []string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for key, ks := range k.keys {
		if ks.agent.givingUnderWay() && !slices.Contains(listed, key) {
			out = append(out, key)
		}
	}
	return out
}

// readIndexes reads the other regions' wants indexes (wanted) and prunes
// this region's own, at once: under a decision's deadline an in-line
// sweep has half of it for every request, and the reads depend on none of
// each other.
func (k *Keys) readIndexes(ctx context.Context, now int64, bound time.Duration, st *SweepStats) ([]string, error) {
	var (
		pst      SweepStats
		pruneErr error
		pruned   sync.WaitGroup
	)
	pruned.Go(func() { pruneErr = k.prune(ctx, now, bound, &pst) })
	wanted, err := k.wanted(ctx, now, bound, st)
	pruned.Wait()
	st.add(pst)
	return wanted, cmp(err, pruneErr)
}

// wanted is the keys the other regions' wants indexes list in force at
// now, each once, in the regions' order. The indexes are read at once.
func (k *Keys) wanted(ctx context.Context, now int64, bound time.Duration, st *SweepStats) ([]string, error) {
	t := k.cfg.Table
	life := k.cfg.WantsLife
	if k.brokenExpiry {
		life = time.Duration(1<<63 - 1)
	}
	type read struct {
		keys  []string
		stale int
		err   error
	}
	reads := make([]read, k.cfg.Config.Regions)
	prefix := k.cfg.ItemPrefix()
	var wg sync.WaitGroup
	for o := range k.cfg.Config.Regions {
		if o == t.Region {
			continue
		}
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, bound)
			defer cancel()
			r := &reads[o]
			r.keys, r.stale, r.err = readWants(rctx, t.Client, t.Table, prefix, o, now, life)
		})
	}
	wg.Wait()
	var (
		out      []string
		firstErr error
	)
	seen := map[string]bool{}
	for o, r := range reads {
		if o == t.Region {
			continue
		}
		st.IndexReads++
		if r.err != nil {
			st.IndexErrors++
			firstErr = cmp(firstErr, r.err)
			continue
		}
		st.Expired += int64(r.stale)
		for _, key := range r.keys {
			if !seen[key] {
				seen[key] = true
				out = append(out, key)
			}
		}
	}
	st.Wanted = int64(len(out))
	return out, firstErr
}

// prune removes from this region's own wants index the listings out of
// force (written more than WantsLife before now: their agents are ticked
// no more here, or they would have listed their keys again), at most
// every WantsLife per process: one read of the index, and a write per
// pruneBatch listings removed.
func (k *Keys) prune(ctx context.Context, now int64, bound time.Duration, st *SweepStats) error {
	if k.brokenExpiry {
		return nil
	}
	life := int64(k.cfg.WantsLife)
	k.sweep.mu.Lock()
	due := k.sweep.pruned == 0 || now-k.sweep.pruned >= life
	if due {
		k.sweep.pruned = now
	}
	k.sweep.mu.Unlock()
	if !due {
		return nil
	}
	t := k.cfg.Table
	pctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	n, err := pruneWants(pctx, t.Client, t.Table, k.cfg.ItemPrefix(), t.Region, now-life)
	st.Prunes++
	st.Pruned += int64(n)
	if err != nil {
		st.PruneErrors++
	}
	return err
}
