package regions

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// A bucket's share is a bucket of its own on the region's store: share
// units of capacity and share/units of the rate (one token every
// units*RefillTime/(RefillAmount*share), rounded up), on an item of its
// own. The parameters are part of a bucket's key space and a rate cannot
// change per decision on a refill grid (see limiter's cap.go), so a
// share that changes moves to a new item (a rebase):
//
//  1. The new item is created empty at a stamp `at` a little ahead (a
//     take of its whole capacity), so it refills at the new rate from at
//     on, on a grid that starts there.
//  2. Decisions stamped at or after at go to the new item; once the
//     agent's clock passes at, the old item takes no more decisions
//     (a decision stamped before at that comes later is denied), and the
//     agent waits for those under way.
//  3. The processes' leases on the old item are returned, and the old
//     item's free tokens at at move to the new one (a refund), at most
//     its capacity: tokens above a lowered capacity are dropped.
//
// So the regions' buckets hold, at every stamp, at most the capacities
// in force, which sum to the units, and refill at rates that sum to the
// bucket's: a giver rebases before it publishes, a receiver after it
// reads. Each region's grid adds at most one refill to an interval
// (a new item's grid starts at its first stamp), hence the unit per
// region kept out of the units.
//
// In transit a grant is a bucket of its own (Move): from the giver's new
// item's first stamp until the receiver's tick it refills at the rate of
// its units, up to them, and the receiver adds what it holds to its new
// item with the tokens carried (accrued). So the rate given is in some
// bucket at every stamp but between the receiver's tick and its new
// item's first stamp. Through the table the receiver's new item holds
// what the grants refilled up to its own first stamp (transit), and the
// tokens travel a tick later (carryTable, lateTokens).

// bucketItem is a bucket share on its item, for stamps from from on.
type bucketItem struct {
	key   string
	from  int64
	share int64
	// extra is the tokens a rebase through the table puts in the item
	// at its first stamp besides the old item's (rebaseTable), and the
	// grants' tokens read while it was ahead (lateTokens).
	extra int64
	// Through the table: mine, made by this agent (its carry's tokens
	// are known here); held, if heldOK, the tokens at its first stamp
	// and the grants' tokens added since (lateTokens).
	mine   bool
	held   int64
	heldOK bool
	// raised is the fence this agent raised the item's key to as it was
	// replaced (a fenced rebase: rebaseTable), raisedAt the agent's stamp
	// when the raise returned. hold is the units a fenced rebase's new
	// item holds at its first stamp for the old item's leases
	// (holdLeases), counted in its tokens.
	raised, raisedAt int64
	hold             int64
	cfg              limiter.TokenBucketConfig
	own              *limiter.TokenBucket // the agent's, without leases; nil when share is 0
	// closed: no more decisions; inflight: decisions under way. Under
	// the agent's mu.
	closed   bool
	inflight int
	procs    []*Limiter
}

// ttl is at least the TTL of item it's bucket (as the limiter keeps it:
// its refill from empty and a refill).
func (it *bucketItem) ttl() time.Duration {
	c := it.cfg
	if c.RefillAmount <= 0 {
		return 0
	}
	return time.Duration((c.MaxAmount+c.RefillAmount-1)/c.RefillAmount+1) * c.RefillTime
}

// bucketFor is the bucket of a share of s units (s > 0).
func (c Config) bucketFor(s int64, leases bool) limiter.TokenBucketConfig {
	b := c.Bucket
	num, den := c.units()*int64(b.RefillTime), b.RefillAmount*s
	return limiter.TokenBucketConfig{Name: "share", MaxAmount: s, RefillTime: time.Duration((num + den - 1) / den), RefillAmount: 1, Leases: leases}
}

// newItem makes an item for a share of s units from stamp at (zero: from
// the first decision, full); prepare empties it at at.
func (a *Agent) newItem(ctx context.Context, at time.Time, s int64, prepare bool) (*bucketItem, error) {
	seq := a.itemSeq.Add(1)
	it := &bucketItem{key: a.key() + "#" + strconv.FormatInt(a.nonce, 36) + "." + strconv.FormatInt(seq, 10),
		from: math.MinInt64, share: s}
	if !at.IsZero() {
		it.from = at.UnixNano()
	}
	if s <= 0 {
		return it, nil
	}
	it.cfg = a.cfg.bucketFor(s, false)
	own, err := limiter.NewTokenBucket(a.store.(storage.BucketStore), it.cfg)
	if err != nil {
		return nil, err
	}
	it.own = own
	it.cfg.Leases = a.cfg.Leases
	if prepare {
		d, err := own.AllowN(ctx, it.key, at, s)
		if err != nil {
			return nil, err
		}
		if !d.Allowed {
			return nil, fmt.Errorf("regions: new bucket item %q not full at its first stamp: %+v", it.key, d)
		}
	}
	return it, nil
}

