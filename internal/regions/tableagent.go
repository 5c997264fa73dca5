package regions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// tableAgent is an agent's side of the table (see table.go): the role it
// holds and the state it resumes from the region's item at every tick,
// so that a successor resumes the same way.
type tableAgent struct {
	t      Table
	holder string
	epoch  int64 // the role's epoch held (0: none)

	// lows are the lowerings on record (a window's), oldest first: their
	// units sum to the agent's pending.
	lows []lowering
	// fenced: the agent's store fences a window's counters
	// (storage.Fencer): a lowering is in force at every stamp of the entry
	// that publishes it and ready once the counters' fence is raised to
	// that entry's fence number (fence, the board's Entry.Fence), in the
	// same tick; without it a lowering waits a validity and a deadline.
	// For a bucket (a storage.BucketFencer), a rebase first raises the
	// old item's fence to the number of the entry that will list the new
	// item, then makes the new item take over after the raise returned
	// (rebaseTable, fenceRebase). unsaved: a lowering made this tick is
	// not yet published; raised: the fence this agent has raised the
	// counters to; raisedTo: the highest fence number it sent in a
	// bucket item's raise (returned or not: its entries never carry a
	// lower one, resume). brokenFence (tests): a fenced lowering is
	// given without raising the fence; stopEarly (tests): the tick stops
	// after the save before the grant, as a holder that stopped there.
	// brokenOrder (tests): a fenced rebase publishes its entry first,
	// its new item in force rebaseAhead after the tick, and raises the
	// old item's fence after (the order before); brokenFenceTTL (tests):
	// the raise and the claim keep the old item for its own TTL only
	// (fenceTTL).
	fenced                      bool
	fence                       int64
	unsaved                     bool
	raised, raisedTo            int64
	brokenFence, stopEarly      bool
	brokenOrder, brokenFenceTTL bool
	// brokenLeaseHold (tests): a fenced rebase of a bucket with leases
	// holds none of the old item's leased units in the new item.
	brokenLeaseHold bool
	// waitLower: a bucket with leases fences its raises only, where
	// it gains (its lowerings wait: fenceFor, raiseWorth);
	// brokenRaiseWait (tests): its raises wait too, as before;
	// brokenRaiseWorth (tests): every raise is fenced.
	waitLower, brokenRaiseWait, brokenRaiseWorth bool
	// pauseRaised (tests): a fenced rebase waits this long after its
	// raise returned, before it lists the new item.
	pauseRaised time.Duration

	maxUntil int64 // the latest Until published
	seen     int64 // the demand counter as the last tick weighed read it
	counted  int64 // that tick's stamp (a held tick weighs nothing: estimate)
	seq      int64 // the entry's
	items    map[string]*bucketItem
	// wants is the key's place in its limit's wants index (nil: none);
	// listed and wantsTry are as the board records them (wants.go).
	wants    *wantsRef
	listed   bool
	wantsTry int64
	// denied counts the units this process's decisions of the key were
	// denied by the region's share since the agent's last tick (Keys
	// adds them); bound is whether the last tick found any; resync
	// whether it took the role since the index was last written;
	// shortAt is its last tick that found the region short (wants.go).
	denied  atomic.Int64
	bound   bool
	resync  bool
	shortAt int64
	// started is when the tick under way started, on the process's
	// monotonic clock (save: the role's lapse); brokenLife (tests)
	// extends the role from the tick's stamp only, as before.
	started    time.Time
	brokenLife bool
	// in is the board's In (nil: not on the board, set to inForce at
	// the tick, crediting nothing); inForce, per giving region, its
	// running total of units given this region in force at the tick
	// (receive). A bucket's; under the agent's mu.
	in, inForce []int64
	// took is the board's Took; owe the grants' tokens to add once the
	// tick's save has recorded them as taken (lateTokens). A bucket's;
	// under the agent's mu.
	took []took
	owe  []owed
	// sent and owing are the tick's tokens carried with grants and owed
	// (counted once its save is made).
	sent, owing int64

	mu    sync.Mutex
	stats TableStats
}

// TableStats counts an agent's work on the table.
type TableStats struct {
	// Takeovers is the times it took the role, Lost the times it found
	// another holding it (a write refused, or a load), Standby the ticks
	// it did not hold it.
	Takeovers, Lost, Standby int64
	LoadErrors, SaveErrors   int64
	// Carries is the rebases whose old item's free tokens it moved
	// (Moved: the tokens it claimed).
	Carries, Moved int64
	// Refilled is the tokens the bucket's new items held at their first
	// stamps for their grants' refill in transit (rebaseTable), and
	// RefilledFromTick what they would have held counted from the tick
	// that started each raise (as before the giver's stamp was used).
	Refilled, RefilledFromTick int64
	// TokensOut is the tokens it carried with its grants (its old
	// items' free tokens above their new shares, at the carry: those
	// of a tick whose save was made); TokensIn those of the grants to
	// it that its new items held as they took the grants over (read
	// before); TokensOwed what the tokens read after were worth (what
	// each grant would have held more; a tick whose save was made),
	// and TokensLate what of it was added (lateTokens).
	TokensOut, TokensIn, TokensOwed, TokensLate int64
	// ResumedPending is the units withheld for a window grant, and
	// ResumedRebases the rebases under way, on record when it took the
	// role (a predecessor's, finished by this agent).
	ResumedPending, ResumedRebases int64
	// Fenced is the window's lowerings made in force at every stamp
	// (a store that fences), or the bucket's rebases that took over
	// rebaseAhead on; Raises the times it raised the counters' fence (a
	// bucket's old item's), and Early the saves made in a tick before
	// its grant, to publish a lowering (a rebase) made in the same tick
	// (fenceTable, fenceRebase). Held is the old items' leased units
	// a fenced rebase's new items held (holdLeases).
	Fenced, Raises, Early, Held int64
}

// NewTableAgent returns an agent of region t.Region that reaches the
// region's processes ([Process]) only through the table: any number of
// them (one per process, or a keeper) may run, one holds the role at a
// time, and each resumes from the region's item (holder names it in the
// item). store is as for [NewAgent].
func NewTableAgent(cfg Config, t Table, holder string, store any) (*Agent, error) {
	t = t.withDefaults()
	if err := t.validate(cfg.Regions); err != nil {
		return nil, err
	}
	a, err := NewAgent(cfg, t.Region, &tableLedger{t}, store)
	if err != nil {
		return nil, err
	}
	a.tbl = &tableAgent{t: t, holder: holder, items: map[string]*bucketItem{}}
	if _, ok := store.(storage.Fencer); ok {
		// A bucket fences where its store fences buckets. With leases
		// (a lease on the old item, spent without the store, is held
		// in the new item, holdLeases) only where a test enables it:
		// its raises (FenceRaises; its lowerings wait, fenceFor) or
		// every rebase (fenceLeased) (docs/regions.md, "Bucket: a fence
		// instead of the wait", "A raise fenced").
		_, bf := store.(storage.BucketFencer)
		a.tbl.fenced = cfg.Bucket == nil || bf && (!cfg.Leases || t.fenceLeased || t.FenceRaises)
		a.tbl.waitLower = cfg.Bucket != nil && cfg.Leases && !t.fenceLeased
	}
	if len(a.items) > 0 {
		a.tbl.items[a.items[0].key] = a.items[0]
	}
	return a, nil
}

// TableStats returns the agent's counts on the table.
func (a *Agent) TableStats() TableStats {
	a.tbl.mu.Lock()
	defer a.tbl.mu.Unlock()
	return a.tbl.stats
}

// Holds reports whether the agent held the role at its last tick.
func (a *Agent) Holds() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tbl != nil && a.tbl.epoch != 0
}

func (tb *tableAgent) count(f func(*TableStats)) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	f(&tb.stats)
}

