package regions

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// offerTableCase is a run of TestSharesTableOffers.
type offerTableCase struct {
	name string
	// wait: the agents' stores are taken as not fencing (a rebase takes
	// over a validity after its tick: an offer's At is then well past
	// its tau).
	wait bool
	// successor: every region has a standby agent; the holders stop at
	// the first step where region 0 has taken a part of an offer (its
	// giver may have settled it by then), and the standbys take the
	// roles over.
	successor bool
	// brokenGive: givers keep what they offer; brokenForget: the
	// standbys resume no offer state; brokenPrune: recipients list no
	// part they took (their givers read none taken).
	brokenGive, brokenForget, brokenPrune bool
	// cut: "taker", region 0 is cut off (offerCut) once it has taken a
	// part of an offer its giver has not settled; "giver", region 1 is
	// once it has an offer open. brokenCut: givers take a region not
	// heard from for 2 s as having taken none.
	cut       string
	brokenCut bool
}

// offerTableResult is what a run saw: the union's history over the
// bucket's bound, the largest sum of the regions' shares in force (the
// agents that last held each role), and the accounting's faults.
type offerTableResult struct {
	over     []limitertest.Violation
	maxShare int64
	faults   []string
	offers   int64 // offers made
	taken    int64 // units taken from offers, as the entries list them
	received int64 // the regions' OfferNet above zero at the end
	frozen   bool  // the holders stopped (successor)
	start    time.Time
	// unsettled: the offers open at the cut still open at the end.
	unsettled []string
	tookOver  bool // and the standbys hold the roles at the end
	admitted  int
	cut       *offerCut // the cut cases'
	failed    int       // decisions failed
	firstErr  error     // the first
}

// TestSharesTableOffers: offers (Config.Offers) through the table, a
// bucket's (three regions on one DynamoDB Local, no replication lag, a
// simulated clock never behind the wall clock, memory stores), demand
// 98/1/1 at 1.2 times the rate for 5 s: the idle regions offer their
// share above their need, the busy one takes parts. Checked: the union's
// history against the bucket's bound (CheckBucketBound), the regions'
// shares in force (each region's last holder's) never summing above the
// units, no offer resolved twice in a region (by every entry saved: a
// part taken is listed only until its giver settles it, a resolution of
// nothing only by Thru, which never steps back), and each giver's offer
// total (State.OfferNet) equal to what the resolutions saved and its
// unsettled offers account for. Cases: fenced (the default), wait (a
// store that does not fence: an offer's withholding is in force a
// validity after its tau, and a part is taken no earlier), successor
// (every region's holder stops once region 0 took a part of an offer:
// the standbys resume the offer state from the item). Broken: a giver
// that keeps what it offers (the shares sum above the units, its
// accounting short); a successor that forgets the offer state (region
// 0's resolves the offers again: resolved twice, its Thru steps back; a
// giver's, where its offer was still open, never takes back what it
// offered: its accounting is short, not asserted apart); recipients
// that list no part they took (their givers take the whole offer back:
// the shares sum above the units, the accounting short).
func TestSharesTableOffers(t *testing.T) {
	client, table := testTable(t)
	for _, c := range []offerTableCase{
		{name: "fenced"},
		{name: "wait", wait: true},
		{name: "successor", successor: true},
		{name: "broken-give", brokenGive: true},
		{name: "broken-forget", successor: true, brokenForget: true},
		{name: "broken-prune", brokenPrune: true},
		{name: "cut-taker", cut: "taker"},
		{name: "cut-giver", cut: "giver"},
		{name: "broken-cut", cut: "taker", brokenCut: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			res := offerTableRun(t, client, table, c)
			t.Logf("%s: %d admitted, %d failed (%v), %d offers, %d units taken (OfferNet above 0: %d), largest sum of shares %d, %d over, faults %v",
				c.name, res.admitted, res.failed, res.firstErr, res.offers, res.taken, res.received, res.maxShare, len(res.over), res.faults)
			// A cut case's offers open at the cut stay open until it heals
			// (their givers cannot read every resolution before), and are
			// settled by the end.
			cutBad := res.cut != nil && (len(res.cut.early) > 0 || len(res.unsettled) > 0)
			failed := len(res.over) > 0 || res.maxShare > offerTableCfg.units() || len(res.faults) > 0 || cutBad
			broken := c.brokenGive || c.brokenForget || c.brokenPrune || c.brokenCut
			if cut := res.cut; cut != nil {
				t.Logf("%s: cut %v after the start, healed %v later; asked and admitted by region before, during and after: %v %v, %v %v, %v %v; offers open at the cut %v, settled before it healed %v, open at the end %v",
					c.name, cut.at.Sub(res.start).Round(time.Millisecond), cut.heal.Sub(cut.at).Round(time.Millisecond),
					cut.asked[0], cut.admitted[0], cut.asked[1], cut.admitted[1], cut.asked[2], cut.admitted[2], cut.open, cut.early, res.unsettled)
			}
			switch {
			case res.cut != nil && res.cut.heal.IsZero():
				t.Errorf("the cut's moment never came, or it never healed: cut at %v", res.cut.at)
			case res.offers == 0 || max(res.taken, res.received) == 0:
				t.Errorf("%d offers, %d units taken (OfferNet above 0: %d): the offers did not move units", res.offers, res.taken, res.received)
			case c.successor && (!res.frozen || !res.tookOver):
				t.Errorf("the holders stopped mid-offer: %v; the standbys took the roles over: %v", res.frozen, res.tookOver)
			case broken && !failed:
				t.Errorf("the broken agents passed every check")
			case !broken && failed:
				t.Errorf("over the bound: %v; shares up to %d of %d units; faults %v", res.over, res.maxShare, offerTableCfg.units(), res.faults)
			}
		})
	}
}

