package dynamo

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
