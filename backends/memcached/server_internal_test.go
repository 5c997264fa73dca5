package memcached

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
)

func testStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	if len(cfg.Addrs) == 0 {
		cfg.Addrs = []string{testserver.Memcached(t)}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	cfg.MaxIdleConns = 256
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func uniqueName(t testing.TB) string {
	return strings.ReplaceAll(t.Name(), "/", ".") + "." + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// TestBoundaryGuard puts the Store's clock a millisecond before a sub-window
// boundary and has 64 goroutines decide at once, half in the ending
// sub-window and half in the next. With the guard, the bounded sliding
// window never allows more than its limit over the two; without it (one
// round trip always) it can, and the overshoot is logged.
func TestBoundaryGuard(t *testing.T) {
	const limit, k, workers = 40, 4, 64
	sub := 15 * time.Second
	boundary := time.Now().Truncate(sub).Add(sub)
	for _, c := range []struct {
		name  string
		guard time.Duration
	}{{"Guarded", 0}, {"OneTrip", -1}} {
		t.Run(c.name, func(t *testing.T) {
			s := testStore(t, Config{BoundaryGuard: c.guard})
			s.now = func() time.Time { return boundary.Add(-time.Millisecond) }
			w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: limit, Window: k * sub, SubWindows: k})
			if err != nil {
				t.Fatal(err)
			}
			worst := int64(0)
			for round := range 10 {
				key := uniqueName(t)
				var total atomic.Int64
				var wg sync.WaitGroup
				start := make(chan struct{})
				errs := make(chan error, workers)
				for i := range workers {
					at := boundary.Add(-time.Millisecond)
					if i%2 == 1 {
						at = boundary
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						for range 2 {
							d, err := w.Allow(context.Background(), key, at)
							if err != nil {
								errs <- err
								return
							}
							if d.Allowed {
								total.Add(1)
							}
						}
					}()
				}
				close(start)
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				worst = max(worst, total.Load()-limit)
				if c.guard >= 0 && total.Load() > limit {
					t.Fatalf("round %d: %d allowed across the boundary, limit %d", round, total.Load(), limit)
				}
			}
			t.Logf("largest overshoot in 10 rounds of %d racing requests: %d", 2*workers, max(worst, 0))
		})
	}
}

func TestOneTrip(t *testing.T) {
	sub := 10 * time.Second
	start := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	cur := start.UnixNano() / int64(sub)
	s := &Store{guard: time.Second}
	for _, c := range []struct {
		clock time.Duration // Store's clock, from the start of sub-window cur
		span  int
		ttl   time.Duration
		want  bool
	}{
		{5 * time.Second, 5, 5 * sub, true},
		{time.Second, 5, 5 * sub, true},
		{time.Second - 1, 5, 5 * sub, false},   // just began
		{9 * time.Second, 5, 5 * sub, false},   // about to end
		{9*time.Second - 1, 5, 5 * sub, true},  // 1s+1ns before the end
		{-time.Second, 5, 5 * sub, false},      // the caller is ahead of us
		{15 * time.Second, 5, 5 * sub, false},  // the caller is behind
		{5 * time.Second, 5, 5*sub + 1, false}, // not span sub-windows: unknown length
		{5 * time.Second, 1, sub, true},        // a fixed window never needs two trips
		{-time.Hour, 1, sub, true},             // ... whatever the clock
		{5 * time.Second, 5, 0, false},         // no TTL: unknown length
	} {
		s.now = func() time.Time { return start.Add(c.clock) }
		if got := s.oneTrip(cur, c.span, c.ttl); got != c.want {
			t.Errorf("clock %v span %d ttl %v: oneTrip %v, want %v", c.clock, c.span, c.ttl, got, c.want)
		}
	}
	s.guard = -1
	s.now = func() time.Time { return start }
	if !s.oneTrip(cur, 5, 5*sub) {
		t.Error("guard off: two trips")
	}
}

// rawCommand sends one command line to addr and returns the reply up to and
// including the line that ends it.
func rawCommand(t testing.TB, addr, cmd string, ends ...string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var b strings.Builder
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: %v (read %q)", cmd, err, b.String())
		}
		b.WriteString(line)
		for _, e := range ends {
			if strings.HasPrefix(line, e) {
				return b.String()
			}
		}
	}
}

