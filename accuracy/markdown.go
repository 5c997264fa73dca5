package accuracy

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// FigureDir is the directory, next to the markdown, that holds the figures.
const FigureDir = "accuracy"

// Write writes dir/accuracy.md and its figures under dir/accuracy/.
func (r *Report) Write(dir string) error {
	figDir := filepath.Join(dir, FigureDir)
	if err := os.MkdirAll(figDir, 0o755); err != nil {
		return err
	}
	figs := r.figures()
	for _, f := range figs {
		fig, err := f.build()
		if err != nil {
			return fmt.Errorf("accuracy: figure %s: %w", f.name, err)
		}
		fig.dpi = r.drawing().dpi
		if err := fig.save(figDir); err != nil {
			return err
		}
	}
	var buf bytes.Buffer
	if err := r.markdown(&buf, figs); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "accuracy.md"), buf.Bytes(), 0o644)
}

// Markdown writes the report's markdown, which refers to the figures Write
// writes under accuracy/.
func (r *Report) Markdown(w io.Writer) error { return r.markdown(w, r.figures()) }

// captioned is a figure of the report, built on demand.
type captioned struct {
	name    string // file name without extension
	build   func() (*figure, error)
	title   string
	caption string
}

// countConfigs are the panels of the counting figures: Criteo's three
// (fixed window, one interpolated counter, interpolated 15 s sub-windows)
// and the bounded estimator.
func (r *Report) countConfigs() []Config {
	cs := []Config{
		{Algorithm: Fixed},
		{Algorithm: Interpolated, SubWindows: 1},
		{Algorithm: Interpolated, SubWindows: 4},
		{Algorithm: Bounded, SubWindows: 4},
	}
	if r.Choice.Found {
		cs = append(cs, r.Choice.Row.Config)
	} else {
		cs = append(cs, Config{Algorithm: Bounded, SubWindows: 30})
	}
	cs = append(cs, Config{Algorithm: Moment, SubWindows: 10})
	var out []Config
	for _, c := range cs {
		if c.valid(r.Options.Params) {
			out = append(out, c)
		}
	}
	return out
}

// admittedConfigs are the panels of the limiting figures.
func (r *Report) admittedConfigs() []Config {
	cs := []Config{
		{Algorithm: Fixed},
		{Algorithm: Bucket},
		{Algorithm: Interpolated, SubWindows: 1},
		{Algorithm: Interpolated, SubWindows: 12},
		{Algorithm: Bounded, SubWindows: 10},
	}
	if r.Choice.Found {
		cs = append(cs, r.Choice.Row.Config)
	} else {
		cs = append(cs, Config{Algorithm: Bounded, SubWindows: 30})
	}
	var out []Config
	for _, c := range cs {
		if c.valid(r.Options.Params) {
			out = append(out, c)
		}
	}
	return out
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)

// drawing is the detail of the report's figures.
func (r *Report) drawing() drawing {
	if r.Options.Draft {
		return draftDrawing
	}
	return fullDrawing
}

