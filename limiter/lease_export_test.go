package limiter

import "time"

// SetBrokenDenyLonger sets brokenDenyLonger (1: as built) for the
// external tests.
func SetBrokenDenyLonger(f time.Duration) { brokenDenyLonger = f }

// SetBrokenWaiting sets brokenWaiting (false: as built) for the external
// tests.
func SetBrokenWaiting(b bool) { brokenWaiting = b }

// SetBrokenWaitRun sets brokenWaitRun (0: as built) for the external
// tests.
func SetBrokenWaitRun(n int64) { brokenWaitRun = n }
