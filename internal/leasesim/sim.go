package leasesim

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Algo is the limit a run simulates.
type Algo uint8

const (
	// Bucket is a token bucket of Limit tokens refilled by one every
	// Refill, kept as backends/dynamo keeps it (GCRA on a refill grid),
	// with the outstanding-lease ring of docs/leases.md.
	Bucket Algo = iota
	// Window is the bounded sliding window at a resolution of Slots slots
	// per Window (the packed window's decision), kept as slot counters.
	Window
)

func (a Algo) String() string {
	if a == Window {
		return "window"
	}
	return "bucket"
}

// Broken selects a deliberately wrong lease rule, to show the never-over
// check fails it.
type Broken uint8

const (
	// NotBroken runs the rules of docs/leases.md.
	NotBroken Broken = iota
	// BucketNoOutstanding keeps the bucket's cap at MaxAmount while leases
	// hold units (no outstanding ring): the store refills past what the
	// leases still hold.
	BucketNoOutstanding
	// WindowSpendPastSlot counts a window lease in the slot it was taken
	// in and spends it over the following slots too.
	WindowSpendPastSlot
)

func (b Broken) String() string {
	switch b {
	case BucketNoOutstanding:
		return "bucket-no-outstanding"
	case WindowSpendPastSlot:
		return "window-spend-past-slot"
	}
	return "not-broken"
}

// Config is one simulated run: N processes (one per entry of Rates) deciding
// one key through one store item.
type Config struct {
	Algo Algo
	// Limit: the bucket's MaxAmount, or the window's limit per Window.
	Limit int64
	// Refill: the bucket's RefillTime (RefillAmount 1).
	Refill time.Duration
	// Window and Slots: the sliding window and its resolution.
	Window time.Duration
	Slots  int
	// Rates are the processes' Poisson arrival rates, decisions a second.
	Rates    []float64
	Duration time.Duration
	Seed     uint64
	// Skew, when positive, offsets each process's clock by a draw in
	// [-Skew, Skew].
	Skew time.Duration
	// Waves, when Period > 0, makes the demand bursty: every rate is
	// multiplied by High for the first On of every Period, by Low for the
	// rest.
	Waves Waves

	// The store: one-way latency Latency plus an exponential jitter of mean
	// Jitter (so arrivals reorder), and the partition's cap: WriteCap writes
	// a second, with a burst of one second (as testserver.CapProxy). A
	// write past the cap is throttled: nothing is applied and the
	// decisions waiting on it are denied for ThrottleRetry.
	Latency, Jitter time.Duration
	WriteCap        float64

	// Leases turns the lease policy on; off, every decision is one store
	// request (today's behaviour).
	Leases bool
	Policy Policy
	Broken Broken

	// Freeze, when FreezeFor > 0, stops process 0 (a frozen Lambda) from
	// FreezeAt for FreezeFor: it decides nothing and sends nothing, and
	// keeps what it holds.
	FreezeAt, FreezeFor time.Duration
}

// Waves is an on-off modulation of every process's rate.
type Waves struct {
	Period, On time.Duration
	Low, High  float64
}

func (w Waves) factor(t int64) float64 {
	if w.Period <= 0 {
		return 1
	}
	if t%int64(w.Period) < int64(w.On) {
		return w.High
	}
	return w.Low
}

func (w Waves) peak() float64 {
	if w.Period <= 0 {
		return 1
	}
	return max(w.High, w.Low)
}

