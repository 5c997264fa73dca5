package storage

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"
)

// MaxLeases is the largest capacity of a limiter.Concurrency limit. Every live
// lease of a key is stored in one value (a memcached item, a DynamoDB item),
// so the capacity bounds the value's size: about 25 bytes per lease.
const MaxLeases = 1000

// MaxLeaseIDLen is the longest lease ID. IDs are 1 to MaxLeaseIDLen bytes of
// A-Z, a-z, 0-9, '-' and '_', so backends can store them as they are (as a
// DynamoDB map key, inside a memcached value) and a limiter.Lease can travel as
// text.
const MaxLeaseIDLen = 64

// LeaseEntry is one lease as stored.
type LeaseEntry struct {
	// ID identifies the lease (see [MaxLeaseIDLen]).
	ID string
	// Expires is when the lease lapses, in Unix nanoseconds: the lease is
	// live while the caller's now is before Expires.
	Expires int64
}

// LeaseOp is one acquire step handed to a [LeaseStore]. Its Apply method is
// the whole algorithm; stores only make it atomic.
type LeaseOp struct {
	// Capacity is the number of live leases the key may hold, this one
	// included.
	Capacity int64
	// Now is the caller's time in Unix nanoseconds.
	Now int64
	// TTL is how long the new lease lives.
	TTL time.Duration
	// ID is the new lease's ID.
	ID string
}

// Apply computes a key's leases after an acquire from cur (nil when the key
// holds none). It drops the leases that expired (Expires <= Now), then adds
// a lease {ID, Now+TTL} if fewer than Capacity remain. If a live lease with
// ID is already there (a retried acquire whose first write landed), it is
// allowed again without adding anything, so retries never take two slots.
// Apply reuses cur's storage; write reports whether the result differs from
// cur. It is pure and cheap: optimistic stores call it again after a lost
// race.
//
// The decision's Limit is Capacity and Remaining the free slots after the
// acquire. ResetAfter is how long until every live lease has expired, the
// latest time the key is free again if no lease is released; a denial's
// RetryAfter is how long until the oldest live lease expires.
func (op LeaseOp) Apply(cur []LeaseEntry) (next []LeaseEntry, d Decision, write bool) {
	next, write = dropExpired(cur, op.Now, "")
	held := false
	for _, e := range next {
		if e.ID == op.ID {
			held = true
			break
		}
	}
	d = Decision{Limit: op.Capacity}
	switch {
	case held:
		d.Allowed = true
	case int64(len(next)) < op.Capacity:
		next = append(next, LeaseEntry{ID: op.ID, Expires: leaseExpiry(op.Now, op.TTL)})
		d.Allowed = true
		write = true
	}
	d.Remaining = max(op.Capacity-int64(len(next)), 0)
	first, last := int64(0), int64(0)
	for i, e := range next {
		if i == 0 || e.Expires < first {
			first = e.Expires
		}
		last = max(last, e.Expires)
	}
	if len(next) > 0 {
		d.ResetAfter = time.Duration(last - op.Now)
	}
	if !d.Allowed {
		d.RetryAfter = max(time.Duration(first-op.Now), 1)
	}
	return next, d, write
}

// ReleaseOp is one release step handed to a [LeaseStore].
type ReleaseOp struct {
	// ID is the lease to remove.
	ID string
	// Now is the caller's time in Unix nanoseconds; leases expired at Now
	// are dropped too.
	Now int64
}

// Apply removes the lease ID and the expired leases from cur, reusing its
// storage. write reports whether anything was removed. Releasing a lease
// that is not there (released before, or expired) changes nothing.
func (op ReleaseOp) Apply(cur []LeaseEntry) (next []LeaseEntry, write bool) {
	return dropExpired(cur, op.Now, op.ID)
}

// dropExpired removes from cur, in place, the entries expired at now and the
// one with ID drop (when not empty).
func dropExpired(cur []LeaseEntry, now int64, drop string) ([]LeaseEntry, bool) {
	next := cur[:0]
	for _, e := range cur {
		if e.Expires > now && (drop == "" || e.ID != drop) {
			next = append(next, e)
		}
	}
	return next, len(next) != len(cur)
}

