package regions

import (
	"context"
	"math/bits"
	"slices"
	"time"
)

// Offers (Config.Offers; the ledger path, and a bucket's through the
// table, with the differences listed at the end): a region
// whose share is above what its own demand needs gives the rest without
// knowing who needs it. At its tick, stamped tau, it withholds X units
// from its own use and lists an Offer of X in its entry. Every region,
// once it has read every region's entry stamped tau or later, knows each
// region's demand and share as of tau (the latest Mark stamped at or
// before tau, from the entries' recent marks) and computes the same split
// of X from them (offerSplit): each region short of its target gets a
// part in proportion to what it lacks, the giver none. A recipient takes
// its part at its first tick at which it has read every region past tau,
// if that is before tau + offerTTL on its clock (less Skew), and lists
// the resolution (Took, taken or not) in its entry; it never takes it
// later. The giver takes back X less what the others took once every
// other region's entry lists its resolution. So a part is in force at
// one region at most, never before its giver withheld it (a recipient
// reads past tau only after the giver's entry at tau), and the giver
// reuses only what nobody took and nobody can take: the shares in force
// never sum above the units. A region partitioned holds every offer
// made meanwhile withheld until its entries replicate again (its
// resolutions are needed), and a region that never publishes holds it
// for good: offerOpen stops a giver from offering more while an offer is
// older than offerStuck.
//
// A bucket's offer is, in transit, a bucket of its own (as a grant's
// Move): capacity X holding the Tokens the giver carried at At (its new
// item's first stamp) and refilled at X's rate from then on; each part
// takes its proportion of the tokens and of the refill up to its
// recipient's tick. A part returned to its giver returns empty. A
// window's offer is of units free in the giver's count only (out of its
// view): the recipient's cap rises at once.
//
// Through the table (a bucket's only): the giver's withholding is its
// rebase to its share less X, in force from its new item's first stamp
// (Offer.At, up to a validity after tau), and a recipient takes its part
// no earlier than its tick stamped At (less Skew) or later; a part
// carries no tokens. The agent's offer state is saved in its item with
// the entry (State.Open, Thru) and resumed at every tick (resumeOffers).
// A region offers only while every other region's entry it reads is
// fresh (offerFresh): where nothing ticks a region's agent, no offer is
// made to wait for it. To keep the entry about 1 KB (a write unit), a
// giver's offers are listed by its open ones (State.Open), a recipient
// lists a part it took only until its giver's entry shows the offer
// settled and a resolution of nothing not at all (its Thru stands for
// it: tookDone, settleOffers), and the marks are those of markSpan, in
// a compact form (markList).

const (
	// offerTTL is how long after its stamp an offer's part may be
	// taken.
	offerTTL = 4 * time.Second
	// offerStuck: a giver with an offer this old unsettled offers no more.
	offerStuck = 2 * offerTTL
	// markMax is how many marks an entry lists (its own last); tookKeep
	// how long a resolution stays listed (its giver must read it).
	markMax  = 16
	tookKeep = 30 * time.Second
	// markSpan: through the table an entry lists its marks of this
	// long before it (at least two): a region that reads another's
	// entries at least this often knows all its marks.
	markSpan = 2 * time.Second
	// offerList is how long after its stamp an offer stays listed in
	// its giver's entry (past offerTTL: a recipient that reads it
	// unlisted resolves it as not taken). Through the table an offer is
	// listed while it is open (State.Open).
	offerList = offerTTL + time.Second
	// offerFresh: through the table a region offers only while every
	// other region's entry it reads was published within this (and
	// Skew) of its tick: regions where nothing ticks the key never
	// resolve an offer (offerOpen).
	offerFresh = 3 * time.Second
)

// Offer is units offered to whoever lacks them as of Tau (see above).
type Offer struct {
	N      int64 `json:"n"` // the giver's offers' number
	Tau    int64 `json:"t"`
	Units  int64 `json:"u"`
	Tokens int64 `json:"k,omitempty"` // a bucket's, carried at At
	At     int64 `json:"a,omitempty"`
}

// Mark is a region's demand and share as published in its entry Seq N
// stamped At.
type Mark struct {
	N      int64   `json:"n"`
	At     int64   `json:"t"`
	Demand float64 `json:"d"`
	Share  int64   `json:"s"`
}

// Took is a resolution of region From's offer N: Units taken (0: none,
// never).
type Took struct {
	From  int   `json:"o"`
	N     int64 `json:"n"`
	Units int64 `json:"u"`
	At    int64 `json:"t"`
}