func (r *Report) figures() []captioned {
	p := r.Options.Params
	w := p.Window
	d := r.drawing()
	var out []captioned
	// The first n windows of a trace, from the start of the window of its
	// first request.
	span := func(tr Trace, n int) (Trace, int64, int64) {
		from := floorDiv(tr.Start(), int64(w)) * int64(w)
		to := from + int64(n)*int64(w)
		return segment(tr, from, to), from, to
	}
	counts := func(name string, tr Trace) func() (*figure, error) {
		return func() (*figure, error) {
			seg, from, to := span(tr, d.countWindows)
			return countFigure(name, seg, from, to, p, r.countConfigs(), d.grid)
		}
	}
	admitted := func(name string, tr Trace) func() (*figure, error) {
		return func() (*figure, error) {
			seg, from, to := span(tr, d.admittedWindows)
			return admittedFigure(name, seg, from, to, p, r.admittedConfigs(), d.grid)
		}
	}

	out = append(out, captioned{"counts-bursty", counts("counts-bursty", r.Traces[1]), "What each configuration counts (the bursty trace)",
		fmt.Sprintf("The first %d windows of the bursty trace, every request counted and none denied, as in Criteo's figures: "+
			"grey is the exact number of requests in the last %v, dotted orange what the configuration counts at each request "+
			"(its estimate, the request included) and in between (a probe, counted and refunded). The fixed window forgets at each window mark; the interpolated estimator "+
			"follows the exact count but strays above and below it; the bounded estimator never counts less than the exact count, "+
			"and the more sub-windows, the closer it stays.", d.countWindows, w)})

	for i, tr := range r.Traces[4:] {
		name := "counts-" + strings.Trim(unsafeName.ReplaceAllString(tr.Name, "-"), "-")
		out = append(out, captioned{name, counts(name, tr), fmt.Sprintf("What each configuration counts (trace %s)", tr.Name),
			fmt.Sprintf("The first %d windows of the trace read from a file (%d of %d), as above.", d.countWindows, i+1, len(r.Traces)-4)})
	}

	for _, tr := range []Trace{r.Traces[3], r.Traces[2]} {
		what := "a burst in the last second of a window, then twice the limit's rate"
		if tr.Name == "edge-start" {
			what = "a burst in the first second of a window, then twice the limit's rate"
		}
		name := "admitted-" + tr.Name
		out = append(out, captioned{name, admitted(name, tr), fmt.Sprintf("What each configuration admits (the %s trace)", tr.Name),
			fmt.Sprintf("The first %d windows of the %s trace (%s), each configuration enforcing the limit: orange is the number "+
				"of requests it admitted in the last %v at each moment, grey the exact sliding log's, red the limit. Orange above red "+
				"is overshoot; orange below grey while requests keep coming is under-admission.", d.admittedWindows, tr.Name, what, w)})
	}

	out = append(out, captioned{"tradeoff", r.tradeoffFigure, "Trade-off: overshoot against admitted share",
		fmt.Sprintf("Each configuration of the summary table: its worst window over every trace, over the limit (above the red "+
			"line it let more than the limit through some window), against what it admitted on the bursty trace relative to the "+
			"exact sliding log. The acceptable region is on the red line, right of the green one (%.0f%%). Configurations with the same point share a label.", 100*r.Options.Target)})

	if r.Shapes != nil {
		out = append(out, captioned{"shapes-frontier", r.shapesFigure, "The packed window's frontier: worst shape against keys read",
			fmt.Sprintf("Left: each representation's share of the exact log on its worst shape, limit and seed, against the keys "+
				"one memcached decision names, at every resolution of the shape matrix (the cached line is its cold, worst-case "+
				"figure, today's bounded one). Right: each shape's worst share (over the %d limits and %d seeds) against the "+
				"resolution r; the red line is the %.0f%% target.", len(r.Shapes.Options.Limits), r.Shapes.Options.Seeds, 100*r.Shapes.Options.Target)})
	}
	out = append(out, captioned{"frontier", r.frontierFigure, "The frontier: accuracy against memcached items",
		fmt.Sprintf("Left: the share of the exact log's admissions on the worst of the %d bursty seeds, against the number of "+
			"counters a key keeps in view (k+1), for every k up to %d that divides the window. Right: the worst overshoot "+
			"over every trace against k; the bounded estimator and the prototypes stay at 1.", r.Options.Seeds, r.Options.MaxSweep)})
	return out
}

func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

func times(x float64) string { return fmt.Sprintf("%.2f", x) }