// Policy is the lease policy of docs/leases.md.
type Policy struct {
	// Target is the units a lease aims at: the lifetime is Target/rate,
	// bounded by MinLife and MaxLife, and n = rate*lifetime.
	Target           float64
	MinLife, MaxLife time.Duration
	// HalfLife of the rate's EWMA.
	HalfLife time.Duration
	// Share: a take asks at most (remaining / Share) units, remaining as
	// the store last told, and at least 1.
	Share int64
	// MinLease: a take of fewer units is a per-request take (n = 1): a
	// key this cold in the process decides as without leases.
	MinLease int64
	// MergeWait: how long an ended lease's return waits for the next take
	// to ride on before it is sent alone.
	MergeWait time.Duration
	// Grace: a bucket lease's ring entry outlives its spending by Grace
	// (rounded up to Epoch), so that its return lands first.
	Grace, Epoch time.Duration
	// Span: the longest a window lease may be spent over (the contract's
	// J, in time); every writer reads Later that much further. Zero means
	// half the window, within MinLife and MaxLife.
	Span time.Duration
}

// DefaultPolicy is the policy docs/leases.md chooses.
func DefaultPolicy() Policy {
	return Policy{
		Target:    16,
		MinLife:   100 * time.Millisecond,
		MaxLife:   time.Second,
		HalfLife:  time.Second,
		Share:     8,
		MinLease:  4,
		MergeWait: 10 * time.Millisecond,
		Grace:     50 * time.Millisecond,
		Epoch:     50 * time.Millisecond,
	}
}

// ThrottleRetry is how long a process denies a key the store throttled
// (limiter.ThrottledRetryAfter).
const ThrottleRetry = 100 * time.Millisecond

func (c *Config) slot() int64 { return int64(c.Window) / int64(c.Slots) }

// spanSlots is J: how many slots past its first a window lease may be
// spent in (0 when leases are off: every writer reads today's Ahead).
func (c *Config) spanSlots() int64 {
	if !c.Leases || c.Algo != Window {
		return 0
	}
	return (int64(c.span()) + c.slot() - 1) / c.slot()
}

// span is a window lease's longest spending range.
func (c *Config) span() time.Duration {
	if c.Policy.Span > 0 {
		return c.Policy.Span
	}
	return min(max(c.Window/2, c.Policy.MinLife), c.Policy.MaxLife)
}

// Result is what a run measured.
type Result struct {
	Decisions, Admitted int64
	// Exact is what a serialized limiter admits on the same arrivals; Share
	// is Admitted/Exact.
	Exact int64
	Share float64
	// FromLease counts decisions answered from a lease (no store request);
	// Cached denials answered in process.
	FromLease, Cached int64
	// Requests is the store writes sent (takes, second writes of partial
	// takes, returns sent alone); Throttled those the cap refused, and
	// ThrottledLate those after the first second.
	Requests, Throttled, ThrottledLate int64
	Takes, Partial, Returns            int64
	// Units granted to leases, returned, spent, and lost: held at the end
	// of the run or in a return the store refused.
	Granted, Returned, Lost int64
	// MaxRing is the most entries a bucket's outstanding ring held.
	MaxRing int
	// Over counts admitted stamps ending a window of stamps over the limit
	// (the history checker's rule), Worst is the worst.
	Over  int
	Worst Over
	// Allowed is every decision's answer in arrival order: for comparing
	// runs. Stamps are the admitted stamps, sorted.
	Allowed []bool
	Stamps  []int64
}

// RequestsPerDecision is Requests/Decisions.
func (r Result) RequestsPerDecision() float64 {
	return float64(r.Requests) / float64(max(r.Decisions, 1))
}

func (r Result) String() string {
	return fmt.Sprintf("decisions %d, admitted %d, exact %d (share %.4f), requests %d (%.4f per decision), throttled %d (%d after 1s), takes %d (partial %d), returns %d, from lease %d, cached %d, granted %d, returned %d, lost %d, over %d (worst +%d)",
		r.Decisions, r.Admitted, r.Exact, r.Share, r.Requests, r.RequestsPerDecision(), r.Throttled, r.ThrottledLate,
		r.Takes, r.Partial, r.Returns, r.FromLease, r.Cached, r.Granted, r.Returned, r.Lost, r.Over, r.Worst.Excess)
}

// ErrConfig is returned for a configuration the simulation cannot run.
var ErrConfig = errors.New("leasesim: bad config")

