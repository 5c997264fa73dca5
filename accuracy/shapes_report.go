package accuracy

import (
	"fmt"
	"image/color"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/sluicehq/sluice/limiter/storage"
)

// This file writes the shape matrix's part of the report: the
// frontier of accuracy against keys read, and the recommendation for the
// stores.

// todayK is limiter.DefaultSubWindows, the configuration the matrix
// compares with (TestDefaultNeverOvershootsAndAdmits97 keeps them equal).
const todayK = 20

func limitName(p Params) string { return fmt.Sprintf("%d per %v", p.Limit, p.Window) }

// where names a cell of the matrix.
func (m *ShapeMatrix) where(w Worst) string {
	return fmt.Sprintf("%s, %s", m.Shapes[w.Shape].Name, limitName(m.Options.Limits[w.Limit]))
}

// cheapest returns the point of the frontier with the fewest keys that
// reaches the target without overshooting, over every representation.
func (m *ShapeMatrix) cheapest() (RepPoint, bool) {
	var best RepPoint
	found := false
	for _, rep := range Representations {
		pt, ok := m.Best(rep)
		if ok && (!found || pt.Keys < best.Keys || pt.Keys == best.Keys && pt.Rep.Writes() < best.Rep.Writes()) {
			best, found = pt, true
		}
	}
	return best, found
}

// writeShapes writes the shape matrix's section, part by part.
func (r *Report) writeShapes(pf func(string, ...any)) {
	m := r.Shapes
	if m == nil {
		return
	}
	m.writeIntro(pf)
	best, found := m.cheapest()
	m.writeStoresRecommendation(pf, best, found)
	m.writeFrontier(pf, best, found)
	m.writePerShape(pf, best, found)
	r.writePacked(pf)
	writeStoresImplement(pf)
}

// writeIntro says what the matrix replays and the representations it
// compares.
func (m *ShapeMatrix) writeIntro(pf func(string, ...any)) {
	o := m.Options
	pf("## Traffic shapes and the window's representation\n\n")
	pf("Every shape below is replayed on %d limits (", len(o.Limits))
	for i, p := range o.Limits {
		if i > 0 {
			pf(", ")
		}
		pf("%s", limitName(p))
	}
	pf("), %d seeds each (%d to %d), traces of %d windows, through the Bounded sliding window at every resolution r "+
		"(slots per window) from %d to %d, and through the exact sliding log. Shapes aligned to sub-windows land on the "+
		"configuration's own grid (W/r), its worst case. The share of a configuration is what it admitted over what the "+
		"exact log admitted, in requests and in units; a cell's figure is the smaller of the two on its worst seed, and a "+
		"configuration's figure the worst cell over every shape and limit: **the default is chosen on the worst shape, not "+
		"the average**. Overshoot is the most units admitted within any window-length interval over the limit.\n\n",
		o.Seeds, o.Seed, o.Seed+uint64(o.Seeds)-1, o.Windows, o.Resolutions[0], o.Resolutions[len(o.Resolutions)-1])

	pf("Every representation compared here is exact at its resolution r (it decides as Bounded with r sub-windows, " +
		"never above the limit), so one replay per r measures them all; they differ in what one memcached decision names " +
		"(keys incr'ed or read, worst case over the offsets in a slot) and how many counters it writes:\n\n")
	pf("- **bounded (today)**: one counter per sub-window, r = k <= 60; a decision incrs its own and gets k in view and " +
		"k ahead (`storage.Ahead`): 2k+1 keys, 1 write.\n")
	pf("- **cached closed sub-windows**: bounded with the closed sub-windows' counts kept in the process. A count in view " +
		"can still rise (a writer up to a window late, the out-of-order horizon) and fall (refunds): a cached count is " +
		"only an upper bound once no writer can add to it, which today's horizon never gives within the view. So today " +
		"it reads 2k+1 keys, like bounded. If the horizon were cut to one sub-window (writers later than that restamped " +
		"to their send time, and clocks within that bound), a warm decision would read 4 keys (its own, one ahead, the " +
		"previous one, and a late-units counter that late writers incr after their sub-window and readers add since " +
		"they cached); a cold key, the common case with many keys spread over many Lambda processes, still reads 2k+1. " +
		"It does not meet the 12-key bound in the worst case.\n")
	pf("- **packed, L levels**: counters of 4 fields of 16 bits (limit below 2^15, and 2^15 more units in flight " +
		"before a carry), level l's fields each the total of 4^(l-1) slots of W/r. A decision incrs its counter at every " +
		"level (one packed delta n<<(16*field) each, pipelined with the get: one round trip), then reads, climbing from " +
		"the oldest slot in view, one counter per level holding the slots still in view and the top-level counters up " +
		"to r slots ahead (`Later`). L = 1 is the sliced prototype with 4 slices. Refunds subtract the same packed " +
		"deltas at every level (memcached: an `incr` of 2^64-delta, a subtraction modulo 2^64 that stays exact after " +
		"a carry out of the top field wrapped the counter). `TestPackedKeysCoverTheView` checks that the fields read cover exactly the slots Bounded " +
		"counts.\n\n")
}

