package regions

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("regions: invalid configuration")

// Config configures one key's limit shared by Regions regions: a sliding
// window of Limit units per Window (SubWindows counters, bounded), or,
// with Bucket set, that token bucket.
type Config struct {
	Regions int
	// Key is the limited key; region r decides it on its own item,
	// Key@r.
	Key        string
	Limit      int64
	Window     time.Duration
	SubWindows int
	// Bucket, if set, makes the limit this token bucket (Limit, Window
	// and SubWindows are then unused).
	Bucket *limiter.TokenBucketConfig
	// Leases lets each process take capacity leases on its region's
	// share (see limiter.SlidingWindowConfig and TokenBucketConfig).
	Leases bool
	// Skew bounds how far apart the regions' clocks are: a region uses
	// a grant only Skew after its giver published it.
	Skew time.Duration
	// Offers lets a region give its share above its own need before it
	// knows who needs it, split as of the offer's stamp (offer.go). On
	// the ledger path (NewAgent), and through the table (NewTableAgent)
	// for a bucket only: a window's agents through the table neither
	// make nor take offers.
	Offers bool

	// brokenSmall (tests): a bucket's surplus under minSurplus of the
	// units is never given, as before (plan).
	brokenSmall bool
	// brokenKeep (tests): a region's surplus is its share above its
	// target, whatever its demand uses, as before (planRate).
	brokenKeep bool
}

// Allocation tuning.
const (
	// minWeight is the least share of the demand a region is counted
	// with, so that a region with no demand yet keeps a little.
	minWeight = 0.01
	// hysteresis is the least surplus worth starting a grant, as a share
	// of the region's target, and at least minSurplus of the limit.
	hysteresis = 0.2
	minSurplus = 0.01
	// demandWeight is the weight of a tick's rate in the demand estimate;
	// two ticks in a row counting more than jumpSigmas deviations and
	// jumpMin units from it on the same side replace it (nextDemand).
	demandWeight = 0.1
	jumpSigmas   = 4
	jumpMin      = 4
	// A tick whose requests took more than slowReads times the agent's
	// usual (its ticks' average, weighted demandWeight) and slowMin is
	// slow: its count is held, not weighed, until a tick that is not, or
	// holdMax of them (Agent.estimate).
	slowReads = 4
	slowMin   = 100 * time.Millisecond
	holdMax   = 2 * time.Second
	// holdAfter is how many ticks after a slow one are held too: the
	// processes' counts come with their next requests, which may end
	// after the agent's.
	holdAfter = 2
	// keepUse is the part of the share its demand uses that a region
	// keeps (planRate): a demand a little above its share's rate is below
	// it at times, and those units serve a region further above its own.
	keepUse = 0.9
	// needHeadroom is how much more than its demand at the limit's rate
	// a region's need is (Config.need).
	needHeadroom = 2.5
	// rebaseAhead is how far ahead of its agent's clock a bucket share's
	// new item takes over (its first stamp).
	rebaseAhead = 20 * time.Millisecond
	// moveKeep is how long a giver lists a bucket's grant in its entry
	// (State.Moves), and moveMax how many at most: a receiver that reads
	// one later takes its units and tokens without what it accrued.
	moveKeep = 10 * time.Second
	moveMax  = 16
)

func (c Config) validate() error {
	if c.Regions < 2 || c.Key == "" {
		return fmt.Errorf("%w: %d regions, key %q", ErrInvalidConfig, c.Regions, c.Key)
	}
	if b := c.Bucket; b != nil {
		if b.MaxAmount < 2*int64(c.Regions) || b.RefillTime <= 0 || b.RefillAmount <= 0 {
			return fmt.Errorf("%w: bucket of %d regions: max amount %d, refill %d every %v", ErrInvalidConfig, c.Regions, b.MaxAmount, b.RefillAmount, b.RefillTime)
		}
		return nil
	}
	if c.Limit < int64(c.Regions) || c.Window <= 0 || c.SubWindows < 1 {
		return fmt.Errorf("%w: %d regions, limit %d, window %v, %d sub-windows", ErrInvalidConfig, c.Regions, c.Limit, c.Window, c.SubWindows)
	}
	return nil
}

// units is what the shares divide: the window's limit, or the bucket's
// capacity less one unit per region (each region's bucket refills on a
// grid of its own, so a region may see one refill more than its rate in
// any interval: the global bound's single refill of slack, times the
// regions).
func (c Config) units() int64 {
	if c.Bucket != nil {
		return c.Bucket.MaxAmount - int64(c.Regions)
	}
	return c.Limit
}

