package accuracy

import (
	"bytes"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Colours: Criteo's figures draw the exact count in grey and the
// approximation in dotted orange.
var (
	grey   = color.RGBA{R: 150, G: 150, B: 150, A: 255}
	orange = color.RGBA{R: 240, G: 120, B: 0, A: 255}
	red    = color.RGBA{R: 200, G: 30, B: 30, A: 255}
	blue   = color.RGBA{R: 30, G: 90, B: 200, A: 255}
	green  = color.RGBA{R: 30, G: 150, B: 60, A: 255}
	purple = color.RGBA{R: 130, G: 50, B: 170, A: 255}
	black  = color.RGBA{A: 255}
)

// figure is a grid of plots written as PNG and SVG.
type figure struct {
	name       string
	w, h       vg.Length
	plots      [][]*plot.Plot
	rows, cols int
	dpi        int // of the PNG
}

// drawing sets how much detail the figures get (Options.Draft draws less).
type drawing struct {
	dpi int
	// grid is the number of points per window at which the curves are
	// evaluated (besides every request).
	grid int
	// countWindows and admittedWindows are the windows the counting and
	// the admission figures show.
	countWindows, admittedWindows int
}

var (
	fullDrawing  = drawing{dpi: 110, grid: 200, countWindows: 15, admittedWindows: 8}
	draftDrawing = drawing{dpi: 40, grid: 10, countWindows: 3, admittedWindows: 4}
)

func newFigure(name string, rows, cols int, w, h vg.Length) *figure {
	f := &figure{name: name, w: w, h: h, rows: rows, cols: cols, plots: make([][]*plot.Plot, rows)}
	for i := range f.plots {
		f.plots[i] = make([]*plot.Plot, cols)
	}
	return f
}

// set places p in the grid, filling rows first.
func (f *figure) set(i int, p *plot.Plot) { f.plots[i/f.cols][i%f.cols] = p }

func (f *figure) draw(c draw.Canvas) {
	tiles := draw.Tiles{
		Rows: f.rows, Cols: f.cols,
		PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2,
		PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2,
	}
	canvases := plot.Align(f.plots, tiles, c)
	for i := range f.plots {
		for j, p := range f.plots[i] {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
}

// save writes dir/name.png and dir/name.svg.
func (f *figure) save(dir string) error {
	img := vgimg.NewWith(vgimg.UseWH(f.w, f.h), vgimg.UseDPI(f.dpi), vgimg.UseBackgroundColor(color.White))
	f.draw(draw.New(img))
	if err := writeFile(filepath.Join(dir, f.name+".png"), vgimg.PngCanvas{Canvas: img}); err != nil {
		return err
	}
	svg := vgsvg.New(f.w, f.h)
	dc := draw.New(svg)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	f.draw(dc)
	return writeFile(filepath.Join(dir, f.name+".svg"), svg)
}

func writeFile(path string, w io.WriterTo) error {
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		return fmt.Errorf("accuracy: %s: %w", path, err)
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Add(plotter.NewGrid())
	return p
}

func line(xys plotter.XYs, c color.Color, width vg.Length, dashes ...vg.Length) *plotter.Line {
	l, err := plotter.NewLine(flat(xys))
	if err != nil {
		panic(fmt.Sprintf("accuracy: line: %v", err)) // only NaN or Inf, which we never produce
	}
	l.Color = c
	l.Width = width
	l.Dashes = dashes
	return l
}

// flat drops the points inside runs of equal y, which change nothing in
// the drawn polyline (and keep the SVGs small).
func flat(xys plotter.XYs) plotter.XYs {
	out := make(plotter.XYs, 0, len(xys))
	for i, p := range xys {
		if i == 0 || i == len(xys)-1 || p.Y != xys[i-1].Y || p.Y != xys[i+1].Y {
			out = append(out, p)
		}
	}
	return out
}

// hline is a horizontal line at y across [x0, x1].
func hline(y, x0, x1 float64, c color.Color) *plotter.Line {
	return line(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}}, c, vg.Points(1), vg.Points(4), vg.Points(3))
}

// vline is a vertical line at x across [y0, y1].
func vline(x, y0, y1 float64, c color.Color) *plotter.Line {
	return line(plotter.XYs{{X: x, Y: y0}, {X: x, Y: y1}}, c, vg.Points(1), vg.Points(4), vg.Points(3))
}

// segment returns the requests of tr in [from, to).
func segment(tr Trace, from, to int64) Trace {
	lo, hi := 0, len(tr.Times)
	for lo < hi && tr.Times[lo] < from {
		lo++
	}
	end := lo
	for end < hi && tr.Times[end] < to {
		end++
	}
	return Trace{Name: tr.Name, About: tr.About, Times: tr.Times[lo:end]}
}

// minutes converts Unix ns to minutes since from.
func minutes(t, from int64) float64 { return float64(t-from) / float64(time.Minute) }

// countFigure is Criteo's figure: for each configuration, the exact number
// of requests in the last window (grey) and what the configuration counts
// (dotted orange), every request counted and none denied.
func countFigure(name string, tr Trace, from, to int64, p Params, configs []Config, grid int) (*figure, error) {
	at := slicesMerge(tr.Times, from, to, int64(p.Window)/int64(grid))
	truth := windowCounts(tr.Times, at, int64(p.Window))
	cols := 2
	rows := (len(configs) + cols - 1) / cols
	f := newFigure(name, rows, cols, vg.Points(780), vg.Points(float64(rows)*220))
	maxY := float64(p.Limit)
	series := make([][]int64, len(configs))
	for i, c := range configs {
		est, err := Count(tr, p, c, at)
		if err != nil {
			return nil, err
		}
		series[i] = est
		for j := range est {
			maxY = max(maxY, float64(est[j]), float64(truth[j]))
		}
	}
	for i, c := range configs {
		pl := newPlot(c.Name(), "minutes", "requests in the last window")
		exact, approx := make(plotter.XYs, len(at)), make(plotter.XYs, len(at))
		for j, t := range at {
			x := minutes(t, from)
			exact[j] = plotter.XY{X: x, Y: float64(truth[j])}
			approx[j] = plotter.XY{X: x, Y: float64(series[i][j])}
		}
		ex := line(exact, grey, vg.Points(1.5))
		ap := line(approx, orange, vg.Points(1.2), vg.Points(2), vg.Points(2))
		lim := hline(float64(p.Limit), 0, minutes(to, from), red)
		pl.Add(ex, ap, lim)
		pl.Legend.Add("exact sliding window", ex)
		pl.Legend.Add("what it counts", ap)
		pl.Legend.Add(fmt.Sprintf("limit (%d)", p.Limit), lim)
		pl.Y.Min, pl.Y.Max = 0, maxY*1.15
		f.set(i, pl)
	}
	return f, nil
}

// admittedFigure plots, for each configuration enforcing the limit, how
// many of its admitted requests fall in the window-length interval ending at
// each moment, against the exact log's and the limit.
func admittedFigure(name string, tr Trace, from, to int64, p Params, configs []Config, grid int) (*figure, error) {
	// Evaluate on a grid plus every request time, so that each peak is
	// drawn at its height.
	at := slicesMerge(tr.Times, from, to, int64(p.Window)/int64(grid))
	ref, err := Simulate(tr, p, Config{Algorithm: Log})
	if err != nil {
		return nil, err
	}
	refCounts := windowCounts(ref.Admits, at, int64(p.Window))
	cols := 2
	rows := (len(configs) + cols - 1) / cols
	f := newFigure(name, rows, cols, vg.Points(780), vg.Points(float64(rows)*220))
	results := make([][]int64, len(configs))
	maxY := float64(p.Limit)
	for i, c := range configs {
		res, err := Simulate(tr, p, c)
		if err != nil {
			return nil, err
		}
		results[i] = windowCounts(res.Admits, at, int64(p.Window))
		for _, v := range results[i] {
			maxY = max(maxY, float64(v))
		}
	}
	for i, c := range configs {
		pl := newPlot(c.Name(), "minutes", "admitted in the last window")
		exact, got := make(plotter.XYs, len(at)), make(plotter.XYs, len(at))
		for j, t := range at {
			x := minutes(t, from)
			exact[j] = plotter.XY{X: x, Y: float64(refCounts[j])}
			got[j] = plotter.XY{X: x, Y: float64(results[i][j])}
		}
		ex := line(exact, grey, vg.Points(1.5))
		gl := line(got, orange, vg.Points(1.2))
		lim := hline(float64(p.Limit), 0, minutes(to, from), red)
		pl.Add(ex, gl, lim)
		pl.Legend.Add("exact sliding log", ex)
		pl.Legend.Add(c.Name(), gl)
		pl.Legend.Add(fmt.Sprintf("limit (%d)", p.Limit), lim)
		pl.Y.Min, pl.Y.Max = 0, maxY*1.2
		f.set(i, pl)
	}
	return f, nil
}

// slicesMerge returns the times of a grid of step over [from, to] merged
// with ts (ascending), without duplicates.
func slicesMerge(ts []int64, from, to, step int64) []int64 {
	var out []int64
	i := 0
	for g := from; g <= to; g += step {
		for i < len(ts) && ts[i] < g {
			if len(out) == 0 || out[len(out)-1] != ts[i] {
				out = append(out, ts[i])
			}
			i++
		}
		if len(out) == 0 || out[len(out)-1] != g {
			out = append(out, g)
		}
	}
	for ; i < len(ts); i++ {
		if out[len(out)-1] != ts[i] {
			out = append(out, ts[i])
		}
	}
	return out
}

// algorithmColor groups the trade-off figure's points.
func algorithmColor(a Algorithm) color.Color {
	switch a {
	case Log:
		return black
	case Bounded:
		return blue
	case Interpolated:
		return orange
	case Fixed, Bucket:
		return red
	case Sliced:
		return green
	}
	return purple
}

// tradeoffFigure plots each configuration's worst overshoot over every
// trace against its admitted share on the bursty trace: all of them on the
// left, a close-up of the region near the exact log on the right.
// Configurations with the same point (sliced k=10x2 decides as bounded
// k=20) share a label.
func (r *Report) tradeoffFigure() (*figure, error) {
	pts := r.tradeoffPoints()
	target := 100 * r.Options.Target
	minX, maxX, maxY := 100.0, 100.0, 1.0
	for _, q := range pts {
		minX, maxX, maxY = min(minX, q.x), max(maxX, q.x), max(maxY, q.y)
	}
	f := newFigure("tradeoff", 1, 2, vg.Points(1000), vg.Points(520))
	all, err := tradeoffPanel(pts, target, fmt.Sprintf("All configurations (limit %d per %v)", r.Options.Params.Limit, r.Options.Params.Window),
		minX-2, maxX+8, 0.9, maxY+0.25, true, 0.6)
	if err != nil {
		return nil, err
	}
	near, err := tradeoffPanel(pts, target, "Close-up near the exact log", target-3, 101.5, 0.97, 1.25, false, 1.1)
	if err != nil {
		return nil, err
	}
	f.set(0, all)
	f.set(1, near)
	return f, nil
}

// tradeoffPoint is a point of the trade-off figure: the configurations
// (names) at share x and worst overshoot y, of one group.
type tradeoffPoint struct {
	x, y  float64
	names []string
	group Algorithm
}

// tradeoffPoints returns the configurations' points, one per distinct
// point.
func (r *Report) tradeoffPoints() []*tradeoffPoint {
	ref := r.reference(1)
	var pts []*tradeoffPoint
	for _, c := range r.Configs {
		res, _ := r.result(1, c)
		x, y := 100*share(res, ref), r.worstOvershoot(c)
		g := c.Algorithm
		if g == Bucket {
			g = Fixed
		}
		found := false
		for _, q := range pts {
			if q.x == x && q.y == y {
				q.names = append(q.names, c.Name())
				found = true
			}
		}
		if !found {
			pts = append(pts, &tradeoffPoint{x: x, y: y, names: []string{c.Name()}, group: g})
		}
	}
	return pts
}

// tradeoffGroups are the trade-off figure's groups, with their legends.
var (
	tradeoffGroups = []Algorithm{Log, Bounded, Interpolated, Fixed, Sliced, Moment}
	tradeoffNames  = []string{"exact sliding log", "sliding window, bounded", "sliding window, interpolated",
		"fixed window, token bucket", "prototype: sliced counters", "prototype: moment counters"}
)

// tradeoffPanel plots the points within [x0, x1] x [y0, y1], labelled
// (rotated by rotation), with the limit and the target as lines.
func tradeoffPanel(pts []*tradeoffPoint, target float64, title string, x0, x1, y0, y1 float64, legend bool, rotation float64) (*plot.Plot, error) {
	pl := newPlot(title, "admitted on the bursty trace, % of the exact sliding log", "worst window over all traces / limit")
	for gi, g := range tradeoffGroups {
		var xys plotter.XYs
		var labels []string
		for _, q := range pts {
			if q.group == g && q.x >= x0 && q.x <= x1 && q.y >= y0 && q.y <= y1 {
				xys = append(xys, plotter.XY{X: q.x, Y: q.y})
				labels = append(labels, strings.Join(q.names, " = "))
			}
		}
		if len(xys) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(xys)
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle.Color = algorithmColor(g)
		sc.GlyphStyle.Radius = vg.Points(3.5)
		sc.GlyphStyle.Shape = draw.CircleGlyph{}
		lb, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
		if err != nil {
			return nil, err
		}
		for i := range lb.TextStyle {
			lb.TextStyle[i].Font.Size = vg.Points(7.5)
			lb.TextStyle[i].Color = algorithmColor(g)
			lb.TextStyle[i].Rotation = rotation
		}
		lb.Offset = vg.Point{X: vg.Points(4), Y: vg.Points(4)}
		pl.Add(sc, lb)
		if legend {
			pl.Legend.Add(tradeoffNames[gi], sc)
		}
	}
	pl.Add(hline(1, x0, x1, red))
	if target >= x0 && target <= x1 {
		pl.Add(vline(target, y0, y1, green))
	}
	pl.X.Min, pl.X.Max, pl.Y.Min, pl.Y.Max = x0, x1, y0, y1
	return pl, nil
}

// frontierFigure plots the sweep: admitted share on the bursty traces
// (worst seed) against memcached items per key, and the interpolated
// estimator's overshoot against k.
func (r *Report) frontierFigure() (*figure, error) {
	f := newFigure("frontier", 1, 2, vg.Points(900), vg.Points(420))
	left := newPlot("Admitted on the bursty traces (worst seed)", "memcached items per key (sub-windows in view)", "% of the exact sliding log")
	left.Legend.Left, left.Legend.Top = false, false
	right := newPlot("Overshoot on the worst trace", "sub-windows k", "worst window / limit")
	series := []struct {
		name string
		keep func(Config) bool
		col  color.Color
	}{
		{"bounded", func(c Config) bool { return c.Algorithm == Bounded }, blue},
		{"interpolated (overshoots: right)", func(c Config) bool { return c.Algorithm == Interpolated }, orange},
		{"prototype: sliced x2", func(c Config) bool { return c.Algorithm == Sliced && c.Slices == 2 }, green},
		{"prototype: sliced x4", func(c Config) bool { return c.Algorithm == Sliced && c.Slices == 4 }, color.RGBA{R: 20, G: 90, B: 40, A: 255}},
		{"prototype: moment", func(c Config) bool { return c.Algorithm == Moment }, purple},
	}
	minY, maxItems, maxK, maxOver := 100.0, 0.0, 0.0, 1.0
	for _, s := range series {
		var share, over plotter.XYs
		for _, row := range r.Sweep {
			if !s.keep(row.Config) {
				continue
			}
			y := 100 * row.MinShare()
			share = append(share, plotter.XY{X: float64(row.Memcached.Items), Y: y})
			over = append(over, plotter.XY{X: float64(row.Config.SubWindows), Y: row.Overshoot})
			minY, maxItems = min(minY, y), max(maxItems, float64(row.Memcached.Items))
			maxK, maxOver = max(maxK, float64(row.Config.SubWindows)), max(maxOver, row.Overshoot)
		}
		if len(share) == 0 {
			continue
		}
		for _, pl := range []struct {
			p   *plot.Plot
			xys plotter.XYs
		}{{left, share}, {right, over}} {
			l, pts, err := plotter.NewLinePoints(pl.xys)
			if err != nil {
				return nil, err
			}
			l.Color, pts.Color = s.col, s.col
			pts.Shape = draw.CircleGlyph{}
			pl.p.Add(l, pts)
			pl.p.Legend.Add(s.name, l, pts)
		}
	}
	target := 100 * r.Options.Target
	choiceItems := float64(r.Options.MaxChoice + 1)
	left.Add(hline(target, 0, maxItems+1, red), vline(choiceItems, minY-2, 101, grey))
	left.Legend.Add(fmt.Sprintf("target %.0f%%", target), hline(target, 0, 1, red))
	left.Legend.Add(fmt.Sprintf("k = %d", r.Options.MaxChoice), vline(choiceItems, 0, 1, grey))
	left.Y.Min, left.Y.Max = minY-2, 101
	right.Add(hline(1, 0, maxK+1, red))
	right.Y.Min, right.Y.Max = 0.9, maxOver+0.1
	f.set(0, left)
	f.set(1, right)
	return f, nil
}