// writeStoresRecommendation writes the recommendation: best, the cheapest
// point of the frontier that reaches the target (found).
func (m *ShapeMatrix) writeStoresRecommendation(pf func(string, ...any), best RepPoint, found bool) {
	o := m.Options
	pf("### Recommendation for the stores\n\n")
	if i, ok := m.resolutionIndex(todayK); ok {
		w := m.WorstAt(i)
		pf("- The sub-window counters' default, bounded k=%d (the window's default before packed counters), names %d keys "+
			"per memcached decision and admits %s of the exact log on its worst shape (%s): it misses the 97%% target on "+
			"the worst shape.\n", todayK, 2*todayK+1, pct(w.Share), m.where(w))
	}
	if pt, ok := m.Best(Representation{Kind: RepBounded}); !ok {
		pf("- No bounded k <= 60 reaches %s on every shape; within %d keys (k <= %d) the best is %s: %s on %s.\n",
			pct(o.Target), o.MaxKeys, (o.MaxKeys-1)/2, pt.Rep.Name(pt.Resolution), pct(pt.Worst.Share), m.where(pt.Worst))
	}
	if found {
		pf("- **Implement %s**: %s, %d keys per decision (%d incrs and one get), worst shape %s (%s), never above "+
			"the limit (overshoot %s). Its items per key with steady traffic: %d.\n",
			best.Rep, best.Rep.Name(best.Resolution), best.Keys, best.Rep.Writes(), pct(best.Worst.Share), m.where(best.Worst),
			times(best.Worst.Overshoot), best.Items)
		for _, rep := range Representations {
			if rep == best.Rep || rep.Kind != RepPacked {
				continue
			}
			if pt, ok := m.Best(rep); ok {
				pf("- Alternatives at the same resolution: %s names %d keys with %d incrs.\n", rep, pt.Keys, rep.Writes())
			}
		}
	} else {
		pf("- No representation reaches %s on every shape within the resolutions measured.\n", pct(o.Target))
	}
	pf("- Resolution, not the estimator, is what the worst shapes ask for: at a resolution of r slots the loss on a " +
		"flood is about 1/(r+1), and bursts landing on slot boundaries lose one slot's traffic each time one arrives " +
		"exactly a window after another. Fewer than about 160 slots per window stays under 97%% on some shape; the " +
		"packed counters buy that resolution without reading r counters.\n")
	pf("- The figures on costed, aligned shapes with small limits are not monotone in r (the request share of the " +
		"exact log depends on which requests of a burst fit, a path effect): see the frontier table. The unit share " +
		"is monotone within a point or two.\n\n")
}