// State is a region's ledger entry, written by that region only.
type State struct {
	// Demand is the units a second its callers asked for, recently.
	Demand float64 `json:"d"`
	// Given is the units it gave each region so far: running totals,
	// never decreasing.
	Given []int64 `json:"g"`
	// Seq numbers its publications.
	Seq int64 `json:"n"`
	// At is when it was published (Unix ns, the giver's clock).
	At int64 `json:"t"`
	// Future are the grants counted in Given that take effect later (a
	// window's units still in its giver's view until then).
	Future []Grant `json:"f,omitempty"`
	// Tokens is the tokens it carried to each region with the units it
	// gave (a bucket's): running totals, never decreasing.
	Tokens []int64 `json:"k,omitempty"`
	// Moves are its recent grants of a bucket's units (moveKeep), each
	// a bucket of its own while in transit (see Move).
	Moves []Move `json:"m,omitempty"`
	// Offers (Config.Offers, offer.go): its offers listed (through the
	// table: none, Open lists them), OfferN its last offer's number,
	// OfferNet the units its offers moved to it (received and taken
	// back, less offered: a running total), Took its resolutions of the
	// others' offers (through the table: the parts taken that their
	// givers have not shown settled), Marks its last entries' demand and
	// share.
	Offers   []Offer  `json:"q,omitempty"`
	OfferN   int64    `json:"qn,omitempty"`
	OfferNet int64    `json:"qs,omitempty"`
	Took     []Took   `json:"x,omitempty"`
	Marks    markList `json:"hm,omitempty"`
	// Open and Thru (through the table): its offers not settled, and
	// per giver the last offer it resolved, saved with the entry so that
	// a successor agent resumes them (offer.go, resumeOffers).
	Open []OpenOffer `json:"qo,omitempty"`
	Thru []int64     `json:"qt,omitempty"`
}

// Move is a grant of a bucket's units while in transit: a bucket of
// capacity Units refilled at their rate, holding the Tokens its giver
// carried from At, the stamp its giver's rate left (its new item's
// first), and refilling from then until its receiver's rate starts (the
// receiver adds what it holds then to its bucket: accrued). Upto is the
// giver's running total Given[To] with it, naming it.
type Move struct {
	To     int   `json:"o"`
	Units  int64 `json:"u"`
	Tokens int64 `json:"k,omitempty"`
	At     int64 `json:"t"`
	Upto   int64 `json:"n"`
}

// Grant is Units given to region To, in force from At (Unix ns).
type Grant struct {
	To    int   `json:"o"`
	Units int64 `json:"u"`
	At    int64 `json:"t"`
}

// Ledger publishes a region's state and reads the other regions' as the
// region's own replica holds them (a lag old).
type Ledger interface {
	Publish(ctx context.Context, region int, st State) error
	Read(ctx context.Context, region int) (State, bool, error)
}

// base is region r's share before any grant: the units split evenly.
func (c Config) base(r int) int64 {
	u, n := c.units(), int64(c.Regions)
	b := u / n
	if int64(r) < u%n {
		b++
	}
	return b
}

// share is region r's share from states (each region's, as read by the
// one computing): its base, less what it gave, plus what the others gave
// it.
func (c Config) share(r int, states []State) int64 {
	s := c.base(r) + states[r].OfferNet
	for o, st := range states {
		if o == r {
			for _, g := range st.Given {
				s -= g
			}
		} else if r < len(st.Given) {
			s += st.Given[r]
		}
	}
	return s
}

// targets are the shares the regions' demands call for: the units in
// proportion to the demands. (Capping a target at a region's need, so
// that units nobody needs stay where they are, was measured worse: when
// demand moves, the surplus of the region it left reaches the region it
// went to a replication lag sooner when spread at once.)
func (c Config) targets(states []State) []float64 {
	var total float64
	for _, st := range states {
		total += st.Demand
	}
	floor := max(total*minWeight, 1e-9)
	w := make([]float64, len(states))
	var sum float64
	for i, st := range states {
		w[i] = max(st.Demand, floor)
		sum += w[i]
	}
	for i := range w {
		w[i] = float64(c.units()) * w[i] / sum
	}
	return w
}

// need is the share a demand calls for on its own: needHeadroom times the
// demand at the limit's rate, at least minWeight of the units (what a
// region keeps of a lowering its plan does not ask for, and of its first
// entry's share: the table path).
func (c Config) need(demand float64) float64 {
	return max(needHeadroom*demand/c.rate(), minWeight) * float64(c.units())
}

// rate is the limit's steady rate in units a second: the bucket's refill,
// or the window's limit over its span (a window and a sub-window: what a
// bounded window admits steadily).
func (c Config) rate() float64 {
	if b := c.Bucket; b != nil {
		return float64(b.RefillAmount) / b.RefillTime.Seconds()
	}
	return float64(c.Limit) / (c.Window + c.Window/time.Duration(c.SubWindows)).Seconds()
}

// plan is what region r would give each region now (nil: nothing): its
// part of what the regions short of their targets lack, as r sees them,
// in proportion to its surplus among all the regions' surpluses, and
// never more than its surplus. giving reports that r already withholds
// units for a grant (no hysteresis then). The hysteresis: a surplus of
// at least hysteresis of what r keeps and minSurplus of the units; a
// bucket's, when the regions short lack minSurplus of the units
// altogether, of a unit at least (a small region's few units above its
// target are its rate unused for good, and a bucket gives them in one
// rebase: docs/regions.md, "The bucket at 98/1/1 through the table,
// decomposed").
func (c Config) plan(r int, states []State, giving bool) []int64 {
	return c.planRate(r, states, giving, 0)
}

