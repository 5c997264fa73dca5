package accuracy

import (
	"errors"
	"runtime"
	"slices"
	"sync"
	"time"
)

// ShapeOptions say what the shape matrix replays: every shape of Shapes on
// every limit, for seeds Seed..Seed+Seeds-1, traces Windows windows long,
// through the Bounded model at every resolution.
type ShapeOptions struct {
	Limits      []Params
	Windows     int
	Seed        uint64
	Seeds       int
	Resolutions []int
	// MaxKeys is the most keys a memcached decision may name (12 by
	// default); Target the share of the exact log to reach on the worst
	// shape.
	MaxKeys int
	Target  float64
}

// DefaultShapeOptions are the matrix of `make accuracy`: four limits
// (2/s, 10/min, 100/min, 5000/h), 4 seeds, traces of 64 windows, every
// resolution from 4 to 500 that divides a second, a minute and an hour into
// sub-windows of at least 1ms.
func DefaultShapeOptions() ShapeOptions {
	return ShapeOptions{
		Limits:      []Params{{Limit: 2, Window: time.Second}, {Limit: 10, Window: time.Minute}, {Limit: 100, Window: time.Minute}, {Limit: 5000, Window: time.Hour}},
		Windows:     64,
		Seed:        1,
		Seeds:       4,
		Resolutions: []int{4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 64, 80, 100, 125, 160, 200, 250, 320, 400, 500},
		MaxKeys:     12,
		Target:      0.97,
	}
}

func (o ShapeOptions) validate() error {
	if len(o.Limits) == 0 || o.Windows < 1 || o.Seeds < 1 || len(o.Resolutions) == 0 || o.Target <= 0 {
		return errors.New("accuracy: shape options need limits, resolutions, Windows >= 1, Seeds >= 1 and Target > 0")
	}
	for _, p := range o.Limits {
		if err := p.validate(); err != nil {
			return err
		}
		for _, r := range o.Resolutions {
			if !validResolution(p, r) {
				return errors.New("accuracy: shape options: a resolution does not divide a limit's window into whole sub-windows of at least 1ms")
			}
		}
	}
	return nil
}

// Cell is one resolution on one shape and limit, over the seeds.
type Cell struct {
	// Shares and UnitShares are the admitted requests and units relative
	// to the exact log's, one per seed.
	Shares, UnitShares []float64
	// Overshoot is the worst window over the limit, worst seed.
	Overshoot float64
	// Requests is the trace's requests, summed over the seeds.
	Requests int
}

// Worst is the smallest share over the seeds, of requests or of units.
func (c Cell) Worst() float64 { return min(slices.Min(c.Shares), slices.Min(c.UnitShares)) }

// Mean is the mean share of requests over the seeds.
func (c Cell) Mean() float64 { return mean(c.Shares) }

// MeanUnits is the mean share of units over the seeds.
func (c Cell) MeanUnits() float64 { return mean(c.UnitShares) }

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// ShapeMatrix is the result of replaying every shape.
type ShapeMatrix struct {
	Options ShapeOptions
	Shapes  []Shape
	// Cells[l][s][i] is resolution Options.Resolutions[i] on shape s and
	// limit l.
	Cells [][][]Cell
}

// Worst is a resolution's worst cell over every shape and limit: the
// smallest worst-seed share, where it is, and the largest overshoot.
type Worst struct {
	Share        float64
	Limit, Shape int
	Overshoot    float64
}

// WorstAt returns the worst over shapes and limits of resolution index i.
func (m *ShapeMatrix) WorstAt(i int) Worst {
	w := Worst{Share: 2}
	for l := range m.Cells {
		for s := range m.Cells[l] {
			c := m.Cells[l][s][i]
			if x := c.Worst(); x < w.Share {
				w.Share, w.Limit, w.Shape = x, l, s
			}
			w.Overshoot = max(w.Overshoot, c.Overshoot)
		}
	}
	return w
}

// resolutionIndex returns the index of r in the options' resolutions.
func (m *ShapeMatrix) resolutionIndex(r int) (int, bool) {
	i := slices.Index(m.Options.Resolutions, r)
	return i, i >= 0
}

// RunShapes replays every shape of Shapes on every limit, seed and
// resolution of o through the Bounded model, in parallel.
func RunShapes(o ShapeOptions) (*ShapeMatrix, error) {
	return runShapes(o, modelBounded)
}

