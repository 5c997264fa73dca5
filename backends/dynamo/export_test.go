package dynamo

import (
	"context"

	"github.com/sluicehq/sluice/limiter/storage"
)

// SetExactOnly makes s write every bucket state with a condition on the exact
// old values, never with a relative update conditioned on a value range.
func SetExactOnly(s *Store, on bool) { s.exactOnly = on }

// ItemKey exposes itemKey to the tests.
var ItemKey = itemKey

// SlotName exposes slotName to the tests.
var SlotName = slotName

// BreakPacked breaks s's packed protocol on purpose, for tests that show
// they fail without it: counters are removed early slots before the keep
// bound, and with noStale no add is ever answered Stale.
func BreakPacked(s *Store, early int64, noStale bool) {
	s.packedEarly, s.packedNoStale = early, noStale
}

// PackedName exposes packedName to the tests.
var PackedName = packedName

// BreakMerged drops the condition of every bucket write that is merged with
// other limits' (tests show the history checker fails such a store).
func BreakMerged(s *Store) { s.brokenMerged = true }

// Attr is the name of attribute name of the limit space in its item.
func Attr(space, name string) string { return spacePrefix(space) + name }

// BreakRingRefund breaks a refund on a bucket's lease ring on purpose:
// noC lowers tat without c, noRoom drops the conditions that tat and s
// hold what it gives back (tests show they fail).
func BreakRingRefund(s *Store, noC, noRoom bool) { s.brokenRefundC, s.brokenRefundRoom = noC, noRoom }

// RingProbe is a bucket item's ring as an op stamped op.Now sees it.
type RingProbe struct {
	// Level is the refill level less tat (uncapped: above MaxAmount the
	// bucket is full by tat); Unsettled and Held are s and h.
	Level, Unsettled, Held, Settled int64
}

// ProbeRing reads k's bucket item (strongly consistent) and returns its
// ring as op sees it.
func ProbeRing(ctx context.Context, s *Store, k storage.Key, op storage.BucketOp) (RingProbe, error) {
	a, err := s.attrsOf(k)
	if err != nil {
		return RingProbe{}, err
	}
	it, found, err := s.readBucket(ctx, a)
	if err != nil || !found {
		return RingProbe{}, err
	}
	v, _ := it.view(op)
	return RingProbe{Level: v.level - it.tat, Unsettled: it.unsettled, Held: it.held, Settled: it.settled}, nil
}

// BreakFence makes s's fenced window adds and bucket takes ignore the
// fence (tests show they fail such a store).
func BreakFence(s *Store) { s.brokenFence = true }
