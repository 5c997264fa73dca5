package dynamo

// SetExactOnly makes s write every bucket state with a condition on the exact
// old values, never with a relative update conditioned on a value range.
func SetExactOnly(s *Store, on bool) { s.exactOnly = on }

// ItemKey exposes itemKey to the tests.
var ItemKey = itemKey

// SlotName exposes slotName to the tests.
var SlotName = slotName