// tableLedger reads the other regions' ledger entries from their items.
type tableLedger struct{ t Table }

func (l *tableLedger) Publish(context.Context, int, State) error {
	return errors.New("regions: a table agent publishes with its board")
}

func (l *tableLedger) Read(ctx context.Context, region int) (State, bool, error) {
	t := l.t
	t.Region = region
	out, err := t.Client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(t.Table), Key: t.key(), ConsistentRead: aws.Bool(true),
		ProjectionExpression: aws.String("s")})
	if err != nil {
		return State{}, false, err
	}
	if _, ok := out.Item["s"].(*types.AttributeValueMemberS); !ok {
		return State{}, false, nil
	}
	it, err := t.parse(out.Item)
	return it.state, err == nil, err
}

// tickTable is Tick through the table: take or keep the role, resume
// from the item, read the others, take the demand the processes wrote,
// receive, give (a lowering or a grant, a rebase or its carry), and save
// the ledger entry, the entry and the state in one conditional write.
func (a *Agent) tickTable(ctx context.Context, now time.Time) error {
	tb := a.tbl
	t := now.UnixNano()
	tb.started = time.Now() // see lapse
	tb.bound = tb.denied.Swap(0) > 0
	it, err := tb.t.load(ctx)
	if err != nil {
		tb.count(func(s *TableStats) { s.LoadErrors++ })
		return err
	}
	took := false
	if tb.epoch == 0 || it.epoch != tb.epoch {
		if tb.epoch != 0 {
			tb.count(func(s *TableStats) { s.Lost++ })
		}
		a.setEpoch(0)
		if it.epoch != 0 && it.lapses >= t {
			tb.count(func(s *TableStats) { s.Standby++ })
			return nil
		}
		it, err = tb.t.acquire(ctx, it.epoch, tb.holder, t, t+int64(tb.t.LockLife), it, tb.stamp(now)+int64(tb.t.Validity))
		if errors.Is(err, errLost) {
			tb.count(func(s *TableStats) { s.Standby++ })
			return nil
		}
		if err != nil {
			return err
		}
		a.setEpoch(it.epoch)
		took = true
		tb.count(func(s *TableStats) { s.Takeovers++ })
	}
	if err := a.resume(it); err != nil {
		return err
	}
	if took {
		// A listed key's hold (wants.go) restarts at a takeover: the
		// predecessor's last short tick is not on the board.
		tb.resync = true
		if tb.listed {
			tb.shortAt = t
		}
		a.takeoverFence(it)
		tb.count(func(s *TableStats) {
			s.ResumedPending += it.board.Pending
			for _, l := range it.board.Lows {
				s.ResumedPending += l.Units
			}
			if len(it.board.Entry.Items) > 1 {
				s.ResumedRebases++
			}
		})
	}
	firstErr := a.readOthers(ctx)
	a.estimateTable(now, it)
	a.receive(now)
	a.offersIn(now)
	firstErr = cmp(firstErr, a.giveTable(ctx, now))
	if !a.Holds() {
		return firstErr // the role was lost at a save before the grant (fenceTable, fenceRebase)
	}
	if a.cfg.Bucket == nil {
		a.holdFirst(now)
	} else {
		a.lateTokens(now)
		if a.brokenEarly {
			firstErr = cmp(firstErr, a.refundOwed(ctx, now))
		}
	}
	a.updateWants(ctx, now)
	wrote := time.Now()
	err = a.save(ctx, now)
	a.count(func(s *AgentStats) { s.Wrote = time.Since(wrote) })
	if err != nil || !a.Holds() {
		return cmp(firstErr, err) // nothing owed is added: under-admits
	}
	tb.count(func(s *TableStats) { s.TokensOut += tb.sent; s.TokensOwed += tb.owing })
	return cmp(firstErr, a.refundOwed(ctx, now))
}

// takeoverFence sets the fence number of a bucket's entries as the agent
// takes the role: a predecessor may have raised the item's fence and
// stopped before it published the rebase (rebaseTable raises first), to
// a number at most the board's Seq plus one; the entries from here on
// carry at least that, so that decisions by them are not refused there.
func (a *Agent) takeoverFence(it tableItem) {
	if a.cfg.Bucket == nil || !a.tbl.fenced {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tbl.fence = max(a.tbl.fence, it.board.Entry.Seq+1)
}

// giveTable is a tick's give through the table: a window's (giveWindow),
// or a bucket's (giveBucketTable), with a fenced rebase made in it
// published and its old item fenced (fenceRebase).
func (a *Agent) giveTable(ctx context.Context, now time.Time) error {
	if a.cfg.Bucket == nil {
		return a.giveWindow(ctx, now)
	}
	err := a.giveBucketTable(ctx, now)
	if ferr := a.fenceRebase(ctx, now); !errors.Is(ferr, errLost) {
		err = cmp(err, ferr)
	}
	return err
}

// estimateTable is estimate through the table, on the units the demand
// counter gained since the last tick weighed (the board's Seen, at its
// Tick). A held tick leaves them as they are, so that the next tick
// counts from there, whichever process holds the role then.
func (a *Agent) estimateTable(now time.Time, it tableItem) {
	tb := a.tbl
	a.offered.Store(max(it.demand-it.board.Seen, 0))
	tb.counted = now.UnixNano()
	if a.estimate(now, a.took(now, tb.started)) {
		tb.seen, tb.counted = it.board.Seen, it.board.Tick
	}
}

// givingUnderWay reports whether the agent, holding the role, has a
// grant under way that a later tick finishes: a window's units withheld
// for it, a bucket's rebase not yet carried, or an offer not settled.
func (a *Agent) givingUnderWay() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tbl != nil && a.tbl.epoch != 0 && (a.pending > 0 || len(a.items) > 1 || a.openOffers > 0)
}

func (a *Agent) setEpoch(e int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tbl.epoch = e
}

// readOthers is a tick's read of the other regions' entries (Tick's and
// tickTable's).
func (a *Agent) readOthers(ctx context.Context) error {
	var firstErr error
	for o := range a.cfg.Regions {
		if o == a.r {
			continue
		}
		st, found, err := a.ledger.Read(ctx, o)
		if err != nil {
			a.count(func(s *AgentStats) { s.ReadErrors++ })
			firstErr = cmp(firstErr, err)
			continue
		}
		// A region's entries replicate in order, but never step back.
		if found && len(st.Given) == a.cfg.Regions && st.Seq >= a.states[o].Seq {
			a.states[o] = st
		}
	}
	return firstErr
}