var offerTableCfg = Config{Regions: 3, Key: "k", Bucket: &limiter.TokenBucketConfig{Name: "global", MaxAmount: 200, RefillTime: 10 * time.Millisecond,
	RefillAmount: 2}, Offers: true}

func offerTableRun(t *testing.T, client *dynamodb.Client, table string, c offerTableCase) offerTableResult {
	ctx := t.Context()
	cfg := offerTableCfg
	now := time.Now()
	name := fmt.Sprintf("offers-%s-%d", c.name, now.UnixNano())
	var (
		holders, standbys [3]*Agent
		procs             [3]*Process
	)
	newAgent := func(r int, holder string, st *memory.Store, tt Table) *Agent {
		a, err := NewTableAgent(cfg, tt, holder, st)
		if err != nil {
			t.Fatal(err)
		}
		if c.wait {
			a.tbl.fenced = false
		}
		a.brokenGive, a.brokenPrune, a.brokenCut = c.brokenGive, c.brokenPrune, c.brokenCut
		return a
	}
	cut := &cutState{region: -1}
	for r := range holders {
		tt := Table{Client: newCutClient(client, r, cut), Table: table, Name: name, Region: r, Refresh: 100 * time.Millisecond, Flush: 100 * time.Millisecond,
			Validity: time.Second, Deadline: time.Second, LockLife: 750 * time.Millisecond}
		st := memStore(t)
		holders[r] = newAgent(r, fmt.Sprintf("r%d-a", r), st, tt)
		if c.successor {
			standbys[r] = newAgent(r, fmt.Sprintf("r%d-b", r), st, tt)
			standbys[r].brokenForget = c.brokenForget
		}
		var err error
		if procs[r], err = NewProcess(cfg, tt, st); err != nil {
			t.Fatal(err)
		}
		// A decision without a valid entry fails at once (not
		// admitted): this loop is what ticks the agents.
		procs[r].brokenNoWait = true
	}
	// The first ticks take the roles and publish the entries the
	// processes need.
	for r, a := range holders {
		if err := a.Tick(ctx, now); err != nil || !a.Holds() {
			t.Fatalf("region %d's first tick: %v (holds: %v)", r, err, a.Holds())
		}
	}
	var res offerTableResult
	if c.cut != "" {
		res.cut = &offerCut{state: cut, giver: c.cut == "giver"}
	}
	var calls []limitertest.Call
	seen := newOfferLog()
	cur := holders // each region's agent that last held its role
	stopped := false
	var frozeAt time.Time
	split := []float64{0.98, 0.01, 0.01}
	rate := 1.2 * cfg.rate()
	owe := make([]float64, 3)
	const step = 50 * time.Millisecond
	if now.Before(time.Now()) {
		now = time.Now() // the first ticks' requests took their time
	}
	start := now
	res.start = start
	var next [3]time.Time // each region's next tick: every 250 ms, a step apart
	for r := range next {
		next[r] = start.Add(time.Duration(r+1) * step)
	}
	end := start.Add(5 * time.Second)
	for now.Before(end) {
		if now = now.Add(step); now.Before(time.Now()) {
			now = time.Now()
		}
		for r := range 3 {
			owe[r] += split[r] * rate * step.Seconds()
			for ; owe[r] >= 1; owe[r]-- {
				d, err := procs[r].AllowN(ctx, "k", now, 1)
				if err != nil {
					res.failed++ // no valid entry (a takeover's gap): not admitted
					if res.firstErr == nil {
						res.firstErr = err
					}
					continue
				}
				calls = append(calls, limitertest.Call{Key: "k", Cost: 1, Stamp: now, Allowed: d.Allowed, Reached: true})
				res.cut.count(r, d.Allowed)
			}
		}
		for r := range 3 {
			if now.Before(next[r]) {
				continue
			}
			next[r] = now.Add(250 * time.Millisecond)
			for _, a := range []*Agent{holders[r], standbys[r]} {
				if a == nil || stopped && a == holders[r] {
					continue
				}
				if stopped && r > 0 && now.Before(frozeAt.Add(giverStall)) {
					continue // the givers' standbys wait
				}
				err := a.Tick(ctx, now)
				if err != nil && !errors.Is(err, errStopped) {
					t.Logf("region %d tick: %v", r, err)
				}
				if a.Holds() {
					cur[r] = a
					if err == nil {
						seen.add(r, a.states[r]) // saved: published
					}
				}
				if res.cut != nil {
					// Right after the tick: before the others read it.
					end = latest(end, res.cut.step(now, cur))
				}
			}
		}
		if c.successor && !stopped && midOffer(holders[0]) {
			// The run goes on at least 3 s more: the standbys take
			// the roles over a LockLife after the holders' last saves.
			stopped, res.frozen, frozeAt = true, true, now
			end = latest(end, now.Add(3*time.Second))
		}
		var sum int64
		for _, a := range cur {
			s, _ := a.Share()
			sum += s
		}
		res.maxShare = max(res.maxShare, sum)
	}
	for _, cl := range calls {
		if cl.Allowed {
			res.admitted++
		}
	}
	res.over = limitertest.CheckBucketBound(calls, *cfg.Bucket)
	var states [3]State
	for r, a := range cur {
		states[r] = a.states[r]
		res.offers += states[r].OfferN
	}
	res.taken, res.faults = seen.accounts(states[:])
	if res.cut != nil {
		res.unsettled = res.cut.unsettled(states[:], true)
	}
	for _, st := range states {
		res.received += max(st.OfferNet, 0)
	}
	res.tookOver = c.successor && standbys[0].Holds() && standbys[1].Holds() && standbys[2].Holds()
	return res
}

