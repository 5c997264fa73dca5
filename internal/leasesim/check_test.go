package leasesim

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// calls turns admitted stamps into the history checker's calls.
func calls(stamps []int64) []limitertest.Call {
	cs := make([]limitertest.Call, len(stamps))
	for i, t := range stamps {
		cs[i] = limitertest.Call{Key: "k", Stamp: time.Unix(0, t), Cost: 1, Allowed: true}
	}
	return cs
}

// randomStamps draws n admitted stamps in [0, span) ns, bunched so that some
// histories break the limits below and some do not.
func randomStamps(rng *rand.Rand, n int, span int64) []int64 {
	s := make([]int64, n)
	for i := range s {
		s[i] = rng.Int64N(span)
		if rng.IntN(4) == 0 && i > 0 {
			s[i] = s[i-1] // equal stamps
		}
	}
	slices.Sort(s)
	return s
}

// TestCheckersAgree compares the local checkers with limitertest's on
// random histories: the same verdict, and the same worst excess for the
// bucket (the trailing window reports its worst the same way).
func TestCheckersAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	overs := [2]int{}
	for trial := range 3000 {
		n := 1 + rng.IntN(40)
		span := int64(1 + rng.IntN(2000))
		st := randomStamps(rng, n, span)
		limit := int64(1 + rng.IntN(12))
		window := int64(1 + rng.IntN(500))
		refill := int64(1 + rng.IntN(300))
		amount := int64(1 + rng.IntN(3))

		nw, worstW := checkTrailing(st, limit, window)
		vw := limitertest.CheckTrailingWindow(calls(st), limit, time.Duration(window))
		if (nw > 0) != (len(vw) > 0) {
			t.Fatalf("trial %d: trailing window: local %d over (worst +%d), limitertest %v; stamps %v limit %d window %d", trial, nw, worstW.Excess, vw, st, limit, window)
		}
		if len(vw) > 0 {
			overs[0]++
			worst := int64(0)
			for _, v := range vw {
				worst = max(worst, v.Units-v.Limit)
			}
			if worst != worstW.Excess {
				t.Fatalf("trial %d: trailing window worst: local +%d, limitertest +%d", trial, worstW.Excess, worst)
			}
		}

		nb, worstB := checkBucket(st, limit, refill, amount)
		vb := limitertest.CheckBucketBound(calls(st), limiter.TokenBucketConfig{MaxAmount: limit, RefillTime: time.Duration(refill), RefillAmount: amount})
		if (nb > 0) != (len(vb) > 0) {
			t.Fatalf("trial %d: bucket: local %d over (worst +%d), limitertest %v; stamps %v max %d refill %d by %d", trial, nb, worstB.Excess, vb, st, limit, refill, amount)
		}
		if len(vb) > 0 {
			overs[1]++
			if w := vb[0].Units - vb[0].Limit; w != worstB.Excess {
				t.Fatalf("trial %d: bucket worst: local +%d, limitertest +%d; stamps %v max %d refill %d by %d", trial, worstB.Excess, w, st, limit, refill, amount)
			}
		}
	}
	// Both verdicts must have occurred, or the comparison proves little.
	if overs[0] < 300 || overs[1] < 300 || overs[0] > 2700 || overs[1] > 2700 {
		t.Fatalf("histories over the limit: %d trailing, %d bucket, of 3000: draw them closer to the limits", overs[0], overs[1])
	}
	t.Logf("of 3000 random histories, %d over a trailing window, %d over a bucket's bound; both checkers agree on every one", overs[0], overs[1])
}

// TestExactReferences pins the serialized references on worked examples.
func TestExactReferences(t *testing.T) {
	// A bucket of 2, one token every 10: at 0, 0, 0 (2 admitted), 10 (1),
	// 15 (0), 20, 20 (1).
	if got := exactBucket([]int64{0, 0, 0, 10, 15, 20, 20}, 2, 10, 1); got != 4 {
		t.Errorf("exactBucket: %d admitted, want 4", got)
	}
	// A window of 2 per 4 slots of 10 (view: 5 slots): slots 0, 0, 1 (no),
	// 4 (no: slots 0..4 hold 2), 5 and 5 (slot 0 left the view).
	if got := exactWindow([]int64{0, 5, 10, 40, 50, 55}, 2, 10, 4); got != 4 {
		t.Errorf("exactWindow: %d admitted, want 4", got)
	}
}
