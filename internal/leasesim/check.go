package leasesim

import (
	"slices"
)

// Over is the worst window of stamps in which a run admitted more than the
// limit allows: Excess units more than the bound, with stamps in
// [From, To] (From is 0 when not tracked).
type Over struct {
	From, To int64
	Excess   int64
}

// checkTrailing applies limitertest.CheckTrailingWindow's rule to admitted
// stamps (unit cost, sorted): for every admitted stamp t, the units with
// stamps in (t-window, t] are at most limit. It returns how many admitted
// stamps end a trailing window over the limit, and the worst one.
//
// why hand-written: limitertest's checker takes []limitertest.Call with
// time.Time stamps; a run here admits about 10^5 units per scenario and
// keeps stamps as int64. check_test.go shows both agree.
func checkTrailing(stamps []int64, limit, window int64) (n int, worst Over) {
	lo := 0
	for hi := range stamps {
		t := stamps[hi]
		// Include every stamp equal to t (they all end the same window).
		end := hi
		for end+1 < len(stamps) && stamps[end+1] == t {
			end++
		}
		for stamps[lo] <= t-window {
			lo++
		}
		if units := int64(end - lo + 1); units > limit {
			n++
			if units-limit > worst.Excess {
				worst = Over{From: t - window, To: t, Excess: units - limit}
			}
		}
	}
	return n, worst
}

// checkBucket applies limitertest.CheckBucketBound's rule to admitted
// stamps (unit cost, sorted), for a bucket of max tokens refilled by amount
// every refill ns: the units admitted with stamps in any [a, b] are at most
// max + amount*(floor((b-a)/refill)+1). It returns the number of right
// ends b over the bound and the worst interval.
//
// why hand-written: limitertest's checker tries every pair of calls
// (quadratic: 10^10 pairs here). With a stamp written q*refill + rho, the
// excess of [i, j] is (j - amount*q_j) - (i - amount*q_i)
// + amount*[rho_j < rho_i] + 1 - max - amount, so one pass with a Fenwick
// tree of prefix maxima over the ranks of rho finds the worst i for every
// j. check_test.go compares it with limitertest.CheckBucketBound.
func checkBucket(stamps []int64, capacity, refill, amount int64) (n int, worst Over) {
	if len(stamps) == 0 {
		return 0, Over{}
	}
	// Ranks of rho (descending), for "rho_i > rho_j" as a prefix query.
	rhos := make([]int64, len(stamps))
	for i, t := range stamps {
		rhos[i] = mod(t, refill)
	}
	uniq := slices.Clone(rhos)
	slices.Sort(uniq)
	uniq = slices.Compact(uniq)
	rank := func(rho int64) int { // 1-based rank from the largest rho
		i, _ := slices.BinarySearch(uniq, rho)
		return len(uniq) - i
	}
	const none = -1 << 62
	fen := make([]int64, len(uniq)+1)
	for i := range fen {
		fen[i] = none
	}
	put := func(r int, v int64) {
		for ; r < len(fen); r += r & -r {
			fen[r] = max64(fen[r], v)
		}
	}
	get := func(r int) int64 { // max over ranks 1..r
		v := int64(none)
		for ; r > 0; r -= r & -r {
			v = max64(v, fen[r])
		}
		return v
	}
	best, bestAt := int64(none), 0 // max over i <= j of -(i - amount*q_i)
	for j, t := range stamps {
		qj := floorDiv(t, refill)
		b := int64(j) - amount*qj
		if -b > best {
			best, bestAt = -b, j
		}
		put(rank(rhos[j]), -b)
		a := b // A_j = j - amount*q_j
		exc := a + best + 1 - capacity - amount
		from := bestAt
		// i with rho_i > rho_j: one more refill step fits between them.
		if r := rank(rhos[j]) - 1; r > 0 {
			if v := get(r); v != none && a+v+1-capacity > exc {
				exc = a + v + 1 - capacity
				from = -1
			}
		}
		if exc > 0 {
			n++
			if exc > worst.Excess {
				f := int64(0)
				if from >= 0 {
					f = stamps[from]
				}
				worst = Over{From: f, To: t, Excess: exc}
			}
		}
	}
	return n, worst
}

// exactBucket counts what a serialized Smyte bucket (max tokens, full at
// the first stamp, amount every refill ns) admits of the calls at the
// given stamps, in stamp order, one unit each.
func exactBucket(stamps []int64, capacity, refill, amount int64) int64 {
	var tokens, updated int64
	var admitted int64
	for i, t := range stamps {
		if i == 0 {
			tokens, updated = capacity, t
		}
		if t > updated {
			if k := (t - updated) / refill; k > 0 {
				tokens = min(capacity, tokens+k*amount)
				updated += k * refill
			}
		}
		if tokens >= 1 {
			tokens--
			admitted++
		}
	}
	return admitted
}

// exactWindow counts what a serialized bounded sliding window (limit per
// r slots of slot ns: a call in slot s is admitted when slots s-r..s hold
// fewer than limit) admits of the calls at the given stamps, in stamp
// order, one unit each: the packed window's decision at resolution r.
func exactWindow(stamps []int64, limit, slot int64, r int) int64 {
	counts := map[int64]int64{}
	var admitted int64
	var sum int64 // slots cur-r..cur
	cur := int64(-1 << 62)
	for _, t := range stamps {
		s := floorDiv(t, slot)
		if s != cur {
			if s-cur > int64(r) {
				sum = 0
				clear(counts)
			} else {
				for x := cur - int64(r); x < s-int64(r); x++ {
					sum -= counts[x]
					delete(counts, x)
				}
			}
			cur = s
		}
		if sum+1 <= limit {
			counts[s]++
			sum++
			admitted++
		}
	}
	return admitted
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func mod(a, b int64) int64 { return a - floorDiv(a, b)*b }

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}
