package memcached

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestErrorf: every failure a Store or Leases call can meet falls in
// exactly one of the limiter's classes (ErrUnavailable, through the
// package's ErrUnavailable; ErrConflict; ErrCorruptState), keeps the
// original error in its chain, and a timeout is also
// context.DeadlineExceeded.
func TestErrorf(t *testing.T) {
	kinds := []error{storage.ErrUnavailable, storage.ErrThrottled, storage.ErrConflict, storage.ErrCorruptState}
	for _, c := range []struct {
		name     string
		err      error
		want     error
		deadline bool // also context.DeadlineExceeded
	}{
		{"corrupt value", fmt.Errorf("%w: not a token bucket value", storage.ErrCorruptState), storage.ErrCorruptState, false},
		{"corrupt lease set", fmt.Errorf("%w: lease set header", storage.ErrCorruptState), storage.ErrCorruptState, false},
		{"CLIENT_ERROR to incr", replyError("incr", []byte("CLIENT_ERROR cannot increment or decrement non-numeric value\r\n")), storage.ErrCorruptState, false},
		{"CLIENT_ERROR through gomemcache", errors.New("memcache: client error: cannot increment or decrement non-numeric value"), storage.ErrCorruptState, false},
		{"retries spent", fmt.Errorf("%w: gave up after 51 lost races", storage.ErrConflict), storage.ErrConflict, false},
		{"lost races until the deadline", fmt.Errorf("%w: 3 lost races, then: %w", storage.ErrConflict, context.DeadlineExceeded), storage.ErrConflict, true},
		{"counter kept vanishing", fmt.Errorf("%w: counter k|c1 kept vanishing between add and incr", storage.ErrConflict), storage.ErrConflict, false},
		{"socket timeout", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, storage.ErrUnavailable, true},
		{"connect timeout", &memcache.ConnectTimeoutError{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}}, storage.ErrUnavailable, true},
		{"call deadline", context.DeadlineExceeded, storage.ErrUnavailable, true},
		{"cancelled", context.Canceled, storage.ErrUnavailable, false},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, storage.ErrUnavailable, false},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, storage.ErrUnavailable, false},
		{"closed", io.EOF, storage.ErrUnavailable, false},
		{"server error", memcache.ErrServerError, storage.ErrUnavailable, false},
		{"no servers", memcache.ErrNoServers, storage.ErrUnavailable, false},
		{"unexpected reply", replyError("get", []byte("SERVER_ERROR out of memory\r\n")), storage.ErrUnavailable, false},
		{"protocol", fmt.Errorf("%w: get value not terminated by CRLF", errProtocol), storage.ErrUnavailable, false},
		{"discovery", fmt.Errorf("%w: cfg: %w", ErrDiscovery, io.ErrUnexpectedEOF), storage.ErrUnavailable, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := errorf("bucket", c.err)
			for _, k := range kinds {
				if is := errors.Is(got, k); is != (k == c.want) {
					t.Errorf("errors.Is(%v, %v) = %v", got, k, is)
				}
			}
			if c.want == storage.ErrUnavailable && !errors.Is(got, ErrUnavailable) {
				t.Errorf("%v does not wrap memcached.ErrUnavailable", got)
			}
			if !errors.Is(got, c.err) {
				t.Errorf("%v: the original error is not in the chain", got)
			}
			if errors.Is(got, context.DeadlineExceeded) != c.deadline {
				t.Errorf("errors.Is(%v, context.DeadlineExceeded) = %v, want %v", got, !c.deadline, c.deadline)
			}
		})
	}
}

