package memory

// BreakFence makes s's fenced adds and bucket takes ignore the fence (tests show they fail
// such a store).
func BreakFence(s *Store) { s.brokenFence = true }

// BreakBucketExpiry makes s keep a bucket a quarter of its TTL after the
// last write (tests show the history check fails such a store).
func BreakBucketExpiry(s *Store) { s.brokenBucketExpiry = true }