func (r *Report) markdown(w io.Writer, figs []captioned) error {
	o := r.Options
	p := o.Params
	var b bytes.Buffer
	pf := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }

	pf("# Accuracy of Sluice's limiters\n\n")
	pf("_Generated by `make accuracy` (`cd accuracy && go run ./cmd/accuracy -out ../docs`) from the simulator in `accuracy/`; do not edit by hand. ")
	if len(o.Files) > 0 {
		var names []string
		for _, f := range o.Files {
			names = append(names, "`"+f.Name+"`")
		}
		pf("This run also replays %s (`-trace`). ", strings.Join(names, ", "))
	}
	pf("Every trace has a fixed seed: the same command gives the same bytes._\n\n")
	pf("Each configuration of the real limiter types (`limiter.SlidingLog`, `FixedWindow`, `SlidingWindow`, `TokenBucket`) enforces ")
	pf("**%d requests per %v** for one key, on the in-process store (`backends/memory`) with a simulated clock, ", p.Limit, p.Window)
	pf("and is compared with the exact sliding log. ")
	pf("The window of %v is split into whole nanoseconds by every sub-window count used here.\n\n", p.Window)

	r.writeShapes(pf)
	r.writeRecommendation(pf)
	r.writeSummary(pf)

	pf("## Figures\n\n")
	for _, f := range figs {
		pf("### %s\n\n![%s](%s/%s.png)\n\n%s ([SVG](%s/%s.svg))\n\n", f.title, f.title, FigureDir, f.name, f.caption, FigureDir, f.name)
	}

	r.writeFrontier(pf)
	r.writeSensitivity(pf)
	r.writeTraces(pf)
	r.writeBetterEstimator(pf)
	r.writeMethod(pf)
	_, err := w.Write(b.Bytes())
	return err
}

// writeRecommendation writes the section on the sliding window's default,
// part by part.
func (r *Report) writeRecommendation(pf func(string, ...any)) {
	pf("## Recommendation for today's `limiter.SlidingWindow` (bursty traces)\n\n")
	if r.Shapes != nil {
		pf("_Chosen on the bursty traces, as before the shape matrix; on the worst shape of the matrix above no bounded k <= 60 reaches the target._\n\n")
	}
	if r.Choice.Found {
		r.writeChoice(pf)
	} else {
		r.writeNoChoice(pf)
	}
	r.writeIssueConfigs(pf)
	r.writeInterpolatedOvershoot(pf)
	r.writeSliced(pf)
	pf("\n")
}

// writeChoice writes why the chosen configuration is the default, and
// what it costs.
func (r *Report) writeChoice(pf func(string, ...any)) {
	o, ch := r.Options, r.Choice
	nTraces := fmt.Sprintf("steady, %d bursty seeds, edge-start, edge-end", o.Seeds)
	if n := len(o.Files); n > 0 {
		nTraces += fmt.Sprintf(" and %d from files", n)
	}
	c := ch.Row.Config
	est := "Bounded"
	if c.Algorithm == Interpolated {
		est = "Interpolated"
	}
	pf("**Default for `limiter.SlidingWindow`: `Estimator: %s`", est)
	if c.Algorithm == Bounded {
		pf(" (the zero value)")
	}
	pf(" with `SubWindows: %d`, that is `DefaultSubWindows = %d`.**\n\n", c.SubWindows, c.SubWindows)
	pf("- It never admitted more than the limit within any window-length interval, on every trace (%s): worst overshoot %s.\n",
		nTraces, times(ch.Row.Overshoot))
	pf("- On the bursty traffic it admitted %s of what the exact sliding log admitted (seed %d), and at least %s on each of the %d seeds (target %s).\n",
		pct(ch.Row.Shares[0]), o.Seed, pct(ch.Row.MinShare()), o.Seeds, pct(o.Target))
	if prev, ok := r.previousBounded(c.SubWindows); ok {
		pf("- It is the fewest sub-windows (at most %d) that does both: with k = %d the bounded estimator admits only %s on its worst seed.\n",
			o.MaxChoice, prev.Config.SubWindows, pct(prev.MinShare()))
	}
	r.writeChoiceSensitivity(pf)
	if c.SubWindows == limiter.DefaultSubWindows && c.Algorithm == Bounded {
		pf("- `limiter.DefaultSubWindows` is %d and the zero Estimator is Bounded: the library's default is this configuration.\n", limiter.DefaultSubWindows)
	} else {
		pf("- The library's default (`limiter.DefaultSubWindows` = %d, Bounded) is not this configuration: change it.\n", limiter.DefaultSubWindows)
	}
	if cur, ok := r.sweepRow(Config{Algorithm: Bounded, SubWindows: 10}); ok && c.SubWindows != 10 {
		pf("- The earlier default, bounded with k = 10, admits %s (worst seed %s): it misses the target.\n", pct(cur.Shares[0]), pct(cur.MinShare()))
	}
	pf("- Its cost on memcached: %d items per key (%d bytes with a %d-byte key name), read in one get-multi with the incr of the current one; ",
		ch.Row.Memcached.Items, ch.Row.Memcached.Bytes, len(SimKey))
	pf("%.2f store calls per decision on the bursty trace (an Add, and a Sub for each refunded denial)", ch.Row.Calls)
	if cur, ok := r.sweepRow(Config{Algorithm: Bounded, SubWindows: 10}); ok && c.SubWindows != 10 {
		pf("; k = 10 keeps %d items (%d bytes)", cur.Memcached.Items, cur.Memcached.Bytes)
	}
	pf(".\n")
	if time.Microsecond%time.Duration(c.SubWindows) == 0 {
		pf("- %d divides every window that is a whole number of microseconds", c.SubWindows)
		if c.SubWindows != 10 {
			pf(", as 10 does")
		}
		pf(" (30 would not divide a 1 s window).\n")
	} else {
		pf("- Note: %d does not divide every window of whole microseconds", c.SubWindows)
		if time.Second%time.Duration(c.SubWindows) != 0 {
			pf(" (1 s, for one)")
		}
		pf("; the limiter refuses the windows it does not divide with this default.\n")
	}

	if st, ok := r.result(0, c); ok && c.Algorithm == Bounded {
		k := float64(c.SubWindows)
		pf("- Caveat: under a constant flood the bounded estimator behaves like a window of W + W/k and admits down to k/(k+1) of the exact log "+
			"(%s for k = %d); on the steady trace (%.3gx the limit) it admitted %s. The target is met on bursty traffic, not under a sustained flood.\n",
			pct(k/(k+1)), c.SubWindows, o.SteadyFactor, pct(share(st, r.reference(0))))
	}
}

