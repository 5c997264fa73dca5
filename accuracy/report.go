package accuracy

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Options say what a report simulates.
type Options struct {
	// Params is the limit every configuration enforces.
	Params Params
	// Seed seeds every generated trace; the bursty trace's seed sweep uses
	// Seed, Seed+1, ..., Seed+Seeds-1.
	Seed  uint64
	Seeds int
	// Steady and SteadyFactor: the steady trace's length in windows and
	// its rate (times the limit's rate).
	Steady       int
	SteadyFactor float64
	// Bursty is the bursty traces' length in windows.
	Bursty int
	// EdgeCycles is the number of 4-window cycles of the edge traces.
	EdgeCycles int
	// Files are traces read from files, replayed like the others.
	Files []Trace
	// Target is the share of the exact log's admissions the default must
	// reach on every bursty trace.
	Target float64
	// MaxChoice is the largest sub-window count the default may have;
	// MaxSweep the largest the frontier shows.
	MaxChoice, MaxSweep int
	// Sensitivity are other limits on which the choice is checked, each
	// with the traces scaled to its window (as many windows as the
	// report's).
	Sensitivity []Params
	// Draft draws small, low-resolution figures of a few windows (for
	// tests and quick looks); the numbers do not change.
	Draft bool
	// Shapes is the traffic-shape matrix (no limits: not run).
	Shapes ShapeOptions
}

// DefaultOptions are the options of `make accuracy`.
func DefaultOptions() Options {
	return Options{
		Params:       DefaultParams,
		Seed:         1,
		Seeds:        8,
		Steady:       60,
		SteadyFactor: 1.5,
		Bursty:       240,
		EdgeCycles:   10,
		Target:       0.97,
		MaxChoice:    31,
		MaxSweep:     60,
		Sensitivity:  []Params{{Limit: 2, Window: time.Second}, {Limit: 10, Window: time.Minute}, {Limit: 1000, Window: time.Minute}},
		Shapes:       DefaultShapeOptions(),
	}
}

// Report holds everything the markdown and the figures show.
type Report struct {
	Options Options
	// Traces are steady, bursty (seed Options.Seed), edge-start, edge-end,
	// then the files.
	Traces []Trace
	// Configs are the rows of the tables: the issue's configurations, the
	// chosen default if it is not among them, and the prototypes.
	Configs []Config
	// Results[i][j] is configuration j on trace i.
	Results [][]Result
	// Sweep is the frontier: each sliding window configuration up to
	// Options.MaxSweep sub-windows on every bursty seed and every trace.
	Sweep []SweepRow
	// Choice is the recommended default for limiter.SlidingWindow.
	Choice Choice
	// Sensitivity checks the choice on the other limits of
	// Options.Sensitivity.
	Sensitivity []SensitivityRow
	// Shapes is the traffic-shape matrix (nil when Options.Shapes has no
	// limits).
	Shapes *ShapeMatrix
	// Packed is the same shapes replayed through the real packed
	// limiter.SlidingWindow at limiter.DefaultSlots on the memory store
	// (nil with Shapes).
	Packed *PackedReplay
}

// SensitivityRow is the choice checked on another limit.
type SensitivityRow struct {
	Params Params
	// Chosen is the report's choice on this limit, Current the bounded
	// window with 10 sub-windows (zero Config when k does not divide
	// the window).
	Chosen, Current SweepRow
	// Fewest is what Choose picks for this limit.
	Fewest Choice
}

// SweepRow is one configuration across the seed sweep.
type SweepRow struct {
	Config Config
	// Shares are the admitted shares (of the exact log's admissions) on
	// the bursty traces, one per seed.
	Shares []float64
	// Overshoot is the worst window count over the limit across every
	// trace: the bursty seeds and the others.
	Overshoot float64
	// Memcached is the footprint on the bursty trace of seed Options.Seed,
	// and Calls its store calls per decision there.
	Memcached Footprint
	Calls     float64
}

// MinShare is the smallest admitted share over the seeds.
func (r SweepRow) MinShare() float64 { return slices.Min(r.Shares) }

// Choice is the recommended sliding-window default.
type Choice struct {
	// Found reports whether a configuration of limiter.SlidingWindow with
	// at most Options.MaxChoice sub-windows never overshot and reached the
	// target on every bursty seed. Row is then the one with the fewest
	// sub-windows (Bounded before Interpolated).
	Found bool
	Row   SweepRow
}