// OpenOffer is a giver's offer not settled (State.Open, through the
// table): Res has bit o set once region o's resolution was read, Taken
// the units those resolutions took.
type OpenOffer struct {
	Offer
	Res   int64 `json:"r,omitempty"`
	Taken int64 `json:"tk,omitempty"`
}

// offerState is an agent's side of the offers.
type offerState struct {
	n     int64     // its offers so far
	mine  []myOffer // its offers not settled
	thru  []int64   // per giver: the last offer resolved here
	marks [][]Mark  // per region: the marks read, by N
}

type myOffer struct {
	Offer
	res   []bool // resolved by each region
	taken int64
}

func newOfferState(regions int) *offerState {
	return &offerState{thru: make([]int64, regions), marks: make([][]Mark, regions)}
}

// learn adds the marks of region o's entry st to those known.
func (s *offerState) learn(o int, st State, now int64) {
	ms := s.marks[o]
	for _, m := range st.Marks {
		i, found := slices.BinarySearchFunc(ms, m.N, func(x Mark, n int64) int { return int(x.N - n) })
		if !found {
			ms = slices.Insert(ms, i, m)
		}
	}
	cut := 0
	for cut < len(ms)-markMax && ms[cut].At < now-int64(tookKeep) {
		cut++
	}
	s.marks[o] = ms[cut:]
}

// asOf is region o's mark as of tau (its latest stamped at or before),
// if known for sure: the next mark (stamped after tau) is known too, or
// none before tau was published (ok, zero mark).
func (s *offerState) asOf(o int, tau int64) (Mark, bool) {
	ms := s.marks[o]
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].At > tau {
			continue
		}
		// A region's stamps increase: one stamped tau is the last.
		if ms[i].At == tau || i+1 < len(ms) && ms[i+1].N == ms[i].N+1 {
			return ms[i], true
		}
		return Mark{}, false // the next is unknown: not read past tau
	}
	if len(ms) > 0 && ms[0].N == 1 {
		return Mark{}, true // none before tau
	}
	return Mark{}, false
}

// latest is region o's last mark known (brokenOffer: a recipient that
// splits by what it read by now, not as of the offer's stamp).
func (s *offerState) latest(o int) (Mark, bool) {
	ms := s.marks[o]
	if len(ms) == 0 {
		return Mark{}, true
	}
	return ms[len(ms)-1], true
}

// offerSplit is the parts of offer o of giver g (nil: not known here):
// what each other region lacks of its target as of o.Tau (the units in
// proportion to the demands, each at most the limit's rate, none for an
// entry StaleEntry older than Tau), in proportion, at most o.Units
// altogether.
func (a *Agent) offerSplit(g int, o Offer) []int64 {
	n := a.cfg.Regions
	states := make([]State, n)
	shares := make([]int64, n)
	for q := range n {
		m, ok := a.off.asOf(q, o.Tau)
		if a.brokenOffer {
			m, ok = a.off.latest(q)
		}
		if !ok {
			return nil
		}
		shares[q] = a.cfg.base(q)
		if m.N > 0 {
			shares[q] = m.Share
			if o.Tau-m.At <= int64(StaleEntry) || a.brokenOffer {
				states[q].Demand = min(m.Demand, a.cfg.rate())
			}
		}
	}
	tg := a.cfg.targets(states)
	lack := make([]float64, n)
	var sum float64
	for q := range n {
		if q != g {
			lack[q] = max(tg[q]-float64(shares[q]), 0)
			sum += lack[q]
		}
	}
	parts := make([]int64, n)
	if sum < 1 {
		return parts
	}
	give := min(float64(o.Units), sum)
	for q := range n {
		parts[q] = int64(give * lack[q] / sum)
	}
	return parts
}

// readPast reports whether every region's entry read here (its own
// published) is stamped tau or later.
func (a *Agent) readPast(tau int64) bool {
	for _, st := range a.states {
		if st.At < tau {
			return false
		}
	}
	return true
}

