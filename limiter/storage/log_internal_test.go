package storage

import (
	"math/rand/v2"
	"testing"
	"time"
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

// Applied serially in any arrival order within the horizon, the log never
// admits more than its limit in any window-length interval of stamps.
func TestLogApplyOutOfOrderNeverOverAdmits(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 3000; trial++ {
		limit := 1 + r.Int64N(6)
		w := int64(10 + r.IntN(20))
		op := LogOp{Limit: limit, Window: time.Duration(w)}
		var entries []int64
		var admitted []int64 // stamps, one per unit
		newest := int64(0)
		for i := 0; i < 40; i++ {
			// Stamps drift forward; arrivals lag up to one window.
			base := int64(i) * w / 8
			now := base - r.Int64N(w)
			if now < newest-w {
				now = newest - w // stay within the horizon
			}
			op.Now, op.N = now, 1+r.Int64N(min(limit, 3))
			next, d, _ := op.Apply(append([]int64(nil), entries...))
			entries = next
			newest = max(newest, now)
			if d.Allowed {
				for range op.N {
					admitted = append(admitted, now)
				}
			}
		}
		for _, s := range admitted {
			n := int64(0)
			for _, a := range admitted {
				if a > s-w && a <= s {
					n++
				}
			}
			if n > limit {
				t.Fatalf("trial %d: %d units in (%d, %d], limit %d; admitted %v", trial, n, s-w, s, limit, admitted)
			}
		}
	}
}
