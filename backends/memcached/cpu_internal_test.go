package memcached

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
)

// ThreeLimitCase is a stack of three limits on one key, built on a given
// store: the cases of the latency benchmarks (BenchmarkThreeLimits) and of
// BenchmarkClientCPU.
type ThreeLimitCase struct {
	Name  string
	Build func(s *Store) (limiter.Limiter, error)
}

// ThreeLimitCases are the stacks the latency benchmarks decide: every
// limit far from its bound, so that every decision is allowed.
func ThreeLimitCases() []ThreeLimitCase {
	var cs []ThreeLimitCase
	for _, k := range []int{limiter.DefaultSubWindows, 4} {
		cs = append(cs, ThreeLimitCase{fmt.Sprintf("Sliding%d+Bucket+Fixed", k), func(s *Store) (limiter.Limiter, error) {
			w, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "w", Limit: 1 << 40, Window: time.Minute, SubWindows: k})
			tb, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 1 << 40, RefillTime: time.Hour})
			f, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "f", Limit: 1 << 40, Window: time.Minute})
			return limiter.NewStack(w, tb, f)
		}})
	}
	cs = append(cs, ThreeLimitCase{"PackedSliding+Bucket+Fixed", func(s *Store) (limiter.Limiter, error) {
		// The packed window in place of the sub-window one.
		w, err := BenchPackedWindow(s)
		if err != nil {
			return nil, err
		}
		tb, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 1 << 40, RefillTime: time.Hour})
		f, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "f", Limit: 1 << 40, Window: time.Minute})
		return limiter.NewStack(w, tb, f)
	}})
	cs = append(cs, ThreeLimitCase{"EmbeddedRules", func(s *Store) (limiter.Limiter, error) {
		// The embedded rules' limits of a request with a token: per-ip
		// (a sliding window and a token bucket) and per-token (a window).
		// Their windows (600 and 1200 a minute) are packed, the default
		// for limits up to limiter.MaxPackedLimit: the largest two such
		// limits keep them packed and far from denying.
		ip, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "per-minute", Limit: limiter.MaxPackedLimit, Window: time.Minute, NoDenyCache: true})
		tb, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "burst", MaxAmount: 1 << 40, RefillTime: 100 * time.Millisecond})
		tok, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "per-token", Limit: limiter.MaxPackedLimit - 1, Window: time.Minute, NoDenyCache: true})
		return limiter.NewStack(ip, tb, tok)
	}})
	cs = append(cs, ThreeLimitCase{"Fixed+Fixed+Fixed", func(s *Store) (limiter.Limiter, error) {
		var ls []limiter.Limiter
		for i := range 3 {
			f, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "f", Limit: 1<<40 + int64(i), Window: time.Minute})
			ls = append(ls, f)
		}
		return limiter.NewStack(ls...)
	}})
	return cs
}

// BenchPackedWindow is the packed sliding window of the benchmarks: the
// default 160 slots, the largest packed limit per minute, no deny cache
// (every decision goes to the store).
func BenchPackedWindow(s *Store) (*limiter.SlidingWindow, error) {
	return limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "packed", Limit: limiter.MaxPackedLimit, Window: time.Minute,
		Representation: limiter.Packed, NoDenyCache: true})
}