// takeOffers resolves the other regions' offers at now (see the
// comment above) and returns the units and tokens taken. Under no lock:
// Tick's own state.
func (a *Agent) takeOffers(now time.Time) (units, tokens int64) {
	t, skew := now.UnixNano(), int64(a.cfg.Skew)
	for o, st := range a.states {
		if o != a.r {
			a.off.learn(o, st, t)
		}
	}
	own := &a.states[a.r]
	for g, st := range a.states {
		if g == a.r {
			continue
		}
		listed := st.Offers
		if a.tbl != nil {
			listed = openOffers(st.Open)
		}
		for n := a.off.thru[g] + 1; n <= st.OfferN; n++ {
			i := slices.IndexFunc(listed, func(o Offer) bool { return o.N == n })
			if i < 0 || t+skew >= listed[i].Tau+int64(offerTTL) {
				a.resolve(own, g, n, 0, t) // unlisted or late: never
				continue
			}
			o := listed[i]
			if !a.readPast(o.Tau) && !a.brokenOffer {
				break // later, in order
			}
			if a.tbl != nil && t-skew < o.At && !a.brokenOffer {
				// Through the table the giver's withholding is in
				// force from its new item's first stamp (At), up to a
				// validity after tau: a part taken before would be in
				// force twice.
				break
			}
			var p int64
			if parts := a.offerSplit(g, o); parts != nil {
				p = parts[a.r]
			}
			units += p
			if a.tbl == nil {
				// Through the table a part carries no tokens (its
				// raise credits the refill from the tick, as a raise
				// no giver listed: rebaseTable).
				tokens += a.offerTokens(o, p, t-skew)
			}
			a.resolve(own, g, n, p, t)
		}
	}
	own.Took = slices.DeleteFunc(own.Took, func(k Took) bool { return a.tookDone(k, t) })
	return units, tokens
}

// openOffers is the offers of open (through the table, a giver lists
// its offers by its open ones: one settled is resolved everywhere, so no
// region reads it again).
func openOffers(open []OpenOffer) []Offer {
	out := make([]Offer, len(open))
	for i, o := range open {
		out[i] = o.Offer
	}
	return out
}

func (a *Agent) resolve(own *State, g int, n, units, t int64) {
	a.off.thru[g] = n
	if units > 0 || a.tbl == nil {
		// Through the table a resolution of nothing is not listed:
		// the entry's Thru stands for it (settleOffers).
		own.Took = append(own.Took, Took{From: g, N: n, Units: units, At: t})
	}
	own.OfferNet += units
}

// tookDone reports whether resolution k may leave the region's entry at
// t. On the ledger path: tookKeep after it (its giver has read it by
// then, or holds the offer withheld for good). Through the table: once
// its giver's entry as read here shows the offer settled (numbered, and
// not open): the giver read it, and its successors resume the offer as
// settled, so none reads the resolution missing as "none taken"
// (settleOffers). A giver's entry replicates in order: a settled offer
// never shows open again.
func (a *Agent) tookDone(k Took, t int64) bool {
	if a.tbl == nil {
		return k.At < t-int64(tookKeep)
	}
	if a.brokenPrune {
		return true
	}
	g := a.states[k.From]
	return k.N <= g.OfferN && !slices.ContainsFunc(g.Open, func(o OpenOffer) bool { return o.N == k.N })
}

// offerTokens is a bucket's part p of offer o at stamp t: its proportion
// of the tokens carried, and of the refill of the offer's units since
// At, at most p (a window's: none).
func (a *Agent) offerTokens(o Offer, p, t int64) int64 {
	b := a.cfg.Bucket
	if b == nil || p <= 0 || o.Units <= 0 {
		return 0
	}
	k := o.Tokens * p / o.Units
	if t <= o.At || k >= p {
		return min(k, p)
	}
	hi, lo := bits.Mul64(uint64(p)*uint64(b.RefillAmount), uint64(t-o.At))
	den := uint64(a.cfg.units()) * uint64(b.RefillTime)
	if hi >= den {
		return p
	}
	q, _ := bits.Div64(hi, lo, den)
	return k + int64(min(q, uint64(p-k)))
}

