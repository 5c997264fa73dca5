package limiter_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

var ccBase = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

func ccLeases(t testing.TB) *memory.Leases {
	t.Helper()
	l, err := memory.NewLeases(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func ccNew(t testing.TB, s storage.LeaseStore, cfg limiter.ConcurrencyConfig) *limiter.Concurrency {
	t.Helper()
	c, err := limiter.NewConcurrency(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLeaseOpApply walks the algorithm step by step on a bare lease list.
func TestLeaseOpApply(t *testing.T) {
	const ttl = 10 * time.Second
	at := func(d time.Duration) int64 { return ccBase.Add(d).UnixNano() }
	var set []storage.LeaseEntry
	steps := []struct {
		at        time.Duration
		id        string
		release   bool
		allowed   bool
		write     bool
		remaining int64
		reset     time.Duration
		retry     time.Duration
		live      int
	}{
		{at: 0, id: "a", allowed: true, write: true, remaining: 1, reset: ttl, live: 1},
		{at: time.Second, id: "b", allowed: true, write: true, remaining: 0, reset: ttl, live: 2},
		{at: 2 * time.Second, id: "c", allowed: false, write: false, remaining: 0, reset: ttl - time.Second, retry: ttl - 2*time.Second, live: 2},
		{at: 2 * time.Second, id: "a", allowed: true, write: false, remaining: 0, reset: ttl - time.Second, live: 2}, // a retried acquire
		{at: 3 * time.Second, id: "a", release: true, write: true, live: 1},
		{at: 3 * time.Second, id: "a", release: true, write: false, live: 1},
		{at: 3 * time.Second, id: "c", allowed: true, write: true, remaining: 0, reset: ttl, live: 2},
		// At 11 s b lapses (it expires at 11 s: live while now < 11 s).
		{at: ttl + time.Second - 1, id: "d", allowed: false, remaining: 0, reset: 2*time.Second + 1, retry: 1, live: 2},
		{at: ttl + time.Second, id: "d", allowed: true, write: true, remaining: 0, reset: ttl, live: 2},
		// Everything lapsed: the acquire drops both and adds one.
		{at: time.Hour, id: "e", allowed: true, write: true, remaining: 1, reset: ttl, live: 1},
		// A release drops the expired leases too.
		{at: 2 * time.Hour, id: "zzz", release: true, write: true, live: 0},
	}
	for i, st := range steps {
		if st.release {
			next, write := storage.ReleaseOp{ID: st.id, Now: at(st.at)}.Apply(set)
			if write != st.write || len(next) != st.live {
				t.Fatalf("step %d: release %s at %v: write=%v live=%d, want %v %d", i, st.id, st.at, write, len(next), st.write, st.live)
			}
			set = next
			continue
		}
		op := storage.LeaseOp{Capacity: 2, Now: at(st.at), TTL: ttl, ID: st.id}
		next, d, write := op.Apply(set)
		if d.Allowed != st.allowed || write != st.write || d.Remaining != st.remaining || d.Limit != 2 ||
			d.ResetAfter != st.reset || d.RetryAfter != st.retry || len(next) != st.live {
			t.Fatalf("step %d: acquire %s at %v: %+v write=%v live=%d; want allowed=%v write=%v remaining=%d reset=%v retry=%v live=%d",
				i, st.id, st.at, d, write, len(next), st.allowed, st.write, st.remaining, st.reset, st.retry, st.live)
		}
		set = next
	}
}

func TestLeaseEncoding(t *testing.T) {
	in := []storage.LeaseEntry{{ID: "a", Expires: 1}, {ID: "AbC-_9", Expires: -1 << 63}, {ID: strings.Repeat("x", storage.MaxLeaseIDLen), Expires: 1<<63 - 1}}
	b := storage.AppendLeases([]byte{'X'}, in)
	out, err := storage.ParseLeases(b[1:], nil)
	if err != nil || len(out) != len(in) {
		t.Fatalf("round trip: %v, %v", out, err)
	}
	for i := range in {
		if out[i] != in[i] {
			t.Fatalf("lease %d: %+v, want %+v", i, out[i], in[i])
		}
	}
	if out, err := storage.ParseLeases(storage.AppendLeases(nil, nil), nil); err != nil || len(out) != 0 {
		t.Fatalf("empty set: %v, %v", out, err)
	}
	for name, v := range map[string][]byte{
		"empty":       {},
		"truncated":   b[1 : len(b)-1],
		"trailing":    append(append([]byte{}, b[1:]...), 0),
		"huge count":  {0xff, 0xff, 0x03},
		"bad ID":      storage.AppendLeases(nil, []storage.LeaseEntry{{ID: "a b", Expires: 1}}),
		"empty ID":    storage.AppendLeases(nil, []storage.LeaseEntry{{ID: "", Expires: 1}}),
		"long ID":     storage.AppendLeases(nil, []storage.LeaseEntry{{ID: strings.Repeat("x", storage.MaxLeaseIDLen+1), Expires: 1}}),
		"ID past end": {1, 10, 'a'},
	} {
		if _, err := storage.ParseLeases(v, nil); !errors.Is(err, storage.ErrCorruptState) {
			t.Errorf("%s: %v, want ErrCorruptState", name, err)
		}
	}
}

func TestLeaseText(t *testing.T) {
	for _, key := range []string{"", "user-1", "a.b.c", "\x00\xff\r\n", strings.Repeat("k", 1000)} {
		l := limiter.Lease{Key: key, ID: "Xq3-_9aZ0bc", Expires: ccBase}
		got, err := limiter.ParseLease(l.String())
		if err != nil || got.Key != key || got.ID != l.ID {
			t.Fatalf("ParseLease(%q) = %+v, %v; want key %q id %q", l.String(), got, err, key, l.ID)
		}
	}
	if s := (limiter.Lease{Key: "k"}).String(); s != "" {
		t.Fatalf("the zero lease encodes as %q", s)
	}
	for _, s := range []string{"", "nodot", ".a2V5", "a b.a2V5", "id.!!!", strings.Repeat("x", 65) + ".a2V5"} {
		if _, err := limiter.ParseLease(s); !errors.Is(err, limiter.ErrUnknownLease) {
			t.Errorf("ParseLease(%q): %v, want ErrUnknownLease", s, err)
		}
	}
	// The default IDs: 64 random bits, base64url-encoded.
	c := ccNew(t, ccLeases(t), limiter.ConcurrencyConfig{Name: "ids", Capacity: 2, LeaseTTL: time.Second})
	a, _, err1 := c.Acquire(context.Background(), "k", ccBase)
	b, _, err2 := c.Acquire(context.Background(), "k", ccBase)
	if err1 != nil || err2 != nil || len(a.ID) != 11 || a.ID == b.ID {
		t.Fatalf("default lease IDs %q and %q (%v, %v)", a.ID, b.ID, err1, err2)
	}
}

func TestConcurrencyInvalidConfig(t *testing.T) {
	s := ccLeases(t)
	for _, c := range []struct {
		store storage.LeaseStore
		cfg   limiter.ConcurrencyConfig
		field string
	}{
		{nil, limiter.ConcurrencyConfig{Capacity: 1, LeaseTTL: time.Second}, "store"},
		{s, limiter.ConcurrencyConfig{Capacity: 0, LeaseTTL: time.Second}, "capacity"},
		{s, limiter.ConcurrencyConfig{Capacity: -1, LeaseTTL: time.Second}, "capacity"},
		{s, limiter.ConcurrencyConfig{Capacity: storage.MaxLeases + 1, LeaseTTL: time.Second}, "capacity"},
		{s, limiter.ConcurrencyConfig{Capacity: 1}, "lease TTL"},
		{s, limiter.ConcurrencyConfig{Capacity: 1, LeaseTTL: -time.Second}, "lease TTL"},
	} {
		_, err := limiter.NewConcurrency(c.store, c.cfg)
		if !errors.Is(err, limiter.ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: %v, want ErrInvalidConfig naming %q", c.cfg, err, c.field)
		}
	}
	// A bad NewID is refused at Acquire, before the store is asked.
	c := ccNew(t, s, limiter.ConcurrencyConfig{Name: "bad-id", Capacity: 1, LeaseTTL: time.Second, NewID: func() string { return "has space" }})
	if _, _, err := c.Acquire(context.Background(), "k", ccBase); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Fatalf("invalid lease ID: %v", err)
	}
	if _, _, err := ccNew(t, s, limiter.ConcurrencyConfig{Capacity: 1, LeaseTTL: time.Second}).Acquire(context.Background(), "k", time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)); err == nil {
		t.Fatal("a time beyond Unix nanoseconds was accepted")
	}
}

// TestConcurrencySynctest runs Stripe's scenario with real goroutines on
// the fake clock of testing/synctest: requests that finish never trip the
// limiter however many there are, Capacity requests in flight hold every
// slot, and a holder that "crashes" without releasing frees its slot once
// its lease expires.
func TestConcurrencySynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const capacity, ttl = 10, time.Minute
		c := ccNew(t, ccLeases(t), limiter.ConcurrencyConfig{Name: "stripe", Capacity: capacity, LeaseTTL: ttl})
		ctx := context.Background()

		// capacity workers, each doing 100 requests of 100 ms in a row:
		// never more than capacity in flight, so nothing is refused.
		var wg sync.WaitGroup
		var mu sync.Mutex
		refused := 0
		for range capacity {
			wg.Go(func() {
				for range 100 {
					l, d, err := c.Acquire(ctx, "user", time.Now())
					if err != nil {
						t.Error(err)
						return
					}
					if !d.Allowed {
						mu.Lock()
						refused++
						mu.Unlock()
						continue
					}
					time.Sleep(100 * time.Millisecond) // the work
					if err := c.Release(ctx, l); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		if refused != 0 {
			t.Fatalf("%d finished requests were refused", refused)
		}

		// capacity requests in flight: the next is refused.
		hold := make(chan struct{})
		for range capacity {
			l, d, err := c.Acquire(ctx, "user", time.Now())
			if err != nil || !d.Allowed {
				t.Fatalf("in-flight request: %+v, %v", d, err)
			}
			wg.Go(func() {
				<-hold
				if err := c.Release(ctx, l); err != nil {
					t.Error(err)
				}
			})
		}
		if _, d, _ := c.Acquire(ctx, "user", time.Now()); d.Allowed || d.RetryAfter != ttl {
			t.Fatalf("request %d: %+v, want refused with RetryAfter %v", capacity+1, d, ttl)
		}
		close(hold)
		wg.Wait()

		// A holder crashes: its goroutine ends without releasing.
		crashed := make(chan struct{})
		go func() {
			defer close(crashed)
			for range capacity {
				if _, d, err := c.Acquire(ctx, "user", time.Now()); err != nil || !d.Allowed {
					t.Errorf("crashing holder: %+v, %v", d, err)
				}
			}
		}()
		<-crashed
		time.Sleep(ttl - time.Second)
		if _, d, _ := c.Acquire(ctx, "user", time.Now()); d.Allowed {
			t.Fatalf("before the lease TTL the crashed holder's slots are still held, yet: %+v", d)
		}
		time.Sleep(time.Second)
		for i := range capacity {
			if _, d, _ := c.Acquire(ctx, "user", time.Now()); !d.Allowed {
				t.Fatalf("after the lease TTL, slot %d is still held: %+v", i, d)
			}
		}
	})
}

// failingLeases is a LeaseStore that always fails.
type failingLeases struct{}

var errLeaseStore = errors.New("lease store down")

func (failingLeases) AcquireLease(context.Context, storage.Key, storage.LeaseOp) (storage.Decision, error) {
	return storage.Decision{}, errLeaseStore
}

func (failingLeases) ReleaseLease(context.Context, storage.Key, storage.ReleaseOp) error {
	return errLeaseStore
}

func TestConcurrencyStoreErrors(t *testing.T) {
	c := ccNew(t, failingLeases{}, limiter.ConcurrencyConfig{Name: "down", Capacity: 1, LeaseTTL: time.Second})
	l, d, err := c.Acquire(context.Background(), "k", ccBase)
	if !errors.Is(err, errLeaseStore) || d.Allowed || l.Held() || !strings.Contains(err.Error(), `"down"`) {
		t.Fatalf("Acquire on a failing store: %+v %+v %v", l, d, err)
	}
	if err := c.Release(context.Background(), limiter.Lease{Key: "k", ID: "x"}); !errors.Is(err, errLeaseStore) {
		t.Fatalf("Release on a failing store: %v", err)
	}
	if err := c.Release(context.Background(), limiter.Lease{}); err != nil {
		t.Fatalf("Release of the zero lease touched the store: %v", err)
	}
	if err := c.Release(context.Background(), limiter.Lease{Key: "k", ID: "bad id"}); !errors.Is(err, limiter.ErrUnknownLease) {
		t.Fatalf("Release of a malformed lease: %v", err)
	}
}
