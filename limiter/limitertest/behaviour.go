package limitertest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// testConcurrency: 64 goroutines on one hot key. Exact algorithms allow
// exactly their limit; the windows never allow more, and once the storm is
// over sequential requests top the count up to exactly the limit (refunds of
// concurrent denials lose nothing).
func testConcurrency(t *testing.T, s Store) {
	const workers = 64
	t.Run("TokenBucket", func(t *testing.T) {
		b := bucket(t, s, limiter.TokenBucketConfig{MaxAmount: 50, RefillTime: time.Hour})
		if n := Hammer(t, b, Key(t), Base, workers, 3); n != 50 {
			t.Fatalf("%d allowed, want exactly 50", n)
		}
	})
	// A log's writes are conditioned on its version: one writer of a
	// round wins, so its storm costs about writers x limit requests. 16
	// writers (128 calls, as 64 x 2) are still a storm on one item; 64
	// ran out their deadlines on a loaded host (see hammerTimeout).
	t.Run("SlidingLog", func(t *testing.T) {
		l := slidingLog(t, s, limiter.SlidingLogConfig{Limit: 20, Window: time.Hour})
		if n := Hammer(t, l, Key(t), Base, 16, 8); n != 20 {
			t.Fatalf("%d allowed, want exactly 20", n)
		}
	})
	windows := map[string]limiter.Limiter{
		"FixedWindow":         fixed(t, s, limiter.FixedWindowConfig{Limit: 50, Window: time.Hour}),
		"SlidingBounded":      sliding(t, s, limiter.SlidingWindowConfig{Limit: 50, Window: time.Hour, SubWindows: 4}),
		"SlidingInterpolated": sliding(t, s, limiter.SlidingWindowConfig{Limit: 50, Window: time.Hour, SubWindows: 4, Estimator: limiter.Interpolated}),
	}
	for name, w := range windows {
		t.Run(name, func(t *testing.T) {
			key := Key(t)
			n := Hammer(t, w, key, Base, workers, 3)
			if n > 50 || n == 0 {
				t.Fatalf("%d allowed under contention, want 1..50", n)
			}
			n += int64(countAllowed(t, w, key, Base, 60))
			if n != 50 {
				t.Fatalf("%d allowed in all, want exactly 50", n)
			}
		})
	}
	t.Run("Stack", func(t *testing.T) {
		a := fixed(t, s, limiter.FixedWindowConfig{Name: "a", Limit: 30, Window: time.Hour})
		b := bucket(t, s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 40, RefillTime: time.Hour})
		st, err := limiter.NewStack(b, a)
		if err != nil {
			t.Fatal(err)
		}
		key := Key(t)
		n := Hammer(t, st, key, Base, workers, 2)
		n += int64(countAllowed(t, st, key, Base, 40))
		if n != 30 {
			t.Fatalf("%d allowed, want exactly 30", n)
		}
		// The bucket got back what the window denied.
		if d, err := b.Get(ctx(t), key, Base); err != nil || d.Remaining != 10 {
			t.Fatalf("bucket after the stack: %+v, %v; want 10 tokens left", d, err)
		}
	})
}

// testHostileKeys: keys with spaces, CR/LF and protocol commands, 10 KB,
// invalid UTF-8, NUL bytes and the empty key are each their own key.
func testHostileKeys(t *testing.T, s Store) {
	keys := []string{
		"", " ", "a b", "a\r\nflush_all", "a\r\nflush_all\r\n", "a\r\nset x 0 0 1\r\n1\r\n",
		"\x00", "a\x00b", "a\x00c", "\xff\xfe\xfd", "ünïcödé", "a\tb", "a\nb",
		strings.Repeat("k", 250), strings.Repeat("k", 251), strings.Repeat("k", 10<<10), strings.Repeat("k", 10<<10-1) + "l",
	}
	b, w := hostileLimits(t, s)
	for _, l := range []limiter.Limiter{b, w} {
		for i, k := range keys {
			if d := allow(t, l, k, Base, 1); !d.Allowed {
				t.Fatalf("%T: key %d (%.20q) was already used: it collides with another key", l, i, k)
			}
		}
		for i, k := range keys {
			if d := allow(t, l, k, Base, 1); d.Allowed {
				t.Fatalf("%T: key %d (%.20q) allowed twice: its state was lost", l, i, k)
			}
		}
	}
}

// hostileLimits returns a bucket and a fixed window in a fresh key space
// per run (the refill time is part of the key), so that the fixed key
// names start fresh on a long-lived server too. A store that keeps the
// limits of one key in one item may refuse two spaces it cannot tell
// apart there (DynamoDB's 2-character attribute prefixes): such a pair,
// found on a probe key, is drawn again.
func hostileLimits(t *testing.T, s Store) (*limiter.TokenBucket, *limiter.FixedWindow) {
	for attempt := 0; ; attempt++ {
		unique := time.Hour + time.Duration(time.Now().UnixNano()%1e9)
		b := bucket(t, s, limiter.TokenBucketConfig{MaxAmount: 1, RefillTime: unique})
		w := fixed(t, s, limiter.FixedWindowConfig{Limit: 1, Window: unique.Truncate(time.Millisecond)})
		probe := Key(t)
		_, errB := b.AllowN(context.Background(), probe, Base, 1)
		_, errW := w.AllowN(context.Background(), probe, Base, 1)
		if attempt < 5 && (errors.Is(errB, limiter.ErrInvalidConfig) || errors.Is(errW, limiter.ErrInvalidConfig)) {
			continue
		}
		if errB != nil || errW != nil {
			t.Fatalf("probe: %v; %v", errB, errW)
		}
		return b, w
	}
}

func testBadArguments(t *testing.T, s Store) {
	b := bucket(t, s, limiter.TokenBucketConfig{MaxAmount: 5, RefillTime: time.Hour})
	sw := sliding(t, s, limiter.SlidingWindowConfig{Limit: 5, Window: time.Minute})
	fw := fixed(t, s, limiter.FixedWindowConfig{Limit: 5, Window: time.Minute})
	sl := slidingLog(t, s, limiter.SlidingLogConfig{Limit: 5, Window: time.Minute})
	for _, l := range []limiter.Limiter{b, sw, fw, sl} {
		key := Key(t)
		for _, n := range []int64{0, -1, 6, 1 << 62} {
			if _, err := l.AllowN(ctx(t), key, Base, n); !isInvalidCost(err) {
				t.Fatalf("%T: AllowN with cost %d: error %v, want ErrInvalidCost", l, n, err)
			}
			if err := l.Refund(ctx(t), key, Base, n); !isInvalidCost(err) {
				t.Fatalf("%T: Refund with cost %d: error %v, want ErrInvalidCost", l, n, err)
			}
		}
		// A cancelled call fails and changes nothing.
		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := l.AllowN(cancelled, key, Base, 5); !errors.Is(err, context.Canceled) {
			t.Fatalf("%T: AllowN on a cancelled context: %v, want context.Canceled", l, err)
		}
		// Nothing was consumed by any of the above.
		if d := allow(t, l, key, Base, 5); !d.Allowed {
			t.Fatalf("%T: after bad calls the full limit is not available: %+v", l, d)
		}
	}
}
