package limitertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// FenceHistoryOptions configures [RunFenceHistory].
type FenceHistoryOptions struct {
	// Workers add concurrently (0: 16), each one unit at a time with the
	// old fence, for Duration (0: 1 s); the fence is raised half-way.
	Workers  int
	Duration time.Duration
	// MaxDelay holds half of the adds back a random time below it (0:
	// 20 ms), so that adds sent before the raise arrive after it.
	MaxDelay time.Duration
	// Seed seeds the delays.
	Seed uint64
	// NoLeases ([RunBucketFenceHistory] only): plain takes only (on
	// DynamoDB a bucket that leased once writes through its lease ring
	// from then on; this keeps its plain writes).
	NoLeases bool
}

// FenceHistory is what [RunFenceHistory] recorded: every add's answer
// and the key's count read right after RaiseFence returned and at the
// end.
type FenceHistory struct {
	// Landed and Fenced count the adds answered nil and ErrFenced;
	// Throttled those refused for capacity (nothing written). InFlight
	// counts the fenced adds sent before RaiseFence returned: the
	// reordered ones the fence is for.
	Landed, Fenced, Throttled, InFlight int64
	// AtRaise is the count read right after RaiseFence returned, Final
	// the count once every add has returned.
	AtRaise, Final int64
}

// errChecksNothing is [FenceHistory.Err]'s error for a history that
// checks nothing.
var errChecksNothing = errors.New("the history checks nothing")

// Err reports a history a fence does not explain: an add with the old
// fence that landed after RaiseFence returned (Final above AtRaise), a
// landed add not counted or a fenced one counted (Final is not Landed),
// or a history that checks nothing (no add landed, none was fenced, none
// in flight across the raise).
func (h FenceHistory) Err() error {
	switch {
	case h.Final != h.AtRaise:
		return fmt.Errorf("%d units with the old fence landed after RaiseFence returned (count %d right after it, %d at the end)", h.Final-h.AtRaise, h.AtRaise, h.Final)
	case h.Final != h.Landed:
		return fmt.Errorf("final count %d, but %d adds were answered nil (and %d ErrFenced)", h.Final, h.Landed, h.Fenced)
	case h.Landed == 0 || h.Fenced == 0 || h.InFlight == 0:
		return fmt.Errorf("%w: %+v", errChecksNothing, h)
	}
	return nil
}

// RunFenceHistory runs Workers goroutines adding one unit at a time with
// fence 1 to one key's sub-window through a [DelayStore] on s (arrivals
// reordered on purpose), raises the key's fence to 2 half-way and reads
// the count at once, then reads it again when every add has returned.
// Check the result with [FenceHistory.Err]. An add's error other than
// ErrFenced or ErrThrottled ends the run with that error.
func RunFenceHistory(ctx context.Context, s Store, opt FenceHistoryOptions) (FenceHistory, error) {
	opt = fenceDefaults(opt)
	fs, ok := s.(storage.Fencer)
	if !ok {
		return FenceHistory{}, fmt.Errorf("%T is not a storage.Fencer", s)
	}
	ds := NewDelayStore(s, opt.MaxDelay, opt.Seed)
	k := storage.Key{Space: "fence-history", Name: fmt.Sprintf("k-%d-%d", opt.Seed, time.Now().UnixNano())}
	take := func(ctx context.Context, _ int) (int64, error) {
		_, err := ds.AddFenced(ctx, k, fenceCur, fenceSpan, 1, fenceTTL, 1)
		return 1, err
	}
	read := func(ctx context.Context) (int64, error) {
		c, err := s.Add(ctx, k, fenceCur, fenceSpan, 0, fenceTTL)
		return c.C[0], err
	}
	return runFenceHistory(ctx, fs, k, opt, take, read)
}

// runFenceHistory runs opt.Workers goroutines calling take (worker w's
// take with fence 1, answering the units it took) until opt.Duration has
// passed, raises k's fence to 2 half-way and reads the units taken (read)
// at once, then again when every take has returned.
func runFenceHistory(ctx context.Context, fs storage.Fencer, k storage.Key, opt FenceHistoryOptions,
	take func(ctx context.Context, w int) (int64, error), read func(context.Context) (int64, error)) (FenceHistory, error) {
	var (
		h       FenceHistory
		mu      sync.Mutex
		raised  time.Time // when RaiseFence returned (zero before)
		firstEr error
	)
	stop := time.Now().Add(opt.Duration)
	var wg sync.WaitGroup
	for w := range opt.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(opt.Seed, uint64(w)))
			ctx := WithDelayRand(ctx, r)
			for time.Now().Before(stop) {
				sent := time.Now()
				got, err := take(ctx, w)
				mu.Lock()
				if err == nil {
					h.Landed += got - 1 // record counts one
				}
				if !h.record(err, sent, raised) && firstEr == nil {
					firstEr = err
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(opt.Duration / 2)
	err := fs.RaiseFence(ctx, k, 2, fenceTTL)
	var at int64
	if err == nil {
		at, err = read(ctx)
	}
	mu.Lock()
	raised, h.AtRaise = time.Now(), at
	mu.Unlock()
	wg.Wait()
	if err != nil {
		return h, fmt.Errorf("raise and read: %w", err)
	}
	if firstEr != nil {
		return h, firstEr
	}
	h.Final, err = read(ctx)
	return h, err
}

// record counts an add's answer err, sent at sent (raised: when the
// raise returned, zero before); it reports false for an unexpected error.
func (h *FenceHistory) record(err error, sent, raised time.Time) bool {
	switch {
	case err == nil:
		h.Landed++
	case errors.Is(err, storage.ErrFenced):
		h.Fenced++
		if raised.IsZero() || sent.Before(raised) {
			h.InFlight++
		}
	case errors.Is(err, storage.ErrThrottled):
		h.Throttled++
	default:
		return false
	}
	return true
}

func fenceDefaults(opt FenceHistoryOptions) FenceHistoryOptions {
	if opt.Workers <= 0 {
		opt.Workers = 16
	}
	if opt.Duration <= 0 {
		opt.Duration = time.Second
	}
	if opt.MaxDelay <= 0 {
		opt.MaxDelay = 20 * time.Millisecond
	}
	return opt
}