// bursty returns the bursty trace of a seed.
func (o Options) bursty(seed uint64) Trace {
	return Bursty(o.Params, time.Duration(o.Bursty)*o.Params.Window, seed)
}

// steady returns the steady trace.
func (o Options) steady() Trace {
	return Steady(o.Params, o.SteadyFactor, time.Duration(o.Steady)*o.Params.Window, o.Seed)
}

// Run simulates everything the report shows.
func Run(o Options) (*Report, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	r := &Report{Options: o}
	p := o.Params
	r.Traces = []Trace{
		o.steady(),
		o.bursty(o.Seed),
		EdgeStart(p, o.EdgeCycles, o.Seed),
		EdgeEnd(p, o.EdgeCycles, o.Seed),
	}
	r.Traces = append(r.Traces, o.Files...)

	var err error
	if r.Sweep, err = r.runSweep(); err != nil {
		return nil, err
	}
	r.Choice = choose(r.Sweep, o)

	// The tables.
	r.Configs = Configs(filterValid(IssueSubWindows, p))
	if r.Choice.Found && !slices.Contains(r.Configs, r.Choice.Row.Config) {
		r.Configs = insertAfter(r.Configs, r.Choice.Row.Config)
	}
	for _, c := range []Config{
		{Algorithm: Sliced, SubWindows: 10, Slices: 2},
		{Algorithm: Sliced, SubWindows: 10, Slices: 4},
		{Algorithm: Moment, SubWindows: 10},
	} {
		if c.valid(p) {
			r.Configs = append(r.Configs, c)
		}
	}
	if r.Results, err = simulateAll(r.Traces, p, r.Configs); err != nil {
		return nil, err
	}
	if r.Choice.Found {
		if r.Sensitivity, err = sensitivity(o, r.Choice.Row.Config); err != nil {
			return nil, err
		}
	}
	if len(o.Shapes.Limits) > 0 {
		if r.Shapes, err = RunShapes(o.Shapes); err != nil {
			return nil, err
		}
		if r.Packed, err = RunPackedReplay(o.Shapes, limiter.DefaultSlots); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// runSweep runs every sub-window count up to MaxSweep of each estimator
// and prototype on every bursty seed, and on the other traces for the
// overshoot.
func (r *Report) runSweep() ([]SweepRow, error) {
	o, p := r.Options, r.Options.Params
	// The sweep: every bursty seed, plus the other traces for the
	// overshoot.
	sweepTraces := []Trace{r.Traces[0], r.Traces[2], r.Traces[3]}
	sweepTraces = append(sweepTraces, o.Files...)
	bursts := make([]Trace, o.Seeds)
	for i := range bursts {
		bursts[i] = o.bursty(o.Seed + uint64(i))
	}
	sweepTraces = append(sweepTraces, bursts...)
	var sweepConfigs []Config
	for _, k := range divisors(p.Window, o.MaxSweep) {
		for _, c := range []Config{
			{Algorithm: Bounded, SubWindows: k},
			{Algorithm: Interpolated, SubWindows: k},
			{Algorithm: Sliced, SubWindows: k, Slices: 2},
			{Algorithm: Sliced, SubWindows: k, Slices: 4},
			{Algorithm: Moment, SubWindows: k},
		} {
			if c.valid(p) {
				sweepConfigs = append(sweepConfigs, c)
			}
		}
	}
	sweep, err := simulateAll(sweepTraces, p, append([]Config{{Algorithm: Log}}, sweepConfigs...))
	if err != nil {
		return nil, err
	}
	nb := len(sweepTraces) - len(bursts)
	var rows []SweepRow
	for j, c := range sweepConfigs {
		row := SweepRow{Config: c}
		for i := range sweepTraces {
			res := sweep[i][j+1]
			row.Overshoot = max(row.Overshoot, res.Overshoot(p))
			if i >= nb {
				row.Shares = append(row.Shares, share(res, sweep[i][0]))
				if i == nb {
					row.Memcached, row.Calls = res.Memcached, res.callsPerDecision()
				}
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// scaled returns o for another limit (traces of as many windows).
func (o Options) scaled(p Params) Options {
	q := o
	q.Params, q.Files, q.Sensitivity = p, nil, nil
	q.Shapes = ShapeOptions{}
	return q
}

// sensitivity checks chosen, and the bounded window with 10 sub-windows, on
// each limit of o.Sensitivity, in parallel.
func sensitivity(o Options, chosen Config) ([]SensitivityRow, error) {
	rows := make([]SensitivityRow, len(o.Sensitivity))
	errs := make([]error, len(o.Sensitivity))
	var wg sync.WaitGroup
	for i, p := range o.Sensitivity {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := o.scaled(p)
			row := SensitivityRow{Params: p}
			var err error
			if chosen.valid(p) {
				if row.Chosen, err = evaluate(q, chosen); err != nil {
					errs[i] = err
					return
				}
			}
			if cur := (Config{Algorithm: Bounded, SubWindows: 10}); cur.valid(p) {
				if row.Current, err = evaluate(q, cur); err != nil {
					errs[i] = err
					return
				}
			}
			row.Fewest, errs[i] = Choose(q)
			rows[i] = row
		}()
	}
	wg.Wait()
	return rows, errors.Join(errs...)
}

// evaluate runs c on every trace of o: its sweep row.
func evaluate(o Options, c Config) (SweepRow, error) {
	p := o.Params
	row := SweepRow{Config: c}
	others := []Trace{o.steady(), EdgeStart(p, o.EdgeCycles, o.Seed), EdgeEnd(p, o.EdgeCycles, o.Seed)}
	for _, tr := range append(others, o.Files...) {
		res, err := Simulate(tr, p, c)
		if err != nil {
			return row, err
		}
		row.Overshoot = max(row.Overshoot, res.Overshoot(p))
	}
	for i := range o.Seeds {
		tr := o.bursty(o.Seed + uint64(i))
		res, err := Simulate(tr, p, c)
		if err != nil {
			return row, err
		}
		row.Overshoot = max(row.Overshoot, res.Overshoot(p))
		row.Shares = append(row.Shares, shareOf(res.Admitted, len(ExactAdmits(tr.Times, p.Limit, p.Window))))
		if i == 0 {
			row.Memcached, row.Calls = res.Memcached, res.callsPerDecision()
		}
	}
	return row, nil
}

// valid reports whether c can enforce p.
func (c Config) valid(p Params) bool {
	if c.sliding() && (c.SubWindows < 1 || c.SubWindows > limiter.MaxSubWindows || p.Window%time.Duration(c.resolution()) != 0) {
		return false
	}
	switch c.Algorithm {
	case Sliced:
		if c.Slices < 1 || c.Slices > 64 {
			return false
		}
		width := 64 / c.Slices
		return width >= 64 || p.Limit < 1<<(width-1)
	case Moment:
		return p.Limit*momentQuanta < 1<<32
	}
	return true
}

func filterValid(ks []int, p Params) []int {
	var out []int
	for _, k := range ks {
		if p.Window%time.Duration(k) == 0 {
			out = append(out, k)
		}
	}
	return out
}

// insertAfter inserts a bounded configuration after the last bounded one
// with fewer sub-windows.
func insertAfter(cs []Config, c Config) []Config {
	at := 0
	for i, d := range cs {
		if d.Algorithm == c.Algorithm && d.SubWindows < c.SubWindows {
			at = i + 1
		}
	}
	return slices.Insert(cs, at, c)
}

// share is what res admitted relative to the exact log ref.
func share(res, ref Result) float64 { return shareOf(res.Admitted, ref.Admitted) }

// shareOf is admitted relative to what the exact log admitted.
func shareOf(admitted, exact int) float64 {
	if exact == 0 {
		return 1
	}
	return float64(admitted) / float64(exact)
}

// candidate reports whether c may be the default: a limiter.SlidingWindow
// with at most o.MaxChoice sub-windows.
func (o Options) candidate(c Config) bool {
	return (c.Algorithm == Bounded || c.Algorithm == Interpolated) && c.SubWindows <= o.MaxChoice
}

// qualifies reports whether a sweep row meets the default's criteria: never
// above the limit in any window of any trace, and at least o.Target of the
// exact log's admissions on every bursty seed.
func (o Options) qualifies(row SweepRow) bool {
	return row.Overshoot <= 1 && len(row.Shares) == o.Seeds && row.MinShare() >= o.Target
}

// choose picks, among the sweep's candidates that qualify, the one with the
// fewest sub-windows (Bounded before Interpolated).
func choose(sweep []SweepRow, o Options) Choice {
	var best Choice
	for _, row := range sweep {
		if !o.candidate(row.Config) || !o.qualifies(row) {
			continue
		}
		if !best.Found || row.Config.SubWindows < best.Row.Config.SubWindows {
			best = Choice{Found: true, Row: row}
		}
	}
	return best
}

func (o Options) validate() error {
	if err := o.Params.validate(); err != nil {
		return err
	}
	if o.Seeds < 1 || o.Steady < 1 || o.Bursty < 1 || o.EdgeCycles < 1 || o.Target <= 0 || o.MaxChoice < 1 || o.MaxSweep < o.MaxChoice {
		return errors.New("accuracy: options need Seeds, Steady, Bursty and EdgeCycles >= 1, Target > 0 and 1 <= MaxChoice <= MaxSweep")
	}
	return nil
}

// Choose makes the choice Run makes, without the rest of the report: it
// tries the candidates in order of sub-windows, Bounded before
// Interpolated, and stops at the first that qualifies, dropping each
// candidate at its first failure.
func Choose(o Options) (Choice, error) {
	if err := o.validate(); err != nil {
		return Choice{}, err
	}
	p := o.Params
	bursts := make([]Trace, o.Seeds)
	refs := make([]int, o.Seeds)
	for i := range bursts {
		bursts[i] = o.bursty(o.Seed + uint64(i))
		refs[i] = len(ExactAdmits(bursts[i].Times, p.Limit, p.Window))
	}
	others := []Trace{o.steady(), EdgeStart(p, o.EdgeCycles, o.Seed), EdgeEnd(p, o.EdgeCycles, o.Seed)}
	others = append(others, o.Files...)
	for _, k := range divisors(p.Window, o.MaxChoice) {
	next:
		for _, a := range []Algorithm{Bounded, Interpolated} {
			row := SweepRow{Config: Config{Algorithm: a, SubWindows: k}}
			for i, tr := range bursts {
				res, err := Simulate(tr, p, row.Config)
				if err != nil {
					return Choice{}, err
				}
				row.Overshoot = max(row.Overshoot, res.Overshoot(p))
				row.Shares = append(row.Shares, shareOf(res.Admitted, refs[i]))
				if i == 0 {
					row.Memcached, row.Calls = res.Memcached, res.callsPerDecision()
				}
				if row.Overshoot > 1 || row.Shares[i] < o.Target {
					continue next
				}
			}
			for _, tr := range others {
				res, err := Simulate(tr, p, row.Config)
				if err != nil {
					return Choice{}, err
				}
				if row.Overshoot = max(row.Overshoot, res.Overshoot(p)); row.Overshoot > 1 {
					continue next
				}
			}
			if o.qualifies(row) {
				return Choice{Found: true, Row: row}, nil
			}
		}
	}
	return Choice{}, nil
}

// simulateAll runs every configuration on every trace, in parallel;
// out[i][j] is configuration j on trace i.
func simulateAll(traces []Trace, p Params, configs []Config) ([][]Result, error) {
	out := make([][]Result, len(traces))
	errs := make([][]error, len(traces))
	type job struct{ i, j int }
	jobs := make(chan job)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for jb := range jobs {
				res, err := Simulate(traces[jb.i], p, configs[jb.j])
				res.Admits = res.Admits[:len(res.Admits):len(res.Admits)]
				out[jb.i][jb.j], errs[jb.i][jb.j] = res, err
			}
		}()
	}
	for i := range traces {
		out[i] = make([]Result, len(configs))
		errs[i] = make([]error, len(configs))
	}
	for i := range traces {
		for j := range configs {
			jobs <- job{i, j}
		}
	}
	close(jobs)
	wg.Wait()
	for i := range errs {
		for j, err := range errs[i] {
			if err != nil {
				return nil, fmt.Errorf("%s on %s: %w", configs[j].Name(), traces[i].Name, err)
			}
		}
	}
	return out, nil
}

// result returns configuration c's result on trace i.
func (r *Report) result(i int, c Config) (Result, bool) {
	for j, d := range r.Configs {
		if d == c {
			return r.Results[i][j], true
		}
	}
	return Result{}, false
}

// reference returns the exact log's result on trace i.
func (r *Report) reference(i int) Result {
	res, _ := r.result(i, Config{Algorithm: Log})
	return res
}

// worstOvershoot is c's largest overshoot over the report's traces.
func (r *Report) worstOvershoot(c Config) float64 {
	w := 0.0
	for i := range r.Traces {
		if res, ok := r.result(i, c); ok {
			w = max(w, res.Overshoot(r.Options.Params))
		}
	}
	return w
}

// sweepRow returns the sweep's row for c.
func (r *Report) sweepRow(c Config) (SweepRow, bool) {
	for _, row := range r.Sweep {
		if row.Config == c {
			return row, true
		}
	}
	return SweepRow{}, false
}