// resume sets the agent's own state from the item as read at the start
// of a tick: its ledger entry, the lowering on record, the bucket's
// items, the demand counter.
func (a *Agent) resume(it tableItem) error {
	tb := a.tbl
	a.mu.Lock()
	defer a.mu.Unlock()
	if it.hasState && len(it.state.Given) == a.cfg.Regions {
		a.states[a.r] = it.state
		a.resumeOffers(it.state)
	}
	b := it.board
	tb.lows = slices.Clone(b.Lows)
	if b.Pending > 0 && len(tb.lows) == 0 { // a board of one lowering
		tb.lows = []lowering{{Units: b.Pending, From: b.From, Ready: b.Ready}}
	}
	a.pending = 0
	for _, l := range tb.lows {
		a.pending += l.Units
	}
	tb.maxUntil, tb.seq, tb.seen = b.MaxUntil, b.Entry.Seq, it.demand
	// A bucket item's fence this agent raised to a number not on the
	// board (its rebase's save lost: rebaseTable raises first) is never
	// above the entries it publishes: they would be refused there.
	tb.fence, tb.unsaved = max(b.Entry.Fence, tb.raisedTo), false
	tb.listed, tb.wantsTry = b.Wants, b.WantsTry
	tb.in, tb.inForce = nil, nil
	if len(b.In) == a.cfg.Regions {
		tb.in = slices.Clone(b.In)
	}
	tb.took, tb.owe, tb.sent, tb.owing = slices.Clone(b.Took), nil, 0, 0
	if b.Tick != 0 {
		a.last = time.Unix(0, b.Tick)
	}
	if a.cfg.Bucket == nil || len(b.Entry.Items) == 0 {
		return nil
	}
	items := make([]*bucketItem, 0, len(b.Entry.Items))
	for _, s := range b.Entry.Items {
		bi := tb.items[s.Key]
		if bi == nil {
			bi = &bucketItem{key: s.Key, from: s.From, share: s.Share, extra: s.Extra}
			if s.Held != nil {
				bi.held, bi.heldOK = *s.Held, true
			}
			if s.Share > 0 {
				bi.cfg = a.cfg.bucketFor(s.Share, false)
				own, err := limiter.NewTokenBucket(a.store.(storage.BucketStore), bi.cfg)
				if err != nil {
					return err
				}
				bi.own = own
				bi.cfg.Leases = a.cfg.Leases
			}
			tb.items[s.Key] = bi
		} else {
			// What the board says was added (a save lost: what this
			// agent added meanwhile was not refunded), but a carry made
			// here and not yet saved.
			bi.extra = s.Extra
			if s.Held != nil {
				bi.held, bi.heldOK = *s.Held, true
			}
		}
		items = append(items, bi)
	}
	a.items = items
	return nil
}

// save publishes the tick: the ledger entry, the entry valid for
// Validity, the state, the role extended for LockLife.
func (a *Agent) save(ctx context.Context, now time.Time) error {
	tb := a.tbl
	t := now.UnixNano()
	a.mu.Lock()
	own := &a.states[a.r]
	own.Seq++
	prev := own.At
	own.At = t
	a.saveOffers(own, prev)
	pub := *own
	pub.Offers = slices.Clone(own.Offers)
	pub.Took = slices.Clone(own.Took)
	pub.Marks = slices.Clone(own.Marks)
	pub.Open = slices.Clone(own.Open)
	pub.Thru = slices.Clone(own.Thru)
	pub.Given = slices.Clone(own.Given)
	pub.Future = slices.Clone(own.Future)
	pub.Tokens = slices.Clone(own.Tokens)
	pub.Moves = slices.Clone(own.Moves)
	b := board{Lows: slices.Clone(tb.lows), Seen: tb.seen, Tick: tb.counted, Wants: tb.listed, WantsTry: tb.wantsTry}
	until := tb.stamp(now) + int64(tb.t.Validity) // see Table.extend
	if tb.t.brokenLapse {
		until = t + int64(tb.t.Validity)
	}
	if tb.fenced && tb.fence == 0 {
		// Every entry carries a fence number (0 would be no fence, never
		// refused), so that a lowering's, higher, refuses those before.
		tb.fence = 1
	}
	b.Entry = Entry{Seq: tb.seq + 1, Until: until, Fence: tb.fence}
	b.MaxUntil = max(tb.maxUntil, b.Entry.Until)
	if a.cfg.Bucket != nil {
		b.In = slices.Clone(tb.in)
		b.Took = slices.Clone(tb.took)
		for _, it := range a.items {
			st := ItemStep{Key: it.key, From: it.from, Share: it.share, Extra: it.extra}
			if it.heldOK {
				st.Held = new(it.held)
			}
			b.Entry.Items = append(b.Entry.Items, st)
		}
	} else {
		b.Entry.Caps = a.capSteps(t)
	}
	epoch := tb.epoch
	a.mu.Unlock()
	lapses := tb.lapse(t)
	if !tb.t.brokenLapse {
		lapses = min(lapses, until) // the role lapses with the entry
	}
	err := tb.t.save(ctx, epoch, pub, b, lapses)
	switch {
	case errors.Is(err, errLost):
		a.setEpoch(0)
		tb.count(func(s *TableStats) { s.Lost++ })
		return nil
	case err != nil:
		// Whether it was written is unknown: the next tick resumes from
		// the item either way.
		tb.count(func(s *TableStats) { s.SaveErrors++ })
		a.count(func(s *AgentStats) { s.PublishErrors++ })
		return err
	}
	a.count(func(s *AgentStats) { s.Published++ })
	a.mu.Lock()
	tb.seq, tb.maxUntil, tb.unsaved = b.Entry.Seq, b.MaxUntil, false // a later save of the tick (fenceTable)
	a.mu.Unlock()
	return nil
}

// lapse is when the role written by the save of a tick stamped t lapses:
// LockLife after the save is sent, plus as long again as the tick took
// so far (at most LockLife), the time the holder's next tick is expected
// to take before its save extends the role again. Extended from the
// tick's stamp only (t + LockLife, before), the role lapsed whenever a
// tick and the next one together outlasted LockLife (two ticks of 400 ms
// on a loaded host), and another container took it: the holder's next
// save was refused, and the role moved at every slow tick
// (TestRoleKeptUnderSlowTicks). How long the tick took is read on the
// process's monotonic clock (a simulated stamp does not pass while the
// requests wait); the lapse is compared with the other containers'
// clocks, which agree with this one's within milliseconds. A holder that
// stopped keeps the role up to twice its last tick longer, but no longer
// than its entry (save; docs/regions.md, "The entry while the holder is
// quiet").
func (tb *tableAgent) lapse(t int64) int64 {
	if tb.brokenLife {
		return t + int64(tb.t.LockLife)
	}
	took := time.Since(tb.started)
	return t + int64(took+tb.t.LockLife+min(took, tb.t.LockLife))
}

// capSteps is a window's caps by stamp from t on: the share less what is
// withheld from the lowering's stamp on, plus each grant to come from its
// stamp on. Under a.mu.
func (a *Agent) capSteps(t int64) []CapStep {
	type change struct{ at, d int64 }
	base := a.owned
	var cs []change
	for _, l := range a.tbl.lows {
		if l.From <= t {
			base -= l.Units
		} else {
			cs = append(cs, change{l.From, -l.Units})
		}
	}
	for _, f := range a.incoming {
		if f.At <= t {
			base += f.Units
		} else {
			cs = append(cs, change{f.At, f.Units})
		}
	}
	slices.SortFunc(cs, func(x, y change) int { return int(min(max(x.at-y.at, -1), 1)) })
	steps := []CapStep{{At: minStamp, Cap: max(base, 0)}}
	c := base
	for _, ch := range cs {
		c += ch.d
		if last := &steps[len(steps)-1]; last.At == ch.at {
			last.Cap = max(c, 0)
		} else {
			steps = append(steps, CapStep{At: ch.at, Cap: max(c, 0)})
		}
	}
	return steps
}

// lowering is units withheld through the table for window grants: the
// cap is lower by them for decisions stamped from From, a stamp no
// earlier than the validity of every entry published before the
// lowering, and the count may be read for a grant of them from Ready
// (From + Deadline), when every decision that read a higher cap is past
// its deadline.
//
// Through a store that fences (Fence, the fence number of the entry that
// published it), a lowering is in force at every stamp (From is
// minStamp) and ready once the region's counters' fence is raised to
// Fence: a decision that read a higher cap decided with a lower fence
// number, and its take reached the store before the raise or is refused
// (Ready is then the stamp of the tick that made it, for the release
// rule of lowerTable).
type lowering struct {
	Units int64 `json:"u"`
	From  int64 `json:"f"`
	Ready int64 `json:"r"`
	Fence int64 `json:"fn,omitempty"`
}

