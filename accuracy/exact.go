package accuracy

import "time"

// ExactAdmits returns the times of the requests an exact sliding window of
// limit per w admits: a request at t is admitted when fewer than limit
// admitted requests lie in (t-w, t]. These are limiter.SlidingLog's
// decisions (TestExactLogIsExact checks it on every test trace) in constant
// time per request, for the sweeps over long traces and large limits.
func ExactAdmits(times []int64, limit int64, w time.Duration) []int64 {
	var admits []int64
	head := 0
	for _, t := range times {
		for head < len(admits) && admits[head] <= t-int64(w) {
			head++
		}
		if int64(len(admits)-head) < limit {
			admits = append(admits, t)
		}
	}
	return admits
}

// ExactUnits is ExactAdmits for a trace with costs: a request of n units at
// t is admitted when the admitted units in (t-w, t] plus n stay within
// limit. It returns the admitted requests and units.
func ExactUnits(tr Trace, limit int64, w time.Duration) (requests int, units int64) {
	var ts, ns []int64
	var inView int64
	head := 0
	for i, t := range tr.Times {
		for head < len(ts) && ts[head] <= t-int64(w) {
			inView -= ns[head]
			head++
		}
		if n := tr.cost(i); inView+n <= limit {
			ts, ns = append(ts, t), append(ns, n)
			inView += n
			units += n
		}
	}
	return len(ts), units
}