// planRate is plan, where r's last tick counted own units a second (0:
// unknown). A region's surplus is its share above what it keeps: its
// target, or, where its demand (r's: the larger of its estimate and own)
// would use more of its share, keepUse of that use (Config.uses). Where the
// regions' demands sum above the limit's rate, a target is below its
// demand, and a grant of units the giver uses only moves them from one
// region whose demand is above its share to another: nothing more is
// admitted, and the grant's rebase or lowering costs units. At even
// demand over the rate that is all a grant does, on the estimates'
// noise (docs/regions.md, "Regional shares on the MRSC table").
func (c Config) planRate(r int, states []State, giving bool, own float64) []int64 {
	tg := c.targets(states)
	shares := make([]float64, len(states))
	keep := make([]float64, len(states))
	for o, st := range states {
		shares[o] = float64(c.share(o, states))
		keep[o] = tg[o]
		if !c.brokenKeep {
			d := st.Demand
			if o == r {
				d = max(d, min(own, c.rate()))
			}
			keep[o] = max(tg[o], min(shares[o], keepUse*c.uses(d)))
		}
	}
	surplus := shares[r] - keep[r]
	if surplus <= 0 {
		return nil
	}
	lack := make([]float64, len(states))
	var lacking, surpluses float64
	for o := range states {
		if d := shares[o] - keep[o]; d > 0 {
			surpluses += d
		} else if d := tg[o] - shares[o]; d > 0 && o != r {
			lack[o] = d
			lacking += lack[o]
		}
	}
	least := minSurplus * float64(c.units())
	if c.Bucket != nil && lacking >= least && !c.brokenSmall {
		least = 1
	}
	if lacking < 1 || !giving && surplus < max(hysteresis*keep[r], least) {
		return nil
	}
	give := min(surplus, lacking*surplus/surpluses)
	out := make([]int64, len(states))
	any := false
	for o := range out {
		out[o] = int64(give * lack[o] / lacking)
		any = any || out[o] > 0
	}
	if !any {
		return nil
	}
	return out
}

// uses is the share a demand (units a second) uses at the limit's rate.
func (c Config) uses(demand float64) float64 {
	return demand / c.rate() * float64(c.units())
}

