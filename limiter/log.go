package limiter

import (
	"context"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// SlidingLogConfig configures a [SlidingLog].
type SlidingLogConfig struct {
	Name string
	// Tag, when not empty, is added to the key space the parameters name
	// (as "#" Tag), so that two limits of the same parameters on one
	// store keep their own log for the same keys (the policy tags the
	// second of two such limits of one rule with its name).
	Tag    string
	Limit  int64
	Window time.Duration
	// NoDenyCache turns off the limit's deny cache (docs/consistency.md, "The deny cache"),
	// which is on by default: a key the store denied is denied again
	// without a store request until the denial's RetryAfter has passed.
	NoDenyCache bool
}

// SlidingLog is the exact sliding window: it keeps the time of every unit
// allowed in the last Window and allows a request if the units in
// (now-Window, now] plus the request's fit within Limit. It is the accuracy
// reference for the approximations, and practical for small limits (memory
// and item size grow with Limit: up to twice Limit entries are kept, for
// callers whose clocks lag the newest writer's, see [storage.LogOp.Apply]). A
// decision is one
// LogStore.UpdateLog; safe for concurrent use; exact on any store that
// honours the LogStore contract.
type SlidingLog struct {
	cfg   SlidingLogConfig
	store storage.LogStore
	batch storage.Batcher // store's
	space string
	cache *denyCache
}

// Space returns the key space of the log: its parameters (and its Tag).
func (l *SlidingLog) Space() string { return l.space }

// NewSlidingLog returns a sliding log on store, or an error wrapping
// [ErrInvalidConfig].
func NewSlidingLog(store storage.LogStore, cfg SlidingLogConfig) (*SlidingLog, error) {
	const kind = "sliding log"
	switch {
	case store == nil:
		return nil, configError(kind, cfg.Name, "store", "must not be nil")
	case cfg.Limit <= 0 || cfg.Limit > storage.MaxLogLimit:
		return nil, configError(kind, cfg.Name, "limit", "must be between 1 and %d, got %d", storage.MaxLogLimit, cfg.Limit)
	case cfg.Window <= 0:
		return nil, configError(kind, cfg.Name, "window", "must be positive, got %v", cfg.Window)
	}
	return &SlidingLog{cfg: cfg, store: store, batch: batcher(storage.Steps{Log: store}), space: "sl:" + strconv.FormatInt(cfg.Limit, 10) + ":" + cfg.Window.String() + tagSpace(cfg.Tag), cache: newDenyCache(cfg.NoDenyCache, false)}, nil
}

// Config returns the log's configuration.
func (l *SlidingLog) Config() SlidingLogConfig { return l.cfg }

// Allow is AllowN(ctx, key, now, 1).
func (l *SlidingLog) Allow(ctx context.Context, key string, now time.Time) (Decision, error) {
	return l.AllowN(ctx, key, now, 1)
}

// AllowN records n units at now if they fit in the window.
func (l *SlidingLog) AllowN(ctx context.Context, key string, now time.Time, n int64) (Decision, error) {
	return decideOne(ctx, l, key, now, n)
}

// Refund removes up to n timestamps recorded at now.
func (l *SlidingLog) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	return refundOne(ctx, l, key, now, n)
}