func (c *Config) validate() error {
	switch {
	case c.Limit <= 0, len(c.Rates) == 0, c.Duration <= 0:
		return fmt.Errorf("%w: limit, rates and duration must be positive", ErrConfig)
	case c.Algo == Bucket && c.Refill <= 0:
		return fmt.Errorf("%w: a bucket needs Refill", ErrConfig)
	case c.Algo == Window && (c.Slots <= 0 || c.Window <= 0 || int64(c.Window)%int64(c.Slots) != 0):
		return fmt.Errorf("%w: a window needs Slots dividing Window", ErrConfig)
	case c.Leases && (c.Policy.MinLife <= 0 || c.Policy.MaxLife < c.Policy.MinLife || c.Policy.Share <= 0 || c.Policy.HalfLife <= 0 || c.Policy.Epoch <= 0):
		return fmt.Errorf("%w: lease policy incomplete", ErrConfig)
	case c.WriteCap <= 0:
		return fmt.Errorf("%w: WriteCap must be positive", ErrConfig)
	}
	return nil
}

// --- events --------------------------------------------------------------

type evKind uint8

const (
	evArrival evKind = iota
	evAtStore
	evReply
	evReturnDue
	evLeaseEnd
)

type event struct {
	at    int64
	seq   uint64
	kind  evKind
	proc  int
	req   *request
	lease *lease
}

type events []event

func (h events) Len() int { return len(h) }
func (h events) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].seq < h[j].seq
}
func (h events) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *events) Push(x any)   { *h = append(*h, x.(event)) }
func (h *events) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// --- processes -----------------------------------------------------------

// lease is what a process holds.
type lease struct {
	got, left int64
	// Spend range: stamps in [from, to).
	from, to int64
	// Bucket: the ring entry; window: the counted slot.
	ref ref
	// Window: units spent per slot (moved there by the return).
	spent map[int64]int64
	// Per-request take: spent by its own decision, never held.
	single bool
	// closed is the stamp the process ended it at: its return's stamp.
	closed int64
}

// waiting is a decision waiting on a take: its index in the decision log
// and its stamp.
type waiting struct {
	idx   int
	stamp int64
}

// request is one store write: a take (with a return riding on it) or a
// return alone.
type request struct {
	proc  int
	stamp int64
	// Take: want units for stamps [from, to); window slots.
	take            bool
	want, full      int64
	from, to        int64
	sFrom, sTo, sAt int64
	exp             int64
	single          bool
	rets            []*lease
	waiters         []waiting
	res             takeResult
	throttled       bool
}

type proc struct {
	rate     float64
	lastArr  int64
	skew     int64
	lease    *lease
	closing  []*lease // ended leases whose return is not sent yet
	inflight *request // the take decisions queue on (n > 1)
	// denyUntil: a denial cached in process; noTakeUntil: after a take
	// that got less than it asked, no new take before the lease's end.
	denyUntil, noTakeUntil int64
	remaining              int64
	known                  bool
	rng                    *rand.Rand
}

type sim struct {
	cfg    *Config
	ev     events
	seq    uint64
	procs  []proc
	it     item
	lat    *rand.Rand
	cap    float64 // the partition's write tokens
	capAt  int64
	res    Result
	stamps []int64 // every arrival's stamp (for the exact reference)
	admit  []int64 // admitted stamps
	end    int64
}