// writeFrontier writes the frontier table: worst share and keys read per
// resolution and representation.
func (m *ShapeMatrix) writeFrontier(pf func(string, ...any), best RepPoint, found bool) {
	o := m.Options
	pf("### The frontier\n\n")
	pf("Worst-shape share (the smaller of requests and units, worst seed) and keys per memcached decision at each " +
		"resolution; \"-\" where the representation cannot have it (bounded and cached stop at 60). Overshoot is the worst over every shape, limit and seed.\n\n")
	pf("| r | worst share | worst shape | overshoot | bounded | cached (warm) | packed L=1 | L=2 | L=3 | L=4 |\n")
	pf("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, res := range o.Resolutions {
		w := m.WorstAt(i)
		mark := ""
		if found && res == best.Resolution {
			mark = " **(recommended)**"
		}
		pf("| %d%s | %s | %s | %s |", res, mark, pct(w.Share), m.where(w), times(w.Overshoot))
		for _, rep := range Representations {
			if !rep.valid(res) {
				pf(" - |")
				continue
			}
			keys, warm := rep.KeysRead(res)
			if rep.Kind == RepCached {
				pf(" %d (%d) |", keys, warm)
			} else {
				pf(" %d |", keys)
			}
		}
		pf("\n")
	}
	pf("\n")
}

// writePerShape writes each shape's share at a few resolutions, and what
// the shapes are.
func (m *ShapeMatrix) writePerShape(pf func(string, ...any), best RepPoint, found bool) {
	o := m.Options
	cols := []int{}
	for _, res := range []int{(o.MaxKeys - 1) / 2, todayK} {
		if _, ok := m.resolutionIndex(res); ok && !slices.Contains(cols, res) {
			cols = append(cols, res)
		}
	}
	if found && !slices.Contains(cols, best.Resolution) {
		cols = append(cols, best.Resolution)
	}
	pf("### Per shape\n\n")
	pf("Share of the exact log per shape and limit: requests worst seed / mean, then units worst seed / mean")
	pf(" (units only differ on the costed shapes). Columns: ")
	for j, res := range cols {
		if j > 0 {
			pf(", ")
		}
		pf("r = %d", res)
	}
	pf(" (bounded k = %d is the most sub-windows within %d keys; k = %d is the sub-window counters' default).\n\n", (o.MaxKeys-1)/2, o.MaxKeys, todayK)
	pf("| limit | shape |")
	for _, res := range cols {
		pf(" r = %d |", res)
	}
	pf("\n|---|---|")
	for range cols {
		pf("---:|")
	}
	pf("\n")
	for l, p := range o.Limits {
		for s, sh := range m.Shapes {
			pf("| %s | %s |", limitName(p), sh.Name)
			for _, res := range cols {
				i, _ := m.resolutionIndex(res)
				c := m.Cells[l][s][i]
				pf(" %s / %s, %s / %s |", pct(slices.Min(c.Shares)), pct(c.Mean()), pct(slices.Min(c.UnitShares)), pct(c.MeanUnits()))
			}
			pf("\n")
		}
	}
	pf("\n**Shapes.** ")
	for i, sh := range m.Shapes {
		if i > 0 {
			pf(" ")
		}
		pf("`%s`: %s.", sh.Name, sh.About)
	}
	pf(" L is the limit; rates are multiples of the limit's rate (L per window). Seeds feed PCG (`math/rand/v2`) with the shape, the limit and, for aligned shapes, r.\n\n")
}

