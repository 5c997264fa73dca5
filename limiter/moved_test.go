package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// failedMove is a Counter whose every Add is a late writer's failed move:
// its units are counted nowhere a punctual writer reads, so it answers
// Moved with Later saturated (as the DynamoDB store does).
type failedMove struct{ subs int }

func (c *failedMove) Add(_ context.Context, _ storage.Key, cur int64, _ int, _ int64, _ time.Duration) (storage.Counts, error) {
	return storage.Counts{Moved: true, At: cur, Later: 1<<63 - 1}, nil
}

func (c *failedMove) Sub(context.Context, storage.Key, int64, int64) error { c.subs++; return nil }

// A moved writer is judged against everything newer: a failed move denies
// every window (the fixed window used to read only C[0] and admitted it).
func TestFailedMoveDenies(t *testing.T) {
	now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	c := &failedMove{}
	fw, err := limiter.NewFixedWindow(c, limiter.FixedWindowConfig{Limit: 2, Window: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sw, err := limiter.NewSlidingWindow(c, limiter.SlidingWindowConfig{Limit: 2, Window: time.Second, Representation: limiter.SubWindowCounters})
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]limiter.Limiter{"fixed": fw, "sliding": sw} {
		d, err := l.AllowN(context.Background(), "k", now, 1)
		if err != nil || d.Allowed {
			t.Errorf("%s window after a failed move: %+v, %v; want denied", name, d, err)
		}
	}
}