// lowerTable is a window grant's step 1 and 2 through the table, for the
// plan g (summing to want): it withholds what the plan asks beyond the
// lowerings on record, and what the region's own demand leaves (holdFor),
// in a new one (while the others wait), releases what the plan no longer
// asks and the region's own demand needs (the newest first), and returns
// what may be given now, g scaled to it: what the plan asks, at most the
// units of the ready lowerings; and the latest Ready of those (readyBy:
// the caller waits until then before it reads its count).
func (a *Agent) lowerTable(now time.Time, g []int64, want int64) (int64, int64) {
	tb, t := a.tbl, now.UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	want = clampPlan(g, want, a.owned)
	hold := a.holdFor(want)
	switch {
	case hold > a.pending && tb.fenced:
		// In force at every stamp of the entry that publishes it (the
		// next save: its Seq is the fence number, above every entry's
		// before), ready once the counters' fence is raised to it
		// (fenceTable).
		tb.fence = max(tb.fence+1, tb.seq+1)
		tb.lows = append(tb.lows, lowering{Units: hold - a.pending, From: minStamp, Ready: t, Fence: tb.fence})
		tb.unsaved = true
		a.pending = hold
		tb.count(func(s *TableStats) { s.Fenced++ })
	case hold > a.pending:
		from := max(tb.maxUntil, t)
		tb.lows = append(tb.lows, lowering{Units: hold - a.pending, From: from, Ready: from + int64(tb.t.Deadline)})
		a.pending = hold
	case hold < a.pending:
		// A withheld unit released and withheld again waits anew (the
		// entries published meanwhile show it): keep what the region's
		// own demand leaves, for the plan to give at once when it asks,
		// but no longer than a validity past its lowering's Ready (a
		// region whose plan asks nothing then gets its units back: its
		// own bursts need them more than a plan that does not ask).
		var fresh int64
		for _, l := range tb.lows {
			if t < l.Ready+int64(tb.t.Validity) {
				fresh += l.Units
			}
		}
		keep := max(hold, min(a.pending, fresh, a.owned-int64(a.cfg.need(a.states[a.r].Demand))))
		if tb.fenced {
			keep = hold // withheld again at once: as in memory
		}
		release := func(i int) {
			d := min(tb.lows[i].Units, a.pending-keep)
			tb.lows[i].Units -= d
			a.pending -= d
		}
		for i := 0; i < len(tb.lows) && a.pending > keep; i++ { // the stale ones first
			if t >= tb.lows[i].Ready+int64(tb.t.Validity) {
				release(i)
			}
		}
		for i := len(tb.lows) - 1; i >= 0 && a.pending > keep; i-- { // then the newest
			release(i)
		}
		tb.lows = slices.DeleteFunc(tb.lows, func(l lowering) bool { return l.Units <= 0 })
	}
	a.stats.Withheld = max(a.stats.Withheld, a.pending)
	ready, by := a.readyBy(now)
	return clampPlan(g, want, ready), by
}

// holdFor is what a window's lowering withholds through the table when
// the plan asks want: once the plan asks anything, or the tick's count
// fell far below the estimate (falling: a first such tick, which the
// estimate weighs in at the bound only), the share less what the
// region's own demand needs (at most the tick's rate, when falling), and
// at least want. A lowering is ready a validity and a deadline after it
// is made, however few units it withholds; the plan asks little of a
// region whose demand just left while the others' demands it reads are
// a lag old, and more a lag later, when it reads where the demand went:
// withheld then, those units waited their own validity and deadline
// (and before they were withheld, while the estimate still counted the
// first tick's fall at its bound, a tick more). Units withheld beyond
// what the plan asks only deny more until the region's demand needs
// them (the next tick releases them, lowerTable). Through a store that
// fences, a lowering is ready in the tick that makes it: there is no wait
// to start early or to save, and a lowering in force at every stamp
// would deny the region's own decisions at once (a tick without
// decisions, falling, would cut its cap to nothing until the next), so
// it withholds what the plan asks, as in memory. Under a.mu.
func (a *Agent) holdFor(want int64) int64 {
	if a.brokenHold || a.tbl.fenced || want == 0 && !a.falling {
		return want
	}
	d := a.states[a.r].Demand
	if a.falling {
		d = min(d, a.tickRate)
	}
	return max(want, a.owned-int64(a.cfg.need(d)))
}

// readySlack is how far ahead of a tick's stamp (as far as the tick has
// run) a lowering's Ready may be for the tick to wait for it
// (readyBy): a Ready is a validity and a deadline past the stamp of a
// save, late in an earlier tick, so a tick stamped that much later
// (eight ticks of 250 ms after it) finds it a few milliseconds ahead,
// and without the wait the grant waited a whole tick more.
const readySlack = 50 * time.Millisecond

// readyBy is the units of the lowerings ready by the tick at now, and
// the latest Ready among them: those whose Ready is past, or at most
// readySlack ahead of the tick's stamp so far (the caller waits until
// then: waitReady), and in effect by the tick's stamp (its From: the
// grant's first part is in force from that stamp). Under a.mu.
func (a *Agent) readyBy(now time.Time) (ready, by int64) {
	tb, t := a.tbl, now.UnixNano()
	r := t
	if !a.brokenReady {
		r = tb.stamp(now) + int64(readySlack)
	}
	for _, l := range tb.lows {
		switch {
		case l.Fence > 0: // once the fence is raised (fenceTable)
			ready += l.Units
		case r >= l.Ready && t >= l.From || a.brokenWait:
			ready += l.Units
			by = max(by, l.Ready)
		}
	}
	return ready, by
}

// fenceTable makes the lowerings ready by the tick ready to give from,
// through a store that fences: it publishes a lowering made this tick
// (a save before the grant's; the tick's own save publishes the grant),
// then raises the region's counters' fence to the latest lowering's
// fence number, unless this agent already did (the fence never lowers).
// From then on a decision that read a higher cap has taken what it took
// (the count read next shows it) or takes nothing. It is idempotent: a
// successor that resumes a lowering raises the fence again; a holder
// that lost the role and raises a fence number on record changes
// nothing (the entries published since carry it or a higher one), and
// publishes no grant (its save is refused).
func (a *Agent) fenceTable(ctx context.Context, now time.Time) error {
	tb := a.tbl
	a.mu.Lock()
	fenced, unsaved := false, tb.unsaved
	for _, l := range tb.lows {
		fenced = fenced || l.Fence > 0
	}
	f := tb.fence
	a.mu.Unlock()
	if !fenced {
		return nil
	}
	if unsaved {
		if err := a.save(ctx, now); err != nil {
			return err // the units stay withheld (if the save landed): the next tick gives them
		}
		if !a.Holds() {
			return errLost // nothing is given: the tick ends (tickTable)
		}
		tb.count(func(s *TableStats) { s.Early++ })
		if tb.stopEarly {
			return errStopped
		}
	}
	if tb.raised >= f || tb.brokenFence {
		return nil
	}
	if err := a.peek.RaiseFence(ctx, a.key(), f); err != nil {
		return fmt.Errorf("regions: raising region %d's fence to %d: %w", a.r, f, err)
	}
	tb.raised = f
	tb.count(func(s *TableStats) { s.Raises++ })
	return nil
}

// waitReady waits until the tick's stamp (as far as it has run) is at
// least by, a lowering's Ready: from then on, every decision that read a
// higher cap is past its deadline, and the count may be read.
func (a *Agent) waitReady(ctx context.Context, now time.Time, by int64) error {
	d := time.Duration(by - a.tbl.stamp(now))
	if d <= 0 || a.brokenWait {
		return nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return nil
	}
}

// firstHold is how far ahead of a region's first entry the units its
// own demand leaves are withheld (holdFirst): two ticks, for the next
// ticks to release them where the region's demand shows before they are
// (through Keys a tick comes with a decision at most every 250 ms, and
// takes a few requests).
const firstHold = 500 * time.Millisecond

