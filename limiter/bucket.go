package limiter

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// TokenBucketConfig configures a [TokenBucket].
type TokenBucketConfig struct {
	// Name identifies the limit in decisions and metrics.
	Name string
	// MaxAmount is the capacity of the bucket; a new bucket starts full.
	MaxAmount int64
	// RefillTime is the time between refills.
	RefillTime time.Duration
	// RefillAmount is the number of tokens each refill adds (capped at
	// MaxAmount). Zero means 1.
	RefillAmount int64
	// Strict keeps a bucket blocked while traffic continues: a denied
	// request restarts the refill timer (Smyte's STRICT).
	Strict bool
	// NoDenyCache turns off the limit's deny cache (see [DenyCache]),
	// which is on by default (not for a Strict bucket, whose denials move its refill time): a key the store denied is denied again
	// without a store request until the denial's RetryAfter has passed.
	NoDenyCache bool
	// Leases lets a hot key be decided in this process from capacity
	// leases: tokens taken in one store step and spent here within
	// MaxLeaseLife, without a store request, never over the bucket's
	// bounds (docs/leases.md). A cold key is decided as without them.
	// Only a bucket that is not Strict leases, and only on a store that
	// keeps [BucketState.Leased] ([LeaseKeeper]); on another store the
	// bucket decides every call at the store.
	Leases bool
}

// TokenBucket is Smyte's token bucket. A bucket holds up to MaxAmount tokens
// and starts full; every RefillTime since the last refill adds RefillAmount
// tokens (refills arrive in steps, and the time left over is kept); AllowN
// takes n tokens if the bucket holds at least n. In strict mode a denial sets
// the refill timer to now, so a client that keeps retrying stays blocked.
//
// The bucket parameters are part of the stored key. A TokenBucket is safe for
// concurrent use and is exact (never admits more than the tokens available)
// on any [BucketStore] that honours its atomicity contract. Time going
// backwards never refills a bucket.
type TokenBucket struct {
	cfg   TokenBucketConfig
	store BucketStore
	batch Batcher // store's
	space string
	ttl   time.Duration
	cache *DenyCache
	lz    *leaser // nil: no leases
}

// NewTokenBucket returns a token bucket on store, or an error wrapping
// [ErrInvalidConfig] naming the bad field.
func NewTokenBucket(store BucketStore, cfg TokenBucketConfig) (*TokenBucket, error) {
	if cfg.RefillAmount == 0 {
		cfg.RefillAmount = 1
	}
	switch {
	case store == nil:
		return nil, configError("token bucket", cfg.Name, "store", "must not be nil")
	case cfg.MaxAmount <= 0:
		return nil, configError("token bucket", cfg.Name, "max amount", "must be positive, got %d", cfg.MaxAmount)
	case cfg.RefillTime <= 0:
		return nil, configError("token bucket", cfg.Name, "refill time", "must be positive, got %v", cfg.RefillTime)
	case cfg.RefillAmount < 0:
		return nil, configError("token bucket", cfg.Name, "refill amount", "must be positive, got %d", cfg.RefillAmount)
	case cfg.Leases && cfg.Strict:
		return nil, configError("token bucket", cfg.Name, "leases", "a strict bucket does not lease (its denials move its refill time)")
	}

	// Time to refill from empty, plus one refill period of slack: after that
	// an absent bucket (full) and a stored one are the same.
	steps := (cfg.MaxAmount + cfg.RefillAmount - 1) / cfg.RefillAmount
	ttl := satMul(time.Duration(steps+1), cfg.RefillTime)
	var lz *leaser
	if k, ok := store.(LeaseKeeper); cfg.Leases && ok && k.KeepsLeased() {
		lz = newLeaser(cfg.MaxAmount)
		lz.holds = true
		// Kept until leased units have expired from it: a bucket the
		// store dropped would start full while leases hold its units.
		ttl = max(ttl, 3*LeaseEpoch)
	}
	return &TokenBucket{
		cfg:   cfg,
		store: store,
		batch: AsBatcher(store),
		space: "tb:" + strconv.FormatInt(cfg.MaxAmount, 10) + ":" + cfg.RefillTime.String() + ":" + strconv.FormatInt(cfg.RefillAmount, 10),
		ttl:   ttl,
		cache: newDenyCache(cfg.NoDenyCache, cfg.Strict),
		lz:    lz,
	}, nil
}

// Config returns the bucket's configuration (with defaults applied).
func (b *TokenBucket) Config() TokenBucketConfig { return b.cfg }