// settleOffers takes back what this region's settled offers left: each
// once every other region's entry lists its resolution. It returns the
// units back.
func (a *Agent) settleOffers(now time.Time) int64 {
	var back int64
	own := &a.states[a.r]
	keep := a.off.mine[:0]
	for _, m := range a.off.mine {
		left := 0
		for o, st := range a.states {
			if o == a.r || m.res[o] {
				continue
			}
			if i := slices.IndexFunc(st.Took, func(k Took) bool { return k.From == a.r && k.N == m.N }); i >= 0 {
				m.res[o] = true
				m.taken += st.Took[i].Units
			} else if a.brokenCut && now.UnixNano()-st.At > int64(2*time.Second) {
				m.res[o] = true // a region not heard from: none taken
			} else if a.tbl != nil && a.r < len(st.Thru) && st.Thru[a.r] >= m.N {
				// Through the table: resolved, and not listed, so of
				// nothing (a part taken stays listed until this
				// region's entry shows the offer settled: tookDone).
				m.res[o] = true
			} else {
				left++
			}
		}
		if left > 0 {
			keep = append(keep, m)
			continue
		}
		if !a.brokenGive {
			back += m.Units - m.taken
		}
	}
	a.off.mine = keep
	own.OfferNet += back
	t := now.UnixNano()
	own.Offers = slices.DeleteFunc(own.Offers, func(o Offer) bool { return o.Tau < t-int64(offerList) })
	return back
}

// offerOpen reports whether the region may offer at now: its own demand
// measured (a tick's count), and none of its offers stuck.
func (a *Agent) offerOpen(now time.Time) bool {
	if a.stats.Ticks < 2 {
		return false
	}
	if a.tbl != nil {
		// Through the table: only while every other region's entry is
		// fresh (a region whose agent stopped would hold the offer
		// withheld until something ticks it again).
		for o, st := range a.states {
			if o != a.r && (st.Seq == 0 || now.UnixNano()-st.At > int64(offerFresh+a.cfg.Skew)) {
				return false
			}
		}
	}
	for _, m := range a.off.mine {
		if m.Tau < now.UnixNano()-int64(offerStuck) {
			return false
		}
	}
	return true
}

// offerSize is what the region offers of owned at now (0: nothing): its
// share above its need (Config.need, of the larger of its estimate and
// its last tick's count), at least minSurplus of the units; at most twice
// what the others lack as it reads them, unless it has not read them all.
func (a *Agent) offerSize(now time.Time, owned int64) int64 {
	if !a.offerOpen(now) {
		return 0
	}
	states := a.planView(now)
	own := a.states[a.r]
	d := max(own.Demand, min(a.lastRate, a.cfg.rate()))
	x := float64(owned) - a.cfg.need(d)
	tg := a.cfg.targets(states)
	var lack float64
	known := true
	for o, st := range states {
		if o == a.r {
			continue
		}
		known = known && st.Seq > 0
		lack += max(tg[o]-float64(a.cfg.share(o, states)), 0)
	}
	if known {
		x = min(x, 2*lack)
	}
	if x < max(minSurplus*float64(a.cfg.units()), 1) {
		return 0
	}
	return int64(x)
}

// addOffer lists an offer of x units at now (a bucket's carrying tokens
// from at): the caller withholds them (a.owned, OfferNet).
func (a *Agent) addOffer(now time.Time, x, tokens, at int64) {
	a.off.n++
	o := Offer{N: a.off.n, Tau: now.UnixNano(), Units: x, Tokens: tokens, At: at}
	own := &a.states[a.r]
	own.Offers = append(own.Offers, o)
	own.OfferN = o.N
	a.off.mine = append(a.off.mine, myOffer{Offer: o, res: make([]bool, a.cfg.Regions)})
}

// mark adds the region's own mark to its entry about to be published
// (Seq and At set), keeping the last markMax.
func (a *Agent) mark(own *State) {
	own.Marks = append(own.Marks, newMark(own, a.owned))
	if n := len(own.Marks); n > markMax {
		own.Marks = slices.Delete(own.Marks, 0, n-markMax)
	}
	a.off.learn(a.r, *own, own.At)
}

// offering reports whether the agent makes and takes offers (Config.Offers,
// on the ledger path, and through the table for a bucket).
func (a *Agent) offering() bool { return a.off != nil && (a.tbl == nil || a.cfg.Bucket != nil) }

// resumeOffers sets the offer state from the region's entry st as its
// item holds it (through the table, at every tick: a successor resumes
// the same way): the offers not settled, and per giver the last offer
// resolved. A successor that forgot them would take an offer again (over)
// or never take its own back (withheld for good). Under a.mu.
func (a *Agent) resumeOffers(st State) {
	if !a.offering() {
		return
	}
	s := a.off
	s.marks[a.r] = nil // only what the item holds (saveOffers)
	s.learn(a.r, st, st.At)
	if a.brokenForget {
		return // its own marks learnt, its offers and resolutions not
	}
	s.n = st.OfferN
	s.thru = make([]int64, a.cfg.Regions)
	copy(s.thru, st.Thru)
	s.mine = s.mine[:0]
	for _, o := range st.Open {
		m := myOffer{Offer: o.Offer, res: make([]bool, a.cfg.Regions), taken: o.Taken}
		for q := range m.res {
			m.res[q] = o.Res&(1<<q) != 0
		}
		s.mine = append(s.mine, m)
	}
}

