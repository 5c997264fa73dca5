package memcached

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

var (
	_ storage.Resetter  = (*Store)(nil)
	_ storage.LogReader = (*Store)(nil)
)

const (
	// maxResetKeys bounds the items one Reset deletes.
	maxResetKeys = 8192
	// resetChunk is the deletes sent before their replies are read, so
	// that neither side's socket buffer fills while the other waits.
	resetChunk = 256
)

// Reset implements [storage.Resetter]: it deletes the limit's items of k
// on k's node, pipelined on one connection (one round trip per 256
// items): the bucket ("|b") or log ("|l") item, or every window counter
// that may be in view. memcached cannot list keys, so a window's counters
// are named the way Add and AddPacked name them, for the sub-windows
// (slots) op.From to op.To, From widened by what an item may outlive its
// TTL (Config.Jitter and the expiry slack of whole seconds); a packed
// window's are the counters of every level covering those slots. A
// counter outside them is out of view of any writer whose clock is within
// a window of the caller's. Missing items are fine (NOT_FOUND).
//
// Under concurrency (see [storage.Resetter]): a window request whose incr
// ran before the delete is forgotten, one after it counts in a counter
// it creates again; a bucket or log write conditioned on the deleted
// item's CAS id fails (NOT_FOUND) and is retried on a new one.
func (s *Store) Reset(ctx context.Context, k storage.Key, op *storage.ResetOp) error {
	if err := ctx.Err(); err != nil {
		return errorf("reset", err)
	}
	base, keys, err := s.resetKeys(k, op)
	if err != nil {
		return err
	}
	addr, err := s.ring.pickTag(base)
	if err != nil {
		return errorf("reset", err)
	}
	err = s.pool.exec(ctx, addr, func(pc *pconn) error {
		for rest := keys; len(rest) > 0; {
			n := min(len(rest), resetChunk)
			for _, key := range rest[:n] {
				pc.w.WriteString("delete ")
				pc.w.WriteString(key)
				pc.w.WriteString("\r\n")
			}
			if err := pc.w.Flush(); err != nil {
				return err
			}
			for range n {
				line, err := pc.r.ReadSlice('\n')
				if err != nil {
					return err
				}
				if s := string(line); s != "DELETED\r\n" && s != "NOT_FOUND\r\n" {
					return replyError("delete", line)
				}
			}
			rest = rest[n:]
		}
		return nil
	})
	// This Store's own memory of the items: the CAS id of a bucket or
	// log, and the window counters it knows to exist.
	if op.Kind == storage.StepBucket || op.Kind == storage.StepLog {
		s.cache.drop(keys[0])
	} else {
		s.keys.forget(k)
	}
	if err != nil {
		return errorf("reset", err)
	}
	return nil
}

// resetKeys returns the base of k for op's kind and the items to delete.
func (s *Store) resetKeys(k storage.Key, op *storage.ResetOp) (string, []string, error) {
	if op == nil {
		return "", nil, fmt.Errorf("memcached: bad reset: nil op")
	}
	switch op.Kind {
	case storage.StepBucket:
		base := s.keys.base(k)
		return base, []string{bucketKey(base)}, nil
	case storage.StepLog:
		base := s.keys.base(k)
		return base, []string{logKey(base)}, nil
	case storage.StepAdd, storage.StepPackedAdd:
	default:
		return "", nil, fmt.Errorf("memcached: bad reset: kind %v", op.Kind)
	}
	if op.Unit <= 0 || op.To < op.From {
		return "", nil, fmt.Errorf("memcached: bad reset: sub-windows %d to %d of %v", op.From, op.To, op.Unit)
	}
	// An item lives up to its TTL rounded up to whole seconds, plus the
	// jitter, plus expirySlack seconds (see expiration): older counters
	// of that many units may still be read by a late writer.
	extra := s.jitter + (expirySlack+1)*time.Second
	w := *op
	w.From -= int64((extra + op.Unit - 1) / op.Unit)
	if op.Kind == storage.StepAdd {
		if w.To-w.From >= maxResetKeys {
			return "", nil, fmt.Errorf("memcached: bad reset: %d sub-windows, at most %d", w.To-w.From+1, maxResetKeys)
		}
		base := s.keys.base(k)
		keys := make([]string, 0, w.To-w.From+1)
		for idx := w.From; idx <= w.To; idx++ {
			keys = append(keys, counterKey(base, idx))
		}
		return base, keys, nil
	}
	base := s.keys.packedBase(k)
	var keys []string
	for l := 1; l <= storage.PackedLevels; l++ {
		first, last := w.Cells(l)
		if last-first >= maxResetKeys || len(keys)+int(last-first+1) > maxResetKeys {
			return "", nil, fmt.Errorf("memcached: bad reset: slots %d to %d name more than %d counters", w.From, w.To, maxResetKeys)
		}
		for i := first; i <= last; i++ {
			keys = append(keys, string(appendPackedKey(nil, base, storage.PackedCell{Level: uint8(l), Index: i})))
		}
	}
	return base, keys, nil
}

// forget drops what the known-counter cache holds of k.
func (kr keyer) forget(k storage.Key) {
	c := kr.known
	if c == nil {
		return
	}
	sh := c.shard(k)
	sh.mu.Lock()
	delete(sh.m, k)
	sh.mu.Unlock()
}

// ReadLog implements [storage.LogReader]: a fresh gets of k's log item,
// decoded (nil when there is none). It writes nothing.
func (s *Store) ReadLog(ctx context.Context, k storage.Key) ([]int64, error) {
	key := logKey(s.keys.base(k))
	s.refunds.Wait(ctx, key) //nolint:errcheck // the read reports ctx's end
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	it, err := s.casLoop().read(ctx, key)
	if err != nil {
		return nil, errorf("log: gets", err)
	}
	if it.Key == "" {
		return nil, nil
	}
	if len(it.Value) == 0 || it.Value[0] != formatLog {
		return nil, errorf("log", fmt.Errorf("%w: not a sliding log value", storage.ErrCorruptState))
	}
	entries, err := storage.ParseLog(it.Value[1:], nil)
	if err != nil {
		return nil, errorf("log", err)
	}
	return entries, nil
}
