package storage

import (
	"time"
)

// Mode is what a [BucketOp] or a [LogOp] does.
type Mode uint8

const (
	ModeTake   Mode = iota // take N (the zero value)
	ModePeek               // read, taking nothing (a bucket's Get)
	ModeRefund             // give N back
	ModeLease              // a lease take: at least N, up to Want
	ModeReturn             // a lease's return alone (Return)
)

// LeaseEpoch is the length of a lease epoch: a capacity lease of a token
// bucket lives at most [MaxLeaseLife], and the units it took stay out of
// the bucket until its return, or until the end of the epoch after the one
// its slot is labelled with (its own or, for a slot a lease took over, two
// later), whichever is first. See docs/leases.md.
const LeaseEpoch = 1200 * time.Millisecond

// MaxLeaseLife is the longest a capacity lease may be spent: it ends at
// least LeaseEpoch-MaxLeaseLife before its units expire from the store, so
// its return lands in time.
const MaxLeaseLife = time.Second

// BucketOp is one token-bucket step, handed to a [BucketStore]. Its Apply
// method is the whole algorithm; stores only make it atomic.
type BucketOp struct {
	MaxAmount    int64
	RefillTime   time.Duration
	RefillAmount int64
	Strict       bool
	// Now is the caller's time in Unix nanoseconds.
	Now int64
	// N is the number of tokens to take (or give back). For a lease take
	// it is the least the take may get (the cost of the decision at hand).
	N int64
	// Want is the most a lease take may get, Epoch the lease epoch its
	// units are counted in (see [BucketState.Leased]).
	Want, Epoch int64
	// Return is a capacity lease's return, applied before the op: a
	// process's next op on the key carries its last lease's return.
	Return LeaseReturn
	// Mode is what the op does.
	Mode Mode
}

// Take reports whether the op takes tokens (as opposed to reading or
// refunding). A store that writes conditionally on the token count may use
// it.
func (op BucketOp) Take() bool { return op.Mode == ModeTake || op.Mode == ModeLease }

// Leases reports whether the op takes a capacity lease or ends one: a
// store that keeps [BucketState.Leased] writes it.
func (op BucketOp) Leases() bool {
	return op.Mode == ModeLease || op.Mode == ModeReturn || op.Return.Got > 0
}

// Apply computes the bucket after op from cur (found is false for a new
// bucket, which starts full at op.Now). It returns the next state (Version
// copied from cur), the decision, and whether the state changed and must be
// written. Apply is pure and cheap: optimistic stores call it again after a
// lost race.
func (op BucketOp) Apply(cur BucketState, found bool) (next BucketState, d Decision, write bool) {
	next = cur
	if !found {
		next = BucketState{Tokens: op.MaxAmount, Updated: op.Now, Version: cur.Version}
		write = true
	}
	if op.expire(&next) {
		write = true
	}
	if op.refill(&next, op.Now) {
		write = true
	}
	if next.Tokens > op.MaxAmount { // parameters changed under a key; never exceed capacity
		next.Tokens = op.MaxAmount
		write = true
	}
	returned := false
	if op.Return.Got > 0 {
		returned = next.giveBack(op.Return)
		write = write || returned
	}
	leased := next.Leased[0].Units + next.Leased[1].Units
	free := next.Tokens - leased // what is in the bucket for anyone
	d = Decision{Limit: op.MaxAmount}
	switch op.Mode {
	case ModePeek:
		d.Allowed = free >= op.N
		write = false
	case ModeRefund:
		next.Tokens = min(op.MaxAmount, next.Tokens+op.N)
		d.Allowed = true
		write = true
	case ModeReturn:
		d.Allowed = returned
	case ModeLease:
		if op.N > free {
			break
		}
		got := min(max(op.Want, op.N), free)
		s := next.leaseSlot(op.Epoch)
		if s == nil { // no slot free of an older epoch: a plain take
			next.Tokens -= op.N
			d.Allowed, write = true, true
			break
		}
		s.Units += got
		d.Granted, d.LeaseRef = got, s.Epoch
		d.Allowed, write = true, true
	default:
		if op.N <= free {
			next.Tokens -= op.N
			d.Allowed = true
			write = true
		} else if op.Strict && op.Now > next.Updated {
			next.Updated = op.Now
			write = true
		}
	}
	d.Leased = next.Leased[0].Units + next.Leased[1].Units
	free = next.Tokens - d.Leased
	d.Remaining = max(free, 0)
	d.ResetAfter = op.untilTokens(next, op.MaxAmount)
	if !d.Allowed {
		d.RetryAfter = max(op.untilTokens(next, min(op.N+leased, op.MaxAmount)), 1)
	}
	return next, d, write
}

