package memcached

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// legal is gomemcache's and memcached's key rule, made stricter: printable
// ASCII only.
func legal(k string) bool { return len(k) <= maxKeyLen && len(k) > 0 && printable(k) }

func hostileNames() []string {
	return []string{
		"", " ", "a b", "a\r\nflush_all", "a\r\nflush_all\r\n", "a\r\nset x 0 0 1\r\n1\r\n",
		"\x00", "a\x00b", "a\x00c", "\xff\xfe\xfd", "ünïcödé", "a\tb", "a\nb", "a\x7fb",
		"k:x/y", "h:abc", "a|b", "a|c1", "|", "a/b", "/",
		strings.Repeat("k", 150), strings.Repeat("k", 151), strings.Repeat("k", 250), strings.Repeat("k", 251),
		strings.Repeat("k", 10<<10), strings.Repeat("k", 10<<10-1) + "l",
	}
}

func TestKeysAreSafeAndDistinct(t *testing.T) {
	for _, prefix := range []string{"", "app:", strings.Repeat("p", MaxKeyPrefix)} {
		kr, err := newKeyer(prefix)
		if err != nil {
			t.Fatal(err)
		}
		spaces := []string{"sw:10:1m0s:10", "tb:2:1m0s:1", "a", "a/b", "a b", ""}
		seen := map[string]storage.Key{}
		for _, sp := range spaces {
			for _, name := range hostileNames() {
				k := storage.Key{Space: sp, Name: name}
				base := kr.base(k)
				for _, key := range []string{base + "|b", base + "|l", counterKey(base, 0), counterKey(base, math.MinInt64), counterKey(base, math.MaxInt64)} {
					if !legal(key) {
						t.Fatalf("prefix %q, key %.30q: memcached key %.60q (%d bytes) is not legal", prefix, k, key, len(key))
					}
					if !strings.HasPrefix(key, prefix) {
						t.Fatalf("key %q lacks prefix %q", key, prefix)
					}
				}
				if other, ok := seen[base]; ok {
					t.Fatalf("keys %.30q and %.30q share the memcached key %q", other, k, base)
				}
				seen[base] = k
			}
		}
		// A readable key stays readable; a key with control bytes is hashed.
		if got := kr.base(storage.Key{Space: "fw:5:1m0s", Name: "user-42"}); got != prefix+"k:fw:5:1m0s/user-42" {
			t.Fatalf("readable key stored as %q", got)
		}
		if got := kr.base(storage.Key{Space: "fw", Name: "a\r\nflush_all"}); !strings.HasPrefix(got, prefix+"h:") || strings.Contains(got, "flush") {
			t.Fatalf("hostile key stored as %q", got)
		}
	}
	// Space and Name are not simply concatenated.
	kr, _ := newKeyer("")
	if kr.base(storage.Key{Space: "ab", Name: "\x00"}) == kr.base(storage.Key{Space: "a", Name: "b\x00"}) {
		t.Fatal("hashed keys ignore the Space/Name boundary")
	}
}

func TestKeyPrefixValidation(t *testing.T) {
	for _, p := range []string{"a b", "a\r\n", "\xff", strings.Repeat("p", MaxKeyPrefix+1)} {
		if _, err := newKeyer(p); !errors.Is(err, limiter.ErrInvalidConfig) {
			t.Errorf("prefix %.20q: %v, want ErrInvalidConfig", p, err)
		}
		if _, err := New(Config{Addrs: []string{"127.0.0.1:1"}, KeyPrefix: p}); !errors.Is(err, limiter.ErrInvalidConfig) {
			t.Errorf("New with prefix %.20q: %v, want ErrInvalidConfig", p, err)
		}
	}
}