// Leases run the Store's read-modify-write loop: its retry budget (a lease
// set whose every cas loses fails with ErrConflict after 1+MaxRetries cas,
// as a bucket does), its error mapping, and its replacement of a pooled
// connection the server closed.
func TestLeasesShareTheLoop(t *testing.T) {
	now := time.Unix(100, 0).UnixNano()
	op := storage.LeaseOp{Capacity: 2, Now: now, TTL: time.Minute, ID: "a"}
	k := storage.Key{Space: "cl", Name: "k"}
	leases := func(t *testing.T, addr string) *Leases {
		t.Helper()
		mc := memcache.New(addr)
		mc.Timeout = 5 * time.Second
		t.Cleanup(func() { mc.Close() })
		l, err := NewLeases(mc, Config{MaxRetries: 3, RetryBackoff: time.Microsecond, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	t.Run("every cas loses", func(t *testing.T) {
		var cas atomic.Int64
		addr := startFake(t, func(line string, r *bufio.Reader) string {
			f := strings.Fields(line)
			switch f[0] {
			case "gets":
				v := string(storage.AppendLeases([]byte{leaseFormat}, []storage.LeaseEntry{{ID: "x", Expires: now + 1}}))
				return fmt.Sprintf("VALUE %s 0 %d 42\r\n%s\r\nEND\r\n", f[1], len(v), v)
			case "cas":
				n, _ := strconv.Atoi(f[4])
				r.Discard(n + 2)
				cas.Add(1)
				return "EXISTS\r\n"
			}
			return "ERROR\r\n"
		})
		_, err := leases(t, addr).AcquireLease(context.Background(), k, op)
		if !errors.Is(err, storage.ErrConflict) || errors.Is(err, storage.ErrUnavailable) {
			t.Fatalf("endless lost races: %v, want ErrConflict", err)
		}
		if got := cas.Load(); got != 4 {
			t.Fatalf("%d cas attempts, want 1 + MaxRetries = 4", got)
		}
	})

	t.Run("not a lease set", func(t *testing.T) {
		addr := startFake(t, func(line string, r *bufio.Reader) string {
			f := strings.Fields(line)
			if f[0] == "gets" {
				return fmt.Sprintf("VALUE %s 0 1 42\r\nB\r\nEND\r\n", f[1])
			}
			return "ERROR\r\n"
		})
		_, err := leases(t, addr).AcquireLease(context.Background(), k, op)
		if !errors.Is(err, storage.ErrCorruptState) || errors.Is(err, storage.ErrUnavailable) {
			t.Fatalf("%v, want ErrCorruptState", err)
		}
	})

	t.Run("server error on cas", func(t *testing.T) {
		addr := startFake(t, func(line string, r *bufio.Reader) string {
			f := strings.Fields(line)
			switch f[0] {
			case "gets":
				return "END\r\n"
			case "add":
				n, _ := strconv.Atoi(f[4])
				r.Discard(n + 2)
				return "SERVER_ERROR out of memory storing object\r\n"
			}
			return "ERROR\r\n"
		})
		_, err := leases(t, addr).AcquireLease(context.Background(), k, op)
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, storage.ErrConflict) {
			t.Fatalf("%v, want ErrUnavailable", err)
		}
	})

	t.Run("pooled connection closed by the server", func(t *testing.T) {
		real := testserver.Memcached(t)
		var requests atomic.Int64
		proxy := startFake(t, func(line string, r *bufio.Reader) string {
			f := strings.Fields(line)
			req := line + "\r\n"
			if f[0] == "cas" || f[0] == "add" || f[0] == "set" {
				n, _ := strconv.Atoi(f[4])
				data := make([]byte, n+2)
				if _, err := io.ReadFull(r, data); err != nil {
					return ""
				}
				req += string(data)
			}
			if requests.Add(1) == 3 {
				return "" // the second call's first command: close, as a restarted server would
			}
			return forward(t, real, req)
		})
		l := leases(t, proxy)
		k := storage.Key{Space: "cl", Name: uniqueName(t)}
		ctx := context.Background()
		if d, err := l.AcquireLease(ctx, k, op); err != nil || !d.Allowed {
			t.Fatalf("first acquire: %+v, %v", d, err)
		}
		op := op
		op.ID = "b"
		if d, err := l.AcquireLease(ctx, k, op); err != nil || !d.Allowed || d.Remaining != 0 {
			t.Fatalf("acquire on a connection the server closed: %+v, %v; want allowed, 0 remaining", d, err)
		}
		if n := requests.Load(); n < 5 {
			t.Fatalf("%d requests: the closed connection was not used", n)
		}
	})
}