// Run simulates cfg and checks the admitted stamps with the history
// checker's rule.
func Run(cfg Config) (Result, error) {
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	s := &sim{cfg: &cfg, end: int64(cfg.Duration), cap: cfg.WriteCap}
	s.it.cfg = s.cfg
	s.lat = rand.New(rand.NewPCG(cfg.Seed, 0x1a7e))
	s.procs = make([]proc, len(cfg.Rates))
	for i := range s.procs {
		p := &s.procs[i]
		p.rng = rand.New(rand.NewPCG(cfg.Seed, uint64(i)+1))
		if cfg.Skew > 0 {
			p.skew = p.rng.Int64N(2*int64(cfg.Skew)+1) - int64(cfg.Skew)
		}
		s.nextArrival(i, 0)
	}
	for len(s.ev) > 0 {
		e := heap.Pop(&s.ev).(event)
		switch e.kind {
		case evArrival:
			s.arrive(e.proc, e.at)
		case evAtStore:
			s.atStore(e.req, e.at)
		case evReply:
			s.reply(e.req, e.at)
		case evReturnDue:
			s.returnDue(e.proc, e.at)
		case evLeaseEnd:
			// The lease's range ended with no decision to notice it.
			if p := &s.procs[e.proc]; p.lease == e.lease && !s.frozen(e.proc, e.at) {
				s.close(e.proc, e.at)
			}
		}
	}
	// What is still held at the end is lost (a process that stops without
	// returning).
	for i := range s.procs {
		p := &s.procs[i]
		if p.lease != nil && !p.lease.single {
			s.res.Lost += p.lease.left
		}
		for _, l := range p.closing {
			s.res.Lost += l.left
		}
	}
	s.finish()
	return s.res, nil
}

func (s *sim) push(at int64, k evKind, p int, r *request) {
	s.seq++
	heap.Push(&s.ev, event{at: at, seq: s.seq, kind: k, proc: p, req: r})
}

// nextArrival draws process i's next arrival after now: Poisson at its
// rate, thinned by the waves.
func (s *sim) nextArrival(i int, now int64) {
	p := &s.procs[i]
	w := s.cfg.Waves
	peak := s.cfg.Rates[i] * w.peak()
	if peak <= 0 {
		return
	}
	at := now
	for {
		at += int64(p.rng.ExpFloat64() / peak * 1e9)
		if at >= s.end {
			return
		}
		if w.Period <= 0 || p.rng.Float64()*w.peak() < w.factor(at) {
			break
		}
	}
	s.push(at, evArrival, i, nil)
}

func (s *sim) frozen(i int, now int64) bool {
	c := s.cfg
	return i == 0 && c.FreezeFor > 0 && now >= int64(c.FreezeAt) && now < int64(c.FreezeAt+c.FreezeFor)
}

// oneWay is a request's or reply's travel time.
func (s *sim) oneWay() int64 {
	return int64(s.cfg.Latency) + int64(s.lat.ExpFloat64()*float64(s.cfg.Jitter))
}

// decide records a decision.
func (s *sim) decide(idx int, stamp int64, allowed bool) {
	s.res.Allowed[idx] = allowed
	if allowed {
		s.res.Admitted++
		s.admit = append(s.admit, stamp)
	}
}

// rateAt updates p's EWMA of decisions a second with an arrival at now.
func (s *sim) rateAt(p *proc, now int64) {
	tau := float64(s.cfg.Policy.HalfLife) / math.Ln2 / 1e9
	if p.lastArr != 0 || p.rate != 0 {
		dt := float64(now-p.lastArr) / 1e9
		p.rate *= math.Exp(-dt / tau)
	}
	p.rate += 1 / tau
	p.lastArr = now
}

// size is the lease a take asks for: (units, lifetime), and full, the
// units the rate alone asks, before the fair share.
func (s *sim) size(p *proc) (int64, int64, int64) {
	c := s.cfg
	if !c.Leases || p.rate <= 0 {
		return 1, 0, 1
	}
	pol := c.Policy
	life := time.Duration(pol.Target / p.rate * 1e9)
	life = min(max(life, pol.MinLife), pol.MaxLife)
	if c.Algo == Window {
		life = min(life, c.span())
	}
	n := int64(p.rate * life.Seconds())
	if n < pol.MinLease {
		return 1, 0, 1
	}
	full := min(n, c.Limit)
	if p.known {
		n = min(n, max(1, p.remaining/pol.Share))
	}
	// A lease cut to one unit by the fair share still holds its process
	// to one take a lifetime (see reply): it is not a per-request take.
	return min(n, c.Limit), int64(life), full
}