func runShapes(o ShapeOptions, e estimator) (*ShapeMatrix, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	m := &ShapeMatrix{Options: o, Shapes: Shapes()}
	m.Cells = make([][][]Cell, len(o.Limits))
	for l := range m.Cells {
		m.Cells[l] = make([][]Cell, len(m.Shapes))
		for s := range m.Cells[l] {
			m.Cells[l][s] = make([]Cell, len(o.Resolutions))
			for i := range o.Resolutions {
				m.Cells[l][s][i] = Cell{Shares: make([]float64, o.Seeds), UnitShares: make([]float64, o.Seeds)}
			}
		}
	}
	// One job per limit, shape, seed and, for aligned shapes, resolution:
	// it generates the trace, runs the exact log, then the resolutions.
	type job struct{ l, s, seed, i int }
	var jobs []job
	for l := range o.Limits {
		for s, sh := range m.Shapes {
			for seed := range o.Seeds {
				if sh.Aligned {
					for i := range o.Resolutions {
						jobs = append(jobs, job{l, s, seed, i})
					}
				} else {
					jobs = append(jobs, job{l, s, seed, -1})
				}
			}
		}
	}
	// The largest traces first, so that the workers finish together.
	slices.SortStableFunc(jobs, func(a, b job) int { return int(o.Limits[b.l].Limit - o.Limits[a.l].Limit) })
	var mu sync.Mutex
	ch := make(chan job)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for jb := range ch {
				p := o.Limits[jb.l]
				sh := m.Shapes[jb.s]
				idx := []int{jb.i}
				grid := 0
				if jb.i < 0 {
					idx = idx[:0]
					for i := range o.Resolutions {
						idx = append(idx, i)
					}
				} else {
					grid = o.Resolutions[jb.i]
				}
				tr := sh.Generate(p, grid, o.Windows, o.Seed+uint64(jb.seed))
				ref := exactModel(tr, p)
				for _, i := range idx {
					res := boundedModel(tr, p, o.Resolutions[i], e, nil)
					mu.Lock()
					c := &m.Cells[jb.l][jb.s][i]
					c.Shares[jb.seed] = shareOf(res.Admitted, ref.Admitted)
					c.UnitShares[jb.seed] = unitShare(res.AdmittedUnits, ref.AdmittedUnits)
					c.Overshoot = max(c.Overshoot, float64(res.WorstWindow)/float64(p.Limit))
					c.Requests += len(tr.Times)
					mu.Unlock()
				}
			}
		}()
	}
	for _, jb := range jobs {
		ch <- jb
	}
	close(ch)
	wg.Wait()
	return m, nil
}

func unitShare(admitted, exact int64) float64 {
	if exact == 0 {
		return 1
	}
	return float64(admitted) / float64(exact)
}

// RepPoint is one representation at one resolution: its keys and its
// worst shape.
type RepPoint struct {
	Rep        Representation
	Resolution int
	Keys, Warm int
	Items      int
	Worst      Worst
}

// Frontier returns, for each representation, its points at every
// resolution of the matrix it can have.
func (m *ShapeMatrix) Frontier() []RepPoint {
	var pts []RepPoint
	for _, rep := range Representations {
		for i, r := range m.Options.Resolutions {
			if !rep.valid(r) {
				continue
			}
			keys, warm := rep.KeysRead(r)
			pts = append(pts, RepPoint{Rep: rep, Resolution: r, Keys: keys, Warm: warm, Items: rep.ItemsPerKey(r), Worst: m.WorstAt(i)})
		}
	}
	return pts
}

// Best returns the point of rep with the fewest keys (then the highest
// share) that never overshoots and reaches the target on the worst shape
// (found), or else its best share within MaxKeys keys.
func (m *ShapeMatrix) Best(rep Representation) (RepPoint, bool) {
	var best RepPoint
	found, any := false, false
	for _, pt := range m.Frontier() {
		if pt.Rep != rep || pt.Worst.Overshoot > 1 {
			continue
		}
		ok := pt.Worst.Share >= m.Options.Target
		switch {
		case ok && (!found || pt.Keys < best.Keys || pt.Keys == best.Keys && pt.Worst.Share > best.Worst.Share):
			best, found, any = pt, true, true
		case !found && pt.Keys <= m.Options.MaxKeys && (!any || pt.Worst.Share > best.Worst.Share):
			best, any = pt, true
		}
	}
	return best, found
}
