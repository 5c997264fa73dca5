package limitertest

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// plainStore is a Store with no optional ability: every call answers
// zero values.
type plainStore struct{}

func (plainStore) Add(context.Context, storage.Key, int64, int, int64, time.Duration) (storage.Counts, error) {
	return storage.Counts{}, nil
}
func (plainStore) Sub(context.Context, storage.Key, int64, int64) error { return nil }
func (plainStore) UpdateBucket(context.Context, storage.Key, storage.BucketOp, time.Duration) (storage.Decision, error) {
	return storage.Decision{}, nil
}
func (plainStore) UpdateLog(context.Context, storage.Key, storage.LogOp, time.Duration) (storage.Decision, error) {
	return storage.Decision{}, nil
}

// ableStore is a plainStore that serves packed windows (or says it does
// not, served false), keeps leases and writes across regions as told.
type ableStore struct {
	plainStore
	served, keeps, cross bool
}

func (ableStore) AddPacked(context.Context, storage.Key, *storage.PackedOp) (storage.PackedCounts, error) {
	return storage.PackedCounts{}, nil
}
func (ableStore) SubPacked(context.Context, storage.Key, *storage.PackedOp) error { return nil }
func (s ableStore) ServesPacked() bool                                            { return s.served }
func (s ableStore) KeepsLeased() bool                                             { return s.keeps }
func (s ableStore) WritesCrossRegions() bool                                      { return s.cross }

// TestWrappersForward: DelayStore and CountingStore say what the store
// they wrap says of its optional abilities, as breaker.Store does: that
// its writes cross regions (storage.CrossRegionWriter, which sizes a
// limiter's leases), that it keeps leases, that it serves packed windows;
// over a store without them they say no, and a packed call through
// CountingStore is an error, not a panic.
func TestWrappersForward(t *testing.T) {
	wrappers := []struct {
		name string
		wrap func(Store) Store
	}{
		{"DelayStore", func(s Store) Store { return NewDelayStore(s, 0, 1) }},
		{"CountingStore", func(s Store) Store { return NewCountingStore(s) }},
	}
	for _, w := range wrappers {
		for _, inner := range []Store{
			plainStore{},
			ableStore{served: true, keeps: true, cross: true},
			ableStore{served: false, keeps: false, cross: false},
			ableStore{served: true, keeps: false, cross: true},
			ableStore{served: false, keeps: true, cross: false},
		} {
			s := w.wrap(inner)
			if got, want := storage.WritesCrossRegions(s), storage.WritesCrossRegions(inner); got != want {
				t.Errorf("%s over %+v: WritesCrossRegions %v, want %v", w.name, inner, got, want)
			}
			if got, want := storage.ServesPacked(s), storage.ServesPacked(inner); got != want {
				t.Errorf("%s over %+v: ServesPacked %v, want %v", w.name, inner, got, want)
			}
			k, ok := s.(storage.LeaseKeeper)
			ik, iok := inner.(storage.LeaseKeeper)
			if got, want := ok && k.KeepsLeased(), iok && ik.KeepsLeased(); got != want {
				t.Errorf("%s over %+v: KeepsLeased %v, want %v", w.name, inner, got, want)
			}
		}
	}
	c := NewCountingStore(plainStore{})
	op := &storage.PackedOp{}
	if _, err := c.AddPacked(context.Background(), storage.Key{}, op); err == nil {
		t.Error("CountingStore.AddPacked over a store without packed windows: no error")
	}
	if err := c.SubPacked(context.Background(), storage.Key{}, op); err == nil {
		t.Error("CountingStore.SubPacked over a store without packed windows: no error")
	}
}