// writeNoChoice says that no configuration meets the target, and the best
// one.
func (r *Report) writeNoChoice(pf func(string, ...any)) {
	o := r.Options
	pf("**No configuration of `limiter.SlidingWindow` with at most %d sub-windows both never overshoots and admits at least %s of the exact log on every bursty seed.**\n\n",
		o.MaxChoice, pct(o.Target))
	best, ok := SweepRow{}, false
	for _, row := range r.Sweep {
		c := row.Config
		if (c.Algorithm == Bounded || c.Algorithm == Interpolated) && c.SubWindows <= o.MaxChoice && row.Overshoot <= 1 &&
			(!ok || row.MinShare() > best.MinShare()) {
			best, ok = row, true
		}
	}
	if ok {
		pf("- The best that never overshoots is %s: %s on its worst bursty seed. The frontier below shows the rest.\n", best.Config.Name(), pct(best.MinShare()))
	}
}

// writeIssueConfigs says which of the configurations first asked about
// meet the target.
func (r *Report) writeIssueConfigs(pf func(string, ...any)) {
	o := r.Options
	var issue []string
	for _, row := range r.Sweep {
		c := row.Config
		if (c.Algorithm == Bounded || c.Algorithm == Interpolated) && containsInt(IssueSubWindows, c.SubWindows) &&
			row.Overshoot <= 1 && row.MinShare() >= o.Target {
			issue = append(issue, c.Name())
		}
	}
	if len(issue) == 0 {
		pf("- Of the issue's configurations (k = 1, 2, 4, 6, 12, 30 under each estimator), none does both.\n")
	} else {
		pf("- Of the issue's configurations (k = 1, 2, 4, 6, 12, 30 under each estimator), only %s does both.\n", strings.Join(issue, ", "))
	}
}

