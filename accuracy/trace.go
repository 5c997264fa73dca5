package accuracy

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Epoch is where generated traces start: 2027-01-15T08:00:00Z, a whole hour
// since the Unix epoch, so windows and sub-windows of whole seconds that
// divide an hour start exactly on it (the ClassDojo edge cases need the
// bursts to sit at a window's start or end).
var Epoch = time.Unix(1_800_000_000, 0).UTC()

// Trace is a sequence of request times (Unix nanoseconds, ascending; equal
// times are several requests at once) by one key, each of cost 1 unless
// Costs says otherwise.
type Trace struct {
	// Name is short and unique within a report ("bursty").
	Name string
	// About says how the trace was made, in a sentence for the report.
	About string
	// Times are the request times, ascending.
	Times []int64
	// Costs, when not nil, are the requests' costs (units), one per time;
	// nil means every request costs 1.
	Costs []int64
}

// cost is the cost of request i.
func (t Trace) cost(i int) int64 {
	if t.Costs == nil {
		return 1
	}
	return t.Costs[i]
}

// Units is the total cost of the trace's requests.
func (t Trace) Units() int64 {
	if t.Costs == nil {
		return int64(len(t.Times))
	}
	var n int64
	for _, c := range t.Costs {
		n += c
	}
	return n
}

// Start and End return the first and last request times (zero for an empty
// trace).
func (t Trace) Start() int64 {
	if len(t.Times) == 0 {
		return 0
	}
	return t.Times[0]
}

// End returns the last request time.
func (t Trace) End() int64 {
	if len(t.Times) == 0 {
		return 0
	}
	return t.Times[len(t.Times)-1]
}

// newRand returns the generator of a trace: PCG seeded with the seed and a
// constant naming the trace's kind, so that two kinds never share a stream.
func newRand(seed uint64, kind string) *rand.Rand {
	var h uint64 = 14695981039346656037 // FNV-1a of kind
	for i := 0; i < len(kind); i++ {
		h ^= uint64(kind[i])
		h *= 1099511628211
	}
	return rand.New(rand.NewPCG(seed, h))
}

// poisson appends the arrival times of a Poisson process of rate per second
// over [from, to) to times.
func poisson(r *rand.Rand, times []int64, from, to int64, rate float64) []int64 {
	if rate <= 0 {
		return times
	}
	mean := float64(time.Second) / rate
	for t := from; ; {
		t += int64(math.Ceil(r.ExpFloat64() * mean))
		if t >= to {
			return times
		}
		times = append(times, t)
	}
}

// limitRate is the limit's rate in requests per second.
func (p Params) limitRate() float64 { return float64(p.Limit) / p.Window.Seconds() }

// Steady is Poisson traffic at factor times the limit's rate for d.
func Steady(p Params, factor float64, d time.Duration, seed uint64) Trace {
	r := newRand(seed, "steady")
	start := Epoch.UnixNano()
	return Trace{
		Name:  "steady",
		About: fmt.Sprintf("Poisson arrivals at %.3gx the limit's rate for %v (seed %d).", factor, d, seed),
		Times: poisson(r, nil, start, start+int64(d), factor*p.limitRate()),
	}
}

// Bursty is on/off traffic for d: each on period lasts a uniformly random
// 1/12 to 3 windows at a rate drawn log-uniformly between 0.2x and 6x the
// limit's rate (Poisson arrivals); each off period is silent for a uniformly
// random 0 to 2 windows.
func Bursty(p Params, d time.Duration, seed uint64) Trace {
	r := newRand(seed, "bursty")
	w := float64(p.Window)
	start := Epoch.UnixNano()
	end := start + int64(d)
	var times []int64
	for t := start; t < end; {
		on := int64(w/12 + r.Float64()*(3*w-w/12))
		factor := 0.2 * math.Pow(30, r.Float64()) // log-uniform in [0.2, 6]
		times = poisson(r, times, t, min(t+on, end), factor*p.limitRate())
		t += on + int64(r.Float64()*2*w)
	}
	return Trace{
		Name: "bursty",
		About: fmt.Sprintf("On/off traffic for %v: on periods of 1/12 to 3 windows at 0.2x to 6x the limit's rate "+
			"(log-uniform, Poisson arrivals), off periods of 0 to 2 windows (seed %d).", d, seed),
		Times: times,
	}
}