// Agent is a region's share keeper for one key: it estimates the
// region's demand, reads the other regions' ledger entries, takes the
// grants made to the region, gives surplus away and publishes its own
// entry (Tick, every few hundred milliseconds), and keeps the region's
// processes ([Limiter]) deciding against the share in force. Safe for
// concurrent use; Tick is called by one goroutine.
//
// A window's share is a cap (limiter.Item.Cap) on one window of the
// whole limit on the region's item. A grant lowers the giver's cap
// first, waits for the decisions that read the higher cap, then reads
// the region's count in view: it gives only what that count leaves free,
// withholding the rest (pending) until the count falls. A receiver
// raises its cap when it reads the grant. A bucket's share is a bucket
// of its own (capacity and rate in proportion), on an item per change
// (rebase): the new item takes over at a stamp, holding at most the old
// one's tokens; a giver rebases before it publishes.
type Agent struct {
	cfg     Config
	r       int
	ledger  Ledger
	offered atomic.Int64

	// Tick's own state.
	states  []State // as read (others) or published (own)
	applied []State // the others' entries whose grants are in force
	last    time.Time
	peek    *limiter.SlidingWindow // reads the region's count (a window)
	store   any
	// nonce and itemSeq name a bucket's items.
	nonce   int64
	itemSeq atomic.Int64
	// ahead is how far ahead a bucket's new item takes over.
	ahead time.Duration
	// broken gives what it should not (tests: the checkers must see it):
	// a window's grants ignore the region's count, a bucket's giver
	// does not rebase; brokenTokens: a bucket's giver carries a token a
	// unit given, saved or not.
	broken, brokenTokens bool
	// brokenWait: through the table, a window's lowerings are ready at
	// once (no wait for the decisions that read a higher cap).
	brokenWait bool
	// brokenExtra: through the table, a bucket's raise puts its whole
	// units in its new item, refilled or not.
	brokenExtra bool
	// brokenAccrue: a bucket's grant arrives as if in transit for an
	// hour (full: the tokens its capacity holds, refilled or not).
	brokenAccrue bool
	// brokenLate: through the table, a grant's tokens read after it left
	// transit are added whole (no cap by what it would have held, nor by
	// its item's room); brokenEarly: they are added before the tick's
	// save records them as taken (lateTokens).
	// brokenRoom: they are added up to what the grant would have held,
	// but without the cap by the item's room.
	brokenLate, brokenEarly, brokenRoom bool
	// brokenCarry: through the table, the carry's room is counted at the
	// new item's first stamp only, as before (carryTable).
	brokenCarry bool
	// noTokens (tests): through the table, a bucket's giver carries no
	// tokens with its grants, as before (carryTokens).
	noTokens bool
	// off is its side of the offers (Config.Offers; nil: none).
	// brokenOffer: a recipient takes its part of an offer as soon as it
	// reads it, split by the marks it has read by then, not as of the
	// offer's stamp; brokenGive: a giver does not withhold what it offers.
	// brokenForget: through the table, a successor resumes no offer
	// state (resumeOffers); brokenPrune: through the table, a recipient
	// drops the parts it took from its entry at once, settled by their
	// givers or not (tookDone): its givers read them as none taken.
	// brokenCut: a giver takes a region whose entry it read is 2 s old
	// (cut off) as having taken none of its offers.
	off                                                           *offerState
	brokenOffer, brokenGive, brokenForget, brokenPrune, brokenCut bool
	// openOffers is len(off.mine) at the last tick's offersIn, under mu
	// (givingUnderWay).
	openOffers int
	// brokenStale: the plan counts a stale entry's demand (planView), as
	// before.
	brokenStale bool
	// brokenCap: the plan counts a demand above the limit's rate (planView),
	// as before.
	brokenCap bool
	// brokenJump: a single tick far from the estimate replaces it, as
	// before (nextDemand). jumpSide is the side of the last tick's
	// count, if far (nextDemand).
	brokenJump bool
	jumpSide   int
	// falling: the last tick's count was far below the estimate, a
	// first such tick (nextDemand weighed it in at the bound), at
	// tickRate units a second: through the table, a window's lowering
	// is made at once for what that rate leaves (holdFor).
	falling  bool
	tickRate float64
	// lastRate is the units a second the last tick weighed counted
	// (nextDemand): the region keeps the share it would use (planRate).
	lastRate float64
	// brokenHold: through the table, a window's lowering withholds only
	// what the plan asks, as before (holdFor); brokenReady: a lowering is
	// ready only at a tick stamped past its Ready, as before (lowerTable).
	brokenHold, brokenReady bool
	// storeWait (tests), if set, is how long a tick at now waited on the
	// region's store (the simulation's stalled store); nil: measured
	// (took).
	storeWait func(now time.Time) time.Duration
	// usualTook is how long the agent's ticks usually wait on the store;
	// heldOffered and heldDt the units and seconds of the slow ticks
	// held (estimate). brokenStall: a slow tick's count is weighed as
	// any other's, as before.
	usualTook           time.Duration
	heldOffered, heldDt float64
	slowAfter           int // ticks still held after the last slow one
	brokenStall         bool

	mu   sync.Mutex
	cond *sync.Cond // signalled as decisions end
	// owned is base + received - given: the share without pending
	// grants; pending is withheld for grants not yet published (a
	// window's).
	owned, pending int64
	// incoming are grants to this region read but not yet in force.
	incoming []Grant
	// gen counts cap decreases; inflight the decisions under way per
	// generation of the cap they read.
	gen      int64
	inflight map[int64]int
	// bucket: the items in force, the current one last.
	items []*bucketItem
	// tokensIn is the tokens taken from each region's grants so far;
	// carryIn those not yet added to the region's bucket; movesIn each
	// region's running total of units given this one through which the
	// grants' accrued tokens were taken.
	tokensIn []int64
	carryIn  int64
	movesIn  []int64
	stats    AgentStats
	// grantsIn is the units of the other regions' grants received (their
	// running totals, as of the last receive); partsIn the units taken
	// from their offers (offersIn): stats.Received is their sum.
	grantsIn, partsIn int64
	// tbl, if set, is the agent's side of the table (NewTableAgent).
	tbl *tableAgent
}

// AgentStats counts an agent's work.
type AgentStats struct {
	Ticks, Grants, Published, ReadErrors, PublishErrors, Rebases int64
	// Given is the units it gave away (grants, and offers made: those
	// no region took come back into its share), Received those it took
	// (grants, and parts of the other regions' offers);
	// Withheld is the largest pending grant; Share the current share
	// (without pending grants).
	Given, Received, Withheld, Share int64
	// Demand is the region's demand estimate (units a second); Held the
	// slow ticks whose counts were held, Took how long the last tick's
	// requests took (its reads, or the write of the tick before, the
	// longer) and UsualTook how long they usually take (Agent.estimate);
	// Wrote how long the last tick's write took.
	Demand                 float64
	Held                   int64
	Took, UsualTook, Wrote time.Duration
}

// NewAgent returns region's agent, holding the base share, on store:
// the region's storage.Counter for a window, storage.BucketStore for a
// bucket.
func NewAgent(cfg Config, region int, ledger Ledger, store any) (*Agent, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if region < 0 || region >= cfg.Regions || ledger == nil {
		return nil, fmt.Errorf("%w: region %d of %d, ledger %v", ErrInvalidConfig, region, cfg.Regions, ledger)
	}
	a := &Agent{cfg: cfg, r: region, ledger: ledger, states: make([]State, cfg.Regions), applied: make([]State, cfg.Regions),
		store: store, inflight: map[int64]int{}, nonce: time.Now().UnixNano(), ahead: rebaseAhead}
	a.cond = sync.NewCond(&a.mu)
	for i := range a.states {
		a.states[i].Given = make([]int64, cfg.Regions)
		a.applied[i].Given = make([]int64, cfg.Regions)
	}
	a.owned = cfg.base(region)
	a.stats.Share = a.owned
	if cfg.Offers {
		a.off = newOfferState(cfg.Regions)
	}
	if cfg.Bucket != nil {
		a.states[region].Tokens = make([]int64, cfg.Regions)
		a.tokensIn = make([]int64, cfg.Regions)
		a.movesIn = make([]int64, cfg.Regions)
		if _, ok := store.(storage.BucketStore); !ok {
			return nil, fmt.Errorf("%w: a bucket's store must be a storage.BucketStore, not %T", ErrInvalidConfig, store)
		}
		it, err := a.newItem(context.Background(), time.Time{}, a.owned, false)
		if err != nil {
			return nil, err
		}
		a.items = []*bucketItem{it}
		return a, nil
	}
	c, ok := store.(storage.Counter)
	if !ok {
		return nil, fmt.Errorf("%w: a window's store must be a storage.Counter, not %T", ErrInvalidConfig, store)
	}
	w, err := a.cfg.window(c, false)
	if err != nil {
		return nil, err
	}
	a.peek = w
	return a, nil
}