// saveOffers puts the offer state in the region's entry own about to be
// saved (Seq and At set: its mark too). Under a.mu.
func (a *Agent) saveOffers(own *State, prev int64) {
	if !a.offering() {
		return
	}
	own.At = max(own.At, prev+1) // asOf: a region's stamps increase
	// Not learned here (mark does): a save lost would leave a mark
	// never published, and the next one published with its number.
	// resumeOffers learns the marks the item holds.
	own.Marks = append(own.Marks, newMark(own, a.owned))
	for len(own.Marks) > markMax || len(own.Marks) > 2 && own.Marks[0].At < own.At-int64(markSpan) {
		own.Marks = own.Marks[1:]
	}
	own.Offers = nil // listed by Open
	own.Thru = slices.Clone(a.off.thru)
	own.Open = own.Open[:0:0]
	for _, m := range a.off.mine {
		o := OpenOffer{Offer: m.Offer, Taken: m.taken}
		for q, r := range m.res {
			if r {
				o.Res |= 1 << q
			}
		}
		own.Open = append(own.Open, o)
	}
}

// offersIn takes the others' offers' parts for this region and what its
// own settled offers left (a bucket's rebase at giveBucket puts them in
// its bucket, with the tokens).
func (a *Agent) offersIn(now time.Time) {
	if !a.offering() {
		return
	}
	units, tokens := a.takeOffers(now)
	back := a.settleOffers(now)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.owned += units + back
	a.carryIn += tokens
	a.openOffers = len(a.off.mine)
	a.partsIn += units
	a.stats.Received += units
	a.stats.Share = a.owned
}

// offerBucket is the offer a bucket's giver makes at now of owned (0:
// none), withheld from the entry's share at once (the plan that follows
// sees it).
func (a *Agent) offerBucket(now time.Time, owned int64) int64 {
	if !a.offering() {
		return 0
	}
	x := a.offerSize(now, owned)
	if !a.brokenGive {
		a.states[a.r].OfferNet -= x
	}
	return x
}

// listBucket lists the bucket's offer of x (withheld by offerBucket),
// carrying tokens from at, or, if the rebase failed (ok false), undoes
// the withholding.
func (a *Agent) listBucket(now time.Time, x, tokens, at int64, ok bool) {
	if x == 0 {
		return
	}
	if !ok {
		if !a.brokenGive {
			a.states[a.r].OfferNet += x
		}
		return
	}
	a.addOffer(now, x, tokens, at)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.brokenGive {
		return
	}
	a.owned -= x
	a.stats.Given += x
	a.stats.Share = a.owned
}

// offerWindow offers a window's share above the region's need, of what
// its count leaves free now (if offering): it lowers the cap by the
// offer, waits for the decisions that read a higher one, then offers
// what the count in view leaves free.
func (a *Agent) offerWindow(ctx context.Context, now time.Time) error {
	if !a.offering() {
		return nil
	}
	a.mu.Lock()
	x := a.offerSize(now, a.owned-a.pending)
	if x == 0 {
		a.mu.Unlock()
		return nil
	}
	a.pending += x
	a.gen++
	gen := a.gen
	a.mu.Unlock()
	a.wait(gen)
	d, err := a.peek.Peek(ctx, a.key(), now)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending -= x
	if err != nil {
		return err
	}
	if !a.brokenGive {
		x = min(x, max(a.owned-(a.cfg.Limit-d.Remaining), 0))
	}
	if x < max(int64(minSurplus*float64(a.cfg.units())), 1) {
		return nil
	}
	a.addOffer(now, x, 0, 0)
	if !a.brokenGive {
		a.states[a.r].OfferNet -= x
		a.owned -= x
	}
	a.stats.Given += x
	a.stats.Share = a.owned
	return nil
}

// offers is the region's offers not settled (tests).
func (a *Agent) offers() []Offer {
	if a.off == nil {
		return nil
	}
	var out []Offer
	for _, m := range a.off.mine {
		out = append(out, m.Offer)
	}
	return out
}