// edge is the shape of the ClassDojo edge cases: cycles of four windows,
// each a burst of Limit requests spread uniformly over the 1/60 of a window
// that starts at burstAt, silence until the second window, then Poisson
// traffic at twice the limit's rate for two windows, then a silent window.
func edge(p Params, name, where string, burstAt float64, cycles int, seed uint64) Trace {
	r := newRand(seed, name)
	w := int64(p.Window)
	burst := w / 60
	var times []int64
	for c := range cycles {
		t0 := Epoch.UnixNano() + int64(c)*4*w
		b0 := t0 + int64(burstAt*float64(w))
		var bs []int64
		for range p.Limit {
			bs = append(bs, b0+r.Int64N(burst))
		}
		slices.Sort(bs)
		times = append(times, bs...)
		times = poisson(r, times, t0+w, t0+3*w, 2*p.limitRate())
	}
	return Trace{
		Name: name,
		About: fmt.Sprintf("ClassDojo's edge case, %d cycles of 4 windows: a burst of the limit (%d requests) in the %s "+
			"of a window, then Poisson traffic at 2x the limit's rate through the next two windows, then silence (seed %d).",
			cycles, p.Limit, where, seed),
		Times: times,
	}
}

// EdgeStart bursts in the first 1/60 of a window (ClassDojo: "100 requests in
// the first 0.25 minutes"). Estimators that assume uniform traffic
// over-estimate afterwards and under-admit.
func EdgeStart(p Params, cycles int, seed uint64) Trace {
	return edge(p, "edge-start", "first 1/60", 0, cycles, seed)
}

// EdgeEnd bursts in the last 1/60 of a window (ClassDojo: "those initial 100
// requests had come in right at the end of the first interval"). Estimators
// that assume uniform traffic under-estimate afterwards and over-admit.
func EdgeEnd(p Params, cycles int, seed uint64) Trace {
	return edge(p, "edge-end", "last 1/60", 59.0/60, cycles, seed)
}

// ReadTrace reads a trace of one timestamp per line: RFC 3339 (with or
// without a fraction, "2026-11-21T12:00:00.25Z") or decimal seconds since the
// Unix epoch ("1763726400.25"; small numbers are fine: windows are aligned to
// multiples of the window since the epoch, as the limiters align them).
// Blank lines and lines starting with '#' are skipped; the times are sorted.
func ReadTrace(name string, r io.Reader) (Trace, error) {
	sc := bufio.NewScanner(r)
	var times []int64
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || s[0] == '#' {
			continue
		}
		t, err := parseTimestamp(s)
		if err != nil {
			return Trace{}, fmt.Errorf("accuracy: trace %s line %d: %w", name, line, err)
		}
		times = append(times, t)
	}
	if err := sc.Err(); err != nil {
		return Trace{}, fmt.Errorf("accuracy: trace %s: %w", name, err)
	}
	if len(times) == 0 {
		return Trace{}, fmt.Errorf("accuracy: trace %s: no timestamps", name)
	}
	slices.Sort(times)
	return Trace{
		Name:  name,
		About: fmt.Sprintf("Read from a file: %d requests over %v.", len(times), time.Duration(times[len(times)-1]-times[0])),
		Times: times,
	}, nil
}

// parseTimestamp parses RFC 3339 or decimal Unix seconds, exactly (no
// floating point), to Unix nanoseconds.
func parseTimestamp(s string) (int64, error) {
	if strings.ContainsAny(s, "T:") {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return 0, fmt.Errorf("not an RFC 3339 time: %w", err)
		}
		if y := t.Year(); y < 1678 || y > 2261 {
			return 0, fmt.Errorf("time %s is outside the range of Unix nanoseconds", s)
		}
		return t.UnixNano(), nil
	}
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" || len(frac) > 9 || strings.TrimLeft(whole, "0123456789") != "" || strings.TrimLeft(frac, "0123456789") != "" {
		return 0, fmt.Errorf("%q is neither RFC 3339 nor decimal seconds since the Unix epoch (at most 9 decimals)", s)
	}
	sec, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || sec > math.MaxInt64/int64(time.Second)-1 {
		return 0, fmt.Errorf("%q: seconds out of range", s)
	}
	ns := int64(0)
	if frac != "" {
		ns, _ = strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
	}
	return sec*int64(time.Second) + ns, nil
}