// window is a window of the whole limit on c: the one a region's
// processes decide on, its agent peeks at and Inspect reads (one key
// space).
func (c Config) window(store storage.Counter, leases bool) (*limiter.SlidingWindow, error) {
	return limiter.NewSlidingWindow(store, limiter.SlidingWindowConfig{Name: "share", Limit: c.Limit, Window: c.Window, SubWindows: c.SubWindows,
		Representation: limiter.SubWindowCounters, Leases: leases})
}

// key is the region's item of the limited key.
func (a *Agent) key() string { return a.cfg.Key + "@" + strconv.Itoa(a.r) }

// Tick runs one round at now: demand, read, take grants, give, publish.
func (a *Agent) Tick(ctx context.Context, now time.Time) error {
	if a.tbl != nil {
		return a.tickTable(ctx, now)
	}
	start := time.Now()
	firstErr := a.readOthers(ctx)
	a.estimate(now, a.took(now, start))

	a.receive(now)
	a.offersIn(now)

	var err error
	if a.cfg.Bucket != nil {
		err = a.giveBucket(ctx, now)
	} else {
		err = a.giveWindow(ctx, now)
	}
	firstErr = cmp(firstErr, err)

	own := &a.states[a.r]
	own.Seq++
	prev := own.At
	own.At = now.UnixNano()
	if a.offering() {
		// A region's stamps increase (offerState.asOf: a mark stamped
		// tau is the last at or before tau).
		own.At = max(own.At, prev+1)
		a.mark(own)
	}
	pub := *own
	pub.Offers = slices.Clone(own.Offers)
	pub.Took = slices.Clone(own.Took)
	pub.Marks = slices.Clone(own.Marks)
	pub.Given = slices.Clone(own.Given)
	pub.Future = slices.Clone(own.Future)
	pub.Tokens = slices.Clone(own.Tokens)
	pub.Moves = slices.Clone(own.Moves)
	wrote := time.Now()
	err = a.ledger.Publish(ctx, a.r, pub)
	a.count(func(s *AgentStats) { s.Wrote = time.Since(wrote) })
	if err != nil {
		// Published at a later tick: the grant is already out of this
		// region's share, so a late publication only delays it.
		a.count(func(s *AgentStats) { s.PublishErrors++ })
		return cmp(firstErr, err)
	}
	a.count(func(s *AgentStats) { s.Published++ })
	return firstErr
}

