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

	// The lowering on record (a window's): the cap is lower by pending
	// from stamp from; the count may be read for the grant from ready.
	// lowGen is the agent's gen it was made at.
	lowGen      int64
	from, ready int64
	maxUntil    int64 // the latest Until published
	seen        int64 // the demand counter, as this tick read it
	seq         int64 // the entry's
	items       map[string]*bucketItem
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
	// ResumedPending is the units withheld for a window grant, and
	// ResumedRebases the rebases under way, on record when it took the
	// role (a predecessor's, finished by this agent).
	ResumedPending, ResumedRebases int64
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
		it, err = tb.t.acquire(ctx, it.epoch, tb.holder, t, t+int64(tb.t.LockLife))
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
		tb.count(func(s *TableStats) {
			s.ResumedPending += it.board.Pending
			if len(it.board.Entry.Items) > 1 {
				s.ResumedRebases++
			}
		})
	}
	firstErr := a.readOthers(ctx)
	a.offered.Store(max(it.demand-it.board.Seen, 0))
	a.estimate(now)
	a.receive(now)
	if a.cfg.Bucket != nil {
		firstErr = cmp(firstErr, a.giveBucketTable(ctx, now))
	} else {
		firstErr = cmp(firstErr, a.giveWindow(ctx, now))
	}
	a.updateWants(ctx, now)
	return cmp(firstErr, a.save(ctx, now))
}

// givingUnderWay reports whether the agent, holding the role, has a
// grant under way that a later tick finishes: a window's units withheld
// for it, or a bucket's rebase not yet carried.
func (a *Agent) givingUnderWay() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tbl != nil && a.tbl.epoch != 0 && (a.pending > 0 || len(a.items) > 1)
}

func (a *Agent) setEpoch(e int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tbl.epoch = e
}

// readOthers is Tick's read of the other regions' entries.
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
	}
	b := it.board
	a.pending, tb.from, tb.ready = b.Pending, b.From, b.Ready
	a.gen = tb.lowGen // the lowering on record, if any, is this one
	tb.maxUntil, tb.seq, tb.seen = b.MaxUntil, b.Entry.Seq, it.demand
	tb.listed, tb.wantsTry = b.Wants, b.WantsTry
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
			bi = &bucketItem{key: s.Key, from: s.From, share: s.Share}
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
	own.At = t
	pub := *own
	pub.Given = slices.Clone(own.Given)
	pub.Future = slices.Clone(own.Future)
	b := board{Pending: a.pending, Seen: tb.seen, Tick: t, Wants: tb.listed, WantsTry: tb.wantsTry}
	if a.pending > 0 {
		b.From, b.Ready = tb.from, tb.ready
	}
	b.Entry = Entry{Seq: tb.seq + 1, Until: t + int64(tb.t.Validity)}
	b.MaxUntil = max(tb.maxUntil, b.Entry.Until)
	if a.cfg.Bucket != nil {
		for _, it := range a.items {
			b.Entry.Items = append(b.Entry.Items, ItemStep{Key: it.key, From: it.from, Share: it.share})
		}
	} else {
		b.Entry.Caps = a.capSteps(t)
	}
	epoch := tb.epoch
	a.mu.Unlock()
	err := tb.t.save(ctx, epoch, pub, b, t+int64(tb.t.LockLife))
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
	return nil
}

// capSteps is a window's caps by stamp from t on: the share less what is
// withheld from the lowering's stamp on, plus each grant to come from its
// stamp on. Under a.mu.
func (a *Agent) capSteps(t int64) []CapStep {
	type change struct{ at, d int64 }
	base := a.owned
	var cs []change
	if a.pending > 0 {
		if a.tbl.from <= t {
			base -= a.pending
		} else {
			cs = append(cs, change{a.tbl.from, -a.pending})
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

// waitTable is a window grant's step 2 through the table: a new lowering
// (gen not the one on record) takes effect from a stamp no earlier than
// the validity of every entry published before it, and the count may be
// read once every decision that read a higher cap is past its deadline.
// It reports whether that time has come.
func (a *Agent) waitTable(now time.Time, gen int64) bool {
	tb := a.tbl
	a.mu.Lock()
	defer a.mu.Unlock()
	if gen != tb.lowGen {
		tb.lowGen = gen
		tb.from = max(tb.maxUntil, now.UnixNano())
		tb.ready = tb.from + int64(tb.t.Deadline)
	}
	return now.UnixNano() >= tb.ready
}

// withholdable is what a window grant may withhold: the share, but while
// a lowering is on record no more than it (a grant larger than it would
// start a new lowering and wait again). Under a.mu.
func (a *Agent) withholdable() int64 {
	if a.tbl != nil && a.pending > 0 {
		return min(a.pending, a.owned)
	}
	return a.owned
}

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
	if errors.Is(err, errRebasing) {
		err = nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
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
// from then on by an entry without it). The carry is made by a later
// tick (carryTable).
func (a *Agent) rebaseTable(ctx context.Context, now time.Time, s int64) error {
	tb := a.tbl
	a.mu.Lock()
	busy, from := len(a.items) > 1, max(now.Add(a.ahead).UnixNano(), tb.maxUntil)
	a.mu.Unlock()
	if busy {
		return errRebasing
	}
	it, err := a.newItem(ctx, time.Unix(0, from), s, true)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.items = append(a.items, it)
	tb.items[it.key] = it
	a.stats.Rebases++
	return nil
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
// spent at stamps before at or lost.
func (a *Agent) carryTable(ctx context.Context, now time.Time) error {
	a.mu.Lock()
	if len(a.items) < 2 || now.UnixNano() < a.items[1].from {
		a.mu.Unlock()
		return nil
	}
	old, it := a.items[0], a.items[1]
	a.mu.Unlock()
	at := time.Unix(0, it.from)
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
		if d, err = old.own.AllowN(ctx, old.key, at, free); err != nil {
			return err
		}
		if d.Allowed {
			moved = free
			break
		}
	}
	if c := min(moved, it.share); c > 0 && it.own != nil {
		if err := it.own.Refund(ctx, it.key, at, c); err != nil {
			return fmt.Errorf("regions: carry to %q: %w", it.key, err)
		}
	}
	a.mu.Lock()
	a.items = a.items[1:]
	delete(a.tbl.items, old.key)
	a.mu.Unlock()
	a.tbl.count(func(s *TableStats) { s.Carries++; s.Moved += moved })
	return nil
}