// BenchmarkClientCPU measures the client's own work for one warm decision
// of each three-limit case, without the network: the decision's
// connection answers every request with the reply real memcached gave to
// the same bytes. Every decision is stamped with the same instant, so
// that it sends the same bytes (checked: a request that differs from the
// recorded one fails the run). raw-get-ns is a gomemcache get's own work
// on a connection canned the same way, measured in the same run; cpu/get
// is the ratio. This is the part of a decision's latency that is the
// client's (BenchmarkThreeLimits has the whole), and the benchmark to
// profile when cutting it:
//
//	scripts/testenv go test -run '^$' -bench ClientCPU -cpuprofile cpu.out ./backends/memcached/
func BenchmarkClientCPU(b *testing.B) {
	addr := testserver.Memcached(b)
	getNs := rawGetCPU(b, addr)
	for _, c := range ThreeLimitCases() {
		b.Run(c.Name, func(b *testing.B) {
			var canned *cannedConn
			s, err := New(Config{Addrs: []string{addr}, Timeout: 2 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			real := s.pool.dial
			s.pool.dial = func(ctx context.Context, network, address string) (net.Conn, error) {
				if canned != nil {
					return nil, errors.New("canned: a second connection")
				}
				nc, err := real(ctx, network, address)
				if err != nil {
					return nil, err
				}
				canned = &cannedConn{Conn: nc}
				return canned, nil
			}
			l, err := c.Build(s)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			key := fmt.Sprint("cpu-", time.Now().UnixNano())
			now := time.Now()
			for i := range 3 {
				if i == 2 {
					canned.startRecording()
				}
				if d, err := l.AllowN(ctx, key, now, 1); err != nil || !d.Allowed {
					b.Fatalf("warm-up decision %d: %+v, %v", i, d, err)
				}
			}
			canned.replay()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if d, err := l.AllowN(ctx, key, now, 1); err != nil || !d.Allowed {
					b.Fatalf("%+v, %v", d, err)
				}
			}
			b.StopTimer()
			if err := canned.failed(); err != nil {
				b.Fatal(err)
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(getNs, "raw-get-ns")
			b.ReportMetric(ns/getNs, "cpu/get")
			b.ReportMetric(float64(len(canned.req)), "request-bytes")
			b.ReportMetric(float64(len(canned.reply)), "reply-bytes")
		})
	}
}

// rawGetCPU returns a gomemcache get's own work in ns, on a canned
// connection recorded from real memcached.
func rawGetCPU(b *testing.B, addr string) float64 {
	b.Helper()
	var canned *cannedConn
	var mu sync.Mutex
	mc := memcache.New(addr)
	mc.Timeout = 2 * time.Second
	mc.DialContext = func(ctx context.Context, network, address string) (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		if canned != nil {
			return nil, errors.New("canned: a second connection")
		}
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		canned = &cannedConn{Conn: nc}
		return canned, nil
	}
	key := fmt.Sprint("cpu-raw-", time.Now().UnixNano())
	if err := mc.Set(&memcache.Item{Key: key, Value: []byte("12345"), Expiration: 600}); err != nil {
		b.Fatal(err)
	}
	canned.startRecording()
	if _, err := mc.Get(key); err != nil {
		b.Fatal(err)
	}
	canned.replay()
	const n = 200000
	start := time.Now()
	for range n {
		if _, err := mc.Get(key); err != nil {
			b.Fatal(err)
		}
	}
	ns := float64(time.Since(start).Nanoseconds()) / n
	if err := canned.failed(); err != nil {
		b.Fatal(err)
	}
	return ns
}

// cannedConn is a connection to real memcached that records one request
// and its reply (startRecording, then replay), and from then on answers
// every write of those same bytes with that reply, without the network.
type cannedConn struct {
	net.Conn
	recording, canned bool
	req, reply        []byte
	ref               []byte // the first canned request
	pending           []byte // the reply being read (canned)
	err               error
}

func (c *cannedConn) startRecording() { c.recording = true }

func (c *cannedConn) replay() {
	c.recording, c.canned = false, true
	c.Conn.Close()
}

func (c *cannedConn) failed() error { return c.err }

func (c *cannedConn) Write(p []byte) (int, error) {
	if !c.canned {
		if c.recording {
			c.req = append(c.req, p...)
		}
		return c.Conn.Write(p)
	}
	// A client's request goes out in one write (a flushed buffer). The
	// first one sets the reference: it may differ from the recorded one
	// where the client remembers state from the last reply (a bucket's
	// value and CAS id, which the canned reply then keeps the same).
	if c.ref == nil {
		c.ref = slices.Clone(p)
	} else if !bytes.Equal(p, c.ref) && c.err == nil {
		c.err = fmt.Errorf("canned: the request differs from the first one:\n%q\nfirst:\n%q", p, c.ref)
	}
	c.pending = c.reply
	return len(p), nil
}

func (c *cannedConn) Read(p []byte) (int, error) {
	if !c.canned {
		n, err := c.Conn.Read(p)
		if c.recording {
			c.reply = append(c.reply, p[:n]...)
		}
		return n, err
	}
	if len(c.pending) == 0 {
		if c.err == nil {
			c.err = errors.New("canned: a read with no request")
		}
		return 0, c.err
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

func (c *cannedConn) SetDeadline(t time.Time) error {
	if c.canned {
		return nil
	}
	return c.Conn.SetDeadline(t)
}

func (c *cannedConn) SetReadDeadline(t time.Time) error {
	if c.canned {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *cannedConn) SetWriteDeadline(t time.Time) error {
	if c.canned {
		return nil
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *cannedConn) Close() error {
	if c.canned {
		return nil
	}
	return c.Conn.Close()
}
