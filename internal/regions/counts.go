package regions

import (
	"context"
	"sync"
	"time"
)

// Counts are what one limit's keys did in this process over a period
// (Keys reports them to KeysConfig.Report, for the authorizer's metrics).
type Counts struct {
	// Given and Received are the units the agents gave away and took in.
	Given, Received int64
	// Ticks is the agents' ticks run here (by decisions and sweeps),
	// TickErrors those that failed.
	Ticks, TickErrors int64
	// Takeovers is the times an agent here took a key's role (a first
	// tick, or a holder that stopped), RoleLost the times one found its
	// role taken by another (a tick that outlasted LockLife, or a holder
	// frozen).
	Takeovers, RoleLost int64
	// Stale is the decisions that found no entry valid at their stamp
	// (decided by the rule's fail mode); StaleEntries the other regions'
	// entries a tick read that show demand but were published more than
	// StaleEntry ago (an agent that stopped while its region's demand
	// was up, or entries that stopped replicating: the plans here count
	// that demand as none).
	Stale, StaleEntries int64
	// Sweeps is the sweeps run; Expired the listings they read out of
	// force; Wanted the most keys the other regions listed in force in
	// one sweep (a gauge).
	Sweeps, Expired, Wanted int64
	// Listed is the listing writes to this region's wants index (a key
	// listed, or listed again), Dropped the keys it could not take.
	Listed, Dropped int64
}

// StaleEntry is how old another region's entry that shows demand may be
// before a tick counts it stale, and the plans count its demand as none
// (planView): ten validities. A region that decides the key publishes
// at least every validity (1 s: its processes need an entry valid at
// their stamps; its agent ticks every 250 ms while they decide), and
// its entry is read a replication lag later (about a second), so a live
// region's entry is about 2 s old at most; 10 s leaves room for
// replication several seconds slow before a live region's demand is
// ignored (it would then receive nothing until its entries arrive:
// under-admits), while a stopped one is given units for 10 s at most.
const StaleEntry = 10 * time.Second

// DefaultReportEvery is how often a limit's counts are reported by
// default (KeysConfig.ReportEvery).
const DefaultReportEvery = time.Minute

func (c *Counts) add(o Counts) {
	c.Given += o.Given
	c.Received += o.Received
	c.Ticks += o.Ticks
	c.TickErrors += o.TickErrors
	c.Takeovers += o.Takeovers
	c.RoleLost += o.RoleLost
	c.Stale += o.Stale
	c.StaleEntries += o.StaleEntries
	c.Sweeps += o.Sweeps
	c.Expired += o.Expired
	c.Wanted = max(c.Wanted, o.Wanted)
	c.Listed += o.Listed
	c.Dropped += o.Dropped
}

// counter is a Keys' counts since its last report.
type counter struct {
	mu       sync.Mutex
	c        Counts
	reported int64 // stamp of the last report (0: none yet)
}

func (k *Keys) count(c Counts) {
	k.counts.mu.Lock()
	defer k.counts.mu.Unlock()
	k.counts.c.add(c)
}

// Flush reports the counts since the last report now (to
// KeysConfig.Report), and returns them.
func (k *Keys) Flush(now time.Time) Counts {
	c, _ := k.take(now, true)
	if k.cfg.Report != nil {
		k.cfg.Report(now, c)
	}
	return c
}

// reportDue reports the counts when ReportEvery has passed since the
// last report (the first period starts at the first call).
func (k *Keys) reportDue(now time.Time) {
	if k.cfg.Report == nil {
		return
	}
	if c, ok := k.take(now, false); ok {
		k.cfg.Report(now, c)
	}
}

// take returns the counts since the last report and starts a new period,
// if ReportEvery has passed since the last report or always.
func (k *Keys) take(now time.Time, always bool) (Counts, bool) {
	t := now.UnixNano()
	k.counts.mu.Lock()
	defer k.counts.mu.Unlock()
	if k.counts.reported == 0 {
		k.counts.reported = t
	}
	if !always && t-k.counts.reported < int64(k.cfg.ReportEvery) {
		return Counts{}, false
	}
	c := k.counts.c
	k.counts.c, k.counts.reported = Counts{}, t
	return c, true
}

// tick ticks ks's agent at now and counts what the tick did. The caller
// holds ks.ticking.
func (k *Keys) tick(ctx context.Context, ks *keyShare, now time.Time) error {
	a := ks.agent
	as, ts, ws := a.Stats(), a.TableStats(), a.WantsStats()
	err := a.Tick(ctx, now)
	as2, ts2, ws2 := a.Stats(), a.TableStats(), a.WantsStats()
	c := Counts{
		Ticks:     1,
		Given:     as2.Given - as.Given,
		Received:  as2.Received - as.Received,
		Takeovers: ts2.Takeovers - ts.Takeovers,
		RoleLost:  ts2.Lost - ts.Lost,
		Listed:    ws2.Added - ws.Added,
		Dropped:   ws2.Dropped - ws.Dropped,
	}
	if err != nil {
		c.TickErrors = 1
	}
	if a.Holds() {
		c.StaleEntries = a.staleEntries(now.UnixNano())
	}
	k.count(c)
	return err
}

// staleEntries is how many other regions' entries, as the agent last
// read them, show demand and were published more than StaleEntry before
// t. The caller holds the key's ticking (the states are Tick's).
func (a *Agent) staleEntries(t int64) int64 {
	var n int64
	for o, st := range a.states {
		if a.stale(o, st, t) {
			n++
		}
	}
	return n
}
