package limitertest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// cutShort is a lease store whose next acquires (cut of them) are cut
// short: the write goes to the store on a context of its own when write
// is set, and the call answers context.DeadlineExceeded either way, as
// when the caller's deadline passes while the reply is on its way (or
// before the request left).
type cutShort struct {
	storage.LeaseStore
	cut   atomic.Int64
	write bool
}

func (s *cutShort) AcquireLease(ctx context.Context, k storage.Key, op storage.LeaseOp) (storage.Decision, error) {
	if s.cut.Add(-1) < 0 {
		return s.LeaseStore.AcquireLease(ctx, k, op)
	}
	if s.write {
		if _, err := s.LeaseStore.AcquireLease(context.WithoutCancel(ctx), k, op); err != nil {
			return storage.Decision{}, err
		}
	}
	return storage.Decision{}, fmt.Errorf("cut short: %w", context.DeadlineExceeded)
}

// testLeaseUnknownOutcome: an acquire whose write landed but whose call
// failed on its deadline gives its slot back (the limiter releases the ID
// it sent), and only that slot; the releases of an ID the store never saw
// (a cut-short acquire that wrote nothing) change no lease.
func testLeaseUnknownOutcome(t *testing.T, s storage.LeaseStore) {
	name, key := Key(t), Key(t)
	cfg := limiter.ConcurrencyConfig{Name: name, Capacity: 2, LeaseTTL: time.Hour}
	plain := must[*limiter.Concurrency](t)(limiter.NewConcurrency(s, cfg))
	cs := &cutShort{LeaseStore: s, write: true}
	cut := must[*limiter.Concurrency](t)(limiter.NewConcurrency(cs, cfg))
	held, _ := acquire(t, plain, key, Base)
	cs.cut.Store(1)
	if _, _, err := cut.Acquire(ctx(t), key, Base); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cut-short acquire: %v, want DeadlineExceeded", err)
	}
	// The clean-up runs in the background: poll, for at most opTimeout.
	var d limiter.Decision
	for start := time.Now(); time.Since(start) < opTimeout; time.Sleep(10 * time.Millisecond) {
		if _, d = acquire(t, plain, key, Base); d.Allowed {
			break
		}
	}
	if !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after a cut-short acquire whose write landed: %+v, want its slot (and only it) free within %v", d, opTimeout)
	}
	cs.write = false
	cs.cut.Store(1)
	if _, _, err := cut.Acquire(ctx(t), key, Base); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cut-short acquire, nothing written: %v, want DeadlineExceeded", err)
	}
	for start := time.Now(); cut.Stats().Releases < 4 && time.Since(start) < opTimeout; {
		time.Sleep(10 * time.Millisecond)
	}
	if st := cut.Stats(); st != (limiter.ConcurrencyStats{Unknown: 2, Releases: 4}) {
		t.Fatalf("clean-ups: %+v, want 2 with 2 releases each, none failed", st)
	}
	if _, d := acquire(t, plain, key, Base); d.Allowed {
		t.Fatalf("releases of an ID the store never saw freed a slot: %+v", d)
	}
	release(t, plain, held)
	if _, d := acquire(t, plain, key, Base); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after releasing the held lease: %+v, want one slot free", d)
	}
}
