package breaker

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

var _ storage.Store = (*Store)(nil)

// Store is a [storage.Store] behind a [Breaker]: each call asks the breaker,
// goes to the backend if allowed and reports its error. Safe for
// concurrent use if the backend is.
type Store struct {
	s     storage.Store
	batch storage.Batcher // s's (storage.AsBatcher)
	b     *Breaker
}

// KeepsLeased implements [storage.LeaseKeeper]: what the wrapped store
// reports.
func (s *Store) KeepsLeased() bool {
	k, ok := s.s.(storage.LeaseKeeper)
	return ok && k.KeepsLeased()
}

// WritesCrossRegions implements [storage.CrossRegionWriter]: what the
// wrapped store reports.
func (s *Store) WritesCrossRegions() bool { return storage.WritesCrossRegions(s.s) }

// Wrap returns s behind a new breaker configured by cfg.
func Wrap(s storage.Store, cfg Config) (*Store, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: breaker %q: nil store", limiter.ErrInvalidConfig, cfg.Name)
	}
	b, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &Store{s: s, batch: storage.AsBatcher(s), b: b}, nil
}

// Breaker returns the store's breaker.
func (s *Store) Breaker() *Breaker { return s.b }

// Unwrap returns the wrapped store.
func (s *Store) Unwrap() storage.Store { return s.s }

// Add implements [storage.Counter].
func (s *Store) Add(ctx context.Context, key storage.Key, cur int64, span int, n int64, ttl time.Duration) (storage.Counts, error) {
	probe, err := s.b.Allow()
	if err != nil {
		return storage.Counts{}, err
	}
	c, err := s.s.Add(ctx, key, cur, span, n, ttl)
	s.b.DoneKey(probe, keyHash(key), err)
	return c, err
}

// Sub implements [storage.Counter].
func (s *Store) Sub(ctx context.Context, key storage.Key, idx int64, n int64) error {
	probe, err := s.b.Allow()
	if err != nil {
		return err
	}
	err = s.s.Sub(ctx, key, idx, n)
	s.b.DoneKey(probe, keyHash(key), err)
	return err
}

// UpdateBucket implements [storage.BucketStore].
func (s *Store) UpdateBucket(ctx context.Context, key storage.Key, op storage.BucketOp, ttl time.Duration) (storage.Decision, error) {
	probe, err := s.b.Allow()
	if err != nil {
		return storage.Decision{}, err
	}
	d, err := s.s.UpdateBucket(ctx, key, op, ttl)
	s.b.DoneKey(probe, keyHash(key), err)
	return d, err
}

// UpdateLog implements [storage.LogStore].
func (s *Store) UpdateLog(ctx context.Context, key storage.Key, op storage.LogOp, ttl time.Duration) (storage.Decision, error) {
	probe, err := s.b.Allow()
	if err != nil {
		return storage.Decision{}, err
	}
	d, err := s.s.UpdateLog(ctx, key, op, ttl)
	s.b.DoneKey(probe, keyHash(key), err)
	return d, err
}

var _ storage.Batcher = (*Store)(nil)

// Do implements [storage.Batcher], so that wrapping a batching backend
// keeps its batches: the batch is one call to the breaker (one Allow; one
// Done with the batch's error, see batchErr), sent to the backend's Do when
// it has one, else step by step through its single-step methods
// ([storage.AsBatcher]). When the
// breaker refuses, every step gets its error.
//
// A fenced take (Step.Fence) of a kind the backend does not fence (a
// window's add on a store that is not a storage.Fencer, a bucket's take on
// one that is not a storage.BucketFencer) is answered an error wrapping
// storage.ErrUnsupported without reaching it, and the other steps are
// sent: a backend's Do may not know the fence, and would take unfenced.
func (s *Store) Do(ctx context.Context, steps []storage.Step, out []storage.StepResult) {
	if s.refuseUnfenceable(ctx, steps, out) {
		return
	}
	probe, err := s.b.Allow()
	if err != nil {
		for i := range steps {
			out[i] = storage.StepResult{Err: err}
		}
		return
	}
	s.batch.Do(ctx, steps, out)
	key, err := batchErr(steps, out[:len(steps)])
	s.b.DoneKey(probe, key, err)
}