// holdFirst withholds, with the region's first entry (a window's), the
// units its own demand leaves (its share less what its demand needs:
// nearly all of it, before it knows any), from a tick ahead: no entry was
// published before, so the lowering is ready a deadline later, and a
// grant of them, when the plan asks, is made at once. (Any later
// lowering takes effect past the validity of the entries published
// before it: a region that idles at the start would give its share
// about a validity later.) Units its demand needs are released by the
// next ticks (lowerTable). Through a store that fences a lowering waits
// for nothing, and none is made.
func (a *Agent) holdFirst(now time.Time) {
	tb := a.tbl
	a.mu.Lock()
	defer a.mu.Unlock()
	if tb.maxUntil != 0 || a.pending != 0 || tb.fenced {
		return
	}
	u := a.owned - int64(a.cfg.need(a.states[a.r].Demand))
	if u <= 0 {
		return
	}
	from := now.Add(firstHold).UnixNano()
	tb.lows = []lowering{{Units: u, From: from, Ready: from + int64(tb.t.Deadline)}}
	a.pending = u
}

// consume takes n given units out of the ready lowerings, the oldest
// first. Under a.mu.
func (tb *tableAgent) consume(n int64) {
	for i := range tb.lows {
		d := min(tb.lows[i].Units, n)
		tb.lows[i].Units -= d
		n -= d
	}
	tb.lows = slices.DeleteFunc(tb.lows, func(l lowering) bool { return l.Units <= 0 })
}

// refilled is what u units of a bucket's share refill in d at their part
// of the bucket's rate (u/units of it), at most u.
func (c Config) refilled(u int64, d time.Duration) int64 {
	b := c.Bucket
	r := float64(u) * float64(b.RefillAmount) * d.Seconds() / (float64(c.units()) * b.RefillTime.Seconds())
	return max(min(int64(r), u), 0)
}

// errStopped (tests): a tick stopped on purpose (stopEarly).
var errStopped = errors.New("regions: the tick stopped (a test)")

// errRebasing: a rebase is under way (its carry not yet made).
var errRebasing = errors.New("regions: a rebase is under way")

// giveBucketTable is giveBucket through the table: first the carry of a
// rebase under way, if its new item is in force; then the grant, in
// force from the stamp the region's bucket takes its new share, if that
// is ahead.
func (a *Agent) giveBucketTable(ctx context.Context, now time.Time) error {
	t := now.UnixNano()
	if err := a.carryTable(ctx, now); err != nil {
		return err
	}
	a.mu.Lock()
	own := &a.states[a.r]
	own.Future = slices.DeleteFunc(own.Future, func(f Grant) bool { return f.At <= t })
	before := slices.Clone(own.Given)
	a.mu.Unlock()
	err := a.giveBucket(ctx, now)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err == nil && a.tbl.inForce != nil {
		// The grants in force are in the share of the item now last
		// (their refill in transit in it: rebaseTable), or joined a
		// share that kept its rate (units received and given at once):
		// they have left transit. Not so while a rebase is under way
		// or when one failed (its item is not listed). Never back: a
		// view of a giver older than the board's (a successor's) must
		// not credit its grants again.
		for o, f := range a.tbl.inForce {
			a.tbl.in[o] = max(a.tbl.in[o], f)
		}
	}
	if errors.Is(err, errRebasing) {
		err = nil
	}
	if at := a.items[len(a.items)-1].from; at > t {
		for o, g := range own.Given {
			if d := g - before[o]; d > 0 {
				own.Future = append(own.Future, Grant{To: o, Units: d, At: at})
			}
		}
	}
	return err
}