// leftAt is the stamp from which a rebase made at now takes the rate
// given out of the region's bucket: rebaseAhead on, or through the table
// its new item's first stamp (rebaseTable; the excess it returns is none
// there: the tokens go at the carry).
func (a *Agent) leftAt(now time.Time) int64 {
	at := now.Add(a.ahead).UnixNano()
	if a.tbl != nil {
		a.mu.Lock()
		defer a.mu.Unlock()
		at = max(at, a.items[len(a.items)-1].from)
	}
	return at
}

// giveBucket gives what the plan gives, rebasing the region's bucket
// first to its share less the grant (and to the grants it received). The
// free tokens the old bucket held above the new share go with the units
// given (tokens it saved while idle), up to one a unit: the receiver adds
// them to its bucket when it takes the grant, so tokens held and tokens
// in transit never sum above the capacities in force and in transit. Each
// grant is listed in the region's entry (State.Moves) for its receiver to
// add what it refilled in transit (accrued).
func (a *Agent) giveBucket(ctx context.Context, now time.Time) error {
	sh, _ := a.Share()
	x := a.offerBucket(now, sh)
	g := a.planNow(now, false)
	var give int64
	for _, u := range g {
		give += u
	}
	a.mu.Lock()
	held := x // withheld for the offer
	if a.brokenGive {
		held = 0
	}
	give = clampPlan(g, give, a.owned-held)
	target := a.owned - give - held
	cur := a.items[len(a.items)-1]
	carryIn := a.carryIn
	a.carryIn = 0
	a.mu.Unlock()
	if a.broken && target < cur.share {
		target = cur.share
	}
	var excess int64
	if target != cur.share {
		var err error
		if excess, err = a.rebase(ctx, now, target, carryIn); err != nil {
			a.listBucket(now, x, 0, 0, false)
			return err // nothing given; received grants are taken at the next tick's rebase
		}
	} else if carryIn > 0 && cur.own != nil {
		if err := cur.own.Refund(ctx, cur.key, now, min(carryIn, cur.share)); err != nil {
			return err // the tokens are lost: under-admits
		}
	}
	at := a.leftAt(now) // the rate given leaves the region's bucket
	a.listBucket(now, x, min(max(excess-give, 0), x), at, true)
	if give == 0 {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	excess = min(excess, give)
	if a.brokenTokens {
		excess = give
	}
	own := &a.states[a.r]
	own.Moves = slices.DeleteFunc(own.Moves, func(m Move) bool { return m.At < now.Add(-moveKeep).UnixNano() })
	for o, u := range g {
		if u == 0 {
			continue
		}
		own.Given[o] += u
		k := excess * u / give
		own.Tokens[o] += k
		if a.tbl == nil {
			own.Moves = append(own.Moves, Move{To: o, Units: u, Tokens: k, At: at, Upto: own.Given[o]})
		} else if it := a.items[len(a.items)-1]; it.from > now.UnixNano() {
			// Through the table the rate given leaves the region's
			// bucket at its new item's first stamp, and the tokens go
			// with the grant at the carry (carryTable sets Tokens). A
			// grant made without a new item ahead (units received and
			// given at once: the region's rate unchanged) is not
			// listed: its receiver counts its refill from its own
			// tick, as before.
			own.Moves = append(own.Moves, Move{To: o, Units: u, At: it.from, Upto: own.Given[o]})
		}
	}
	if n := len(own.Moves); n > moveMax {
		own.Moves = slices.Delete(own.Moves, 0, n-moveMax)
	}
	a.owned -= give
	a.stats.Given += give
	a.stats.Grants++
	a.stats.Share = a.owned
	return nil
}

// accrued is what the grants to this region listed in moves (those past
// from, the running total Given[r] of their giver already taken)
// refilled in transit up to stamp t (the receiver's rate for them starts
// at t or later), besides the tokens they carried: each is a bucket of
// capacity Units holding Tokens at At and refilled at the rate of Units
// since (Move), its refills counted whole (rounded down), so the tokens
// held and in transit never exceed the capacities in force and in
// transit, and the rates in force and in transit never sum above the
// bucket's.
func (a *Agent) accrued(moves []Move, from, t int64) int64 {
	b := a.cfg.Bucket
	var sum int64
	for _, m := range moves {
		if m.To != a.r || m.Upto <= from || t <= m.At || m.Tokens < 0 || m.Units <= m.Tokens {
			continue
		}
		room, since := m.Units-m.Tokens, m.At
		if a.brokenAccrue {
			since = t - int64(time.Hour) // as if in transit for long: full
		}
		// Refills of Units at RefillAmount every RefillTime of the
		// whole units: Units*RefillAmount*(t-since) / (units*RefillTime),
		// in 128 bits.
		hi, lo := bits.Mul64(uint64(m.Units)*uint64(b.RefillAmount), uint64(t-since))
		den := uint64(a.cfg.units()) * uint64(b.RefillTime)
		if hi >= den {
			sum += room // more than any room
			continue
		}
		q, _ := bits.Div64(hi, lo, den)
		sum += int64(min(q, uint64(room)))
	}
	return sum
}

// rebase moves the region's bucket to a new item of s units (see the
// file's comment), adding carryIn tokens (received with grants), and
// returns the old item's free tokens that the new one could not hold.
// Through the table the old item's tokens move later (carryTable), so
// none are carried with a grant there: carryIn is 0 (receive takes no
// tokens on the table path) and nothing is returned.
func (a *Agent) rebase(ctx context.Context, now time.Time, s, carryIn int64) (int64, error) {
	if a.tbl != nil {
		return 0, a.rebaseTable(ctx, now, s)
	}
	at := now.Add(a.ahead)
	it, err := a.newItem(ctx, at, s, true)
	if err != nil {
		return 0, err
	}
	a.mu.Lock()
	a.stats.Rebases++
	old := a.items[len(a.items)-1]
	it.procs = old.procs
	a.items = append(a.items, it)
	a.mu.Unlock()

	time.Sleep(time.Until(at))
	a.mu.Lock()
	old.closed = true
	for old.inflight > 0 {
		a.cond.Wait()
	}
	a.mu.Unlock()
	var free int64
	if old.own != nil {
		for _, p := range old.procs {
			if tb := p.bucket(old, false); tb != nil {
				tb.ReturnLeases(ctx, at) // a return lost under-admits
				p.retire(tb)
			}
		}
		d, err := old.own.Get(ctx, old.key, at)
		if err != nil {
			return 0, err // the old tokens stay behind: under-admits
		}
		free = d.Remaining
	}
	if carry := min(free+carryIn, s); carry > 0 {
		if err := it.own.Refund(ctx, it.key, at, carry); err != nil {
			return 0, err
		}
	}
	a.mu.Lock()
	a.items = a.items[len(a.items)-1:]
	a.mu.Unlock()
	return max(free-s, 0), nil
}

// bucket returns the process's bucket of it (made when make is set).
func (l *Limiter) bucket(it *bucketItem, make bool) *limiter.TokenBucket {
	l.mu.Lock()
	defer l.mu.Unlock()
	if tb := l.buckets[it]; tb != nil || !make {
		if !make {
			delete(l.buckets, it)
		}
		return tb
	}
	tb, err := limiter.NewTokenBucket(l.store.(storage.BucketStore), it.cfg)
	if err != nil {
		return nil // cfg was valid for the agent's own
	}
	l.buckets[it] = tb
	return tb
}

// retire keeps the lease counts of tb, the bucket of a replaced item
// (LeaseStats).
func (l *Limiter) retire(tb *limiter.TokenBucket) {
	if brokenRetire {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.retired = l.retired.Add(tb.LeaseStats())
}

// brokenRetire (tests): a replaced item's lease counts are dropped with
// its bucket, as before.
var brokenRetire = false

// allowBucket decides n units at now on the item in force at now's
// stamp.
func (l *Limiter) allowBucket(ctx context.Context, now time.Time, n int64) (limiter.Decision, error) {
	a, t := l.a, now.UnixNano()
	a.mu.Lock()
	var it *bucketItem
	for i := len(a.items) - 1; i >= 0; i-- {
		if a.items[i].from <= t {
			it = a.items[i]
			break
		}
	}
	if it == nil || it.closed {
		a.mu.Unlock()
		return limiter.Decision{RetryAfter: rebaseAhead}, nil // a stamp behind the region's bucket
	}
	it.inflight++
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		it.inflight--
		a.cond.Broadcast()
		a.mu.Unlock()
	}()
	if it.share < n {
		return limiter.Decision{Limit: it.share, RetryAfter: rebaseAhead}, nil
	}
	tb := l.bucket(it, true)
	if tb == nil {
		return limiter.Decision{}, fmt.Errorf("regions: no bucket for %q", it.key)
	}
	return tb.AllowN(ctx, it.key, now, n)
}
