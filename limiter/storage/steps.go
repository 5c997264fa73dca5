package storage

import (
	"context"
	"fmt"
)

// Steps is the plain loop of a store that does not batch: a [Batcher]
// whose Do performs each step in turn with the single-step method of its
// kind. A step of a kind whose method is nil answers an error wrapping
// [ErrUnsupported]. A backend that batches some kinds only uses it for the
// others (Step). Two Steps over the same methods are ==, as a Batcher must
// be.
type Steps struct {
	Counter Counter
	Packed  PackedCounter
	Bucket  BucketStore
	Log     LogStore
}

// Do performs the steps one at a time.
func (s Steps) Do(ctx context.Context, steps []Step, out []StepResult) {
	for i := range steps {
		out[i] = s.Step(ctx, &steps[i])
	}
}

// Step performs one step with its single-step method.
func (s Steps) Step(ctx context.Context, st *Step) StepResult {
	var r StepResult
	switch {
	case st.Kind == StepAdd && st.Fence > 0 && st.N > 0:
		f, ok := s.Counter.(Fencer)
		if !ok {
			r.Err = fmt.Errorf("%w: the store does not fence adds (%T is not a storage.Fencer)", ErrUnsupported, s.Counter)
			break
		}
		r.Counts, r.Err = f.AddFenced(ctx, st.Key, st.Idx, st.Span, st.N, st.TTL, st.Fence)
	case st.Kind == StepBucket && st.Fence > 0 && st.Bucket.Take():
		f, ok := s.Bucket.(BucketFencer)
		if !ok {
			r.Err = fmt.Errorf("%w: the store does not fence buckets (%T is not a storage.BucketFencer)", ErrUnsupported, s.Bucket)
			break
		}
		r.Decision, r.Err = f.UpdateBucketFenced(ctx, st.Key, st.Bucket, st.TTL, st.Fence)
	case st.Kind == StepAdd && s.Counter != nil:
		r.Counts, r.Err = s.Counter.Add(ctx, st.Key, st.Idx, st.Span, st.N, st.TTL)
	case st.Kind == StepSub && s.Counter != nil:
		r.Err = s.Counter.Sub(ctx, st.Key, st.Idx, st.N)
	case st.Kind == StepBucket && s.Bucket != nil:
		r.Decision, r.Err = s.Bucket.UpdateBucket(ctx, st.Key, st.Bucket, st.TTL)
	case st.Kind == StepLog && s.Log != nil:
		r.Decision, r.Err = s.Log.UpdateLog(ctx, st.Key, st.Log, st.TTL)
	case st.Kind == StepPackedAdd && s.Packed != nil:
		r.Packed, r.Err = s.Packed.AddPacked(ctx, st.Key, &st.Packed)
	case st.Kind == StepPackedSub && s.Packed != nil:
		r.Err = s.Packed.SubPacked(ctx, st.Key, &st.Packed)
	default:
		r.Err = fmt.Errorf("%w: the store does not serve %s steps", ErrUnsupported, st.Kind)
	}
	return r
}

// ServesPacked reports whether s serves packed windows: it implements
// [PackedCounter] and, if it is a wrapper that forwards PackedCounter to
// another store (a circuit breaker, a test's delaying store), it says the
// store it wraps does, with a method ServesPacked() bool. A window whose
// representation is Auto is packed only on such a store, so that a
// wrapper does not make a window packed over a store that cannot serve it.
func ServesPacked(s Counter) bool {
	if _, ok := s.(PackedCounter); !ok {
		return false
	}
	if f, ok := s.(interface{ ServesPacked() bool }); ok {
		return f.ServesPacked()
	}
	return true
}

// AsBatcher returns s as a [Batcher]: s itself when it batches, else the
// plain loop over its single-step methods ([Steps]; its packed ones when
// it implements [PackedCounter]). s's type must be comparable, as a
// Batcher's.
func AsBatcher(s Store) Batcher {
	if b, ok := s.(Batcher); ok {
		return b
	}
	return stepsOf(s)
}

// DoStep performs one step on s with its single-step method, whether or
// not s batches: a building block for a store that batches only some
// kinds.
func DoStep(ctx context.Context, s Store, st *Step) StepResult {
	return stepsOf(s).Step(ctx, st)
}

func stepsOf(s Store) Steps {
	p, _ := s.(PackedCounter)
	return Steps{Counter: s, Packed: p, Bucket: s, Log: s}
}