// Space returns the key space of the bucket's state: its parameters.
func (b *TokenBucket) Space() string { return b.space }

// Allow is AllowN(ctx, key, now, 1).
func (b *TokenBucket) Allow(ctx context.Context, key string, now time.Time) (Decision, error) {
	return b.AllowN(ctx, key, now, 1)
}

// AllowN is Smyte's reduce(n): it takes n tokens if the bucket holds them.
func (b *TokenBucket) AllowN(ctx context.Context, key string, now time.Time, n int64) (Decision, error) {
	return decideOne(ctx, b, key, now, n)
}

// Get is Smyte's get(): the bucket's state at now, without taking anything.
// Decision.Remaining is the number of tokens; Allowed reports whether a
// request of cost 1 would pass.
func (b *TokenBucket) Get(ctx context.Context, key string, now time.Time) (Decision, error) {
	t, err := unixNano(b.cfg.Name, now)
	if err != nil {
		return Decision{}, err
	}
	d, err := b.store.UpdateBucket(ctx, Key{Space: b.space, Name: key}, b.op(t, 1, opPeek), b.ttl)
	if err != nil {
		return Decision{}, b.storeErr(err)
	}
	d.Name = b.cfg.Name
	return d, nil
}

// Refund puts n tokens back (capped at MaxAmount).
func (b *TokenBucket) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	return refundOne(ctx, b, key, now, n)
}

type opMode uint8

const (
	opTake opMode = iota
	opPeek
	opRefund
	opLease  // a lease take: at least N, up to Want
	opReturn // a lease's return alone (Return)
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
	mode   opMode
}

// LeaseReturn ends a capacity lease of a token bucket: Got tokens were
// granted in lease epoch Epoch, Unspent of them were not spent. Applied
// before the epoch has expired, the spent tokens leave the bucket and
// the lease's hold on it ends; after, it is refused (the epoch's units
// left the bucket at its end: giving them back would give them twice).
type LeaseReturn struct {
	Epoch, Got, Unspent int64
}

// Take reports whether the op takes tokens (as opposed to reading or
// refunding). A store that writes conditionally on the token count may use
// it.
func (op BucketOp) Take() bool { return op.mode == opTake || op.mode == opLease }

// Leases reports whether the op takes a capacity lease or ends one: a
// store that keeps [BucketState.Leased] writes it.
func (op BucketOp) Leases() bool {
	return op.mode == opLease || op.mode == opReturn || op.Return.Got > 0
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
	switch op.mode {
	case opPeek:
		d.Allowed = free >= op.N
		write = false
	case opRefund:
		next.Tokens = min(op.MaxAmount, next.Tokens+op.N)
		d.Allowed = true
		write = true
	case opReturn:
		d.Allowed = returned
	case opLease:
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
	free = next.Tokens - next.Leased[0].Units - next.Leased[1].Units
	d.Remaining = max(free, 0)
	d.ResetAfter = op.untilTokens(next, op.MaxAmount)
	if !d.Allowed {
		d.RetryAfter = max(op.untilTokens(next, min(op.N+leased, op.MaxAmount)), 1)
	}
	return next, d, write
}

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

// leaseAhead is how many epochs past its own a slot taken over by a lease
// is labelled: the slot then serves the leases of leaseAhead+1 epochs
// before another must be taken over (on DynamoDB every process's first
// take after a takeover loses one race), and holds a lost lease's units
// at most leaseAhead epochs longer.
const leaseAhead = 2

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

// leaseEpochOf is the lease epoch of t (Unix ns).
func leaseEpochOf(t int64) int64 { return floorDiv(t, int64(LeaseEpoch)) }

// epochExpiry is when the units of lease epoch e leave the bucket: the end
// of the epoch after it.
func epochExpiry(e int64) int64 { return (e + 2) * int64(LeaseEpoch) }

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

func satMul(a, b time.Duration) time.Duration {
	if a != 0 && b > (1<<63-1)/a {
		return 1<<63 - 1
	}
	return a * b
}

func configError(kind, name, field, format string, args ...any) error {
	return fmt.Errorf("%w: %s %q: %s %s", ErrInvalidConfig, kind, name, field, fmt.Sprintf(format, args...))
}

func costError(name string, n, limit int64) error {
	if n <= 0 {
		return fmt.Errorf("%w: limit %q: cost must be positive, got %d", ErrInvalidCost, name, n)
	}
	return fmt.Errorf("%w: limit %q: cost %d exceeds the capacity %d, so it could never be allowed", ErrInvalidCost, name, n, limit)
}