// LeaseExpiry returns the time until which a store must keep leases: the
// latest Expires among them (now when there are none). A backend with
// server-side expiry keeps the value at least until then, plus a margin for
// the difference between its clock and the callers'.
func LeaseExpiry(entries []LeaseEntry, now int64) time.Duration {
	last := now
	for _, e := range entries {
		last = max(last, e.Expires)
	}
	return time.Duration(last - now)
}

func leaseExpiry(now int64, ttl time.Duration) int64 {
	if now > 1<<63-1-int64(ttl) {
		return 1<<63 - 1
	}
	return now + int64(ttl)
}

// LeaseStore is the store the concurrent-requests limiter needs: an atomic
// read-modify-write of one key's set of live leases.
//
// AcquireLease calls op.Apply with the key's leases (nil when none), stores
// the result when Apply asks for a write, and returns Apply's decision. The
// read-modify-write must be atomic: memory does it under a lock, memcached
// with gets and cas on one value holding the leases, DynamoDB with one
// conditional write on one item; optimistic stores call Apply again on the
// state that beat them, within ctx's deadline, and never lose an update.
// The leases must be kept at least until [LeaseExpiry] of what was written.
//
// ReleaseLease removes the lease op.ID, atomically as well (with op.Apply,
// or natively: DynamoDB removes one map entry). It may leave the leases
// expired at op.Now for the next acquire to drop. Releasing a lease that is
// not held is not an error.
type LeaseStore interface {
	AcquireLease(ctx context.Context, key Key, op LeaseOp) (Decision, error)
	ReleaseLease(ctx context.Context, key Key, op ReleaseOp) error
}

func ValidLeaseID(id string) bool {
	if len(id) == 0 || len(id) > MaxLeaseIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// AppendLeases appends the binary encoding of entries to dst: a uvarint
// count, then per lease a uvarint ID length, the ID and a varint Expires.
// Backends that store a key's leases as one value use it with [ParseLeases].
func AppendLeases(dst []byte, entries []LeaseEntry) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(entries)))
	for _, e := range entries {
		dst = binary.AppendUvarint(dst, uint64(len(e.ID)))
		dst = append(dst, e.ID...)
		dst = binary.AppendVarint(dst, e.Expires)
	}
	return dst
}

// ParseLeases decodes what [AppendLeases] wrote, appending the leases to
// dst. A malformed value (more than 2*MaxLeases leases, a bad ID, trailing
// bytes) gives an error wrapping [ErrCorruptState].
func ParseLeases(b []byte, dst []LeaseEntry) ([]LeaseEntry, error) {
	n, w := binary.Uvarint(b)
	if w <= 0 || n > 2*MaxLeases {
		return dst, fmt.Errorf("%w: lease set header", ErrCorruptState)
	}
	b = b[w:]
	for i := uint64(0); i < n; i++ {
		l, w := binary.Uvarint(b)
		if w <= 0 || l > MaxLeaseIDLen || uint64(len(b)-w) < l {
			return dst, fmt.Errorf("%w: lease %d of %d: ID", ErrCorruptState, i, n)
		}
		id := string(b[w : w+int(l)])
		b = b[w+int(l):]
		if !ValidLeaseID(id) {
			return dst, fmt.Errorf("%w: lease %d of %d: bad ID", ErrCorruptState, i, n)
		}
		exp, w := binary.Varint(b)
		if w <= 0 {
			return dst, fmt.Errorf("%w: lease %d of %d: expiry", ErrCorruptState, i, n)
		}
		b = b[w:]
		dst = append(dst, LeaseEntry{ID: id, Expires: exp})
	}
	if len(b) != 0 {
		return dst, fmt.Errorf("%w: %d trailing bytes after lease set", ErrCorruptState, len(b))
	}
	return dst, nil
}
