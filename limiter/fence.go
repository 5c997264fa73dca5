package limiter

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/limiter/storage"
)

// A fence on a window's counters or a token bucket (Item.Fence,
// SlidingWindow.RaiseFence, TokenBucket.RaiseFence, storage.Fencer,
// storage.BucketFencer): a caller that lowers what others may take on a key (a
// share, Item.Cap, a bucket's rebase) raises the key's fence, then reads
// the state (Peek, Get);
// every take decided on the older state carries a lower fence, so it is
// in what the read counts or refused by the store. See docs/fence.md.
//
// A fenced item's step, a lease take's included, carries the fence to the
// store. An item the store refused (storage.ErrFenced) took nothing; it is
// not an outage, so its Fail does not decide it: Decide gives back what
// the batch's other items took and returns an error wrapping
// storage.ErrFenced (the item's Outcome.Err holds it too), and no denial
// is cached for it. Units a live capacity lease took before the fence rose
// were counted by the store, so spending them needs no store request.
// A fence needs a *SlidingWindow with sub-window counters on a store
// implementing storage.Fencer, or a *TokenBucket on a store implementing
// storage.Fencer and storage.BucketFencer. A bucket's takes, plain and
// lease takes (with a lease return they carry), are fenced; its refunds,
// lease returns and reads never are.

// fenceCheck refuses a fence f that limit s cannot take.
func fenceCheck(s stepper, f int64) error {
	if f < 0 {
		return fmt.Errorf("%w: a fence must be positive, got %d", ErrInvalidConfig, f)
	}
	switch l := s.(type) {
	case *SlidingWindow:
		_, err := l.fencer()
		return err
	case *TokenBucket:
		_, err := l.fencer()
		return err
	}
	return fmt.Errorf("%w: a fence (Item.Fence) needs a sliding window with sub-window counters or a token bucket, not %T", ErrInvalidConfig, s)
}

// fencer returns the bucket's store as a storage.Fencer that fences
// buckets (storage.BucketFencer), or an error wrapping ErrInvalidConfig.
func (b *TokenBucket) fencer() (storage.Fencer, error) {
	f, ok := b.store.(storage.Fencer)
	if _, bf := b.store.(storage.BucketFencer); !ok || !bf {
		return nil, fmt.Errorf("%w: limit %q: a bucket's fence needs a store implementing storage.Fencer and storage.BucketFencer; %T does not", ErrInvalidConfig, b.cfg.Name, b.store)
	}
	return f, nil
}

// fencer returns the window's store as a storage.Fencer, or an error
// wrapping ErrInvalidConfig.
func (w *SlidingWindow) fencer() (storage.Fencer, error) {
	if w.packed != nil {
		return nil, fmt.Errorf("%w: limit %q: a fence needs sub-window counters, not a packed window", ErrInvalidConfig, w.cfg.Name)
	}
	f, ok := w.store.(storage.Fencer)
	if !ok {
		return nil, fmt.Errorf("%w: limit %q: a fence needs a store implementing storage.Fencer; %T does not", ErrInvalidConfig, w.cfg.Name, w.store)
	}
	return f, nil
}

// fenceStep puts fence f on st when it is a take of a window's counters
// or of a bucket (a lease take's included).
func fenceStep(st *storage.Step, f int64) {
	if (st.Kind == storage.StepAdd && st.N > 0) || (st.Kind == storage.StepBucket && st.Bucket.Take()) {
		st.Fence = f
	}
}

// RaiseFence raises the fence of key's counters to f (f > 0), never
// lowering it: once it returns nil, every take of this window on key with
// a lower Item.Fence is either counted (a Peek afterwards sees it) or
// refused with an error wrapping storage.ErrFenced. The key is the one
// Decide and Peek use. It refuses a packed window and a store that is not
// a storage.Fencer (ErrInvalidConfig).
func (w *SlidingWindow) RaiseFence(ctx context.Context, key string, f int64) error {
	if f <= 0 {
		return fmt.Errorf("%w: limit %q: a fence must be positive, got %d", ErrInvalidConfig, w.cfg.Name, f)
	}
	fs, err := w.fencer()
	if err != nil {
		return err
	}
	if err := fs.RaiseFence(ctx, storage.Key{Space: w.space, Name: key}, f, w.ttl); err != nil {
		return fmt.Errorf("limiter: sliding window %q: raise fence: %w", w.cfg.Name, err)
	}
	return nil
}

// RaiseFence raises the fence of key's bucket to f (f > 0), never lowering
// it: once it returns nil, every take of this bucket on key (a lease take
// included) with a lower Item.Fence has either landed (a Get afterwards
// shows it) or is refused with an error wrapping storage.ErrFenced. The
// key is the one AllowN and Get use; the fence is kept at least the
// bucket's TTL. It refuses a store that does not fence buckets
// (ErrInvalidConfig).
func (b *TokenBucket) RaiseFence(ctx context.Context, key string, f int64) error {
	if f <= 0 {
		return fmt.Errorf("%w: limit %q: a fence must be positive, got %d", ErrInvalidConfig, b.cfg.Name, f)
	}
	fs, err := b.fencer()
	if err != nil {
		return err
	}
	if err := fs.RaiseFence(ctx, storage.Key{Space: b.space, Name: key}, f, b.ttl); err != nil {
		return fmt.Errorf("limiter: token bucket %q: raise fence: %w", b.cfg.Name, err)
	}
	return nil
}
