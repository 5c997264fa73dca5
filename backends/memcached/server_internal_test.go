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
	"github.com/sluicehq/sluice/limiter/storage"
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

// TestExpirySetOnServer reads an item's expiry back: an absolute time, the
// TTL rounded up to a second plus expirySlack, as memcached's whole-second
// clock reads it (up to 2 s either way: the client's truncation, the
// server's tick).
func TestExpirySetOnServer(t *testing.T) {
	addr := testserver.Memcached(t)
	s := testStore(t, Config{Addrs: []string{addr}, Jitter: -1})
	k := storage.Key{Space: "sw:test", Name: uniqueName(t)}
	if _, err := s.Add(context.Background(), k, 7, 5, 1, 12500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if ttl, want := ttlOnServer(t, addr, counterKey(s.keys.base(k), 7)), 13+expirySlack; ttl < want-2 || ttl > want+2 {
		t.Fatalf("counter expires in %ds, want %d (12.5s rounded up, plus %d) within 2 s", ttl, want, expirySlack)
	}
	// A bucket whose TTL is beyond 30 days gets an absolute time (not one
	// in 1970, which would expire it at once).
	b, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 40, RefillTime: 24 * time.Hour})
	bk := uniqueName(t)
	if d, err := b.Allow(context.Background(), bk, time.Now()); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	ttl := ttlOnServer(t, addr, bucketKey(s.keys.base(storage.Key{Space: b.Space(), Name: bk})))
	if want := 41 * 24 * 3600; ttl < want-5 || ttl > want+5 {
		t.Fatalf("bucket with a 41-day TTL expires in %ds, want about %d", ttl, want)
	}
}

