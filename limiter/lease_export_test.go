package limiter

import "time"

// SetBrokenDenyLonger sets brokenDenyLonger (1: as built) for the
// external tests.
func SetBrokenDenyLonger(f time.Duration) { brokenDenyLonger = f }