// ttlOnServer returns the seconds left before key expires, from the meta get
// command ("mg <key> t"): -1 for no expiry; it fails the test on a miss.
func ttlOnServer(t testing.TB, addr, key string) int {
	t.Helper()
	reply := rawCommand(t, addr, "mg "+key+" t", "HD", "EN", "ERROR", "CLIENT_ERROR")
	for _, f := range strings.Fields(reply)[1:] {
		if v, ok := strings.CutPrefix(f, "t"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("mg %s: %q", key, reply)
			}
			return n
		}
	}
	t.Fatalf("mg %s: %q, want HD t<seconds>", key, reply)
	return 0
}

// TestExpirySetOnServer reads an item's expiry back: window plus one
// sub-window, rounded up to a second, plus jitter.
func TestExpirySetOnServer(t *testing.T) {
	addr := testserver.Memcached(t)
	s := testStore(t, Config{Addrs: []string{addr}, Jitter: -1})
	k := limiter.Key{Space: "sw:test", Name: uniqueName(t)}
	if _, err := s.Add(context.Background(), k, 7, 5, 1, 12500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if ttl := ttlOnServer(t, addr, counterKey(s.keys.base(k), 7)); ttl != 13 && ttl != 12 {
		t.Fatalf("counter expires in %ds, want 13 (12.5s rounded up; 12 if a second passed)", ttl)
	}
	// A bucket whose TTL is beyond 30 days gets an absolute time (not one
	// in 1970, which would expire it at once).
	b, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 40, RefillTime: 24 * time.Hour})
	bk := uniqueName(t)
	if d, err := b.Allow(context.Background(), bk, time.Now()); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	ttl := ttlOnServer(t, addr, bucketKey(s.keys.base(limiter.Key{Space: b.Space(), Name: bk})))
	if want := 41 * 24 * 3600; ttl < want-5 || ttl > want+5 {
		t.Fatalf("bucket with a 41-day TTL expires in %ds, want about %d", ttl, want)
	}
}

func TestCorruptState(t *testing.T) {
	addr := testserver.Memcached(t)
	s := testStore(t, Config{Addrs: []string{addr}})
	mc := memcache.New(addr)
	ctx := context.Background()

	b, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 5, RefillTime: time.Minute})
	name := uniqueName(t)
	key := bucketKey(s.keys.base(limiter.Key{Space: b.Space(), Name: name}))
	for _, v := range []string{"garbage", "B", "L\x02\x04"} {
		if err := mc.Set(&memcache.Item{Key: key, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Allow(ctx, name, time.Now()); !errors.Is(err, limiter.ErrCorruptState) {
			t.Fatalf("bucket value %q: %v, want ErrCorruptState", v, err)
		}
	}

	l, _ := limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Limit: 5, Window: time.Minute})
	lname := uniqueName(t) + "log"
	lkey := logKey(s.keys.base(limiter.Key{Space: "sl:5:1m0s", Name: lname}))
	for _, v := range []string{"garbage", "L\x05\x02", "B\x02\x02"} {
		if err := mc.Set(&memcache.Item{Key: lkey, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Allow(ctx, lname, time.Now()); !errors.Is(err, limiter.ErrCorruptState) {
			t.Fatalf("log value %q: %v, want ErrCorruptState", v, err)
		}
	}

	// A counter that is not a number: incr refuses, get-multi cannot parse.
	k := limiter.Key{Space: "sw:test", Name: uniqueName(t)}
	base := s.keys.base(k)
	mc.Set(&memcache.Item{Key: counterKey(base, 10), Value: []byte("x")})
	if _, err := s.Add(ctx, k, 10, 3, 1, time.Minute); !errors.Is(err, limiter.ErrCorruptState) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("incr of a non-number: %v, want ErrCorruptState only", err)
	}
	if _, err := s.Add(ctx, k, 11, 3, 1, time.Minute); !errors.Is(err, limiter.ErrCorruptState) {
		t.Fatalf("get-multi of a non-number: %v, want ErrCorruptState", err)
	}
}