func (s *sim) arrive(i int, now int64) {
	s.nextArrival(i, now)
	if s.frozen(i, now) {
		return
	}
	p := &s.procs[i]
	t := now + p.skew
	idx := len(s.stamps)
	s.stamps = append(s.stamps, t)
	s.res.Allowed = append(s.res.Allowed, false)
	s.res.Decisions++
	if s.cfg.Leases {
		s.rateAt(p, t)
	}
	// A lease past its spending range ends: its return waits for the next
	// take, or MergeWait.
	if l := p.lease; l != nil && t >= l.to {
		s.close(i, now)
	}
	if l := p.lease; l != nil && l.left > 0 && t >= l.from && t < l.to {
		s.spend(l, t)
		s.res.FromLease++
		s.decide(idx, t, true)
		if l.left == 0 {
			s.close(i, now)
		}
		return
	}
	if t < p.denyUntil || t < p.noTakeUntil {
		s.res.Cached++
		s.decide(idx, t, false)
		return
	}
	n, life, full := s.size(p)
	if full > 1 && p.inflight != nil {
		p.inflight.waiters = append(p.inflight.waiters, waiting{idx, t})
		return
	}
	s.sendTake(i, now, t, n, life, full, waiting{idx, t})
}

func (s *sim) spend(l *lease, t int64) {
	l.left--
	if l.spent != nil {
		l.spent[floorDiv(t, s.cfg.slot())]++
	}
}

// close ends p's lease: what it did not spend goes back with the next
// write (or alone after MergeWait).
func (s *sim) close(i int, now int64) {
	p := &s.procs[i]
	l := p.lease
	p.lease = nil
	if l.single {
		return
	}
	l.closed = min(now+p.skew, l.to)
	// What it gives back rides on the next take: a bucket's ring entry (or
	// it expires on its own), a window's spent units moved to their
	// slots (or they stay counted later than spent: stricter). Only
	// MinLease unspent units or more are worth a write of their own
	// (fewer are lost: under-admission, counted).
	if s.cfg.Algo == Window && s.cfg.Broken == WindowSpendPastSlot && l.left == 0 {
		return
	}
	p.closing = append(p.closing, l)
	if l.left >= s.cfg.Policy.MinLease {
		s.push(now+int64(s.cfg.Policy.MergeWait), evReturnDue, i, nil)
	}
}

func (s *sim) returnDue(i int, now int64) {
	p := &s.procs[i]
	if s.frozen(i, now) {
		// Sent after the thaw.
		s.push(int64(s.cfg.FreezeAt+s.cfg.FreezeFor), evReturnDue, i, nil)
		return
	}
	var send []*lease
	keep := p.closing[:0]
	for _, l := range p.closing {
		if l.left >= s.cfg.Policy.MinLease {
			send = append(send, l)
		} else {
			keep = append(keep, l) // too little to be worth a write: waits for a take
		}
	}
	p.closing = keep
	if len(send) == 0 {
		return
	}
	r := &request{proc: i, stamp: now + p.skew, rets: send}
	s.send(r, now)
}

func (s *sim) sendTake(i int, now, t, n, life, full int64, w waiting) {
	c := s.cfg
	p := &s.procs[i]
	r := &request{proc: i, stamp: t, take: true, want: n, full: full, waiters: []waiting{w}, rets: p.closing}
	p.closing = nil
	r.from, r.to = t, t+max(life, 1)
	r.single = full == 1
	switch c.Algo {
	case Bucket:
		if !r.single {
			e := int64(c.Policy.Epoch)
			r.exp = (t + life + int64(c.Policy.Grace) + e - 1) / e * e
		}
	case Window:
		sl := c.slot()
		r.sFrom = floorDiv(t, sl)
		r.sTo, r.sAt = r.sFrom, r.sFrom
		if !r.single {
			j := min(c.spanSlots(), (life+sl-1)/sl-1)
			r.sTo = r.sFrom + max(j, 0)
			r.to = (r.sTo + 1) * sl
			r.sAt = r.sTo
			if c.Broken == WindowSpendPastSlot {
				// Counted where taken, read as a writer there, spent
				// over the whole range.
				r.sAt = r.sFrom
			}
		}
	}
	if !r.single {
		p.inflight = r
	}
	s.send(r, now)
}

