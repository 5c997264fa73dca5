package limitertest

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/sluice/limiter/storage"
)

// CheckFenceHistories runs the fence histories on stores newStore makes,
// each as a subtest that fails t when [FenceHistory.Err] rejects it:
// "window" ([RunFenceHistory]) and, where the store fences buckets
// ([storage.BucketFencer]), "bucket/leases" and "bucket/plain"
// ([RunBucketFenceHistory] with and without lease takes). Each runs with
// opt, seeded by [HistorySeed] (logged, to replay). With breakFence set,
// each runs again as ".../broken" on a store breakFence made ignore the
// fence, seeded 1, and must be rejected: the checker is shown to fail.
// logf, if set, adds a line about the store after each run (its
// requests, its conflicts).
func CheckFenceHistories(t *testing.T, newStore func(t *testing.T) Store, breakFence func(Store), opt FenceHistoryOptions, logf func(Store) string) {
	t.Helper()
	cases := []fenceCase{{"window", RunFenceHistory, false}}
	if _, ok := newStore(t).(storage.BucketFencer); ok {
		cases = append(cases, fenceCase{"bucket/leases", RunBucketFenceHistory, false}, fenceCase{"bucket/plain", RunBucketFenceHistory, true})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seed, err := HistorySeed()
			if err != nil {
				t.Fatal(err)
			}
			o := opt
			o.Seed, o.NoLeases = seed, c.noLeases
			checkFenceHistory(t, newStore, nil, o, c.run, logf)
			if breakFence != nil {
				t.Run("broken", func(t *testing.T) {
					o.Seed = 1
					checkFenceHistory(t, newStore, breakFence, o, c.run, logf)
				})
			}
		})
	}
}

// fenceCase is one of CheckFenceHistories' histories.
type fenceCase struct {
	name     string
	run      func(context.Context, Store, FenceHistoryOptions) (FenceHistory, error)
	noLeases bool
}

// fenceAttempts is how many histories checkFenceHistory runs at most.
const fenceAttempts = 3

// checkFenceHistory runs one history on a store newStore makes (broken
// first by breakFence, if set) and fails t unless the checker's verdict
// is the one expected. A history that checks nothing (no add fenced or in
// flight across the raise: a machine too loaded for the run's pace, as a
// make test at load 17 met once in four runs) runs again on a new store
// with the next seed, up to fenceAttempts in all; the last one is judged
// in full. For a broken store only a violation counts as its rejection.
func checkFenceHistory(t *testing.T, newStore func(t *testing.T) Store, breakFence func(Store), opt FenceHistoryOptions,
	run func(context.Context, Store, FenceHistoryOptions) (FenceHistory, error), logf func(Store) string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		s := newStore(t)
		if breakFence != nil {
			breakFence(s)
		}
		h, err := run(t.Context(), s, opt)
		if err != nil {
			t.Fatal(err)
		}
		extra := ""
		if logf != nil {
			extra = "; " + logf(s)
		}
		err = h.Err()
		t.Logf("seed %d: %+v%s: %v", opt.Seed, h, extra, err)
		if errors.Is(err, errChecksNothing) && attempt < fenceAttempts {
			opt.Seed++
			continue
		}
		switch {
		case breakFence == nil && err != nil:
			t.Error(err)
		case breakFence != nil && (err == nil || errors.Is(err, errChecksNothing)):
			t.Errorf("the history of a store that ignores the fence was not rejected: %v", err)
		}
		return
	}
}