// batchErr is what a batch tells the breaker: the first step error that
// counts as a failure (the backend unavailable) and its key's hash, else
// nil when some step was answered (a conflict, corrupt state or a
// throttle is an answer), else the first error (only a wrapped store's
// own open breaker).
func batchErr(steps []storage.Step, out []storage.StepResult) (uint64, error) {
	var first error
	answered := false
	for i, r := range out {
		switch err := r.Err; {
		case err == nil:
			answered = true
		case errors.Is(err, storage.ErrBreakerOpen):
			if first == nil {
				first = err
			}
		case errors.Is(err, storage.ErrUnavailable):
			return keyHash(steps[i].Key), err
		default:
			answered = true
		}
	}
	if answered {
		return 0, nil
	}
	return 0, first
}

// keySeed seeds keyHash.
var keySeed = maphash.MakeSeed()

// keyHash names key to the breaker, which opens only on failures from
// several distinct keys. Never 0 (0 is "no key").
func keyHash(key storage.Key) uint64 {
	var h maphash.Hash
	h.SetSeed(keySeed)
	h.WriteString(key.Space)
	h.WriteByte(0)
	h.WriteString(key.Name)
	return h.Sum64() | 1
}

var _ storage.PackedCounter = (*Store)(nil)

// ServesPacked reports whether the backend serves packed windows
// ([storage.ServesPacked]): a window whose representation is Auto is
// packed on the wrapper only then.
func (s *Store) ServesPacked() bool { return storage.ServesPacked(s.s) }

// AddPacked implements [storage.PackedCounter] when the backend does (the
// DynamoDB store): a packed window on the wrapped store goes through the
// breaker like the backend's other calls. On a backend without it, it
// fails with an error wrapping limiter.ErrInvalidConfig, without asking
// the breaker (so a packed window is then refused at its first call, not
// at NewSlidingWindow).
func (s *Store) AddPacked(ctx context.Context, key storage.Key, op *storage.PackedOp) (storage.PackedCounts, error) {
	p, err := s.packed()
	if err != nil {
		return storage.PackedCounts{}, err
	}
	probe, err := s.b.Allow()
	if err != nil {
		return storage.PackedCounts{}, err
	}
	c, err := p.AddPacked(ctx, key, op)
	s.b.DoneKey(probe, keyHash(key), err)
	return c, err
}

// SubPacked implements [storage.PackedCounter] as AddPacked does.
func (s *Store) SubPacked(ctx context.Context, key storage.Key, op *storage.PackedOp) error {
	p, err := s.packed()
	if err != nil {
		return err
	}
	probe, err := s.b.Allow()
	if err != nil {
		return err
	}
	err = p.SubPacked(ctx, key, op)
	s.b.DoneKey(probe, keyHash(key), err)
	return err
}

// packed returns the backend as a storage.PackedCounter.
func (s *Store) packed() (storage.PackedCounter, error) {
	p, ok := s.s.(storage.PackedCounter)
	if !ok {
		return nil, fmt.Errorf("%w: breaker %q: store %T does not implement storage.PackedCounter", limiter.ErrInvalidConfig, s.b.Name(), s.s)
	}
	return p, nil
}

var _ storage.Fencer = (*Store)(nil)

// AddFenced implements [storage.Fencer] when the backend does (memory,
// DynamoDB), through the breaker as Add; a refusal (storage.ErrFenced)
// is the store's answer, not a failure. On a backend without it, it fails
// with an error wrapping storage.ErrUnsupported, without asking the
// breaker.
func (s *Store) AddFenced(ctx context.Context, key storage.Key, cur int64, span int, n int64, ttl time.Duration, fence int64) (storage.Counts, error) {
	f, err := s.fencer()
	if err != nil {
		return storage.Counts{}, err
	}
	probe, err := s.b.Allow()
	if err != nil {
		return storage.Counts{}, err
	}
	c, err := f.AddFenced(ctx, key, cur, span, n, ttl, fence)
	s.b.DoneKey(probe, keyHash(key), err)
	return c, err
}

