package accuracy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// This file generates the demanding traffic shapes. A shape is
// generated for a limit, a grid (the resolution r of the configuration
// replayed on it: shapes aligned to sub-windows land on that
// configuration's own sub-window boundaries, its worst case) and a seed.

// Shape is one kind of traffic of the shape matrix.
type Shape struct {
	// Name is short ("end-bursts"); About describes it in a sentence.
	Name, About string
	// Aligned shapes depend on the grid: they are generated once per
	// resolution.
	Aligned bool
	gen     func(p Params, r, windows int, seed uint64) Trace
}

// Generate returns the shape's trace for limit p, windows windows long, on
// a grid of r parts per window, from seed.
func (sh Shape) Generate(p Params, r, windows int, seed uint64) Trace {
	tr := sh.gen(p, r, windows, seed)
	tr.Name = sh.Name
	tr.About = fmt.Sprintf("%s (%d per %v, %d windows, seed %d)", sh.About, p.Limit, p.Window, windows, seed)
	return tr
}

// maxCost is the largest cost of the costed shapes: 10, or the limit when
// it is smaller (a cost above the limit is an error).
func (p Params) maxCost() int64 { return min(10, p.Limit) }

// shapeRand is the generator of one shape's trace for a limit and a grid.
func shapeRand(name string, p Params, r int, seed uint64) *rand.Rand {
	return newRand(seed, "shape:"+name+":"+strconv.FormatInt(p.Limit, 10)+"/"+p.Window.String()+":"+strconv.Itoa(r))
}

// alignedBursts returns bursts at sub-window boundaries of the grid: at
// each boundary, with probability q, a burst of 1..Limit units (uniform)
// lands at once, at the sub-window's first nanosecond (atEnd false) or its
// last (atEnd true); requests cost 1, or 1..maxCost (uniform) when costed.
// q is set so that the bursts' units average twice the limit's rate.
func alignedBursts(p Params, r, windows int, rs *rand.Rand, atEnd, costed bool) Trace {
	s := int64(p.Window) / int64(r)
	meanUnits := float64(p.Limit+1) / 2
	q := math.Min(1, 2*float64(p.Limit)/(float64(r)*meanUnits))
	first := floorDiv(Epoch.UnixNano(), s)
	var tr Trace
	if costed {
		tr.Costs = []int64{}
	}
	for j := range int64(r) * int64(windows) {
		if rs.Float64() >= q {
			continue
		}
		at := (first + j) * s
		if atEnd {
			at += s - 1
		}
		target := 1 + rs.Int64N(p.Limit)
		for units := int64(0); units < target; {
			n := int64(1)
			if costed {
				n = min(1+rs.Int64N(p.maxCost()), target-units)
				tr.Costs = append(tr.Costs, n)
			}
			tr.Times = append(tr.Times, at)
			units += n
		}
	}
	return tr
}

// pareto draws from a Pareto distribution of scale xm and shape alpha.
func pareto(rs *rand.Rand, xm, alpha float64) float64 {
	return xm / math.Pow(1-rs.Float64(), 1/alpha)
}

// Shapes are the demanding traffic shapes, plus the report's bursty and edge
// traces, in the order the report shows them.
func Shapes() []Shape {
	aligned := func(name string, atEnd, costed bool) func(Params, int, int, uint64) Trace {
		return func(p Params, r, windows int, seed uint64) Trace {
			return alignedBursts(p, r, windows, shapeRand(name, p, r, seed), atEnd, costed)
		}
	}
	shapes := []Shape{
		{Name: "start-bursts", Aligned: true, gen: aligned("start-bursts", false, false),
			About: "Bursts of 1..L requests (uniform) at the first nanosecond of random sub-windows of the configuration's own grid, twice the limit's rate on average"},
		{Name: "end-bursts", Aligned: true, gen: aligned("end-bursts", true, false),
			About: "Bursts of 1..L requests at the last nanosecond of random sub-windows of the configuration's own grid, twice the limit's rate on average"},
		{Name: "cost-start-bursts", Aligned: true, gen: aligned("cost-start-bursts", false, true),
			About: "Bursts of 1..L units at the first nanosecond of random sub-windows of the configuration's own grid, in requests of cost 1..10 (at most L; uniform), twice the limit's rate in units"},
		{Name: "cost-end-bursts", Aligned: true, gen: aligned("cost-end-bursts", true, true),
			About: "As cost-start-bursts, at the last nanosecond of the sub-windows"},
	}
	for _, f := range []float64{0.5, 1, 2, 5, 10} {
		name := "poisson-" + strconv.FormatFloat(f, 'g', -1, 64) + "x"
		shapes = append(shapes, Shape{Name: name, About: fmt.Sprintf("Poisson arrivals at %gx the limit's rate", f),
			gen: func(p Params, _ int, windows int, seed uint64) Trace {
				start := Epoch.UnixNano()
				return Trace{Times: poisson(shapeRand(name, p, 0, seed), nil, start, start+int64(windows)*int64(p.Window), f*p.limitRate())}
			}})
	}
	shapes = append(shapes,
		Shape{Name: "cost-poisson-2x", About: "Poisson arrivals of requests of cost 1..10 (at most L; uniform) at twice the limit's rate in units",
			gen: func(p Params, _ int, windows int, seed uint64) Trace {
				rs := shapeRand("cost-poisson-2x", p, 0, seed)
				mean := float64(1+p.maxCost()) / 2
				start := Epoch.UnixNano()
				tr := Trace{Times: poisson(rs, nil, start, start+int64(windows)*int64(p.Window), 2*p.limitRate()/mean)}
				tr.Costs = make([]int64, len(tr.Times))
				for i := range tr.Costs {
					tr.Costs[i] = 1 + rs.Int64N(p.maxCost())
				}
				return tr
			}},
		Shape{Name: "on-off-pareto", About: "Heavy-tailed on/off traffic: on and off periods Pareto-distributed (shape 1.2, scale 1/20 of a window, capped at 5 windows), Poisson arrivals at 0.5x to 10x the limit's rate (log-uniform) while on",
			gen: func(p Params, _ int, windows int, seed uint64) Trace {
				rs := shapeRand("on-off-pareto", p, 0, seed)
				w := float64(p.Window)
				start := Epoch.UnixNano()
				end := start + int64(windows)*int64(p.Window)
				var times []int64
				for t := start; t < end; {
					on := int64(math.Min(pareto(rs, w/20, 1.2), 5*w))
					factor := 0.5 * math.Pow(20, rs.Float64())
					times = poisson(rs, times, t, min(t+on, end), factor*p.limitRate())
					t += on + int64(math.Min(pareto(rs, w/20, 1.2), 5*w))
				}
				return Trace{Times: times}
			}},
		Shape{Name: "bursty", About: "The report's bursty trace: on periods of 1/12 to 3 windows at 0.2x to 6x the limit's rate, off periods of 0 to 2 windows",
			gen: func(p Params, _ int, windows int, seed uint64) Trace {
				return Bursty(p, time.Duration(windows)*p.Window, seed)
			}},
		Shape{Name: "edge-start", About: "ClassDojo's edge case: a burst of the limit in the first 1/60 of a window, then 2x the limit's rate for two windows, then silence",
			gen: func(p Params, _ int, windows int, seed uint64) Trace {
				return EdgeStart(p, max(1, windows/4), seed)
			}},
		Shape{Name: "edge-end", About: "As edge-start, the burst in the last 1/60 of a window",
			gen: func(p Params, _ int, windows int, seed uint64) Trace {
				return EdgeEnd(p, max(1, windows/4), seed)
			}},
	)
	return shapes
}