// writeInterpolatedOvershoot says how far the interpolated estimator
// overshoots.
func (r *Report) writeInterpolatedOvershoot(pf func(string, ...any)) {
	var worst, least SweepRow
	all := true
	for _, row := range r.Sweep {
		if row.Config.Algorithm == Interpolated && containsInt(IssueSubWindows, row.Config.SubWindows) {
			if row.Overshoot > worst.Overshoot {
				worst = row
			}
			if least.Overshoot == 0 || row.Overshoot < least.Overshoot {
				least = row
			}
			all = all && row.Overshoot > 1
		}
	}
	if worst.Overshoot > 1 {
		every := "with every k of the issue"
		if !all {
			every = "with some k"
		}
		spread := fmt.Sprintf("from %s times the limit (%s) to %s (%s)", times(least.Overshoot), least.Config.Name(), times(worst.Overshoot), worst.Config.Name())
		if least.Overshoot == worst.Overshoot {
			spread = times(worst.Overshoot) + " times the limit with each of them"
		}
		pf("- The interpolated estimator (ClassDojo's and Criteo's) overshoots %s: its worst window holds %s; "+
			"see the edge-end figure and the tables. It admits close to the exact log on average, which is why it looks good on smooth traffic.\n",
			every, spread)
	}
}

// writeSliced points at the sliced prototype, when the sweep has it.
func (r *Report) writeSliced(pf func(string, ...any)) {
	if row, ok := r.sweepRow(Config{Algorithm: Sliced, SubWindows: 10, Slices: 2}); ok {
		pf("- A cheaper way to the same decisions, for the limiter's owner to consider: keep 10 counters but pack two half-sub-window counts in each "+
			"(the *sliced* prototype below): it decides exactly as bounded with k = 20 (%s on the worst seed) with %d items per key instead of 21.",
			pct(row.MinShare()), row.Memcached.Items)
		if row4, ok := r.sweepRow(Config{Algorithm: Sliced, SubWindows: 10, Slices: 4}); ok {
			if st, ok := r.result(0, row4.Config); ok {
				pf(" Four slices (16-bit fields, limits below 32768) decide as k = 40: %s on the worst bursty seed and %s under the steady flood.",
					pct(row4.MinShare()), pct(share(st, r.reference(0))))
			}
		}
		pf("\n")
	}
}

