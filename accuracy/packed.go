package accuracy

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// PackedReplay is the shape matrix at one resolution replayed through the
// real limiter type, limiter.SlidingWindow with the Packed representation,
// on the memory store (backends/memory, storage.PackedCounter): what the
// library does, rather than the model (model.go) the matrix uses.
type PackedReplay struct {
	// Slots is the resolution (limiter.SlidingWindowConfig.Slots).
	Slots int
	// Cells[l][s] is the window on limit l and shape s, over the seeds.
	Cells [][]Cell
	// Decisions is the requests replayed; Mismatches those the limiter
	// decided otherwise than the Bounded model at resolution Slots (the
	// packed window decides exactly as Bounded: it must be 0).
	Decisions, Mismatches int
	// FirstMismatch describes the first one, if any.
	FirstMismatch string
	// Keys is the most counters one decision names (adds and reads).
	Keys int
}

// Worst returns the worst cell over limits and shapes.
func (p *PackedReplay) Worst() Worst {
	w := Worst{Share: 2}
	for l := range p.Cells {
		for s, c := range p.Cells[l] {
			if x := c.Worst(); x < w.Share {
				w.Share, w.Limit, w.Shape = x, l, s
			}
			w.Overshoot = max(w.Overshoot, c.Overshoot)
		}
	}
	return w
}

// packedKeysNamed is the most counters (level, index) one decision of the
// limiter names at resolution r, over every slot offset of a top-level
// counter, from storage.PackedPlan.
func packedKeysNamed(r int) int {
	most := 0
	base := int64(1) << 40
	for f := base; f < base+1<<(2*storage.PackedLevels); f++ {
		op := storage.PackedPlan(f, r, 1, time.Millisecond)
		seen := map[storage.PackedCell]bool{}
		for _, a := range op.Adds {
			seen[a.Cell] = true
		}
		for _, c := range op.Reads[:op.NReads] {
			seen[c] = true
		}
		most = max(most, len(seen))
	}
	return most
}

// RunPackedReplay replays every shape, limit and seed of o through a
// packed limiter.SlidingWindow of slots slots per window on a fresh memory
// store (deny cache on, as by default), alongside the exact log and the
// Bounded model at the same resolution, in parallel.
func RunPackedReplay(o ShapeOptions, slots int) (*PackedReplay, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	shapes := Shapes()
	rep := &PackedReplay{Slots: slots, Keys: packedKeysNamed(slots)}
	rep.Cells = make([][]Cell, len(o.Limits))
	for l := range rep.Cells {
		rep.Cells[l] = make([]Cell, len(shapes))
		for s := range rep.Cells[l] {
			rep.Cells[l][s] = Cell{Shares: make([]float64, o.Seeds), UnitShares: make([]float64, o.Seeds)}
		}
	}
	type job struct{ l, s, seed int }
	var jobs []job
	for l := range o.Limits {
		for s := range shapes {
			for seed := range o.Seeds {
				jobs = append(jobs, job{l, s, seed})
			}
		}
	}
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	ch := make(chan job)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for jb := range ch {
				p := o.Limits[jb.l]
				sh := shapes[jb.s]
				grid := 0
				if sh.Aligned {
					grid = slots
				}
				tr := sh.Generate(p, grid, o.Windows, o.Seed+uint64(jb.seed))
				ref := exactModel(tr, p)
				want := make([]bool, len(tr.Times))
				boundedModelOf(tr, p, slots, modelBounded, nil, want)
				res, mism, first, err := replayPacked(tr, p, slots, want)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("accuracy: packed replay of %s on %s: %w", sh.Name, limitName(p), err)
				}
				c := &rep.Cells[jb.l][jb.s]
				c.Shares[jb.seed] = shareOf(res.Admitted, ref.Admitted)
				c.UnitShares[jb.seed] = unitShare(res.AdmittedUnits, ref.AdmittedUnits)
				c.Overshoot = max(c.Overshoot, float64(res.WorstWindow)/float64(p.Limit))
				c.Requests += len(tr.Times)
				rep.Decisions += len(tr.Times)
				rep.Mismatches += mism
				if mism > 0 && rep.FirstMismatch == "" {
					rep.FirstMismatch = fmt.Sprintf("%s, %s, seed %d: %s", sh.Name, limitName(p), o.Seed+uint64(jb.seed), first)
				}
				mu.Unlock()
			}
		}()
	}
	for _, jb := range jobs {
		ch <- jb
	}
	close(ch)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return rep, nil
}

// replayPacked replays tr through the real packed window and compares
// each decision with the model's (want[i]: request i admitted).
func replayPacked(tr Trace, p Params, slots int, want []bool) (ModelResult, int, string, error) {
	var res ModelResult
	store, err := memory.New(memory.Config{MaxKeys: 1024})
	if err != nil {
		return res, 0, "", err
	}
	w, err := limiter.NewSlidingWindow(store, limiter.SlidingWindowConfig{
		Name: "packed", Limit: p.Limit, Window: p.Window, Representation: limiter.Packed, Slots: slots,
	})
	if err != nil {
		return res, 0, "", err
	}
	ctx := context.Background()
	m := windowMeter{w: int64(p.Window)}
	mism := 0
	first := ""
	for i, t := range tr.Times {
		n := tr.cost(i)
		d, err := w.AllowN(ctx, "k", time.Unix(0, t), n)
		if err != nil {
			return res, mism, first, err
		}
		if d.Allowed != want[i] {
			if mism == 0 {
				first = "request " + strconv.Itoa(i) + " at " + time.Duration(t-tr.Times[0]).String() + " into the trace: limiter allowed=" + strconv.FormatBool(d.Allowed)
			}
			mism++
		}
		m.advance(t)
		if d.Allowed {
			m.admit(t, n)
			res.Admitted++
			res.AdmittedUnits += n
		}
	}
	res.WorstWindow = m.worst
	return res, mism, first, nil
}