// send puts r on the wire; the partition's cap decides at the store.
func (s *sim) send(r *request, now int64) {
	s.res.Requests++
	if r.take {
		s.res.Takes++
	} else {
		s.res.Returns++
	}
	s.push(now+s.oneWay(), evAtStore, r.proc, r)
}

func (s *sim) atStore(r *request, now int64) {
	c := s.cfg
	// The partition's cap: WriteCap a second, one second of burst.
	s.cap = min(c.WriteCap, s.cap+float64(now-s.capAt)/1e9*c.WriteCap)
	s.capAt = now
	if s.cap < 1 {
		r.throttled = true
		s.res.Throttled++
		if now >= int64(time.Second) {
			s.res.ThrottledLate++
		}
		s.push(now+s.oneWay(), evReply, r.proc, r)
		return
	}
	s.cap--
	for _, l := range r.rets {
		s.applyReturn(l)
	}
	if r.take {
		switch c.Algo {
		case Bucket:
			r.res = s.it.bucketTake(r.stamp, r.want, r.exp)
			s.res.MaxRing = max(s.res.MaxRing, len(s.it.ring))
		case Window:
			if c.Broken == WindowSpendPastSlot {
				r.res = s.it.windowTake(r.sFrom, r.sFrom, r.sAt, r.want)
			} else {
				r.res = s.it.windowTake(r.sFrom, r.sTo, r.sAt, r.want)
			}
		}
		if r.res.partial {
			// A second write: the bucket's failed condition sent again
			// for what is there, or the window's excess given back.
			s.res.Requests++
			s.res.Partial++
			s.cap--
		}
	}
	s.push(now+s.oneWay(), evReply, r.proc, r)
}

// applyReturn applies a lease's return (a bucket's may be refused: its
// units are then lost, counted).
func (s *sim) applyReturn(l *lease) {
	switch s.cfg.Algo {
	case Bucket:
		ok := s.it.bucketReturn(l.closed, l.ref.exp, l.got, l.left)
		if ok {
			s.res.Returned += l.left
		} else {
			s.res.Lost += l.left
		}
	default:
		spent := l.spent
		if s.cfg.Broken == WindowSpendPastSlot {
			spent = nil
		}
		s.it.windowReturn(l.ref.slot, l.left, spent)
		s.res.Returned += l.left
	}
}

func (s *sim) reply(r *request, now int64) {
	c := s.cfg
	p := &s.procs[r.proc]
	if p.inflight == r {
		p.inflight = nil
	}
	if r.throttled {
		s.throttled(r, now)
		return
	}
	if !r.take {
		return
	}
	res := r.res
	p.remaining, p.known = res.remaining, true
	if !r.single {
		s.res.Granted += res.got
	}
	l := &lease{got: res.got, left: res.got, from: r.from, to: r.to, ref: res.ref, single: r.single}
	if c.Algo == Window && !r.single {
		l.spent = map[int64]int64{}
	}
	// Serve the waiters from the units got, in order, within the range.
	var again []waiting
	for _, w := range r.waiters {
		switch {
		case l.left > 0 && w.stamp >= l.from && w.stamp < l.to:
			s.spend(l, w.stamp)
			if w.stamp != r.stamp {
				s.res.FromLease++
			}
			s.decide(w.idx, w.stamp, true)
		case res.got > 0 && l.left > 0:
			again = append(again, w) // past the range: a take of its own
		default:
			s.decide(w.idx, w.stamp, false)
		}
	}
	t := now + p.skew
	s.holdOff(r, t)
	if !l.single && l.got > 0 {
		s.keep(r.proc, l, now, t)
	}
	for _, w := range again {
		if p.lease != nil && p.lease.left > 0 && w.stamp >= p.lease.from && w.stamp < p.lease.to {
			s.spend(p.lease, w.stamp)
			s.res.FromLease++
			s.decide(w.idx, w.stamp, true)
			continue
		}
		// Its own take at its own stamp (a late writer to the store).
		s.sendTake(r.proc, now, w.stamp, 1, 0, 1, w)
	}
}

