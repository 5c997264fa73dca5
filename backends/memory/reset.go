package memory

import (
	"context"
	"slices"

	"github.com/sluicehq/sluice/limiter/storage"
)

var (
	_ storage.Resetter  = (*Store)(nil)
	_ storage.LogReader = (*Store)(nil)
)

// Reset implements [storage.Resetter]: it deletes the entry of k under
// its shard's lock, whatever op says (an entry holds one limit's state on
// one key: every counter of a window, a bucket or a log). A request after
// it finds the key new; a refund after it finds nothing to give back, or
// the entry a newer request created. A window's fence
// ([storage.Fencer]) is kept: a reset never lowers it.
func (s *Store) Reset(ctx context.Context, k storage.Key, _ *storage.ResetOp) error {
	sh, _, err := s.lock(ctx, k)
	if err != nil {
		return err
	}
	defer sh.mu.Unlock()
	if e, ok := sh.m[k]; ok {
		if f := e.fence; f > 0 && s.now() < e.expires {
			e.reset()
			e.fence = f
			return nil
		}
		sh.remove(e)
	}
	return nil
}

// ReadLog implements [storage.LogReader]: a copy of k's log, or nil. It
// creates nothing.
func (s *Store) ReadLog(ctx context.Context, k storage.Key) ([]int64, error) {
	sh, now, err := s.lock(ctx, k)
	if err != nil {
		return nil, err
	}
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || now >= e.expires || len(e.log) == 0 {
		return nil, nil
	}
	return slices.Clone(e.log), nil
}
