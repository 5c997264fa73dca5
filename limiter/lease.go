package limiter

import (
	"context"
	"errors"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// Capacity leases: a hot key's units taken from the store in one step and
// spent in this process, one decision at a time, without a store request.
// The units are counted in the store before they are spent, so no number
// of processes admits more than the limit. docs/leases.md has the
// reasoning and the figures.

// LeaseStats counts a limit's capacity leases in this process.
type LeaseStats struct {
	// Takes is the lease takes sent to the store; Granted the units they
	// got (each take's own decision included).
	Takes, Granted int64
	// Decisions is the decisions answered from a lease, without a store
	// request.
	Decisions int64
	// Returns is the returns sent; Returned the unspent units they gave
	// back. ReturnsAlone counts the returns sent in a store step of
	// their own, landed or not (a bucket's return otherwise rides on
	// the key's next step; a window's is always alone).
	Returns, Returned, ReturnsAlone int64
	// Lost is the unspent units not given back: too few to be worth a
	// write, a return that failed or was refused after its epoch, or
	// leases dropped with the process. They under-admit until they expire
	// from the store, never over-admit.
	Lost int64
}

// Add returns the sum of s and o.
func (s LeaseStats) Add(o LeaseStats) LeaseStats {
	return LeaseStats{
		Takes: s.Takes + o.Takes, Granted: s.Granted + o.Granted, Decisions: s.Decisions + o.Decisions,
		Returns: s.Returns + o.Returns, Returned: s.Returned + o.Returned, ReturnsAlone: s.ReturnsAlone + o.ReturnsAlone,
		Lost: s.Lost + o.Lost,
	}
}

// Lease tuning: see docs/leases.md ("Adaptive size") for the measurements
// behind each figure.
const (
	// leaseDecisions is the decisions a lease is sized for.
	leaseDecisions = 16
	// minLeaseLife and MaxLeaseLife bound a lease's lifetime.
	minLeaseLife = 100 * time.Millisecond
	// minLease is the smallest lease worth taking, in units: below it a
	// key is cold and each decision is its own store step, as without
	// leases (a smaller lease would save few requests, and a client's
	// quick handful of requests would lease).
	minLease = 8
	// minReturn is the fewest unspent units worth a return write.
	minReturn = 4
	// fairShare divides what the store said remains: a take asks at most
	// remaining/fairShare, so that near the limit many processes do not
	// strand units in idle leases.
	fairShare = 8
	// drainedFor is how long a process waits before taking again on a
	// key whose last take got less than it asked.
	drainedFor = 100 * time.Millisecond
	// rateHalfLife is the half-life of a key's rate estimate.
	rateHalfLife = time.Second
	// maxLeaseKeys bounds the keys a limit tracks per shard.
	maxLeaseKeys = 256
	leaseShards  = 16
	// leaseRoundTrips is the fewest of the key's store round trips a
	// lease lives (up to MaxLeaseLife) on a store whose writes cross
	// regions (storage.CrossRegionWriter): where a take is a cross-region
	// write (40 ms and more, longer when writes from several regions
	// meet), a lease sized for 16 decisions alone is spent in a few round
	// trips, and the takes and returns of a hot key's processes keep its
	// item written from every region at once.
	leaseRoundTrips = 8
	// backlogSpacing and backlogRun: units seen closer together than
	// 1/backlogSpacing of the key's mean spacing (its rate's) are a
	// backlog's (calls that queued behind a pause, answered one after
	// another), and backlogRun of them in a row make a run (leaseKey.run).
	// On a Poisson stream a gap that short is 1 in 8 and a run of
	// backlogRun 1 in 2,000.
	backlogSpacing = 8
	backlogRun     = 4
	// leaseSaves is the store time a lease below minLease must save on
	// such a store (its units less one, times the key's round trip): a
	// key under minLease leases from 2 units when its round trip is long.
	leaseSaves = 100 * time.Millisecond
)

var leaseSeed = maphash.MakeSeed()

// leaser is one limit's leases in this process: per key, a rate estimate
// and at most one live lease. Bounded like denyCache; safe for concurrent
// use. A nil *leaser leases nothing.
type leaser struct {
	shards [leaseShards]leaseShard
	// maxWant bounds a take (the packed window's field headroom).
	maxWant int64
	// holds: the store holds a lease's units until its return (a
	// bucket's ring), so every lease is returned.
	holds bool
	// far: the store's writes cross regions (storage.CrossRegionWriter):
	// a key's store round trip is measured and sizes its leases too. On
	// any other store nothing is measured and leases follow the rate
	// alone.
	far   bool
	stats struct {
		takes, granted, decisions, returns, returned, alone, lost atomic.Int64
	}
}

type leaseShard struct {
	mu sync.Mutex
	m  map[string]*leaseKey
}

// leaseKey is a key's leasing state in this process.
type leaseKey struct {
	sum   float64 // units seen, decayed by their age (half-life rateHalfLife)
	seen  int64   // stamp of the last update (Unix ns)
	first int64   // stamp of the first
	// The live lease: units unspent of got, spendable at stamps in
	// [from, to), counted in the store at ref (a window's slot, a
	// bucket's lease epoch); got == 0: none.
	units, got int64
	from, to   int64
	ref        int64
	// d is the store's decision at the take (Remaining after it).
	d Decision
	// remaining is what the store last said remains of the limit
	// (-1: unknown).
	remaining int64
	// drained: no take before this stamp.
	drained int64
	// run is the units of the backlog run the last ones seen belong to
	// (observe), and before the stamp of the call before the run's
	// first: near a lease's end, a backlog leases what its run has
	// shown (want), on a key whose last lease, taken at took, came
	// within a second of before.
	run, before, took int64
	// rtt is the key's store round trip in this process (wall time of
	// the store steps that decided it, conflicts and retries included),
	// averaged; 0: not measured (always, unless the leaser is far).
	rtt time.Duration
}

// lease is a closed lease to give back (got == 0: nothing), at stamp at.
type lease struct {
	key     string
	ref     int64
	got     int64
	unspent int64
	at      int64
	// holds: the store holds the lease's units until its return (a
	// bucket's), so a return is sent even with nothing unspent.
	holds bool
}

// newLeaser returns a leaser whose takes ask at most maxWant units, on
// store (far when it says its writes cross regions).
func newLeaser(maxWant int64, store any) *leaser {
	l := &leaser{maxWant: maxWant, far: storage.WritesCrossRegions(store)}
	for i := range l.shards {
		l.shards[i].m = make(map[string]*leaseKey)
	}
	return l
}

func (l *leaser) shard(key string) *leaseShard {
	return &l.shards[maphash.String(leaseSeed, key)%leaseShards]
}

// Stats returns the counters.
func (l *leaser) Stats() LeaseStats {
	if l == nil {
		return LeaseStats{}
	}
	return LeaseStats{
		Takes: l.stats.takes.Load(), Granted: l.stats.granted.Load(),
		Decisions: l.stats.decisions.Load(),
		Returns:   l.stats.returns.Load(), Returned: l.stats.returned.Load(),
		ReturnsAlone: l.stats.alone.Load(), Lost: l.stats.lost.Load(),
	}
}

// entry returns key's state, creating it (evicting an idle key when the
// shard is full). Called with sh.mu held.
func (sh *leaseShard) entry(key string, t int64) *leaseKey {
	if k := sh.m[key]; k != nil {
		return k
	}
	if len(sh.m) >= maxLeaseKeys {
		// Evict the least recently seen of a few keys holding no lease
		// (map order is random): a flood of cold keys never evicts a hot
		// key's lease.
		var victim string
		var oldest int64 = math.MaxInt64
		n := 0
		for k, v := range sh.m {
			if v.got == 0 && v.seen < oldest {
				victim, oldest = k, v.seen
			}
			if n++; n == 8 {
				break
			}
		}
		if oldest == math.MaxInt64 {
			return nil
		}
		delete(sh.m, victim)
	}
	k := &leaseKey{seen: t, first: t, remaining: -1}
	sh.m[key] = k
	return k
}

// observe adds n units at t to the key's rate estimate, and to its
// backlog run when they come within a fraction of the rate's spacing of
// the last ones.
func (k *leaseKey) observe(t, n int64) {
	prev := k.seen
	dt := t - prev
	if dt > 0 {
		k.sum *= math.Exp2(-float64(dt) / float64(rateHalfLife))
		k.seen = t
	}
	if k.sum > 0 && (dt <= 0 || float64(dt)*k.rate()*backlogSpacing < float64(n)*float64(time.Second)) {
		k.run += n
	} else {
		k.run, k.before = n, prev
	}
	k.sum += float64(n)
}

// minRateAge is the shortest history a rate estimate divides by, so that a
// client's few calls in a row do not read as a hot key (docs/leases.md,
// "A new process near a slot's end": a floor of 100 ms leased them).
const minRateAge = 250 * time.Millisecond

// rate is the key's units a second: an exponentially weighted average
// (half-life rateHalfLife) over the time since the key was first seen, so
// that a new hot key is known as hot within a fraction of a second rather
// than after several half-lives.
func (k *leaseKey) rate() float64 {
	age := max(float64(k.seen-k.first), float64(minRateAge)) / float64(rateHalfLife)
	weight := (1 - math.Exp2(-age)) * rateHalfLife.Seconds() / math.Ln2
	return k.sum / weight
}

// close ends k's live lease at t: what is to be given back.
func (k *leaseKey) close(key string, t int64) lease {
	c := lease{key: key, ref: k.ref, got: k.got, unspent: k.units, at: max(t, k.from)}
	k.units, k.got = 0, 0
	return c
}

// spend answers a decision of n units at t from key's lease: ok when the
// lease covers it. Otherwise closed is the lease that ended (to give
// back), if any. Every call counts in the key's rate.
func (l *leaser) spend(key string, t, n int64) (d Decision, ref int64, ok bool, closed lease) {
	sh := l.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.entry(key, t)
	if k == nil {
		return Decision{}, 0, false, lease{}
	}
	k.observe(t, n)
	if k.got == 0 {
		return Decision{}, 0, false, lease{}
	}
	if t >= k.from && t < k.to && k.units >= n {
		k.units -= n
		d = k.d
		d.Remaining = min(satAdd(d.Remaining, k.units), d.Limit)
		d.Granted, d.LeaseRef = 0, 0
		l.stats.decisions.Add(1)
		return d, k.ref, true, lease{}
	}
	if t < k.from {
		return Decision{}, 0, false, lease{} // a stamp before the take: the store decides
	}
	c := k.close(key, t)
	c.holds = l.holds
	return Decision{}, 0, false, c
}

// unspend puts back n units spent from key's lease at ref by a decision
// its batch then denied.
func (l *leaser) unspend(key string, ref, n int64) {
	sh := l.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if k := sh.m[key]; k != nil && k.got > 0 && k.ref == ref {
		k.units += n
		return
	}
	l.stats.lost.Add(n)
}

// want is how many units to take for a decision of n at t whose lease
// could be spent until end: n (a plain step) for a cold or drained key,
// else a lease sized to the key's rate, a fair share of what remains and
// maxWant.
func (l *leaser) want(key string, t, n, end int64) int64 {
	sh := l.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.m[key]
	// A key this process has not yet decided at the store (remaining
	// unknown) is not leased: its first decision tells the fair share.
	if k == nil || t < k.drained || k.got > 0 || k.remaining < 0 {
		return n
	}
	rate := k.rate()
	life := time.Duration(float64(time.Second) * leaseDecisions * float64(n) / max(rate, 1e-9))
	life = min(max(life, minLeaseLife), storage.MaxLeaseLife)
	if long := min(leaseRoundTrips*k.rtt, storage.MaxLeaseLife); long > life && unitsIn(rate, long) <= k.remaining/fairShare {
		// Round trips (a far store's only: rtt is 0 otherwise), while
		// what remains covers them: near the limit a longer lease would
		// only hold units the other processes are denied meanwhile.
		life = long
	}
	nominal := unitsIn(rate, life)
	if left := time.Duration(end - t); left-life < life {
		// What would be left after this lease is shorter than it: one
		// lease to the end rather than a short one after it.
		life = min(left, storage.MaxLeaseLife)
	}
	w := min(unitsIn(rate, life), k.remaining/fairShare, l.maxWant)
	if w < k.minLease() && nominal >= k.minLease() && k.run >= backlogRun && k.leasedBefore(t) {
		// A backlog near the lease's end of a key that leased within
		// a second of its last call before the backlog (calls that
		// queued behind a pause of the process, answered at once,
		// however long it stood still; a cold key's quick handful
		// never leases): the rate, spread
		// over the little time left, says a lease would strand its
		// units, and each call would be a store step of its own. Lease
		// the units the run has shown so far (it doubles with each
		// take), at most the lease the rate calls for.
		w = min(k.run, nominal, k.remaining/fairShare, l.maxWant)
		if w > n {
			return w
		}
	}
	if w < k.minLease() || w <= n {
		return n
	}
	return w
}

// unitsIn is the units a key deciding rate a second decides in d. A
// lease's life for leaseDecisions decisions (leaseDecisions/rate) is
// rounded down to whole nanoseconds, so rate*life falls a hair short of
// them, and truncated it was one unit short: 15 units for 16 decisions,
// a take every 15 (docs/leases.md, "What the requests are"). The
// relative slack, far above the rounding's (1 ns in 100 ms) and far
// below a unit, gives the whole units.
func unitsIn(rate float64, d time.Duration) int64 {
	return int64(rate * d.Seconds() * (1 + 1e-7))
}

// leasedBefore reports whether the key took a lease within rateHalfLife
// of its last call before its backlog run: measured from that call, not
// from t, so that a pause of the process (no call of the key while it
// stood still) does not make a hot key's backlog look cold.
func (k *leaseKey) leasedBefore(t int64) bool {
	switch {
	case brokenBacklog:
		return false
	case brokenPause:
		return t-k.took < int64(rateHalfLife)
	}
	return k.took > 0 && k.before-k.took < int64(rateHalfLife)
}

// brokenBacklog: a backlog near a lease's end is a store step a call
// (want), as before; brokenPause: only a backlog whose key leased within
// the second before now leases, as before, so a pause of a second or
// more turns the rule off. Tests only.
var brokenBacklog, brokenPause = false, false

// minLease is the smallest lease worth taking on the key: minLease, or
// fewer units (at least 2) when they save leaseSaves of store round trips
// (a far store's key: rtt is 0 otherwise).
func (k *leaseKey) minLease() int64 {
	if k.rtt <= 0 {
		return minLease
	}
	return min(max(int64(leaseSaves/k.rtt)+1, 2), minLease)
}

// roundTrip adds a store round trip of key's (d, wall time) to its
// average, a quarter of the way; only on a far store.
func (l *leaser) roundTrip(key string, t int64, d time.Duration) {
	if !l.far || d <= 0 {
		return
	}
	sh := l.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if k := sh.entry(key, t); k != nil {
		if k.rtt == 0 {
			k.rtt = d
		} else {
			k.rtt += (d - k.rtt) / 4
		}
	}
}

// took records a take of want units (at least n) for key at t whose
// lease may be spent in [t, end) and is counted at ref: got units
// granted (0: denied or a plain step), d the store's decision. It
// returns a lease that the new one replaced (to give back).
func (l *leaser) took(key string, t, n, want, got, end, ref int64, d Decision) lease {
	sh := l.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.entry(key, t)
	if k == nil {
		return lease{}
	}
	k.remaining = d.Remaining
	if want <= n {
		return lease{} // a plain step
	}
	l.stats.takes.Add(1)
	l.stats.granted.Add(got)
	if got < want/2 {
		// Drained: what remains is near what the take asked. (Getting a
		// little less than asked is not: a fair share of a busy key.)
		k.drained = t + int64(drainedFor)
	}
	if got < n {
		return lease{}
	}
	var old lease
	if k.got > 0 {
		if k.ref == ref {
			// Two takes of this process at once, counted at the same
			// place: one lease, spendable where both are.
			k.units += got - n
			k.got += got
			k.from, k.to = max(k.from, t), min(k.to, end)
			return lease{}
		}
		old = k.close(key, t)
		old.holds = l.holds
	}
	k.units, k.got, k.from, k.to, k.ref, k.d = got-n, got, t, end, ref, d
	k.took = t
	return old
}

// returned counts a closed lease's return: sent (ok) or lost.
func (l *leaser) returned(c lease, sent bool) {
	if sent {
		l.stats.returns.Add(1)
		l.stats.returned.Add(c.unspent)
		return
	}
	l.stats.lost.Add(c.unspent)
}

// leasable is implemented by the limiters that lease: the lease's terms
// and its steps.
type leasable interface {
	leases() *leaser
	// leaseTerms is where the units of a lease taken at t are counted
	// and until when they may be spent.
	leaseTerms(t int64) (ref, end int64)
	// leaseStep is the take of want units (at least n) for key at t,
	// counted at ref.
	leaseStep(key string, t, n, want, ref int64) storage.Step
	// returnStep gives back c's unspent units, and the store to send it
	// to.
	returnStep(c lease) (storage.Step, storage.Batcher)
	// carryReturn puts c's return on st, a step of c's key, if it can.
	carryReturn(st *storage.Step, c lease) bool
}

// leaseUse is one item's use of leases in a Decide: spent from a live
// lease (spent, at ref), or a take planned (want > its N).
type leaseUse struct {
	lz        leasable
	spent     bool
	ref       int64
	want, end int64
	// ret is the key's lease that closed at this decision; rode: its
	// return rides on the item's step.
	ret  lease
	rode bool
}

// leaseRound is a Decide's lease bookkeeping: per item, and the leases
// that closed meanwhile, to give back after the decision.
type leaseRound struct {
	use    []leaseUse
	closed []closedLease
	useBuf [scratchItems]leaseUse
	clBuf  [2 * scratchItems]closedLease
	// far: an item's leaser is far (its store's writes cross regions);
	// the batch's store round trip, from sent, is then rtt.
	far  bool
	sent time.Time
	rtt  time.Duration
}

type closedLease struct {
	lz leasable
	c  lease
}

// spendLeases answers the items a live lease covers (Outcome.Leased);
// it reports whether any item leases at all.
func (r *leaseRound) spendLeases(items []Item, out []Outcome, t int64) bool {
	any := false
	for i, it := range items {
		lz, ok := it.Limit.(leasable)
		if !ok || lz.leases() == nil {
			continue
		}
		if !any {
			any = true
			r.use = r.useBuf[:0]
			if len(items) > scratchItems {
				r.use = make([]leaseUse, 0, len(items))
			}
			r.use = r.use[:len(items)]
			r.closed = r.clBuf[:0]
		}
		u := &r.use[i]
		u.lz = lz
		r.far = r.far || lz.leases().far
		d, ref, hit, closed := lz.leases().spend(it.Key, t, it.N)
		u.ret = closed
		if hit {
			u.spent, u.ref = true, ref
			out[i] = Outcome{Decision: d, Leased: true}
		}
	}
	return any
}

func (r *leaseRound) close(lz leasable, c lease) {
	if c.got > 0 {
		r.closed = append(r.closed, closedLease{lz, c})
	}
}

// sending marks the batch's store steps sent, and sent their answers
// in: a far leaser's round trip, measured on the monotonic clock (not
// the decision's time, now). Nothing is measured otherwise.
func (r *leaseRound) sending() {
	if r.far {
		r.sent = time.Now()
	}
}

func (r *leaseRound) answered() {
	if r.far {
		r.rtt = time.Since(r.sent)
	}
}

// spent reports whether item i was answered from a lease.
func (r *leaseRound) spent(i int) bool { return r.use != nil && r.use[i].spent }

// unspendAll puts back what the batch's items spent from leases (the
// batch was denied).
func (r *leaseRound) unspendAll(items []Item, out []Outcome) {
	for i := range r.use {
		u := &r.use[i]
		if u.ret.got > 0 && !u.rode {
			r.close(u.lz, u.ret) // no step carries it: sent alone
			u.ret = lease{}
		}
		if u.spent {
			u.lz.leases().unspend(items[i].Key, u.ref, items[i].N)
			out[i].Refunded = true
		}
	}
}

// planTake makes item i's step a lease take when its key is hot.
func (r *leaseRound) planTake(i int, it *Item, st *storage.Step, t int64) {
	if r.use == nil || r.use[i].lz == nil {
		return
	}
	u := &r.use[i]
	defer func() {
		if u.ret.got > 0 {
			u.rode = u.lz.carryReturn(st, u.ret)
		}
	}()
	ref, end := u.lz.leaseTerms(t)
	u.want = u.lz.leases().want(it.Key, t, it.N, end)
	if u.want > it.N {
		shadow := st.Shadow
		*st = u.lz.leaseStep(it.Key, t, it.N, u.want, ref)
		st.Shadow = shadow
		u.ref, u.end = ref, end
	}
}

// settle records the answers of the batch's steps in the leases: a lease
// take's units become a lease (all of them when the batch was denied:
// they were counted, and the decision did not use them), a plain step's
// Remaining sizes the next take.
func (r *leaseRound) settle(items []Item, out []Outcome, es []entry, t int64, denied bool) {
	for i := range r.use {
		u, o := &r.use[i], &out[i]
		if r.far && u.lz != nil && !u.spent && es[i].err == nil && !o.Skipped {
			u.lz.leases().roundTrip(items[i].Key, t, r.rtt) // a throttled step's too: its conflicts
		}
		if u.ret.got > 0 {
			if u.rode && es[i].err == nil && o.Err == nil && !o.Skipped {
				u.lz.leases().returned(u.ret, true)
			} else {
				r.close(u.lz, u.ret) // sent alone
			}
			u.ret = lease{}
		}
		if u.lz == nil || u.spent || es[i].err != nil || o.Err != nil || o.Skipped {
			continue
		}
		n, want := items[i].N, max(u.want, items[i].N)
		if denied && o.Decision.Granted > 0 {
			n, o.Refunded = 0, true
		}
		ref := u.ref
		if o.Decision.LeaseRef != 0 {
			ref = o.Decision.LeaseRef // a bucket's slot
		}
		r.close(u.lz, u.lz.leases().took(items[i].Key, t, n, want, o.Decision.Granted, u.end, ref, o.Decision))
		o.Decision.Granted, o.Decision.LeaseRef = 0, 0
	}
}

// returnTimeout bounds a return sent after its decision.
const returnTimeout = time.Second

// sendReturns gives back the closed leases' unspent units, each in a
// store step of its own sent without waiting; a lease with fewer than
// minReturn unspent units is counted lost.
func (r *leaseRound) sendReturns(ctx context.Context) {
	for _, cl := range r.closed {
		lz, c := cl.lz, cl.c
		if c.unspent < minReturn && !c.holds {
			lz.leases().returned(c, false)
			continue
		}
		st, store := lz.returnStep(c)
		go func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), returnTimeout)
			defer cancel()
			var res [1]storage.StepResult
			store.Do(ctx, []storage.Step{st}, res[:])
			ok := res[0].Err == nil && (st.Kind != storage.StepBucket || res[0].Decision.Allowed)
			lz.leases().stats.alone.Add(1)
			lz.leases().returned(c, ok)
		}()
	}
	r.closed = nil
}

// closeAll ends every live lease at t: what is to be given back.
func (l *leaser) closeAll(t int64) []lease {
	var out []lease
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for key, k := range sh.m {
			if k.got > 0 {
				c := k.close(key, t)
				c.holds = l.holds
				out = append(out, c)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// returnLeases ends every live lease of lz at now and gives back the
// unspent units (a bucket's: ends its hold too), waiting for the writes.
func returnLeases(ctx context.Context, lz leasable, now time.Time) error {
	l := lz.leases()
	if l == nil {
		return nil
	}
	t, err := unixNano("", now)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range l.closeAll(t) {
		if c.unspent == 0 && !c.holds {
			l.returned(c, true)
			continue
		}
		st, store := lz.returnStep(c)
		st.Sync = true
		var res [1]storage.StepResult
		store.Do(ctx, []storage.Step{st}, res[:])
		ok := res[0].Err == nil && (st.Kind != storage.StepBucket || res[0].Decision.Allowed)
		l.stats.alone.Add(1)
		l.returned(c, ok)
		if res[0].Err != nil {
			errs = append(errs, res[0].Err)
		}
	}
	return errors.Join(errs...)
}
