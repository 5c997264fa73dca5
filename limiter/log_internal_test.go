package limiter

import (
	"math/rand/v2"
	"testing"
)

func bruteMax(entries []int64, at, w int64) int64 {
	best := int64(0)
	for s := at; s < at+w; s++ {
		c := int64(0)
		for _, e := range entries {
			if e > s-w && e <= s {
				c++
			}
		}
		best = max(best, c)
	}
	return best
}

func TestMaxInWindowsBrute(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		n := r.IntN(8)
		var e []int64
		for j := 0; j < n; j++ {
			e = append(e, r.Int64N(30))
		}
		for a := 1; a < len(e); a++ {
			for b := a; b > 0 && e[b-1] > e[b]; b-- {
				e[b-1], e[b] = e[b], e[b-1]
			}
		}
		at := r.Int64N(30)
		w := 1 + r.Int64N(10)
		if got, want := maxInWindows(e, at, w), bruteMax(e, at, w); got != want {
			t.Fatalf("entries %v at %d w %d: got %d want %d", e, at, w, got, want)
		}
	}
}