// refill adds the refills due by t to s, Smyte style: whole refills only,
// the remainder is kept. A clock behind Updated refills nothing and never
// moves Updated back. It reports whether s changed.
func (op BucketOp) refill(s *BucketState, t int64) bool {
	rt := int64(op.RefillTime)
	if t <= s.Updated {
		return false
	}
	refills := (t - s.Updated) / rt
	if refills <= 0 {
		return false
	}
	if s.Tokens < op.MaxAmount {
		need := (op.MaxAmount - s.Tokens + op.RefillAmount - 1) / op.RefillAmount
		if refills >= need {
			s.Tokens = op.MaxAmount
		} else {
			s.Tokens += refills * op.RefillAmount
		}
	}
	s.Updated += refills * rt
	return true
}

// expire takes the units of the lease epochs that ended by op.Now out of
// s for good, oldest first, each at its end: the bucket is refilled to
// that instant (capped at MaxAmount with the epoch's units still in it,
// so a refill the leased units kept out stays out), then loses them. It
// reports whether s changed.
func (op BucketOp) expire(s *BucketState) bool {
	changed := false
	for {
		i := -1
		for j := range s.Leased {
			e := s.Leased[j]
			if e != (LeaseSlot{}) && epochExpiry(e.Epoch) <= op.Now && (i < 0 || e.Epoch < s.Leased[i].Epoch) {
				i = j
			}
		}
		if i < 0 {
			return changed
		}
		op.refill(s, epochExpiry(s.Leased[i].Epoch))
		s.Tokens -= s.Leased[i].Units
		s.Leased[i] = LeaseSlot{}
		changed = true
	}
}

// untilTokens is how long until s holds want tokens with no more traffic.
func (op BucketOp) untilTokens(s BucketState, want int64) time.Duration {
	if s.Tokens >= want {
		return 0
	}
	refills := (want - s.Tokens + op.RefillAmount - 1) / op.RefillAmount
	at := s.Updated + refills*int64(op.RefillTime)
	if at <= op.Now {
		return 0
	}
	return time.Duration(at - op.Now)
}

// Refund reports whether the op gives tokens back (a batch's refund round)
// rather than taking or reading. Like a [StepSub], a refund's answer is not
// needed by the caller: a [Batcher] may send it without waiting.
func (op BucketOp) Refund() bool { return op.Mode == ModeRefund }

// LeaseReturn ends a capacity lease of a token bucket: Got tokens were
// granted in lease epoch Epoch, Unspent of them were not spent. Applied
// before the epoch has expired, the spent tokens leave the bucket and
// the lease's hold on it ends; after, it is refused (the epoch's units
// left the bucket at its end: giving them back would give them twice).
type LeaseReturn struct {
	Epoch, Got, Unspent int64
}

// leaseAhead is how many epochs past its own a slot taken over by a lease
// is labelled: the slot then serves the leases of leaseAhead+1 epochs
// before another must be taken over (on DynamoDB every process's first
// take after a takeover loses one race), and holds a lost lease's units
// at most leaseAhead epochs longer.
const leaseAhead = 2

// epochExpiry is when the units of lease epoch e leave the bucket: the end
// of the epoch after it.
func epochExpiry(e int64) int64 { return (e + 2) * int64(LeaseEpoch) }

// giveBack applies a lease's return to s, unless its epoch has expired:
// the spent tokens leave the bucket, the lease's hold ends.
func (s *BucketState) giveBack(r LeaseReturn) bool {
	i := 0
	if s.Leased[1].Epoch == r.Epoch {
		i = 1
	}
	l := &s.Leased[i]
	if l.Epoch != r.Epoch || r.Epoch == 0 || l.Units == 0 {
		return false
	}
	spent := r.Got - min(r.Unspent, r.Got)
	s.Tokens -= spent
	l.Units = max(l.Units-r.Got, 0)
	return true
}

// leaseSlot is the slot for the units of a lease taken in epoch e: the
// one labelled e or later with the earliest label (its units expire no
// sooner than e's would), else a free one, labelled e+leaseAhead; nil
// when the only free-less slot holds an older epoch not yet expired.
func (s *BucketState) leaseSlot(e int64) *LeaseSlot {
	var best *LeaseSlot
	for i := range s.Leased {
		if l := &s.Leased[i]; l.Epoch >= e && (best == nil || l.Epoch < best.Epoch) {
			best = l
		}
	}
	if best != nil {
		return best
	}
	for i := range s.Leased {
		if l := &s.Leased[i]; *l == (LeaseSlot{}) {
			*l = LeaseSlot{Epoch: e + leaseAhead}
			return l
		}
	}
	return nil
}