// rebaseTable starts a rebase to s units through the table: the new item,
// empty at its first stamp, takes over from a stamp no earlier than the
// validity of every entry published so far (no process decides a stamp
// from then on by an entry without it); through a store that fences
// buckets, it raises the old item's fence first and takes over just
// after the raise returned (rebaseAhead past it, and Skew), the new item
// holding the old item's leased units (holdLeases) or, where it cannot,
// after that validity. The carry is made by a later
// tick (carryTable). The grants in force since the last item (all in
// its share) refill in no region's item from the stamp their giver's
// rate left (its new item's first, Move.At) until the new one takes
// over: the new item holds at its first stamp what they refilled
// meanwhile (extra: transit, each at most its units), as a bucket of
// their capacity at their rate would have; a raise's units no giver
// listed count from now. Put there before the item is listed (with the
// board's In past them), they are added once whoever makes the carry.
func (a *Agent) rebaseTable(ctx context.Context, now time.Time, s int64) error {
	tb := a.tbl
	a.mu.Lock()
	busy, from := len(a.items) > 1, max(now.Add(a.ahead).UnixNano(), tb.maxUntil)
	old, f := a.items[len(a.items)-1], max(tb.fence+1, tb.seq+1)
	raise := s - old.share
	in, inForce := slices.Clone(tb.in), slices.Clone(tb.inForce)
	a.mu.Unlock()
	if busy {
		return errRebasing
	}
	var hold, holdUntil int64
	fence, err := a.fences(ctx, now, old, raise, from)
	if err != nil {
		return err // nothing is listed or given
	}
	if fence {
		if from, hold, holdUntil, err = a.fencedStart(ctx, now, old, f, s, from); err != nil {
			return err // nothing is listed or given; the next entries carry f (raisedTo)
		}
	}
	it, err := a.newItem(ctx, time.Unix(0, from), s, hold == 0)
	if err != nil {
		return err
	}
	if hold > 0 && it.own != nil {
		if err := a.holdLeases(ctx, it, from, hold, holdUntil); err != nil {
			return err // the item is not listed: unused
		}
	}
	it.mine = true
	var fromTick, tokens int64
	var recs []took
	if it.own != nil {
		credit, units, k, rs := a.transit(in, inForce, from)
		recs, tokens = rs, k
		if raise > 0 {
			fromTick = min(a.cfg.refilled(raise, time.Duration(from-now.UnixNano())), s)
		}
		if raise > units {
			credit += a.cfg.refilled(raise-units, time.Duration(from-now.UnixNano()))
		}
		it.extra = min(credit, s)
		if a.brokenExtra && raise > 0 {
			it.extra = raise
		}
		// In the item before it is listed: a successor that redoes the
		// carry finds them there, never adds them twice.
		if it.extra > 0 {
			if err := it.own.Refund(ctx, it.key, time.Unix(0, from), it.extra); err != nil {
				return err // the item is not listed: unused
			}
		}
	}
	tb.count(func(st *TableStats) {
		st.Refilled += max(it.extra-tokens, 0)
		st.RefilledFromTick += fromTick
		st.TokensIn += min(tokens, it.extra)
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	a.items = append(a.items, it)
	tb.items[it.key] = it
	for i := range recs {
		recs[i].Item = it.from
	}
	tb.took = append(tb.took, recs...)
	if n := len(tb.took); n > moveMax {
		tb.took = slices.Delete(tb.took, 0, n-moveMax)
	}
	a.stats.Rebases++
	if fence {
		// Published with the fence number the old item's fence was
		// raised to, above every one before (fenceRebase).
		tb.fence = max(tb.fence, f)
		tb.unsaved = true
		tb.count(func(s *TableStats) { s.Fenced++ })
	}
	return nil
}

// fenceFor reports whether a rebase that raises the region's share by
// raise units (below 0: lowers it) is fenced. With leases a raise's hold
// always fits (the old item's leased units are within its share, below
// the new one) and saves the wait for the entries published before:
// meanwhile the region decides at its old share, and the grants' refill
// in transit stops at their units (about 0.75 s of their rate lost). A
// lowering keeps the wait (every rebase fenced with leases measured
// below the wait: docs/regions.md).
func (tb *tableAgent) fenceFor(raise int64) bool {
	if !tb.fenced || !tb.waitLower {
		return tb.fenced
	}
	return raise > 0 && !tb.brokenRaiseWait
}

// fences reports whether a rebase from item old that raises the share
// by raise units (below 0: lowers it) is fenced (fenceFor), and with
// leases a raise only where it gains (raiseWorth).
func (a *Agent) fences(ctx context.Context, now time.Time, old *bucketItem, raise, wait int64) (bool, error) {
	if !a.tbl.fenceFor(raise) || !a.tbl.waitLower {
		return a.tbl.fenceFor(raise), nil
	}
	return a.raiseWorth(ctx, now, old, raise, wait)
}

// raiseWorth reports whether a raise by raise units of a bucket with
// leases gains by its fence: the wait (its first stamp at wait) costs
// about what the raise's units refill meanwhile, where the fence costs
// the old item's leased units, held in the new item (holdLeases) for 1
// to 2.4 s, and lost where the processes leave their leases on the old
// item unspent. A region whose share creeps up by a few units a tick
// (grants of 1-10) while its processes lease tens held its units back
// raise after raise (docs/regions.md, "A raise fenced").
// brokenRaiseWorth (tests): every raise is fenced.
func (a *Agent) raiseWorth(ctx context.Context, now time.Time, old *bucketItem, raise, wait int64) (bool, error) {
	if old.own == nil || a.tbl.brokenRaiseWorth {
		return true, nil
	}
	t := a.tbl.stamp(now)
	l, err := a.leasedAt(ctx, old, t)
	if err != nil {
		return false, err
	}
	return l < a.cfg.refilled(raise, time.Duration(wait-t)), nil
}

// fencedStart is a fenced rebase's first steps (rebaseTable): it raises
// old's fence to f and returns the new item's first stamp, after the
// raise returned (and Skew, the processes' clocks), and with leases the
// old item's leased units for the new item to hold (until holdUntil), or
// the wait's first stamp (wait) where the new share s cannot hold them.
// The entries published before are refused on the old item once its
// fence is raised: no wait for them. A decision by one that reached the
// old item before the raise was stamped before the first stamp, so the
// claim there (carryTable) reads every take the old item will ever have
// at stamps from it on. (Published first, the raise after, such a
// decision, stamped past that stamp, took the old item's refills beside
// the new item's: brokenOrder.)
func (a *Agent) fencedStart(ctx context.Context, now time.Time, old *bucketItem, f, s, wait int64) (from, hold, holdUntil int64, err error) {
	tb := a.tbl
	raisedAt := tb.stamp(now)
	if !tb.brokenOrder {
		if raisedAt, err = a.raiseItem(ctx, now, old, f); err != nil {
			return 0, 0, 0, err
		}
		time.Sleep(tb.pauseRaised)
	}
	from = max(raisedAt+int64(a.ahead), raisedAt+int64(a.cfg.Skew)+1, old.from+1)
	if !a.cfg.Leases || old.own == nil || tb.brokenOrder {
		return from, 0, 0, nil
	}
	// The old item's leases taken before the raise are spent without the
	// store, by processes that still hold an entry without the new item,
	// at stamps from from on too, until they end (by holdUntil).
	l, err := a.leasedAt(ctx, old, raisedAt+int64(a.cfg.Skew)+1)
	switch {
	case err != nil:
		return 0, 0, 0, err
	case tb.brokenLeaseHold:
		return from, 0, 0, nil
	case l > s:
		return max(from, wait), 0, 0, nil
	}
	return from, l, raisedAt + int64(a.cfg.Skew) + int64(storage.MaxLeaseLife), nil
}

// leasedAt is the units of live capacity leases the bucket of item it
// holds at stamp t (a read).
func (a *Agent) leasedAt(ctx context.Context, it *bucketItem, t int64) (int64, error) {
	bs, ok := a.store.(storage.BucketStore)
	if !ok {
		return 0, fmt.Errorf("regions: region %d's store is not a bucket store (%T)", a.r, a.store)
	}
	c := it.own.Config()
	op := storage.BucketOp{MaxAmount: c.MaxAmount, RefillTime: c.RefillTime, RefillAmount: c.RefillAmount, Now: t, Mode: storage.ModePeek}
	d, err := bs.UpdateBucket(ctx, a.oldKey(it), op, it.ttl())
	if err != nil {
		return 0, fmt.Errorf("regions: reading the leases of region %d's item %q: %w", a.r, it.key, err)
	}
	return d.Leased, nil
}

// holdLeases prepares new item it (not yet listed, never written: full at
// its first stamp from) holding n units of its capacity as a capacity
// lease of nobody's, in a slot that expires no sooner than stamp until,
// and empty besides: n is the old item's units leased before its fence
// rose, which processes holding an entry without the new item may spend
// at stamps from from on until their leases end (by until). So the
// region holds, from from on, the new item's tokens and those leases
// within the new share, as the old item held them within the old one;
// once they have ended the hold's units leave the bucket (storage's
// lease expiry), as theirs do.
func (a *Agent) holdLeases(ctx context.Context, it *bucketItem, from, n, until int64) error {
	bs, ok := a.store.(storage.BucketStore)
	if !ok {
		return fmt.Errorf("regions: region %d's store is not a bucket store (%T)", a.r, a.store)
	}
	c := it.own.Config()
	// The slot's label e expires at (e+2) epochs (storage's epochExpiry);
	// a fresh item's first lease slot is labelled its op's epoch plus
	// two (leaseAhead): checked on the answer.
	le := int64(storage.LeaseEpoch)
	e := (until+le-1)/le - 2
	op := storage.BucketOp{MaxAmount: c.MaxAmount, RefillTime: c.RefillTime, RefillAmount: c.RefillAmount, Now: from,
		N: n, Want: n, Epoch: e - 2, Mode: storage.ModeLease}
	d, err := bs.UpdateBucket(ctx, a.oldKey(it), op, max(it.ttl(), 3*storage.LeaseEpoch))
	if err != nil {
		return fmt.Errorf("regions: holding %d leased units in %q: %w", n, it.key, err)
	}
	if !d.Allowed || d.Granted != n || d.LeaseRef < e {
		return fmt.Errorf("regions: holding %d leased units in %q until %d: %+v", n, it.key, until, d)
	}
	if n < it.share {
		dd, err := it.own.AllowN(ctx, it.key, time.Unix(0, from), it.share-n)
		if err != nil {
			return err
		}
		if !dd.Allowed {
			return fmt.Errorf("regions: new bucket item %q not full at its first stamp: %+v", it.key, dd)
		}
	}
	it.hold = n
	a.tbl.count(func(s *TableStats) { s.Held += n })
	return nil
}

// transit is what the grants to this region in force since in (per
// giver, its running total given this region; to inForce) hold at from,
// this region's new item's first stamp: each listed in its giver's entry
// (Move) is a bucket of its units holding the tokens carried with it
// (none until its giver's carry is read: lateTokens adds them later)
// refilled at their rate from its giver's stamp At until from less Skew,
// at most its units (accrued). units is the units of those listed, and
// tokens their tokens; the rest count from the receiver's tick
// (rebaseTable). recs are the grants listed whose tokens were not read
// yet, each with its credit (their Item is the caller's to set).
func (a *Agent) transit(in, inForce []int64, from int64) (credit, units, tokens int64, recs []took) {
	if len(in) != a.cfg.Regions || len(inForce) != a.cfg.Regions {
		return 0, 0, 0, nil
	}
	for o, ap := range a.applied {
		if o == a.r {
			continue
		}
		for _, m := range ap.Moves {
			if m.To != a.r || m.Upto <= in[o] || m.Upto > inForce[o] || m.Units <= 0 {
				continue
			}
			units += m.Units
			k := min(max(m.Tokens, 0), m.Units)
			c := k + a.accrued([]Move{m}, in[o], from-int64(a.cfg.Skew))
			credit += c
			tokens += k
			if k == 0 {
				recs = append(recs, took{From: o, Upto: m.Upto, Units: m.Units, Credit: c})
			}
		}
	}
	return credit, units, tokens, recs
}

// fenceRebase publishes a fenced rebase made this tick (rebaseTable: the
// old item's fence already raised to the number of the entry that lists
// the new item, which takes over after the raise returned) with a save
// before the tick's own: the grant is in force from the new item's first
// stamp. The tick's own save publishes what follows (the tokens owed,
// the wants). brokenOrder (tests): the raise comes after this save, as
// before.
func (a *Agent) fenceRebase(ctx context.Context, now time.Time) error {
	tb := a.tbl
	a.mu.Lock()
	unsaved := tb.unsaved && a.cfg.Bucket != nil && len(a.items) > 1
	a.mu.Unlock()
	if !unsaved {
		return nil
	}
	if err := a.save(ctx, now); err != nil {
		return err // published or not: the old item is fenced either way
	}
	if !a.Holds() {
		return errLost
	}
	tb.count(func(s *TableStats) { s.Early++ })
	if tb.stopEarly {
		return errStopped
	}
	if tb.brokenOrder {
		return a.raiseOld(ctx, now)
	}
	return nil
}

// raiseOld raises the fence of the item a rebase under way replaces (the
// first of two) to the fence number of the latest entry, unless this
// agent already did (brokenOrder's raise, after the entry is published,
// and its carry's; a rebase made in order raised it before it listed the
// new item: rebaseTable).
func (a *Agent) raiseOld(ctx context.Context, now time.Time) error {
	tb := a.tbl
	a.mu.Lock()
	if len(a.items) < 2 {
		a.mu.Unlock()
		return nil
	}
	old, f := a.items[0], tb.fence
	a.mu.Unlock()
	_, err := a.raiseItem(ctx, now, old, f)
	return err
}

// raiseItem raises the fence of item old to f, unless this agent already
// did, and returns the agent's stamp once the raise returned (a decision
// by an entry of a lower number that reached the item took it before
// then). Idempotent (a fence never lowers). The entries this agent
// publishes from now on carry f at least (raisedTo), whatever the raise
// answers.
func (a *Agent) raiseItem(ctx context.Context, now time.Time, old *bucketItem, f int64) (int64, error) {
	tb := a.tbl
	a.mu.Lock()
	done := old.raised >= f
	if !done && !tb.brokenFence && old.own != nil && f > 0 {
		tb.raisedTo, tb.fence = max(tb.raisedTo, f), max(tb.fence, f)
	}
	a.mu.Unlock()
	if done || tb.brokenFence || old.own == nil || f <= 0 {
		return tb.stamp(now), nil
	}
	fs, ok := a.store.(storage.Fencer)
	if !ok {
		return 0, fmt.Errorf("regions: region %d's store does not fence (%T)", a.r, a.store)
	}
	ttl := a.fenceTTL()
	if tb.brokenFenceTTL {
		ttl = old.ttl()
	}
	if err := fs.RaiseFence(ctx, a.oldKey(old), f, ttl); err != nil {
		return 0, fmt.Errorf("regions: raising the fence of region %d's item %q to %d: %w", a.r, old.key, f, err)
	}
	at := tb.stamp(now)
	a.mu.Lock()
	old.raised, old.raisedAt = f, at
	a.mu.Unlock()
	tb.count(func(s *TableStats) { s.Raises++ })
	return at, nil
}

// oldKey is the store's key of item it's bucket.
func (a *Agent) oldKey(it *bucketItem) storage.Key {
	return storage.Key{Space: it.own.Space(), Name: it.key}
}

// fenceTTL is how long a fenced rebase's old item, and its fence, must be
// kept from its raise and from its claim, its last write (a take the
// claim leaves nothing for writes nothing): past the validity of every
// entry published before the rebase (at most Validity past a save made
// before either) and the deadline of a decision by one, and Skew. The
// bucket's own TTL (the time it refills from empty) may be shorter: a
// state dropped then is the full bucket a new one would be, but a
// dropped fence would let a decision by an older entry take from it at
// its old rate.
func (a *Agent) fenceTTL() time.Duration {
	return a.tbl.t.Validity + a.tbl.t.Deadline + a.cfg.Skew
}

// claim takes n tokens of the old item it at stamp at (carryTable); a
// fenced rebase's through the store, kept fenceTTL.
func (a *Agent) claim(ctx context.Context, it *bucketItem, at time.Time, n int64) (bool, error) {
	bs, ok := a.store.(storage.BucketStore)
	if !a.tbl.fenced || !ok {
		d, err := it.own.AllowN(ctx, it.key, at, n)
		return d.Allowed, err
	}
	c := it.own.Config()
	op := storage.BucketOp{MaxAmount: c.MaxAmount, RefillTime: c.RefillTime, RefillAmount: c.RefillAmount, Now: at.UnixNano(), N: n}
	ttl := max(a.fenceTTL(), it.ttl())
	if a.tbl.brokenFenceTTL {
		ttl = it.ttl()
	}
	d, err := bs.UpdateBucket(ctx, a.oldKey(it), op, ttl)
	return d.Allowed, err
}

// carryTable moves the old item's free tokens to the new one once the new
// one is in force (at its first stamp, at): it claims them with a take at
// at, which no other mover (a predecessor that resumed) can also get,
// then gives them to the new item, at most its capacity. Nobody decides
// on the old item at a stamp from at on, so its free tokens at at are
// all it will ever have: a decision stamped before at that reaches it
// after the claim finds it empty (a clock behind the item's refills
// nothing). The processes' leases on it are not returned: their units
// are held out of the free tokens (the item's ring) until they lapse,
// spent at stamps before at or lost. A raise's new item already holds
// its extra (rebaseTable): the carry adds at most the rest of its
// capacity, less its refills since at. What the new item does not take
// goes with the grants that left at at (carryTokens). A fenced rebase
// (its new item in force while entries without it are still valid)
// raised the old item's fence before it listed the new item, and at was
// chosen after the raise returned (rebaseTable): every decision by an
// older entry that the old item took was stamped before at, so the
// claim at at is exact. It claims through the store with fenceTTL
// (claim). brokenOrder (tests) raises here if its raise after the
// publication was not made (stopEarly).
func (a *Agent) carryTable(ctx context.Context, now time.Time) error {
	a.mu.Lock()
	if len(a.items) < 2 || now.UnixNano() < a.items[1].from {
		a.mu.Unlock()
		return nil
	}
	old, it := a.items[0], a.items[1]
	a.mu.Unlock()
	at := time.Unix(0, it.from)
	if a.tbl.fenced && a.tbl.brokenOrder {
		if err := a.raiseOld(ctx, now); err != nil {
			return err
		}
	}
	var moved int64
	for range 3 {
		if old.own == nil {
			break
		}
		d, err := old.own.Get(ctx, old.key, at)
		if err != nil {
			return err
		}
		if d.Remaining <= 0 {
			break
		}
		free := d.Remaining
		ok, err := a.claim(ctx, old, at, free)
		if err != nil {
			return err
		}
		if ok {
			moved = free
			break
		}
	}
	// What the new item takes: at most its room as the refund lands
	// (its capacity less what it held at its first stamp and its refills
	// since, lateTokens): the refund at at is added to what the item
	// holds when it lands, refilled to the latest decision's stamp, so
	// a room counted at at alone let tokens held and carried exceed the
	// capacity by that refill. An idle item ends full either way; the
	// rest goes with the grants.
	var c int64
	if it.own != nil {
		room := it.room(it.extra+it.hold, a.tbl.stamp(now))
		if a.brokenCarry {
			room = it.share - it.extra
		}
		c = max(min(moved, room), 0)
	}
	if c > 0 {
		if err := it.own.Refund(ctx, it.key, at, c); err != nil {
			a.mu.Lock()
			it.mine = false // added or not: what it holds is not known here
			a.mu.Unlock()
			return fmt.Errorf("regions: carry to %q: %w", it.key, err)
		}
	}
	a.mu.Lock()
	if it.mine { // a successor's carry does not know what its predecessor's added
		if !it.heldOK {
			it.held, it.heldOK = it.extra+it.hold, true
		}
		it.held += c
	}
	a.tbl.sent += a.carryTokens(it.from, moved-c)
	a.items = a.items[1:]
	delete(a.tbl.items, old.key)
	a.mu.Unlock()
	a.tbl.count(func(s *TableStats) { s.Carries++; s.Moved += moved })
	return nil
}

// carryTokens carries the tokens the old item held at the carry above
// what its new one (first stamp at) takes, excess, with the grants whose
// rate left at at (the grants the region's share fell by there, listed
// in its entry), at most one a unit, in proportion to their units: their
// Move.Tokens and the running totals State.Tokens, published by the
// tick's save. The claim gives the tokens to one carry only, so a
// successor that redoes the carry (its predecessor's save lost) carries
// none: the tokens are lost (under-admits), never carried twice. It
// returns the tokens carried. Under a.mu.
func (a *Agent) carryTokens(at, excess int64) int64 {
	own := &a.states[a.r]
	var units int64
	for _, m := range own.Moves {
		if m.At == at && m.To != a.r && m.Tokens == 0 {
			units += m.Units
		}
	}
	if excess <= 0 || units <= 0 || a.noTokens {
		return 0
	}
	excess = min(excess, units)
	tokens := make([]int64, a.cfg.Regions)
	copy(tokens, own.Tokens)
	moves := slices.Clone(own.Moves) // the published entry's are shared
	var sent int64
	for i, m := range moves {
		if m.At == at && m.To != a.r && m.Tokens == 0 {
			k := excess * m.Units / units
			moves[i].Tokens = k
			tokens[m.To] += k
			sent += k
		}
	}
	own.Tokens, own.Moves = tokens, moves
	return sent
}

// owed is at most n tokens to add to item it once the tick's save has
// recorded them as taken (lateTokens): at its first stamp while it is
// ahead (ahead), else at the refund's; base is what it held at its first
// stamp before them (refundOwed).
type owed struct {
	it          *bucketItem
	n, base     int64
	ahead, free bool // free: no room (brokenLate, brokenRoom)
}

// lateTokens takes the tokens of the grants that left transit before
// their givers' carries were read (a grant's tokens travel with its
// giver's carry, a tick after its stamp: carryTable). The grant's item
// holds Credit for it (its refill in transit, at most its units), where
// the grant, a bucket of its units holding its k tokens and refilled in
// transit, would have held min(Units, k + refill): it is owed
// min(k, Units - Credit). The tick's save records the tokens as taken
// (the grant leaves Took), and only after that save the owed tokens are added
// (refundOwed): a successor that resumes after it takes none again; a
// save lost adds none (under-admits). They go to the grant's item, if
// still the region's:
//
//   - ahead (not yet in force, its carry not made): at its first stamp,
//     as if read before (Extra; the carry then adds the old item's
//     tokens up to the rest of the capacity);
//   - in force, its tokens at its first stamp known (Held): at most its
//     capacity less Held and what it refilled since (its grid starts at
//     its first stamp), so that the tokens it held and those owed never
//     exceed its capacity at any stamp since. (A bucket that filled
//     meanwhile dropped refill the grant's tokens would have displaced:
//     adding them later without that cap would hand back a dropped
//     refill.)
//
// Otherwise (replaced since, or its carry a predecessor's) they are lost.
func (a *Agent) lateTokens(now time.Time) {
	tb, t := a.tbl, now.UnixNano()
	ref := tb.stamp(now) // about when the refunds are made
	a.mu.Lock()
	defer a.mu.Unlock()
	var owe int64
	keep := tb.took[:0:0]
	for _, r := range tb.took {
		if r.From < 0 || r.From >= len(a.applied) || r.From == a.r {
			continue
		}
		k, listed := int64(0), false
		for _, m := range a.applied[r.From].Moves {
			if m.To == a.r && m.Upto == r.Upto {
				k, listed = min(max(m.Tokens, 0), r.Units), true
				break
			}
		}
		if k == 0 {
			if listed || a.applied[r.From].Seq == 0 {
				keep = append(keep, r) // its tokens may come yet
			}
			continue
		}
		// Taken, whatever of it is added: the save leaves it out.
		o := min(k, max(r.Units-r.Credit, 0))
		if a.brokenLate {
			o = k
		}
		owe += o
		var it *bucketItem
		for _, x := range a.items {
			if x.from == r.Item {
				it = x
			}
		}
		if o <= 0 || it == nil || it.own == nil {
			continue
		}
		w := owed{it: it, ahead: it.from > t, free: a.brokenLate || a.brokenRoom}
		switch {
		case w.ahead:
			w.base = it.extra + it.hold
			w.n = min(o, it.share-w.base)
			it.extra += max(w.n, 0)
		case it.heldOK:
			w.base = it.held
			w.n = min(o, it.room(w.base, ref))
			it.held += max(w.n, 0)
		}
		if w.free {
			w.n = o
		}
		if w.n > 0 {
			tb.owe = append(tb.owe, w)
		}
	}
	tb.took = keep
	tb.owing += owe
}

// refundOwed adds the tokens lateTokens found owed (after the tick's
// save recorded them as taken), each at most its item's room as it is
// sent (the save took a while: the item may have refilled further; the
// board's Extra and Held count the larger figure, which only
// under-admits). A refund that fails loses its tokens (under-admits).
func (a *Agent) refundOwed(ctx context.Context, now time.Time) error {
	a.mu.Lock()
	owe := a.tbl.owe
	a.tbl.owe = nil
	a.mu.Unlock()
	var firstErr error
	for _, o := range owe {
		t := a.tbl.stamp(now)
		n := min(o.n, o.it.room(o.base, t))
		at := t
		if o.ahead {
			at = o.it.from
		}
		if o.free {
			n = o.n
		}
		if n <= 0 {
			continue
		}
		o.n = n
		if err := o.it.own.Refund(ctx, o.it.key, time.Unix(0, at), o.n); err != nil {
			firstErr = cmp(firstErr, fmt.Errorf("regions: a grant's tokens to %q: %w", o.it.key, err))
			continue
		}
		a.tbl.count(func(s *TableStats) { s.TokensLate += o.n })
	}
	return firstErr
}

// stamp is about the stamp of a request the tick under way makes now:
// the tick's stamp plus the time it has taken so far.
func (tb *tableAgent) stamp(now time.Time) int64 {
	return now.UnixNano() + int64(time.Since(tb.started))
}

// room is what item it can take on top of base tokens by a refund sent
// at stamp t: its capacity less base and its refills up to t, and
// rebaseAhead's more (the refund lands after decisions stamped a little
// later).
func (it *bucketItem) room(base, t int64) int64 {
	return it.share - base - it.refills(t+int64(rebaseAhead))
}

// refills is the refills item it has had from its first stamp to t (its
// grid starts there).
func (it *bucketItem) refills(t int64) int64 {
	if t <= it.from || it.from == minStamp || it.cfg.RefillTime <= 0 {
		return 0
	}
	return (t - it.from) / int64(it.cfg.RefillTime) * it.cfg.RefillAmount
}