// TestCASConflict: a server where every cas loses gives ErrConflict after
// MaxRetries, and never a decision.
func TestCASConflict(t *testing.T) {
	var cas atomic.Int64
	addr := startFake(t, func(line string, r *bufio.Reader) string {
		f := strings.Fields(line)
		switch f[0] {
		case "gets":
			v := string(encodeBucket(limiter.BucketState{Tokens: 1, Updated: 1}))
			return fmt.Sprintf("VALUE %s 0 %d 42\r\n%s\r\nEND\r\n", f[1], len(v), v)
		case "cas":
			n, _ := strconv.Atoi(f[4])
			r.Discard(n + 2)
			cas.Add(1)
			return "EXISTS\r\n"
		}
		return "ERROR\r\n"
	})
	s, err := New(Config{Addrs: []string{addr}, MaxRetries: 3, RetryBackoff: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 5, RefillTime: time.Minute})
	_, err = b.Allow(context.Background(), "k", time.Unix(100, 0))
	if !errors.Is(err, limiter.ErrConflict) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("endless CAS conflicts: %v, want ErrConflict", err)
	}
	if got := cas.Load(); got != 4 {
		t.Fatalf("%d cas attempts, want 1 + MaxRetries = 4", got)
	}
	// Retries also stop at the deadline.
	s.maxRetries = 1 << 30
	s.backoff = 10 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = b.Allow(ctx, "k", time.Unix(100, 0))
	if !errors.Is(err, limiter.ErrConflict) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("endless CAS conflicts within a deadline: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("gave up after %v, deadline 100ms", el)
	}
}

// TestCachedItemSkipsTheRead: after a read that wrote nothing (a peek), the
// next update of the key writes with cas on the cached CAS id, without a
// gets; a stale cached item costs one failed cas and a re-read, and no
// update is lost.
func TestCachedItemSkipsTheRead(t *testing.T) {
	addr := testserver.Memcached(t)
	var gets atomic.Int64
	// Count gets by proxying the real server.
	proxy := startFake(t, func(line string, r *bufio.Reader) string {
		f := strings.Fields(line)
		req := line + "\r\n"
		if f[0] == "gets" {
			gets.Add(1)
		}
		if f[0] == "cas" || f[0] == "add" || f[0] == "set" {
			n, _ := strconv.Atoi(f[4])
			data := make([]byte, n+2)
			if _, err := io.ReadFull(r, data); err != nil {
				return ""
			}
			req += string(data)
		}
		return forward(t, addr, req)
	})
	s := testStore(t, Config{Addrs: []string{proxy}})
	other := testStore(t, Config{Addrs: []string{addr}})
	cfg := limiter.TokenBucketConfig{MaxAmount: 10, RefillTime: time.Hour}
	b, _ := limiter.NewTokenBucket(s, cfg)
	ob, _ := limiter.NewTokenBucket(other, cfg)
	ctx, now, key := context.Background(), time.Now(), uniqueName(t)

	if d, err := b.Allow(ctx, key, now); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	if d, err := b.Get(ctx, key, now); err != nil || d.Remaining != 9 {
		t.Fatal(d, err)
	}
	before := gets.Load()
	if d, err := b.Allow(ctx, key, now); err != nil || d.Remaining != 8 {
		t.Fatal(d, err)
	}
	if n := gets.Load() - before; n != 0 {
		t.Fatalf("warm key: %d gets, want 0", n)
	}
	// Make the cache stale: peek (cache), then another client takes one.
	b.Get(ctx, key, now)
	if d, err := ob.Allow(ctx, key, now); err != nil || d.Remaining != 7 {
		t.Fatal(d, err)
	}
	if d, err := b.Allow(ctx, key, now); err != nil || d.Remaining != 6 {
		t.Fatalf("after a stale cache: %+v, %v; want 6 remaining (no lost update)", d, err)
	}
	// A decision that writes nothing is never made on a cached item.
	b.Get(ctx, key, now)
	for range 6 {
		ob.Allow(ctx, key, now)
	}
	if d, err := b.Get(ctx, key, now); err != nil || d.Remaining != 0 || d.Allowed {
		t.Fatalf("peek after another client emptied the bucket: %+v, %v", d, err)
	}
}

// forward sends req to addr and returns the reply (one line, or a get
// response up to END).
func forward(t testing.TB, addr, req string) string {
	first, _, _ := strings.Cut(req, " ")
	ends := []string{"STORED", "NOT_STORED", "EXISTS", "NOT_FOUND", "ERROR", "CLIENT_ERROR", "SERVER_ERROR"}
	if first == "gets" || first == "get" {
		ends = []string{"END", "ERROR"}
	}
	return rawCommand(t, addr, strings.TrimSuffix(req, "\r\n"), ends...)
}
