package accuracy

import "time"

// This file holds a fast model of the Bounded sliding window, for the
// traffic-shape matrix (shapes.go), which replays millions of requests per
// configuration. It makes the decisions of limiter.SlidingWindow with the
// Bounded estimator and r sub-windows on an in-order trace, denied requests
// refunded (TestModelIsTheLimiter checks it against the real type and
// against the sliced prototype, which decides as Bounded with k*B
// sub-windows). Every window representation that stays exact at a
// resolution of r parts per window (sliced counters, packed totals, cached
// closed sub-windows) decides as this model with that r; they differ only
// in what a decision reads from the store (representation.go).

// estimator selects what the model counts of the oldest, partly visible
// sub-window.
type estimator uint8

const (
	// modelBounded counts it in full: limiter.Bounded.
	modelBounded estimator = iota
	// modelLeaky ignores it: a deliberately over-admitting estimator (a
	// window of r sub-windows that forgets the partly visible one), for the
	// tests that prove the overshoot check catches one.
	modelLeaky
)

// ModelResult is what the model (or the exact log) did with a trace.
type ModelResult struct {
	// Admitted and AdmittedUnits are the admitted requests and units.
	Admitted      int
	AdmittedUnits int64
	// WorstWindow is the most admitted units in any interval (t-W, t].
	WorstWindow int64
}

// windowMeter tracks the admitted units in the trailing window and their
// maximum.
type windowMeter struct {
	w      int64
	ts, ns []int64
	head   int
	units  int64
	worst  int64
}

// advance drops the admissions at or before t-w.
func (m *windowMeter) advance(t int64) {
	for m.head < len(m.ts) && m.ts[m.head] <= t-m.w {
		m.units -= m.ns[m.head]
		m.head++
	}
	if m.head > 4096 && m.head > len(m.ts)/2 { // keep the slices short
		m.ts, m.ns = append(m.ts[:0], m.ts[m.head:]...), append(m.ns[:0], m.ns[m.head:]...)
		m.head = 0
	}
}

func (m *windowMeter) admit(t, n int64) {
	m.ts, m.ns = append(m.ts, t), append(m.ns, n)
	m.units += n
	m.worst = max(m.worst, m.units)
}

// boundedModel replays tr through a sliding window of r sub-windows
// enforcing p with estimator e. admits, when not nil, receives the times of
// the admitted requests.
func boundedModel(tr Trace, p Params, r int, e estimator, admits *[]int64) ModelResult {
	return boundedModelOf(tr, p, r, e, admits, nil)
}

// boundedModelOf is boundedModel that also sets allowed[i] for each
// admitted request i, when allowed is not nil.
func boundedModelOf(tr Trace, p Params, r int, e estimator, admits *[]int64, allowed []bool) ModelResult {
	s := int64(p.Window) / int64(r)
	span := int64(r + 1)
	ring := make([]int64, span) // ring[idx mod span] is sub-window idx's count, idx in newest-r..newest
	var newest, sum int64       // sum is the ring's total
	m := windowMeter{w: int64(p.Window)}
	var res ModelResult
	for i, t := range tr.Times {
		idx := floorDiv(t, s)
		switch {
		case i == 0 || idx-newest > int64(r):
			clear(ring)
			sum = 0
		default:
			for j := newest + 1; j <= idx; j++ {
				sum -= ring[j%span]
				ring[j%span] = 0
			}
		}
		newest = idx
		n := tr.cost(i)
		used := sum + n
		if e == modelLeaky {
			used -= ring[(idx+1)%span] // the oldest, idx-r
		}
		m.advance(t)
		if used > p.Limit {
			continue
		}
		ring[idx%span] += n
		sum += n
		m.admit(t, n)
		res.Admitted++
		res.AdmittedUnits += n
		if admits != nil {
			*admits = append(*admits, t)
		}
		if allowed != nil {
			allowed[i] = true
		}
	}
	res.WorstWindow = m.worst
	return res
}

// exactModel is the exact sliding log's result on tr (ExactUnits, with the
// worst window, which is the limit whenever the trace fills a window).
func exactModel(tr Trace, p Params) ModelResult {
	m := windowMeter{w: int64(p.Window)}
	var res ModelResult
	for i, t := range tr.Times {
		m.advance(t)
		if n := tr.cost(i); m.units+n <= p.Limit {
			m.admit(t, n)
			res.Admitted++
			res.AdmittedUnits += n
		}
	}
	res.WorstWindow = m.worst
	return res
}

// validResolution reports whether r parts divide p's window into whole
// nanoseconds of at least 1ms (limiter.SlidingWindow's rule).
func validResolution(p Params, r int) bool {
	return r >= 1 && p.Window%time.Duration(r) == 0 && p.Window/time.Duration(r) >= time.Millisecond
}