// previousBounded returns the sweep's bounded row with the most sub-windows
// below k.
func (r *Report) previousBounded(k int) (SweepRow, bool) {
	var prev SweepRow
	ok := false
	for _, row := range r.Sweep {
		if row.Config.Algorithm == Bounded && row.Config.SubWindows < k {
			prev, ok = row, true
		}
	}
	return prev, ok
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

func (r *Report) writeSummary(pf func(string, ...any)) {
	p := r.Options.Params
	pf("## Summary\n\n")
	pf("Overshoot is the most requests admitted within any window-length interval, over the limit, worst of all traces (1.00 = never more than the limit). ")
	pf("Admitted is relative to what the exact sliding log admitted on the same trace. ")
	pf("Memcached figures are per tracked key: the items in view and their bytes (slab chunks, see [Method](#method)). ")
	pf("Store calls are per decision on the bursty trace: a window makes one Add (with `backends/memcached`, one round trip that increments the current counter ")
	pf("and reads the others) and a Sub (a decr) to refund a denial; a bucket or a log makes one update (gets, then cas when the state changes).\n\n")
	pf("| configuration | overshoot |")
	for _, tr := range r.Traces {
		pf(" admitted: %s |", tr.Name)
	}
	pf(" items | bytes/key | store calls/decision |\n|---|---:|")
	for range r.Traces {
		pf("---:|")
	}
	pf("---:|---:|---:|\n")
	for j, c := range r.Configs {
		name := c.Name()
		if r.Choice.Found && c == r.Choice.Row.Config {
			name = "**" + name + " (recommended)**"
		}
		if c.Algorithm == Sliced || c.Algorithm == Moment {
			name += " (prototype)"
		}
		pf("| %s | %s |", name, times(r.worstOvershoot(c)))
		for i := range r.Traces {
			pf(" %s |", pct(share(r.Results[i][j], r.reference(i))))
		}
		b := r.Results[1][j]
		pf(" %d | %d | %.2f |\n", b.Memcached.Items, b.Memcached.Bytes, b.callsPerDecision())
	}
	pf("\nThe token bucket holds %d tokens refilled at %d per %v: it admits a full bucket and then the refill within one window, ", p.Limit, p.Limit, p.Window)
	pf("so up to twice the limit; it limits a rate, not a window count.\n\n")
}

func (r *Report) writeFrontier(pf func(string, ...any)) {
	o := r.Options
	pf("## The frontier\n\n")
	pf("Every sub-window count up to %d that divides %v, on the %d bursty seeds (%d to %d) and the other traces. ", o.MaxSweep, o.Params.Window, o.Seeds, o.Seed, o.Seed+uint64(o.Seeds)-1)
	pf("Admitted shares are on the bursty traces: seed %d / worst seed. Overshoot is the worst over every trace. ", o.Seed)
	pf("Items, bytes and store calls are the bounded window's (the prototypes keep the items of the same k, with longer values). ")
	pf("The default is chosen among k ≤ %d.\n\n", o.MaxChoice)
	pf("| k | items | bytes/key | store calls/decision | bounded | interpolated | interpolated overshoot | sliced x2 (prototype) | sliced x4 (prototype) | moment (prototype) |\n")
	pf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, k := range divisors(o.Params.Window, o.MaxSweep) {
		bnd, ok := r.sweepRow(Config{Algorithm: Bounded, SubWindows: k})
		if !ok {
			continue
		}
		cell := func(c Config) string {
			row, ok := r.sweepRow(c)
			if !ok {
				return "n/a"
			}
			s := pct(row.Shares[0]) + " / " + pct(row.MinShare())
			if row.Overshoot > 1 {
				s += fmt.Sprintf(" (overshoot %s)", times(row.Overshoot))
			}
			return s
		}
		itp, _ := r.sweepRow(Config{Algorithm: Interpolated, SubWindows: k})
		mark := ""
		if r.Choice.Found && r.Choice.Row.Config == bnd.Config {
			mark = " **(recommended)**"
		}
		pf("| %d%s | %d | %d | %.2f | %s | %s | %s | %s | %s | %s |\n", k, mark, bnd.Memcached.Items, bnd.Memcached.Bytes, bnd.Calls,
			cell(bnd.Config), pct(itp.Shares[0])+" / "+pct(itp.MinShare()), times(itp.Overshoot),
			cell(Config{Algorithm: Sliced, SubWindows: k, Slices: 2}), cell(Config{Algorithm: Sliced, SubWindows: k, Slices: 4}),
			cell(Config{Algorithm: Moment, SubWindows: k}))
	}
	pf("\n")
}

func (r *Report) writeSensitivity(pf func(string, ...any)) {
	if len(r.Sensitivity) == 0 {
		return
	}
	o := r.Options
	c := r.Choice.Row.Config
	pf("## Other limits\n\n")
	pf("The same traces scaled to other limits (as many windows, the same multiples of the limit's rate), %d bursty seeds each: ", o.Seeds)
	pf("the admitted share on the worst seed, the worst overshoot over every trace, and the fewest sub-windows (at most %d) that reach %s without overshooting.\n\n",
		o.MaxChoice, pct(o.Target))
	pf("| limit | %s | bounded k=10 | fewest sub-windows |\n|---|---:|---:|---|\n", c.Name())
	cell := func(row SweepRow) string {
		if len(row.Shares) == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%s (overshoot %s)", pct(row.MinShare()), times(row.Overshoot))
	}
	for _, s := range r.Sensitivity {
		fewest := "none"
		if s.Fewest.Found {
			fewest = fmt.Sprintf("%s (%s)", s.Fewest.Row.Config.Name(), pct(s.Fewest.Row.MinShare()))
		}
		pf("| %d per %v | %s | %s | %s |\n", s.Params.Limit, s.Params.Window, cell(s.Chosen), cell(s.Current), fewest)
	}
	pf("\n")
}

func (r *Report) writeTraces(pf func(string, ...any)) {
	p := r.Options.Params
	pf("## Per trace\n\n")
	pf("Worst window is the most requests the configuration admitted within any interval (t-W, t]. ")
	pf("Excess admissions took the configuration's own trailing window above the limit; needless denials were made while its trailing window ")
	pf("held fewer than the limit (an exact limiter would have allowed them).\n\n")
	for i, tr := range r.Traces {
		ref := r.reference(i)
		dur := time.Duration(0)
		if len(tr.Times) > 0 {
			dur = time.Duration(tr.End() - tr.Start()).Round(time.Second)
		}
		pf("### %s\n\n%s %d requests over %v; the exact sliding log admitted %d.\n\n", tr.Name, tr.About, len(tr.Times), dur, ref.Admitted)
		pf("| configuration | admitted | vs exact log | worst window | overshoot | excess admissions | needless denials | store calls/decision |\n")
		pf("|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for j, c := range r.Configs {
			res := r.Results[i][j]
			pf("| %s | %d | %s | %d | %s | %d | %d | %.2f |\n", c.Name(), res.Admitted, pct(share(res, ref)), res.WorstWindow,
				times(res.Overshoot(p)), res.Excess, res.Needless, float64(res.StoreCalls)/float64(max(res.Requests, 1)))
		}
		pf("\n")
	}
}

func (r *Report) writeBetterEstimator(pf func(string, ...any)) {
	pf("## Can an estimator admit more than Bounded without overshooting?\n\n")
	pf("**Not from the counts alone.** At offset e into the current sub-window i, the window (t-W, t] holds the part of the oldest sub-window i-k ")
	pf("after offset e. Nothing in a counter tells c requests spread over a sub-window from c requests in its last nanosecond, and the second is ")
	pf("a history the limiter itself would produce: after a quiet spell it admits a burst of c at the end of a sub-window. Then all c are in view ")
	pf("for every e short of the sub-window's end, so the tightest bound on the oldest counter's in-view share, knowing the limit and the counts, ")
	pf("is c itself: the Bounded estimator. Any estimator that is a function of the counts and admits where Bounded denies (the first such state ")
	pf("has the k+1 counters summing to the limit, which the burst history reaches) lets more than the limit into that window. The limit does not ")
	pf("help: that history keeps every window within it. `TestCountsAloneCannotBeatBounded` replays it.\n\n")
	pf("**With the same counters carrying more than a count, yes.** A memcached counter is a 64-bit number and incr adds any amount, so a request can ")
	pf("add a number that also says *when* in its sub-window it came, with no more items, store calls or round trips:\n\n")
	pf("- *Sliced counters* (`accuracy.SlicedWindow`): split each sub-window into B slices and give each slice a 64/B-bit field of the counter; a request ")
	pf("at offset x adds n << (64/B * floor(x*B/s)) (the earliest slice in the low bits). The estimate sums every field of the k newest counters and, of the oldest, ")
	pf("only the slices that reach into the window. It decides exactly as Bounded with k*B sub-windows, so it never overshoots, and costs what k sub-windows cost. ")
	pf("Conditions: a field must never overflow (the limit plus the requests in flight below 2^(64/B-1); denied requests refunded, so no `CountDenied`), ")
	pf("a refund subtracts the same packed amount (same `now`), readers sum fields (memcached values grow to 20 digits, which the table's bytes include), ")
	pf("and `retryAfter` works per slice. `TestItemSizeAgainstMemcached` runs both prototypes on a real memcached through `backends/memcached` and gets the decisions of the memory store.\n")
	pf("- *Moment counters* (`accuracy.MomentWindow`): the count in the high 32 bits and the sum of arrival offsets (in 1/1024 of a sub-window) in the low 32. ")
	pf("The requests of the oldest sub-window still in view arrived after offset e, so each added at least m = floor(1024e/s): at most floor(S/m) of them, ")
	pf("the tightest bound given the count and the sum (Markov's inequality). It never overshoots either, but it admits less than two slices do.\n\n")
	pf("Both are prototypes in the simulator, tested for never overshooting with a seed sweep; `limiter/` is unchanged.\n\n")
}

func (r *Report) writeMethod(pf func(string, ...any)) {
	pf("## Method\n\n")
	pf("**Traces** (Poisson arrivals from `math/rand/v2` PCG with fixed seeds; generated traces start at %s, a whole hour, so windows start on the minute):\n\n",
		Epoch.Format(time.RFC3339))
	for _, tr := range r.Traces {
		pf("- `%s`: %s\n", tr.Name, tr.About)
	}
	pf("\nTo replay your own traffic, write one timestamp per line (RFC 3339, or decimal seconds since the Unix epoch; `#` starts a comment) ")
	pf("and run `go run ./cmd/accuracy -out DIR -trace FILE` from `accuracy/` (repeat `-trace` for several files): the report then has a table and a figure for each file.\n\n")
	pf("**Configurations.** Each runs the real limiter type on a fresh `backends/memory` store whose clock is the trace's time, ")
	pf("calling `AllowN(ctx, %q, t, 1)` for each request: `limiter.SlidingLog` (the reference), `FixedWindow`, `SlidingWindow` with ", SimKey)
	pf("`Bounded` and `Interpolated`, and `TokenBucket` (capacity = limit, refilled at limit per window). Denied requests are refunded (the default). ")
	pf("The prototypes run in `accuracy/` on the same store through the same `storage.Counter` interface.\n\n")
	pf("**Metrics.** Worst window: the most admitted requests in any interval (t-W, t], found at every admission (the maximum is always reached at one). ")
	pf("Overshoot: worst window / limit. Admitted: admitted requests / the exact log's admitted requests on the same trace ")
	pf("(the sweeps and the other limits count the exact log's admissions with `accuracy.ExactAdmits`, which makes `limiter.SlidingLog`'s decisions in constant time; `TestExactLogIsExact` checks both agree). ")
	pf("Store calls: calls through the store interface per request.\n\n")
	pf("**Memcached bytes.** An item of memcached 1.6 takes a %d-byte header (`struct _stritem` on 64-bit), %d bytes of CAS id, the key and a NUL, ", itemHeader, itemCAS)
	pf("and the value followed by `\\r\\n` (client flags add 4 bytes only when non-zero; Sluice sets none): %d + key + value bytes, stored in the chunk of the ", itemHeader+itemCAS+3)
	pf("smallest slab class that holds it (96, 120, 152, 192, 240, ... bytes with the default `-n 48 -f 1.25`). Sources: memcached's `memcached.h` (`struct _stritem`), ")
	pf("`items.c` (`item_make_header`, `do_item_alloc`), `slabs.c` (`slabs_init`); `TestItemSizeAgainstMemcached` checks the formula against the real server's slab ")
	pf("statistics under `make test`. Keys and values are as `backends/memcached` writes them: `k:<space>/<name>|c<sub-window index>`, ")
	pf("a counter's value its decimal digits (the most it reached: memcached keeps the longest number an incr wrote). ")
	pf("The key name is %q (%d bytes); bytes/key is the number of items times the chunk of the longest key and value seen. ", SimKey, len(SimKey))
	pf("Items are those a decision reads. Counters live 2(k+1) sub-windows (the out-of-order horizon of `storage.Counter`, docs/consistency.md), ")
	pf("rounded up to a second, plus 4 s of slack (memcached's clock and clock skew) and up to 1 s of jitter, ")
	pf("so a key with steady traffic holds up to k+1 more, and those of the last 5 s or so, until they expire: about twice the figure, more for sub-windows " +
		"of a few seconds or less. The hash table adds about 8 bytes per item.\n\n")
	pf("**Reproducibility.** Fixed seeds, no wall clock, no map iteration in the output: `TestReportIsReproducible` writes the report twice and compares the bytes.\n")
}

// writeChoiceSensitivity says whether the chosen configuration meets the
// target on the other limits.
func (r *Report) writeChoiceSensitivity(pf func(string, ...any)) {
	o := r.Options
	if len(r.Sensitivity) > 0 {
		var limits []string
		least, over, all := 1.0, 0.0, true
		for _, s := range r.Sensitivity {
			if len(s.Chosen.Shares) == 0 {
				all = false
				continue
			}
			limits = append(limits, fmt.Sprintf("%d per %v", s.Params.Limit, s.Params.Window))
			least, over = min(least, s.Chosen.MinShare()), max(over, s.Chosen.Overshoot)
		}
		if len(limits) > 0 {
			verdict := "meets the target there too"
			if least < o.Target || over > 1 || !all {
				verdict = "does not meet the target on all of them"
			}
			pf("- On other limits (%s, traces scaled to the window) it admits at least %s on the worst seed, worst overshoot %s: it %s ([Other limits](#other-limits)).\n",
				strings.Join(limits, ", "), pct(least), times(over), verdict)
		}
	}
}