// writeStoresImplement says what each store implements for the packed
// window.
func writeStoresImplement(pf func(string, ...any)) {
	pf("### What the stores implement (`storage.PackedCounter`)\n\n")
	pf("The limiter computes every counter (level, index) and packed delta; a store adds the deltas (creating at 0), " +
		"reads the counters named, and gives back the same deltas on a refund (`AddPacked`, `SubPacked`; the contract, " +
		"with its out-of-order rules, is in `limiter/store.go` and docs/consistency.md). `limiter.SlidingWindowConfig` " +
		"chooses it with `Representation: limiter.Packed` (and `Slots`, default 160); `NewSlidingWindow` refuses it on a " +
		"store without `PackedCounter`, above a limit of 32767, with a `MaxCost` above 32 (`limiter.PackedMaxCost`; " +
		"without a `MaxCost` it takes calls of cost up to 32 and refuses larger ones with `ErrInvalidCost`), with " +
		"`CountDenied` or `Interpolated`. **It is the " +
		"default**: the zero value, `limiter.Auto`, is `Packed` at 160 slots when the store serves it (all three do; " +
		"`storage.ServesPacked`), the limit is at most 32767, `MaxCost` at most 32, the estimator Bounded, `CountDenied` " +
		"off, no `SubWindows` " +
		"named and 160 cuts the window into slots of at least 100 us; otherwise it is 20 sub-windows, as before. Rules " +
		"choose with `representation` and `slots` (docs/rules.md).\n\n")
	pf("- **memory**: per key and level a ring of counters covering the slots within `Keep` (2r+1) of the newest; an " +
		"op naming an older counter is answered `Stale` and the request denied.\n")
	pf("- **memcached** (`backends/memcached`): per level an item `<base>|p<level>:<index>` on the key's node; a " +
		"decision pipelines one `add` (create at 0, with the delta's `TTL`: level l lives 4^l + 2r + 2 slots) and one " +
		"`incr` of the packed delta per level, then one `get` of the counters read, on one connection: one round trip, as " +
		"today. `incr` is atomic on the 64-bit value and wraps like the limiter's arithmetic, so packed fields need no " +
		"CAS; the limiter detects a carry from the incr replies (`PackedCounts.Added`). A refund subtracts the same " +
		"delta at every level modulo 2^64 (`incr` of 2^64-delta: exact also after adds in flight carried out of the " +
		"top field and wrapped the counter, where a `decr` would stop at 0 and lose the counter; after an eviction " +
		"it borrows into the top field, stricter). All of a key's " +
		"counters are on one node, so that one connection orders each writer's incrs before its get: of two writers " +
		"the later get sees the other's every level. It never answers `Stale` (it forgets by age).\n")
	pf("- **DynamoDB** (`backends/dynamo`): one item per key holding one Number attribute per counter; one " +
		"UpdateItem `ADD`s each level's delta, removes the counters past the keep bound and returns `ALL_NEW`; it tracks " +
		"the newest slot in the item and answers `Stale` past the horizon.\n\n")
	pf("**Upgrading.** The packed and the sub-window representations use different keys, so a deployment that " +
		"moves a default window to packed starts its counts afresh, and while old and new versions run side by side " +
		"(a Lambda rollout) each counts on its own keys: up to twice the limit in that window. Pin " +
		"`representation: subwindows` (or `Representation: limiter.SubWindowCounters`) to keep the old counters, and " +
		"switch when a window's worth of double admission is acceptable. The costs per store (memcached items per key, " +
		"DynamoDB item size and write units, latency and throughput against raw calls) are in docs/benchmarks.md, " +
		"\"The packed sliding window\".\n\n")
}

