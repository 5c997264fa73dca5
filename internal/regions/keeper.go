package regions

import (
	"context"
	"time"
)

// Keeper defaults.
const (
	// DefaultKeeperMargin is how long before its invocation's deadline a
	// keeper stops: its last round's requests (each bounded by the
	// table's Deadline) end before the deadline.
	DefaultKeeperMargin = 3 * time.Second
	// DefaultKeeperRun bounds a keeper's run when its context has no
	// deadline (a scheduled event comes every minute).
	DefaultKeeperRun = time.Minute
)

// Keeper sweeps a region's limits (Keys.Sweep) for the duration of one
// invocation: a function invoked every minute by a schedule runs it so
// that a region where nobody decides a key still gives its share of it to
// the regions that list it as wanted. Sweeps run every Period (default
// the limits' Tick) until the context's deadline less Margin.
type Keeper struct {
	// Keys returns the limits to sweep (read at every round: a rules
	// table may add some).
	Keys func() []*Keys
	// Now is the clock (nil: time.Now).
	Now    func() time.Time
	Period time.Duration
	Margin time.Duration
}

// KeeperReport is what a keeper's run did.
type KeeperReport struct {
	Limits int           `json:"limits"`
	Rounds int64         `json:"rounds"`
	Ran    time.Duration `json:"ranNs"`
	SweepStats
}

// Run sweeps every Period until ctx's deadline less Margin (or
// DefaultKeeperRun less Margin without a deadline), and returns what it
// did, with the first error a sweep met (the sweeps go on after one).
func (kp *Keeper) Run(ctx context.Context) (KeeperReport, error) {
	now := kp.Now
	if now == nil {
		now = time.Now
	}
	margin := orDefault(kp.Margin, DefaultKeeperMargin)
	start := now()
	end := start.Add(DefaultKeeperRun)
	if d, ok := ctx.Deadline(); ok {
		end = d
	}
	end = end.Add(-margin)
	var (
		rep      KeeperReport
		firstErr error
	)
	for {
		t := now()
		if !t.Before(end) {
			break
		}
		keys := kp.Keys()
		rep.Limits = len(keys)
		if len(keys) == 0 {
			break
		}
		period := kp.Period
		for _, k := range keys {
			st, err := k.Sweep(ctx, t)
			rep.add(st)
			firstErr = cmp(firstErr, err)
			if kp.Period <= 0 && (period <= 0 || k.cfg.Tick < period) {
				period = k.cfg.Tick
			}
		}
		rep.Rounds++
		next := t.Add(period)
		if !next.Before(end) {
			break
		}
		timer := time.NewTimer(next.Sub(now()))
		select {
		case <-ctx.Done():
			timer.Stop()
			rep.Ran = now().Sub(start)
			return rep, cmp(firstErr, ctx.Err())
		case <-timer.C:
		}
	}
	rep.Ran = now().Sub(start)
	return rep, firstErr
}