func TestExpiry(t *testing.T) {
	now := time.Date(2026, 3, 1, 0, 0, 0, 500_000_000, time.UTC)
	s := &Store{now: func() time.Time { return now }}
	at := now.Unix() + expirySlack
	for _, c := range []struct {
		ttl  time.Duration
		want int64
	}{
		// Always an absolute time: now, plus the TTL rounded up, plus
		// the slack for truncation, memcached's tick and clock skew.
		{0, at},
		{time.Millisecond, at + 1},
		{time.Second, at + 1},
		{time.Second + time.Nanosecond, at + 2},
		{66 * time.Second, at + 66},
		{400 * 24 * time.Hour, at + 400*24*3600},
		// Past 2038 an int32 cannot hold it: no expiry.
		{20 * 365 * 24 * time.Hour, 0},
		{math.MaxInt64, 0},
	} {
		if got := s.expiry(c.ttl); int64(got) != c.want {
			t.Errorf("expiry(%v) = %d, want %d", c.ttl, got, c.want)
		}
	}
	// Jitter only ever adds, by at most Jitter (rounded up to a second).
	s.jitter = 3 * time.Second
	for range 1000 {
		if got := int64(s.expiry(10 * time.Second)); got < at+10 || got > at+13 {
			t.Fatalf("expiry(10s) with 3s jitter = %d, want %d to %d", got, at+10, at+13)
		}
	}
}

func TestBucketEncoding(t *testing.T) {
	for _, b := range []storage.BucketState{{}, {Tokens: 5, Updated: 1}, {Tokens: math.MaxInt64, Updated: math.MinInt64}, {Tokens: -1, Updated: math.MaxInt64}} {
		got, err := decodeBucket(encodeBucket(b))
		if err != nil || got != b {
			t.Fatalf("round trip of %+v: %+v, %v", b, got, err)
		}
	}
	for _, v := range []string{"", "B", "B\x02", "X\x02\x02", "B\x02\x02\x02", "L\x00", "5"} {
		if _, err := decodeBucket([]byte(v)); !errors.Is(err, storage.ErrCorruptState) {
			t.Errorf("decode %q: %v, want ErrCorruptState", v, err)
		}
	}
}

func TestParseCount(t *testing.T) {
	for _, c := range []struct {
		v    string
		want int64
		ok   bool
	}{{"0", 0, true}, {"42", 42, true}, {"9   ", 9, true}, {"18446744073709551615", math.MaxInt64, true}, {"", 0, false}, {"x", 0, false}, {"-1", 0, false}} {
		got, err := parseCount([]byte(c.v))
		if c.ok != (err == nil) || got != c.want {
			t.Errorf("parseCount(%q) = %d, %v", c.v, got, err)
		}
		if err != nil && !errors.Is(err, storage.ErrCorruptState) {
			t.Errorf("parseCount(%q): %v, want ErrCorruptState", c.v, err)
		}
	}
}

func TestItemCacheBounded(t *testing.T) {
	c := newItemCache(8)
	for i := range 100 {
		c.put(itemWithKey(fmt.Sprint(i)))
	}
	if len(c.m) != 8 {
		t.Fatalf("cache holds %d items, want 8", len(c.m))
	}
	if c.get("99") == nil {
		t.Fatal("the last item put is not cached")
	}
	var nilCache *itemCache
	nilCache.put(itemWithKey("x"))
	if nilCache.get("x") != nil {
		t.Fatal("nil cache returned an item")
	}
}

// fakeServer is a TCP server speaking just enough memcached for a test: each
// request line goes to handle, which may read a data block from r and
// returns the reply to write ("" closes the connection).
type fakeServer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startFake(t testing.TB, handle func(line string, r *bufio.Reader) string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := &fakeServer{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		fs.mu.Lock()
		for _, c := range fs.conns {
			c.Close()
		}
		fs.mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fs.mu.Lock()
			fs.conns = append(fs.conns, c)
			fs.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					reply := handle(strings.TrimRight(line, "\r\n"), r)
					if reply == "" {
						return
					}
					if _, err := c.Write([]byte(reply)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func itemWithKey(k string) *memcache.Item { return &memcache.Item{Key: k} }
