package breaker

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// ShedStore is the store of the load shedders: leases (the fleet-usage
// shedder) and gauges (the published utilization): memcached.Leases,
// dynamo.Leases, or memory.Leases (tests only: it counts per process).
type ShedStore interface {
	storage.LeaseStore
	storage.GaugeStore
}

var _ ShedStore = (*Leases)(nil)

// Leases is a [ShedStore] behind a breaker, usually the breaker of the
// counter store on the same backend ([Store.Breaker]), so that one outage
// opens one breaker for both. Safe for concurrent use if the store is.
type Leases struct {
	s ShedStore
	b *Breaker
}

// WrapLeases returns s behind b.
func WrapLeases(s ShedStore, b *Breaker) (*Leases, error) {
	if s == nil || b == nil {
		return nil, fmt.Errorf("%w: breaker: nil shed store or breaker", limiter.ErrInvalidConfig)
	}
	return &Leases{s: s, b: b}, nil
}

// Unwrap returns the wrapped store.
func (l *Leases) Unwrap() ShedStore { return l.s }

// AcquireLease implements [storage.LeaseStore].
func (l *Leases) AcquireLease(ctx context.Context, key storage.Key, op storage.LeaseOp) (storage.Decision, error) {
	probe, err := l.b.Allow()
	if err != nil {
		return storage.Decision{}, err
	}
	d, err := l.s.AcquireLease(ctx, key, op)
	l.b.Done(probe, err)
	return d, err
}

// ReleaseLease implements [storage.LeaseStore]. A release the breaker
// refuses leaves the lease to expire.
func (l *Leases) ReleaseLease(ctx context.Context, key storage.Key, op storage.ReleaseOp) error {
	probe, err := l.b.Allow()
	if err != nil {
		return err
	}
	err = l.s.ReleaseLease(ctx, key, op)
	l.b.Done(probe, err)
	return err
}

// PutGauge implements [storage.GaugeStore].
func (l *Leases) PutGauge(ctx context.Context, key storage.Key, g storage.Gauge, ttl time.Duration) error {
	probe, err := l.b.Allow()
	if err != nil {
		return err
	}
	err = l.s.PutGauge(ctx, key, g, ttl)
	l.b.Done(probe, err)
	return err
}

// GetGauge implements [storage.GaugeStore].
func (l *Leases) GetGauge(ctx context.Context, key storage.Key) (storage.Gauge, bool, error) {
	probe, err := l.b.Allow()
	if err != nil {
		return storage.Gauge{}, false, err
	}
	g, found, err := l.s.GetGauge(ctx, key)
	l.b.Done(probe, err)
	return g, found, err
}