// shapesFigure plots the frontier of the shape matrix: worst-shape share
// against keys per memcached decision for each representation, and each
// shape's worst share against r.
func (r *Report) shapesFigure() (*figure, error) {
	m := r.Shapes
	f := newFigure("shapes-frontier", 1, 2, vg.Points(960), vg.Points(440))
	left := newPlot("Worst shape against keys read per memcached decision", "keys per decision (log scale)", "% of the exact log, worst shape and seed")
	left.X.Scale = plot.LogScale{}
	left.X.Tick.Marker = plot.LogTicks{Prec: -1}
	left.Legend.Left, left.Legend.Top = false, false
	right := newPlot("Each shape's worst share against the resolution", "slots per window r (log scale)", "% of the exact log, worst limit and seed")
	right.X.Scale = plot.LogScale{}
	right.X.Tick.Marker = plot.LogTicks{Prec: -1}
	right.Legend.Left, right.Legend.Top = false, false
	cols := []color.Color{blue, grey, green, color.RGBA{R: 20, G: 90, B: 40, A: 255}, purple, orange}
	minY, maxKeys := 100.0, 1.0
	for j, rep := range Representations {
		var xys plotter.XYs
		for _, pt := range m.Frontier() {
			if pt.Rep == rep {
				xys = append(xys, plotter.XY{X: float64(pt.Keys), Y: 100 * pt.Worst.Share})
				minY, maxKeys = min(minY, 100*pt.Worst.Share), max(maxKeys, float64(pt.Keys))
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color = cols[j%len(cols)], cols[j%len(cols)]
		pts.Shape = draw.CircleGlyph{}
		if rep.Kind == RepCached {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		left.Add(l, pts)
		left.Legend.Add(rep.String(), l, pts)
	}
	target := 100 * m.Options.Target
	left.Add(hline(target, 1, maxKeys*1.2, red), vline(float64(m.Options.MaxKeys), minY-2, 101, grey))
	left.Legend.Add(fmt.Sprintf("target %.0f%%", target), hline(target, 1, 2, red))
	left.Legend.Add(fmt.Sprintf("%d keys", m.Options.MaxKeys), vline(1, 0, 1, grey))
	left.Y.Min, left.Y.Max = math.Floor(minY-2), 101

	palette := []color.Color{blue, orange, green, purple, red, black, grey,
		color.RGBA{R: 20, G: 90, B: 40, A: 255}, color.RGBA{R: 160, G: 110, B: 0, A: 255}, color.RGBA{R: 0, G: 150, B: 170, A: 255},
		color.RGBA{R: 220, G: 80, B: 160, A: 255}, color.RGBA{R: 90, G: 90, B: 20, A: 255}, color.RGBA{R: 100, G: 60, B: 20, A: 255}, color.RGBA{R: 60, G: 60, B: 160, A: 255}}
	minR := 100.0
	for s, sh := range m.Shapes {
		var xys plotter.XYs
		for i, res := range m.Options.Resolutions {
			w := 2.0
			for l := range m.Cells {
				w = min(w, m.Cells[l][s][i].Worst())
			}
			xys = append(xys, plotter.XY{X: float64(res), Y: 100 * w})
			minR = min(minR, 100*w)
		}
		ln := line(xys, palette[s%len(palette)], vg.Points(1.2))
		if s >= len(palette)/2 {
			ln.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		right.Add(ln)
		right.Legend.Add(sh.Name, ln)
	}
	res := m.Options.Resolutions
	right.Add(hline(target, float64(res[0]), float64(res[len(res)-1]), red))
	right.Y.Min, right.Y.Max = math.Floor(minR-2), 101
	f.set(0, left)
	f.set(1, right)
	return f, nil
}

// writePacked reports the shapes replayed through the real packed window.
func (r *Report) writePacked(pf func(string, ...any)) {
	pr, m := r.Packed, r.Shapes
	if pr == nil || m == nil {
		return
	}
	w := pr.Worst()
	pf("### The packed window through the real limiter\n\n")
	pf("The same shapes, limits and seeds replayed through `limiter.SlidingWindow` with `Representation: limiter.Packed`, "+
		"`Slots: %d` (%d levels of 4 fields of %d bits), on the memory store (`backends/memory`, which implements "+
		"`storage.PackedCounter`), with the deny cache on as by default; aligned shapes land on its slot grid (W/%d).\n\n",
		pr.Slots, storage.PackedLevels, storage.PackedFieldBits, pr.Slots)
	verdict := "identical to"
	if pr.Mismatches > 0 {
		verdict = fmt.Sprintf("**different from** (first: %s)", pr.FirstMismatch)
	}
	pf("- %d decisions, %d of them different from the Bounded model at r = %d: its decisions are %s Bounded's.\n",
		pr.Decisions, pr.Mismatches, pr.Slots, verdict)
	pf("- Worst shape: %s of the exact log (%s); overshoot %.2f (1.00: never above the limit in any window).\n",
		pct(w.Share), m.where(w), w.Overshoot)
	pf("- At most %d counters named per decision (adds and reads, every slot offset; `storage.PackedPlan`).\n\n", pr.Keys)
	pf("| limit | worst shape | worst share | overshoot |\n|---|---|---:|---:|\n")
	for l, p := range m.Options.Limits {
		lw := Worst{Share: 2}
		for s, c := range pr.Cells[l] {
			if x := c.Worst(); x < lw.Share {
				lw.Share, lw.Shape = x, s
			}
			lw.Overshoot = max(lw.Overshoot, c.Overshoot)
		}
		pf("| %s | %s | %s | %.2f |\n", limitName(p), m.Shapes[lw.Shape].Name, pct(lw.Share), lw.Overshoot)
	}
	pf("\n")
}
