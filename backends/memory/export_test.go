package memory

// BreakFence makes s's fenced adds and bucket takes ignore the fence (tests show they fail
// such a store).
func BreakFence(s *Store) { s.brokenFence = true }