// receive takes the grants made to this region: those published Skew
// ago or more, and in force (each at its At, plus Skew); the later ones
// are kept for the decisions stamped after them.
func (a *Agent) receive(now time.Time) {
	t, skew := now.UnixNano(), int64(a.cfg.Skew)
	var got, tokens int64
	var incoming []Grant
	var inForce []int64 // through the table, a bucket's: per giver
	if a.cfg.Bucket != nil && a.tbl != nil {
		inForce = make([]int64, a.cfg.Regions)
	}
	for o, st := range a.states {
		if o == a.r {
			continue
		}
		if t >= st.At+skew && st.Seq >= a.applied[o].Seq {
			a.applied[o] = st
		}
		ap := a.applied[o]
		got += ap.Given[a.r]
		if a.cfg.Bucket != nil && a.tbl == nil {
			if a.r < len(ap.Tokens) && ap.Tokens[a.r] > a.tokensIn[o] {
				tokens += ap.Tokens[a.r] - a.tokensIn[o]
				a.tokensIn[o] = ap.Tokens[a.r]
			}
			tokens += a.accrued(ap.Moves, a.movesIn[o], t-skew)
			a.movesIn[o] = max(a.movesIn[o], ap.Given[a.r])
		}
		var later int64
		for _, f := range ap.Future {
			if f.To == a.r && f.At+skew > t {
				later += f.Units
				incoming = append(incoming, Grant{To: a.r, Units: f.Units, At: f.At + skew})
			}
		}
		got -= later
		if inForce != nil {
			inForce[o] = ap.Given[a.r] - later
		}
	}
	var gave int64
	for _, g := range a.states[a.r].Given {
		gave += g
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.owned = a.cfg.base(a.r) - gave + got + a.states[a.r].OfferNet
	a.incoming = incoming
	if inForce != nil {
		a.tbl.inForce = inForce
		if a.tbl.in == nil { // unknown (a board from before): credit none
			a.tbl.in = slices.Clone(inForce)
		}
	}
	a.carryIn += tokens
	a.grantsIn = got
	a.stats.Received = a.grantsIn + a.partsIn
	if brokenReceived {
		a.stats.Received = got
	}
	a.stats.Share = a.owned
}

// brokenReceived (tests): Received counts the grants only, as before:
// the offers' parts taken are lost at the next receive.
var brokenReceived = false

// estimate updates the region's demand from the units its processes
// were offered since the last tick, which waited took on the region's
// store (Agent.took).
//
// A slow tick (its requests took more than slowReads times the usual and
// slowMin), and the holdAfter ticks after it, are held: their counts and
// time are kept aside, the estimate unchanged, and the next tick not held
// weighs them with its own as one tick. A stall of the region's store (or
// a starved host) delays the processes' calls, and their counts with
// them, as it delays the agent's requests: counted tick by tick, the
// stall reads as two ticks far below the estimate (demand that left,
// nextDemand), and the region gave its units away just before the calls
// that waited came back. Counted over the stall and the ticks after it,
// the calls that waited are there. A hold lasts at most holdMax: slowness
// that lasts that long is the store's new usual. It reports whether it
// held the tick (through the table, the board keeps the held count:
// estimateTable).
func (a *Agent) estimate(now time.Time, took time.Duration) (held bool) {
	offered := a.offered.Swap(0)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.Ticks++
	a.falling = false
	waited := took > slowMin && took > slowReads*a.usualTook && a.stats.Ticks > 1 && !a.brokenStall
	if a.stats.Ticks == 1 {
		a.usualTook = took
	} else if !waited {
		a.usualTook += time.Duration(demandWeight * float64(took-a.usualTook))
	}
	slow := waited || a.slowAfter > 0
	if waited {
		a.slowAfter = holdAfter
	} else if a.slowAfter > 0 {
		a.slowAfter--
	}
	if !a.last.IsZero() && now.After(a.last) {
		dt := now.Sub(a.last).Seconds()
		if slow && a.heldDt+dt < holdMax.Seconds() {
			if a.tbl == nil {
				a.heldOffered += float64(offered)
				a.heldDt += dt
			}
			a.jumpSide = 0 // a far tick before the stall was part of it
			a.stats.Held++
			held = true
		} else {
			if waited { // held holdMax: the new usual
				a.usualTook = took
			}
			own := &a.states[a.r]
			own.Demand = a.nextDemand(own.Demand, float64(offered)+a.heldOffered, dt+a.heldDt)
			a.heldOffered, a.heldDt = 0, 0
			a.stats.Demand = own.Demand
		}
	}
	a.last = now
	a.stats.Took, a.stats.UsualTook = took, a.usualTook
	return held
}

// took is how long a tick at now waited on the region's store: its
// reads, from start, or the last tick's write (its entry's publication),
// the longer (a stall may hold writes only).
func (a *Agent) took(now, start time.Time) time.Duration {
	if a.storeWait != nil {
		return a.storeWait(now)
	}
	return max(time.Since(start), a.Stats().Wrote)
}

// nextDemand is the demand estimate after a tick of dt seconds that
// counted offered units, from the estimate est: exponentially weighted,
// unless the tick's count is far from what the estimate expects of a
// Poisson stream (more than jumpSigmas deviations and jumpMin units).
// Two such ticks in a row on the same side are demand that moved, taken
// at once (the first tick's estimate too); a single one (a burst of
// calls that waited on a slow store, or of counts its processes wrote
// late) is weighed in at that bound only, so that the plans do not move
// units after a blip that is over before the units arrive. Under a.mu.
func (a *Agent) nextDemand(est, offered, dt float64) float64 {
	want := est * dt
	bound := jumpSigmas*math.Sqrt(want) + jumpMin
	side := 0
	if d := offered - want; d > bound {
		side = 1
	} else if -d > bound {
		side = -1
	}
	last := a.jumpSide
	a.jumpSide = side
	a.lastRate = offered / dt
	if a.stats.Ticks == 2 || side != 0 && (side == last || a.brokenJump) {
		a.jumpSide = 0
		return offered / dt
	}
	a.falling, a.tickRate = side < 0, offered/dt
	if side != 0 {
		offered = max(want+float64(side)*bound, 0)
	}
	return (1-demandWeight)*est + demandWeight*offered/dt
}

// planNow is the plan at now (plan), on planView.
func (a *Agent) planNow(now time.Time, giving bool) []int64 {
	a.mu.Lock()
	own := a.lastRate
	a.mu.Unlock()
	return a.cfg.planRate(a.r, a.planView(now), giving, own)
}

// planView is the states the plan reads at now: as read, but the demand
// of another region's entry that is stale (published more than
// StaleEntry before) counted as none. Such a region's agent stopped (its
// region no longer decides the key, so nothing ticks it) or its entries
// stopped replicating: counting its last demand held capacity for it,
// and the others' plans went on giving it units nobody would use or
// give back until it ticked again. Its grants (Given) are facts and still
// count; only its target falls to the floor, so the others give it
// nothing and keep more (a plan only decides what a region gives out of
// what it holds: never over does not depend on it).
//
// And every region's demand counts at most the limit's rate. Steadily
// this changes which region uses the units, never how many are used (a
// region whose demand is counted at the rate uses all it could hold; one
// counted as it is, d, is given less than d: the weights sum to more
// than the rate). But an estimate far above the rate is more often a
// burst (calls that waited on a slow store, taken as moved demand after
// two such ticks) than demand, and the units it drew from the others
// arrived after it was over. Where every region's demand is above the
// rate the limit is split evenly.
func (a *Agent) planView(now time.Time) []State {
	states := a.states
	rate := a.cfg.rate()
	for o, st := range a.states {
		d := st.Demand
		if a.stale(o, st, now.UnixNano()) && !a.brokenStale {
			d = 0
		} else if !a.brokenCap {
			d = min(d, rate)
		}
		if d != st.Demand {
			if &states[0] == &a.states[0] {
				states = slices.Clone(a.states) // the entries' slices are shared, read only
			}
			states[o].Demand = d
		}
	}
	return states
}

// stale reports whether region o's entry st, as read, shows demand yet
// was published more than StaleEntry (and Skew, the clocks) before t.
func (a *Agent) stale(o int, st State, t int64) bool {
	return o != a.r && st.Seq > 0 && st.Demand > 0 && t-st.At > int64(StaleEntry+a.cfg.Skew)
}

// giveWindow withholds what the plan gives (lowering the cap, waiting
// for the decisions that read a higher one), then gives it, each part
// in force from when the region's count in view leaves it free: now, or
// at one of the next sub-window starts (its count in view there, read
// ahead), or at the latest when every sub-window in view now has left it.
func (a *Agent) giveWindow(ctx context.Context, now time.Time) error {
	giving := a.dropFuture(now)
	if err := a.offerWindow(ctx, now); err != nil {
		return err
	}
	g := a.planNow(now, giving)
	var want int64
	for _, u := range g {
		want += u
	}
	if a.tbl != nil {
		// Through the table: the lowerings wait their deadlines, or
		// through a store that fences, are published and fenced at
		// once; want becomes what the ready ones allow (lowerTable).
		var by int64
		if want, by = a.lowerTable(now, g, want); want == 0 {
			return nil
		}
		if err := a.fenceTable(ctx, now); errors.Is(err, errLost) {
			return nil // the tick ends (tickTable)
		} else if err != nil {
			return err // the units stay withheld: the next tick gives them
		}
		if err := a.waitReady(ctx, now, by); err != nil {
			return err // the units stay withheld: the next tick gives them
		}
	} else {
		a.mu.Lock()
		want = clampPlan(g, want, a.owned)
		if want > a.pending {
			a.gen++ // a lower cap: the decisions under way read a higher one
		}
		a.pending = want
		a.stats.Withheld = max(a.stats.Withheld, want)
		gen := a.gen
		a.mu.Unlock()
		if want == 0 {
			return nil
		}
		a.wait(gen)
	}
	a.mu.Lock()
	owned := a.owned
	a.mu.Unlock()
	free := func(at time.Time) (int64, error) {
		d, err := a.peek.Peek(ctx, a.key(), at)
		if err != nil {
			return 0, err
		}
		return min(want, max(owned-(a.cfg.Limit-d.Remaining), 0)), nil
	}
	cum, err := free(now)
	if err != nil {
		return err
	}
	if a.broken {
		cum = want
	}
	steps := []grantStep{{now.UnixNano(), cum}}
	sub := int64(a.cfg.Window) / int64(a.cfg.SubWindows)
	idx := floorDiv(now.UnixNano(), sub)
	for j := int64(1); j <= int64(a.cfg.SubWindows) && cum < want; j++ {
		c, err := free(time.Unix(0, (idx+j)*sub))
		if err != nil {
			break // the rest when the view has left
		}
		if c > cum {
			steps = append(steps, grantStep{(idx + j) * sub, c})
			cum = c
		}
	}
	if cum < want {
		steps = append(steps, grantStep{(idx + int64(a.cfg.SubWindows) + 1) * sub, want})
	}
	a.publish(g, steps, want, now)
	return nil
}

// dropFuture drops the region's grants in force by now from its entry's
// Future, and reports whether it withholds units for a grant.
func (a *Agent) dropFuture(now time.Time) (giving bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	own := &a.states[a.r]
	own.Future = slices.DeleteFunc(own.Future, func(f Grant) bool { return f.At <= now.UnixNano() })
	return a.pending > 0
}

// grantStep is a part of a grant: cum of it in force from at.
type grantStep struct {
	at  int64
	cum int64 // given in force by at
}

// publish gives g (summing to want) in the parts of steps: the region's
// ledger entry then shows them, each in force from its step.
func (a *Agent) publish(g []int64, steps []grantStep, want int64, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	own := &a.states[a.r]
	var prev int64
	for _, st := range steps {
		for o, u := range g {
			x := u*st.cum/want - u*prev/want
			if x <= 0 {
				continue
			}
			own.Given[o] += x
			if st.at > now.UnixNano() {
				own.Future = append(own.Future, Grant{To: o, Units: x, At: st.at})
			}
		}
		prev = st.cum
	}
	a.owned -= want
	a.pending -= want // all of it in memory; through the table, ready lowerings'
	if a.tbl != nil {
		a.tbl.consume(want)
	}
	a.stats.Given += want
	a.stats.Grants++
	a.stats.Share = a.owned
}

// clampPlan scales g (summing to want) down to what the region holds:
// the plan counts the grants to it not yet in force (or read less than
// Skew ago). It returns the new sum.
func clampPlan(g []int64, want, owned int64) int64 {
	if want <= owned {
		return want
	}
	var sum int64
	for o := range g {
		g[o] = g[o] * max(owned, 0) / want
		sum += g[o]
	}
	return sum
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// wait returns when no decision that read the cap of a generation before
// gen is under way (in memory; through the table, lowerTable waits).
func (a *Agent) wait(gen int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		busy := false
		for g, n := range a.inflight {
			if g < gen && n > 0 {
				busy = true
			}
		}
		if !busy {
			return
		}
		a.cond.Wait()
	}
}

// enterWindow registers a decision stamped t and returns the cap it is
// judged against (grants in force at t included) and its generation.
func (a *Agent) enterWindow(t int64) (int64, int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inflight[a.gen]++
	c := a.owned - a.pending
	for _, f := range a.incoming {
		if f.At <= t {
			c += f.Units
		}
	}
	return c, a.gen
}

func (a *Agent) leave(gen int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inflight[gen]--; a.inflight[gen] <= 0 {
		delete(a.inflight, gen)
		a.cond.Broadcast()
	}
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func (a *Agent) count(f func(*AgentStats)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(&a.stats)
}

// Share returns the share in force (without pending grants) and what
// is withheld for grants.
func (a *Agent) Share() (share, pending int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.owned, a.pending
}

// Stats returns the agent's counts.
func (a *Agent) Stats() AgentStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.stats
	s.Share = a.owned
	return s
}

// Limiter is one process's limiter of its region's share of the agent's
// key. Safe for concurrent use.
type Limiter struct {
	a     *Agent
	store any
	w     *limiter.SlidingWindow // a window's

	mu      sync.Mutex
	buckets map[*bucketItem]*limiter.TokenBucket // a bucket's, per item
	retired limiter.LeaseStats                   // the lease counts of buckets of replaced items
}

// NewLimiter returns a limiter of the agent's region on store (a
// process's own, of the agent's kind).
func (a *Agent) NewLimiter(store any) (*Limiter, error) {
	l := &Limiter{a: a, store: store, buckets: map[*bucketItem]*limiter.TokenBucket{}}
	if a.cfg.Bucket != nil {
		if _, ok := store.(storage.BucketStore); !ok {
			return nil, fmt.Errorf("%w: a bucket's store must be a storage.BucketStore, not %T", ErrInvalidConfig, store)
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, it := range a.items {
			it.procs = append(it.procs, l)
		}
		return l, nil
	}
	c, ok := store.(storage.Counter)
	if !ok {
		return nil, fmt.Errorf("%w: a window's store must be a storage.Counter, not %T", ErrInvalidConfig, store)
	}
	w, err := a.cfg.window(c, a.cfg.Leases)
	if err != nil {
		return nil, err
	}
	l.w = w
	return l, nil
}

// ErrKey is returned for a key other than the agent's.
var ErrKey = errors.New("regions: not the agent's key")

// AllowN decides n units of key at now against the region's share, on
// the region's own item of the key (no other region writes it, so
// last-writer-wins never replaces its counts).
func (l *Limiter) AllowN(ctx context.Context, key string, now time.Time, n int64) (limiter.Decision, error) {
	if key != l.a.cfg.Key {
		return limiter.Decision{}, fmt.Errorf("%w: %q, not %q", ErrKey, key, l.a.cfg.Key)
	}
	l.a.offered.Add(n)
	if l.a.cfg.Bucket != nil {
		return l.allowBucket(ctx, now, n)
	}
	cap, gen := l.a.enterWindow(now.UnixNano())
	defer l.a.leave(gen)
	if cap < n {
		return limiter.Decision{Limit: max(cap, 0), RetryAfter: l.a.cfg.Window / time.Duration(l.a.cfg.SubWindows)}, nil
	}
	var out [1]limiter.Outcome
	if _, err := limiter.Decide(ctx, now, []limiter.Item{{Limit: l.w, Key: l.a.key(), N: n, Cap: cap}}, out[:]); err != nil {
		return limiter.Decision{}, err
	}
	return out[0].Decision, out[0].Err
}

// Refund gives nothing back: the share, and so the cap that judged the
// units, may have changed since they were taken. A lost refund
// under-admits until the units leave the window; it never over-admits.
func (l *Limiter) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	return nil
}

// LeaseStats sums the limiter's capacity lease counts: its window's, or
// its buckets' (of every item it decided on, those a rebase replaced
// included).
func (l *Limiter) LeaseStats() limiter.LeaseStats {
	if l.w != nil {
		return l.w.LeaseStats()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return bucketLeases(l.retired, l.buckets)
}

var _ limiter.Limiter = (*Limiter)(nil)