// RaiseFence implements [storage.Fencer] as AddFenced does.
func (s *Store) RaiseFence(ctx context.Context, key storage.Key, f int64, ttl time.Duration) error {
	fs, err := s.fencer()
	if err != nil {
		return err
	}
	probe, err := s.b.Allow()
	if err != nil {
		return err
	}
	err = fs.RaiseFence(ctx, key, f, ttl)
	s.b.DoneKey(probe, keyHash(key), err)
	return err
}

// fencer returns the backend as a storage.Fencer.
func (s *Store) fencer() (storage.Fencer, error) {
	f, ok := s.s.(storage.Fencer)
	if !ok {
		return nil, fmt.Errorf("breaker %q: store %T does not implement storage.Fencer: %w", s.b.Name(), s.s, storage.ErrUnsupported)
	}
	return f, nil
}

var _ storage.BucketFencer = (*Store)(nil)

// UpdateBucketFenced implements [storage.BucketFencer] when the backend
// does (memory, DynamoDB), through the breaker as UpdateBucket; a refusal
// (storage.ErrFenced) is the store's answer, not a failure. On a backend
// without it, it fails with an error wrapping storage.ErrUnsupported,
// without asking the breaker.
func (s *Store) UpdateBucketFenced(ctx context.Context, key storage.Key, op storage.BucketOp, ttl time.Duration, fence int64) (storage.Decision, error) {
	f, ok := s.s.(storage.BucketFencer)
	if !ok {
		return storage.Decision{}, fmt.Errorf("breaker %q: store %T does not implement storage.BucketFencer: %w", s.b.Name(), s.s, storage.ErrUnsupported)
	}
	probe, err := s.b.Allow()
	if err != nil {
		return storage.Decision{}, err
	}
	d, err := f.UpdateBucketFenced(ctx, key, op, ttl, fence)
	s.b.DoneKey(probe, keyHash(key), err)
	return d, err
}

// unfenceable reports whether st is a fenced take the backend does not
// fence.
func (s *Store) unfenceable(st *storage.Step) bool {
	if st.Fence <= 0 {
		return false
	}
	switch {
	case st.Kind == storage.StepAdd && st.N > 0:
		_, ok := s.s.(storage.Fencer)
		return !ok
	case st.Kind == storage.StepBucket && st.Bucket.Take():
		_, ok := s.s.(storage.BucketFencer)
		return !ok
	}
	return false
}

// refuseUnfenceable answers the steps the backend cannot fence with an
// error wrapping storage.ErrUnsupported and sends the others through Do;
// it reports false, having done nothing, when there are none.
func (s *Store) refuseUnfenceable(ctx context.Context, steps []storage.Step, out []storage.StepResult) bool {
	i := 0
	for i < len(steps) && !s.unfenceable(&steps[i]) {
		i++
	}
	if i == len(steps) {
		return false
	}
	rest, idx := make([]storage.Step, 0, len(steps)), make([]int, 0, len(steps))
	for j := range steps {
		if s.unfenceable(&steps[j]) {
			out[j] = storage.StepResult{Err: fmt.Errorf("breaker %q: store %T does not fence this %s take: %w", s.b.Name(), s.s, steps[j].Kind, storage.ErrUnsupported)}
			continue
		}
		rest, idx = append(rest, steps[j]), append(idx, j)
	}
	if len(rest) > 0 {
		res := make([]storage.StepResult, len(rest))
		s.Do(ctx, rest, res)
		for k, j := range idx {
			out[j] = res[k]
		}
	}
	return true
}