// throttled handles a request the store throttled: nothing applied, so
// its returns wait for the next write, its waiters are denied, and a take
// keeps the process from taking again for ThrottleRetry.
func (s *sim) throttled(r *request, now int64) {
	p := &s.procs[r.proc]
	p.closing = append(p.closing, r.rets...)
	if len(r.rets) > 0 {
		s.push(now+int64(s.cfg.Policy.MergeWait), evReturnDue, r.proc, nil)
	}
	for _, w := range r.waiters {
		s.decide(w.idx, w.stamp, false)
	}
	if r.take {
		p.denyUntil = max(p.denyUntil, now+p.skew+int64(ThrottleRetry))
	}
}

// holdOff remembers, after the take r answered at the process's time t,
// how long the process denies the key (a denial) or takes no more (less
// than it asked).
func (s *sim) holdOff(r *request, t int64) {
	c, p, res := s.cfg, &s.procs[r.proc], r.res
	switch {
	case res.got == 0:
		// Denied: remembered until the store's RetryAfter (a window: the
		// next slot), and, for a process that leases, at least MinLife,
		// so that a drained key is asked a few times a second per process.
		ra := res.retryAfter
		if c.Algo == Window {
			sl := c.slot()
			ra = (floorDiv(r.stamp, sl)+1)*sl - r.stamp
		}
		until := r.stamp + ra
		if !r.single {
			until = max(until, t+int64(c.Policy.MinLife))
		}
		p.denyUntil = max(p.denyUntil, until)
	case !r.single && (res.got < r.want || res.got < c.Policy.MinLease):
		// Less than the rate asks (the fair share, or what was there):
		// the key is near its limit. No new take before this lease's end,
		// so that a drained key costs each process at most one take a
		// lifetime.
		p.noTakeUntil = max(p.noTakeUntil, min(r.to, r.from+int64(c.Policy.MinLife)))
	}
}

// keep makes l, a lease just taken, the process's lease (at its time t),
// to end at l.to; one used up or already past its end is closed.
func (s *sim) keep(proc int, l *lease, now, t int64) {
	p := &s.procs[proc]
	if p.lease != nil {
		// A lease taken by a take sent alongside (n == 1 then): keep
		// the newer, close the older.
		s.close(proc, now)
	}
	p.lease = l
	if l.left == 0 || t >= l.to {
		s.close(proc, now)
	} else {
		s.seq++
		heap.Push(&s.ev, event{at: l.to - p.skew, seq: s.seq, kind: evLeaseEnd, proc: proc, lease: l})
	}
}

func (s *sim) finish() {
	c := s.cfg
	sorted := slices.Clone(s.stamps)
	slices.Sort(sorted)
	adm := s.admit
	slices.Sort(adm)
	switch c.Algo {
	case Bucket:
		s.res.Exact = exactBucket(sorted, c.Limit, int64(c.Refill), 1)
		s.res.Over, s.res.Worst = checkBucket(adm, c.Limit, int64(c.Refill), 1)
	case Window:
		s.res.Exact = exactWindow(sorted, c.Limit, c.slot(), c.Slots)
		s.res.Over, s.res.Worst = checkTrailing(adm, c.Limit, int64(c.Window))
	}
	s.res.Share = float64(s.res.Admitted) / float64(max(s.res.Exact, 1))
	s.res.Stamps = adm
}