// giverStall is how long after the holders stop the givers' standbys
// wait before they tick: region 0's standby takes its role over while
// the offers it took parts of are still open (listed), so that one
// that forgot what it resolved would take them again.
const giverStall = 1500 * time.Millisecond

// offerCut is a cut case's partition and what each region admitted
// before, during and after it.
type offerCut struct {
	state    *cutState
	giver    bool       // region 1 is cut (else region 0)
	at, heal time.Time  // the cut and its end (zero: not yet)
	open     [3][]int64 // the givers' offers open at the cut
	// early: those settled before the cut healed (their giver cannot
	// have read every resolution).
	early    []string
	asked    [3][3]int // by phase (before, during, after) and region
	admitted [3][3]int
}

// cutFor is how long a cut case's partition lasts.
const cutFor = 3 * time.Second

func (c *offerCut) count(r int, allowed bool) {
	if c == nil {
		return
	}
	p := 0
	if !c.heal.IsZero() {
		p = 2
	} else if !c.at.IsZero() {
		p = 1
	}
	c.asked[p][r]++
	if allowed {
		c.admitted[p][r]++
	}
}

// step starts the cut when its moment has come, ends it cutFor later,
// and returns the run's end (3 s after the cut ends; zero before).
func (c *offerCut) step(now time.Time, cur [3]*Agent) time.Time {
	switch {
	case c.at.IsZero() && c.ready(cur):
		r := 0
		if c.giver {
			r = 1
		}
		c.state.set(r)
		c.at = now
		for g, a := range cur {
			for _, m := range a.off.mine {
				c.open[g] = append(c.open[g], m.N)
			}
		}
	case !c.at.IsZero() && c.heal.IsZero() && now.Sub(c.at) >= cutFor:
		var states [3]State
		for g, a := range cur {
			states[g] = a.states[g]
		}
		c.early = c.unsettled(states[:], false)
		c.state.set(-1)
		c.heal = now
	}
	if c.at.IsZero() {
		return time.Time{}
	}
	return c.at.Add(cutFor + 3*time.Second)
}

// ready reports whether the cut's moment has come: region 1 has an offer
// open (giver), or region 0 has taken a part of an offer whose giver has
// not read its resolution (taker).
func (c *offerCut) ready(cur [3]*Agent) bool {
	if c.giver {
		return len(cur[1].off.mine) > 0
	}
	if !midOffer(cur[0]) {
		return false
	}
	for _, a := range cur[1:] {
		if slices.ContainsFunc(a.off.mine, func(m myOffer) bool { return !m.res[0] }) {
			return true
		}
	}
	return false
}

