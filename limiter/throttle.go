package limiter

import (
	"errors"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// ThrottledRetryAfter is the RetryAfter of a decision [Decide] makes for an
// item whose store throttled its key (an error wrapping [storage.ErrThrottled], or
// [storage.ErrConflict]: every conditional write on the key lost its race):
// the key is denied, never admitted uncounted, and the deny cache then
// keeps this process from sending the key to the store again for that
// long. A partition that refused a write has no capacity left for about a
// second (DynamoDB: 1,000 write units a second per partition); a tenth of
// that lets the key's next requests try again soon without piling onto it.
const ThrottledRetryAfter = 100 * time.Millisecond

// throttled reports whether err says the store refused the key for
// capacity (ErrThrottled), or that the key is so contended that its
// conditional writes lost every race within their retries (ErrConflict):
// answers about that key, not failures of the store. Either way nothing
// was counted, and the key is busy: the one that most needs its limit.
func throttled(err error) bool {
	return errors.Is(err, storage.ErrThrottled) || errors.Is(err, storage.ErrConflict)
}

// described is implemented by the package's limiters: the name and
// capacity a decision reports.
type described interface {
	describe() (name string, limit int64)
}

func (b *TokenBucket) describe() (string, int64)   { return b.cfg.Name, b.cfg.MaxAmount }
func (w *SlidingWindow) describe() (string, int64) { return w.cfg.Name, w.cfg.Limit }
func (w *FixedWindow) describe() (string, int64)   { return w.cfg.Name, w.cfg.Limit }
func (l *SlidingLog) describe() (string, int64)    { return l.cfg.Name, l.cfg.Limit }

// throttledDecision is the denial of a throttled item of limit l.
func throttledDecision(l Limiter) Decision {
	d := Decision{RetryAfter: ThrottledRetryAfter, ResetAfter: ThrottledRetryAfter}
	if s, ok := l.(described); ok {
		d.Name, d.Limit = s.describe()
	}
	return d
}