// TestExpiryAfterStall: counters written right after memcached resumes
// from a stall live their TTL. memcached's own clock, which a timer on its
// main thread moves once a second, is behind when a stopped server
// resumes, and its worker threads serve the requests that waited before
// that timer runs: a relative expiry set then expired as soon as the
// clock caught up, and a window whose counter vanishes admits up to its
// limit again. With the relative expiries of before, this test lost 8 to
// 188 counters in each of 3 runs with a 5 s stall (4 of 5 runs failed
// with a 3 s one); expiration's absolute times lose none. The server is
// private (stopped with SIGSTOP by its PID for 5 s), with 16 worker
// threads to serve the waiting requests.
func TestExpiryAfterStall(t *testing.T) {
	srv := testserver.StartMemcached(t, "-t", "16")
	s := testStore(t, Config{Addrs: []string{srv.Addr()}, Jitter: -1})
	ctx := context.Background()
	const (
		ttl     = 2 * time.Second
		writers = 64
	)
	// A warm pooled connection per writer: their adds wait in
	// established sockets during the stall.
	var warm sync.WaitGroup
	for w := range writers {
		warm.Go(func() {
			if _, err := s.Add(ctx, storage.Key{Space: "sw:stall", Name: fmt.Sprint(uniqueName(t), "-warm-", w)}, 1, 1, 1, ttl); err != nil {
				t.Error(err)
			}
		})
	}
	warm.Wait()
	if t.Failed() {
		return
	}
	// The writers start in the stall's last 0.5 s and go on for 100 ms
	// after it.
	srv.Pause()
	time.Sleep(4500 * time.Millisecond)
	var (
		mu      sync.Mutex
		keys    []string
		wg      sync.WaitGroup
		resumed atomic.Int64
	)
	for w := range writers {
		wg.Go(func() {
			for i := 0; ; i++ {
				if r := resumed.Load(); r != 0 && time.Since(time.Unix(0, r)) > 100*time.Millisecond {
					return
				}
				k := storage.Key{Space: "sw:stall", Name: fmt.Sprint(uniqueName(t), "-", w, "-", i)}
				if _, err := s.Add(ctx, k, 7, 1, 1, ttl); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				keys = append(keys, counterKey(s.keys.base(k), 7))
				mu.Unlock()
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	resumed.Store(time.Now().UnixNano())
	srv.Resume()
	wg.Wait()
	if t.Failed() {
		return
	}
	time.Sleep(500 * time.Millisecond) // well inside the TTL
	mc := memcache.New(srv.Addr())
	var lost []string
	for _, key := range keys {
		_, err := mc.Get(key)
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			lost = append(lost, key)
		case err != nil:
			t.Fatal(err)
		}
	}
	t.Logf("%d counters written by %d writers from a 5 s stall's last 0.5 s to 100 ms after it; %d gone 0.5 s later (TTL %v)", len(keys), writers, len(lost), ttl)
	if len(lost) > 0 {
		t.Fatalf("%d of %d counters written around the stall's end expired within a quarter of their TTL, first %s", len(lost), len(keys), lost[0])
	}
}

func TestCorruptState(t *testing.T) {
	addr := testserver.Memcached(t)
	s := testStore(t, Config{Addrs: []string{addr}})
	mc := memcache.New(addr)
	ctx := context.Background()

	b, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 5, RefillTime: time.Minute})
	name := uniqueName(t)
	key := bucketKey(s.keys.base(storage.Key{Space: b.Space(), Name: name}))
	for _, v := range []string{"garbage", "B", "L\x02\x04"} {
		if err := mc.Set(&memcache.Item{Key: key, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Allow(ctx, name, time.Now()); !errors.Is(err, storage.ErrCorruptState) {
			t.Fatalf("bucket value %q: %v, want ErrCorruptState", v, err)
		}
	}

	l, _ := limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Limit: 5, Window: time.Minute})
	lname := uniqueName(t) + "log"
	lkey := logKey(s.keys.base(storage.Key{Space: "sl:5:1m0s", Name: lname}))
	for _, v := range []string{"garbage", "L\x05\x02", "B\x02\x02"} {
		if err := mc.Set(&memcache.Item{Key: lkey, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Allow(ctx, lname, time.Now()); !errors.Is(err, storage.ErrCorruptState) {
			t.Fatalf("log value %q: %v, want ErrCorruptState", v, err)
		}
	}

	// A counter that is not a number: incr refuses, get-multi cannot parse.
	k := storage.Key{Space: "sw:test", Name: uniqueName(t)}
	base := s.keys.base(k)
	mc.Set(&memcache.Item{Key: counterKey(base, 10), Value: []byte("x")})
	if _, err := s.Add(ctx, k, 10, 3, 1, time.Minute); !errors.Is(err, storage.ErrCorruptState) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("incr of a non-number: %v, want ErrCorruptState only", err)
	}
	if _, err := s.Add(ctx, k, 11, 3, 1, time.Minute); !errors.Is(err, storage.ErrCorruptState) {
		t.Fatalf("get-multi of a non-number: %v, want ErrCorruptState", err)
	}
}

// TestCASConflict: a server where every cas loses gives ErrConflict after
// MaxRetries, and never a decision.
func TestCASConflict(t *testing.T) {
	var cas atomic.Int64
	addr := conflictServer(t, &cas, func(int64) {})
	s, err := New(Config{Addrs: []string{addr}, MaxRetries: 3, RetryBackoff: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// UpdateBucket's own loop (the batch path's fallback), not Do. No deny
	// cache: a decision lost to conflicts is a denial it would remember.
	b, _ := limiter.NewTokenBucket(singleStep{s}, limiter.TokenBucketConfig{MaxAmount: 5, RefillTime: time.Minute, NoDenyCache: true})
	_, err = b.Allow(context.Background(), "k", time.Unix(100, 0))
	if !errors.Is(err, storage.ErrConflict) || errors.Is(err, ErrUnavailable) {
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
	if !errors.Is(err, storage.ErrConflict) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("endless CAS conflicts within a deadline: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("gave up after %v, deadline 100ms", el)
	}
}

// conflictServer is a fake memcached whose every cas loses (EXISTS): its
// gets return a bucket, and each cas is counted in cas, then passed to
// before (with its count) before the answer.
func conflictServer(t *testing.T, cas *atomic.Int64, before func(n int64)) string {
	return startFake(t, func(line string, r *bufio.Reader) string {
		f := strings.Fields(line)
		switch f[0] {
		case "gets":
			v := string(encodeBucket(storage.BucketState{Tokens: 1, Updated: 1}))
			return fmt.Sprintf("VALUE %s 0 %d 42\r\n%s\r\nEND\r\n", f[1], len(v), v)
		case "cas":
			n, _ := strconv.Atoi(f[4])
			r.Discard(n + 2)
			before(cas.Add(1))
			return "EXISTS\r\n"
		}
		return "ERROR\r\n"
	})
}

// TestCASConflictDeadlineInWrite: lost races, then the deadline strikes
// while a write is in flight (the server answers the third cas after
// it): the error wraps storage.ErrConflict as well as the deadline, as it
// does when the deadline strikes in a read or a backoff. (Before, only
// the deadline: seen under load in TestCASConflict.)
func TestCASConflictDeadlineInWrite(t *testing.T) {
	var cas atomic.Int64
	addr := conflictServer(t, &cas, func(n int64) {
		if n == 3 {
			time.Sleep(300 * time.Millisecond)
		}
	})
	s, err := New(Config{Addrs: []string{addr}, MaxRetries: 100, RetryBackoff: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b, _ := limiter.NewTokenBucket(singleStep{s}, limiter.TokenBucketConfig{MaxAmount: 5, RefillTime: time.Minute, NoDenyCache: true})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = b.Allow(ctx, "k", time.Unix(100, 0))
	if !errors.Is(err, storage.ErrConflict) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lost races, then the deadline in a write: %v, want ErrConflict and DeadlineExceeded", err)
	}
	if got := cas.Load(); got != 3 {
		t.Fatalf("%d cas attempts, want 3 (the third outlives the deadline)", got)
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
	// UpdateBucket's own loop (the batch path's fallback), not Do.
	b, _ := limiter.NewTokenBucket(singleStep{s}, cfg)
	ob, _ := limiter.NewTokenBucket(singleStep{other}, cfg)
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

// TestWindowPipelineAgainstFakes: replies a real server never sends, and the
// rare counter that vanishes between add and incr.
func TestWindowPipelineAgainstFakes(t *testing.T) {
	k := storage.Key{Space: "sw", Name: "k"}
	base := "k:sw/k"
	for _, c := range []struct {
		name    string
		reply   func(cmd string, incrs int) string // reply to add, incr or get
		wantErr error                              // nil: success
		want    storage.Counts
	}{
		{"Normal", func(cmd string, _ int) string {
			switch cmd {
			case "add":
				return "NOT_STORED\r\n"
			case "incr":
				return "7\r\n"
			}
			return "VALUE " + base + "|c11 0 1\r\n2\r\nVALUE " + base + "|c9 0 3\r\n5  \r\nVALUE " + base + "|c8 0 1\r\n1\r\nEND\r\n"
		}, nil, storage.Counts{C: [storage.MaxSpan]int64{7, 5, 1}, Later: 2}},
		{"VanishesOnce", func(cmd string, incrs int) string {
			switch {
			case cmd == "add":
				return "STORED\r\n"
			case cmd == "incr" && incrs == 1:
				return "NOT_FOUND\r\n"
			case cmd == "incr":
				return "1\r\n"
			}
			return "END\r\n"
		}, nil, storage.Counts{C: [storage.MaxSpan]int64{1}}},
		{"KeepsVanishing", func(cmd string, _ int) string {
			switch cmd {
			case "add":
				return "STORED\r\n"
			case "incr":
				return "NOT_FOUND\r\n"
			}
			return "END\r\n"
		}, storage.ErrConflict, storage.Counts{}},
		{"OutOfMemory", func(cmd string, _ int) string {
			if cmd == "add" {
				return "SERVER_ERROR out of memory storing object\r\n"
			}
			return "END\r\n"
		}, ErrUnavailable, storage.Counts{}},
		{"NotANumber", func(cmd string, _ int) string {
			switch cmd {
			case "add":
				return "NOT_STORED\r\n"
			case "incr":
				return "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
			}
			return "END\r\n"
		}, storage.ErrCorruptState, storage.Counts{}},
		{"ForeignKeyInReply", func(cmd string, _ int) string {
			switch cmd {
			case "add":
				return "NOT_STORED\r\n"
			case "incr":
				return "1\r\n"
			}
			return "VALUE other|c9 0 1\r\n1\r\nEND\r\n"
		}, ErrUnavailable, storage.Counts{}},
		{"SubWindowNotAsked", func(cmd string, _ int) string {
			switch cmd {
			case "add":
				return "NOT_STORED\r\n"
			case "incr":
				return "1\r\n"
			}
			return "VALUE " + base + "|c10 0 1\r\n1\r\nEND\r\n" // cur itself: incremented, not read
		}, ErrUnavailable, storage.Counts{}},
		{"HugeValue", func(cmd string, _ int) string {
			switch cmd {
			case "add":
				return "NOT_STORED\r\n"
			case "incr":
				return "1\r\n"
			}
			return "VALUE " + base + "|c9 0 99999999\r\n"
		}, ErrUnavailable, storage.Counts{}},
		{"Truncated", func(cmd string, _ int) string {
			switch cmd {
			case "add":
				return "NOT_STORED\r\n"
			case "incr":
				return "1\r\n"
			}
			return "VALUE " + base + "|c9 0 5\r\n1"
		}, ErrUnavailable, storage.Counts{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			incrs := 0
			addr := startFake(t, func(line string, r *bufio.Reader) string {
				mu.Lock()
				defer mu.Unlock()
				cmd, _, _ := strings.Cut(line, " ")
				switch cmd {
				case "add":
					r.ReadString('\n') // the data block
				case "incr":
					incrs++
				case "get":
				default:
					return "ERROR\r\n"
				}
				return c.reply(cmd, incrs)
			})
			s, err := New(Config{Addrs: []string{addr}, Timeout: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			got, err := s.Add(context.Background(), k, 10, 3, 1, time.Minute)
			if c.wantErr == nil {
				if err != nil || got != c.want {
					t.Fatalf("got %v, %v; want %v", got.C[:3], err, c.want.C[:3])
				}
				return
			}
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("error %v, want %v", err, c.wantErr)
			}
		})
	}
}

// singleStep hides the Store's Do: the limiters then use UpdateBucket and
// UpdateLog, one call per step.
type singleStep struct{ *Store }

func (singleStep) Do() {} // shadows Store.Do: not a storage.Batcher