// unsettled is the offers open at the cut still open in the regions'
// entries states (open false: those no longer open).
func (c *offerCut) unsettled(states []State, open bool) []string {
	var out []string
	for g, ns := range c.open {
		for _, n := range ns {
			if slices.ContainsFunc(states[g].Open, func(o OpenOffer) bool { return o.N == n }) == open {
				out = append(out, fmt.Sprintf("region %d's offer %d", g, n))
			}
		}
	}
	return out
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// midOffer reports whether region 0's agent has taken a part of an offer
// (whether or not its giver has settled it: under load, the ticks of
// one step can do both).
func midOffer(a0 *Agent) bool {
	return slices.ContainsFunc(a0.states[0].Took, func(k Took) bool { return k.Units > 0 })
}

// offerLog is every resolution the regions published (an entry lists
// a part taken only until its giver settles it, and a resolution of
// nothing not at all: Thru stands for it), and the faults seen while
// logging: a region's Thru stepping back.
type offerLog struct {
	took   map[[3]int64]map[int64]int64 // region, giver, offer: units by resolution stamp
	thru   map[int][]int64
	faults []string
}

func newOfferLog() *offerLog {
	return &offerLog{took: map[[3]int64]map[int64]int64{}, thru: map[int][]int64{}}
}

// add logs region r's entry st as saved.
func (l *offerLog) add(r int, st State) {
	for _, k := range st.Took {
		id := [3]int64{int64(r), int64(k.From), k.N}
		if l.took[id] == nil {
			l.took[id] = map[int64]int64{}
		}
		l.took[id][k.At] = k.Units
	}
	for g, n := range l.thru[r] {
		if g < len(st.Thru) && st.Thru[g] < n {
			l.faults = append(l.faults, fmt.Sprintf("region %d's Thru of region %d's offers stepped back from %d to %d", r, g, n, st.Thru[g]))
		}
	}
	if len(st.Thru) > 0 {
		l.thru[r] = slices.Clone(st.Thru)
	}
}

// accounts checks the regions' offers by the log and their last entries
// states: no offer resolved twice in a region; each region's OfferNet
// equal to what it took, less what the others took of its settled
// offers, less its unsettled offers. It returns the units taken.
func (l *offerLog) accounts(states []State) (taken int64, faults []string) {
	faults = slices.Clone(l.faults)
	got := make([]int64, len(states)) // by recipient
	gave := map[[2]int64]int64{}      // giver, offer: units taken by the others
	for id, res := range l.took {
		if len(res) > 1 {
			faults = append(faults, fmt.Sprintf("region %d resolved region %d's offer %d twice", id[0], id[1], id[2]))
		}
		for _, u := range res {
			got[id[0]] += u
			gave[[2]int64{id[1], id[2]}] += u
			taken += u
		}
	}
	for r, st := range states {
		want := got[r]
		for _, o := range st.Open {
			want -= o.Units
		}
		for n := int64(1); n <= st.OfferN; n++ {
			if !slices.ContainsFunc(st.Open, func(o OpenOffer) bool { return o.N == n }) {
				want -= gave[[2]int64{int64(r), n}]
			}
		}
		if st.OfferNet != want {
			faults = append(faults, fmt.Sprintf("region %d: OfferNet %d, its offers and resolutions account for %d", r, st.OfferNet, want))
		}
	}
	slices.Sort(faults)
	return taken, faults
}

// TestMarkListJSON: an entry's marks survive their compact form (gaps in
// N, shares falling, a demand of two decimals), and a malformed list is
// refused.
func TestMarkListJSON(t *testing.T) {
	l := markList{{N: 7, At: 1_800_000_000_123_456_789, Demand: 163.27, Share: 191}, {N: 8, At: 1_800_000_000_373_456_790, Demand: 0, Share: 13},
		{N: 10, At: 1_800_000_001_000_000_000, Demand: 0.01, Share: 200}}
	b, err := json.Marshal(State{Marks: l})
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil || !slices.Equal(st.Marks, l) {
		t.Errorf("%s decoded to %+v (%v), want %+v", b, st.Marks, err, l)
	}
	if err := json.Unmarshal([]byte(`{"hm":[1,2,3]}`), &st); err == nil {
		t.Errorf("three numbers decoded to %+v", st.Marks)
	}
	if m := newMark(&State{Demand: 163.2749}, 1); m.Demand != 163.27 {
		t.Errorf("a mark's demand of 163.2749 is %v, not 163.27", m.Demand)
	}
}
