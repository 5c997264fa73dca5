package memcached

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestNodeBreakerExec: the accounting of exec, on a fake clock. Only the
// node's unavailability counts (a refused dial; not a protocol error, not
// the caller's cancellation); an open node fails at once without dialling
// while the other node works; after OpenFor one probe goes through while
// the others fail at once, and its success closes the breaker.
func TestNodeBreakerExec(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		var dials atomic.Int64
		dial := func(ctx context.Context, network, address string) (net.Conn, error) {
			dials.Add(1)
			if address == "127.0.0.2:1" && down.Load() {
				return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
			}
			c, _ := net.Pipe()
			return c, nil
		}
		var changes []string
		nb, err := newNodeBreakers(&BreakerConfig{Failures: 2, OpenFor: time.Second,
			OnChange: func(node, from, to string) { changes = append(changes, node+" "+from+">"+to) }})
		if err != nil {
			t.Fatal(err)
		}
		p := newPool(dial, time.Second, 4)
		p.breakers = nb
		defer p.close()
		a, b := &addr{"tcp", "127.0.0.1:1"}, &addr{"tcp", "127.0.0.2:1"}
		ok := func(*pconn) error { return nil }
		state := func(node string) string { return nb.Get(node).State().String() }

		for range 5 { // answers, even malformed ones, are answers
			if err := p.exec(t.Context(), a, func(*pconn) error { return replyError("get", []byte("BOGUS\r\n")) }); !errors.Is(err, errProtocol) {
				t.Fatalf("protocol error: %v", err)
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		for range 5 { // the caller's cancellation tells nothing of the node
			p.exec(ctx, a, func(*pconn) error { return context.Canceled })
		}
		if s := state(a.s); s != "closed" {
			t.Fatalf("node a %s after answers and cancellations", s)
		}

		down.Store(true)
		for i := range 2 {
			err := p.exec(t.Context(), b, ok)
			if !errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, storage.ErrBreakerOpen) {
				t.Fatalf("failure %d: %v", i, err)
			}
		}
		before := dials.Load()
		err = p.exec(t.Context(), b, ok)
		if !errors.Is(err, storage.ErrBreakerOpen) || !errors.Is(err, storage.ErrUnavailable) || dials.Load() != before {
			t.Fatalf("open node: %v, %d dials; want ErrBreakerOpen and ErrUnavailable without a dial", err, dials.Load()-before)
		}
		if err := p.exec(t.Context(), a, ok); err != nil {
			t.Fatalf("node a while b is open: %v", err)
		}

		time.Sleep(time.Second)
		down.Store(false)
		release := make(chan struct{})
		probed := make(chan error)
		go func() {
			probed <- p.exec(t.Context(), b, func(*pconn) error { <-release; return nil })
		}()
		synctest.Wait()
		if err := p.exec(t.Context(), b, ok); !errors.Is(err, storage.ErrBreakerOpen) {
			t.Fatalf("second call during the probe: %v; want ErrBreakerOpen", err)
		}
		close(release)
		if err := <-probed; err != nil {
			t.Fatal(err)
		}
		if s := state(b.s); s != "closed" {
			t.Fatalf("node b %s after a successful probe", s)
		}
		want := []string{"127.0.0.2:1 closed>open", "127.0.0.2:1 open>half-open", "127.0.0.2:1 half-open>closed"}
		if !slices.Equal(changes, want) {
			t.Errorf("transitions %q, want %q", changes, want)
		}
	})
}

// keyOn returns a key whose items live on node.
func keyOn(t *testing.T, s *Store, node string) storage.Key {
	t.Helper()
	for i := range 1000 {
		k := storage.Key{Space: "nodebreaker", Name: fmt.Sprintf("%s-%d-%d", t.Name(), time.Now().UnixNano(), i)}
		if a, err := s.ring.pickTag(s.keys.base(k)); err == nil && a.String() == node {
			return k
		}
	}
	t.Fatalf("no key on %s", node)
	return storage.Key{}
}

// recorder collects OnChange calls.
type recorder struct {
	mu sync.Mutex
	l  []string
}

func (r *recorder) on(node, from, to string) {
	r.mu.Lock()
	r.l = append(r.l, node+" "+from+">"+to)
	r.mu.Unlock()
}

func (r *recorder) of(node string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.l {
		if len(s) > len(node) && s[:len(node)+1] == node+" " {
			out = append(out, s[len(node)+1:])
		}
	}
	return out
}

func (s *Store) breakerState(node string) string { return s.pool.breakers.Get(node).State().String() }

// fast runs f and fails if it takes 5 ms or more or its error does not
// wrap storage.ErrBreakerOpen and storage.ErrUnavailable.
func fast(t *testing.T, dials *atomic.Int64, what string, f func() error) {
	t.Helper()
	before := dials.Load()
	start := time.Now()
	err := f()
	d := time.Since(start)
	t.Logf("%s on the open node: %v", what, d)
	// What makes it fast: no attempt to reach the node. (Its speed is a
	// benchmark's figure, BenchmarkOutage; a bound here only checks that
	// the call did not wait out the store's timeout, 100 ms or more here.)
	if n := dials.Load() - before; n != 0 {
		t.Errorf("%s on the open node dialed it %d times; want none", what, n)
	}
	if d >= 50*time.Millisecond {
		t.Errorf("%s on the open node took %v", what, d)
	}
	if !errors.Is(err, storage.ErrBreakerOpen) || !errors.Is(err, storage.ErrUnavailable) {
		t.Errorf("%s on the open node: %v; want ErrBreakerOpen and ErrUnavailable", what, err)
	}
}

// countDials counts the dials s makes to addr from now on, on both of its
// connection paths (its pipelines' pool and gomemcache's).
func countDials(s *Store, addr string) *atomic.Int64 {
	var n atomic.Int64
	base := s.pool.dial
	counting := func(ctx context.Context, network, address string) (net.Conn, error) {
		if address == addr {
			n.Add(1)
		}
		return base(ctx, network, address)
	}
	s.pool.dial = counting
	s.mc.DialContext = clientDialer(s.pool.breakers, counting)
	return &n
}

// TestNodeBreakerStopped: two real memcached nodes, one stopped (refused
// connections). After Failures failed calls its breaker opens; calls for
// its keys then fail without dialing it on every path (windows, refunds,
// batches through the pipeline, buckets through gomemcache), while the
// live node's keys are decided by the store, in the same batch too, and
// its breaker never leaves closed. Once the node is back, calls every
// 5 ms close its breaker within one OpenFor.
func TestNodeBreakerStopped(t *testing.T) {
	live, dead := testserver.StartMemcached(t), testserver.StartMemcached(t)
	const openFor = 300 * time.Millisecond
	rec := &recorder{}
	s, err := New(Config{Addrs: []string{live.Addr(), dead.Addr()}, Timeout: 250 * time.Millisecond,
		Breaker: &BreakerConfig{Failures: 3, OpenFor: openFor, OnChange: rec.on}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	deadDials := countDials(s, dead.Addr())
	ctx := t.Context()
	kl, kd := keyOn(t, s, live.Addr()), keyOn(t, s, dead.Addr())
	add := func(k storage.Key) error { _, err := s.Add(ctx, k, 100, 2, 1, time.Minute); return err }
	op := storage.BucketOp{MaxAmount: 1 << 40, RefillTime: time.Hour, RefillAmount: 1, Now: time.Now().UnixNano(), N: 1}
	bucket := func(k storage.Key) error { _, err := s.UpdateBucket(ctx, k, op, time.Minute); return err }
	for _, k := range []storage.Key{kl, kd} {
		if err := errors.Join(add(k), bucket(k)); err != nil {
			t.Fatal(err)
		}
	}

	dead.Stop()
	for i := range 3 {
		if err := add(kd); !errors.Is(err, storage.ErrUnavailable) || errors.Is(err, storage.ErrBreakerOpen) {
			t.Fatalf("call %d on the stopped node: %v; want a failure of the node", i, err)
		}
		if err := add(kl); err != nil {
			t.Fatalf("call %d on the live node: %v", i, err)
		}
	}
	if st := s.breakerState(dead.Addr()); st != "open" {
		t.Fatalf("stopped node's breaker %s after 3 failures", st)
	}
	fast(t, deadDials, "Add", func() error { return add(kd) })
	fast(t, deadDials, "Sub", func() error { return s.Sub(ctx, kd, 100, 1) })
	fast(t, deadDials, "UpdateBucket", func() error { return bucket(kd) })
	steps := []storage.Step{
		{Kind: storage.StepAdd, Key: kd, Idx: 100, Span: 2, N: 1, TTL: time.Minute},
		{Kind: storage.StepAdd, Key: kl, Idx: 100, Span: 2, N: 1, TTL: time.Minute},
		{Kind: storage.StepBucket, Key: kl, Bucket: op, TTL: time.Minute},
	}
	out := make([]storage.StepResult, len(steps))
	fast(t, deadDials, "Do", func() error { s.Do(ctx, steps, out); return out[0].Err })
	if out[1].Err != nil || out[1].Counts.C[0] < 2 || out[2].Err != nil || !out[2].Decision.Allowed {
		t.Errorf("live node's steps in the batch: %+v %+v", out[1], out[2])
	}
	for range 20 {
		if err := errors.Join(add(kl), bucket(kl)); err != nil {
			t.Fatalf("live node while the other is open: %v", err)
		}
	}
	if st := s.breakerState(live.Addr()); st != "closed" {
		t.Errorf("live node's breaker %s", st)
	}

	dead.Restart()
	back := time.Now()
	for add(kd) != nil {
		if time.Since(back) > 2*openFor {
			t.Fatalf("node back for %v, breaker %s", time.Since(back), s.breakerState(dead.Addr()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	closed := time.Since(back)
	t.Logf("breaker closed %v after the node's restart (OpenFor %v)", closed, openFor)
	if closed > openFor+50*time.Millisecond {
		t.Errorf("closed %v after the node came back; want within OpenFor %v", closed, openFor)
	}
	if st := s.breakerState(dead.Addr()); st != "closed" {
		t.Errorf("breaker %s after a successful call", st)
	}
	if got := rec.of(live.Addr()); len(got) != 0 {
		t.Errorf("live node's transitions: %q", got)
	}
	got := rec.of(dead.Addr())
	if len(got) < 3 || got[0] != "closed>open" || got[len(got)-1] != "half-open>closed" {
		t.Errorf("stopped node's transitions: %q", got)
	}
	var states []string
	for _, b := range s.Breakers() {
		states = append(states, b.Node+" "+b.State)
	}
	if len(states) != 2 {
		t.Errorf("Breakers() = %q", states)
	}
}

// TestNodeBreakerHungBuckets: the gomemcache path alone (buckets) on a
// node that accepts connections and never answers (SIGSTOP): socket
// timeouts reported by its connections open its breaker; bucket calls
// then fail without dialing it while the other node's buckets are decided;
// after the node resumes, a probe closes the breaker within OpenFor plus
// the timeout.
func TestNodeBreakerHungBuckets(t *testing.T) {
	live, hung := testserver.StartMemcached(t), testserver.StartMemcached(t)
	const openFor = 300 * time.Millisecond
	s, err := New(Config{Addrs: []string{live.Addr(), hung.Addr()}, Timeout: 100 * time.Millisecond,
		Breaker: &BreakerConfig{Failures: 3, OpenFor: openFor}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	kl, kh := keyOn(t, s, live.Addr()), keyOn(t, s, hung.Addr())
	hungDials := countDials(s, hung.Addr())
	op := storage.BucketOp{MaxAmount: 1 << 40, RefillTime: time.Hour, RefillAmount: 1, Now: time.Now().UnixNano(), N: 1}
	bucket := func(k storage.Key) error { _, err := s.UpdateBucket(ctx, k, op, time.Minute); return err }

	hung.Pause()
	t.Cleanup(hung.Resume)
	for i := 0; s.breakerState(hung.Addr()) != "open"; i++ {
		if i == 6 {
			t.Fatalf("breaker %s after %d bucket calls on a hung node", s.breakerState(hung.Addr()), i)
		}
		if err := bucket(kh); !errors.Is(err, storage.ErrUnavailable) {
			t.Fatalf("bucket on the hung node: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // the connection reports at its socket timeout
	}
	fast(t, hungDials, "UpdateBucket", func() error { return bucket(kh) })
	if err := bucket(kl); err != nil {
		t.Fatalf("live node: %v", err)
	}

	hung.Resume()
	back := time.Now()
	for bucket(kh) != nil {
		if time.Since(back) > 2*openFor {
			t.Fatalf("node back for %v, breaker %s", time.Since(back), s.breakerState(hung.Addr()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("breaker closed %v after the node resumed (OpenFor %v)", time.Since(back), openFor)
	// The bound that holds (package breaker's TestRecoveryBound): a probe
	// that left for the hung node just before it resumed fails at its
	// timeout, and the breaker waits another OpenFor.
	if d, bound := time.Since(back), openFor+100*time.Millisecond+50*time.Millisecond; d > bound {
		t.Errorf("closed %v after the node resumed; want within OpenFor + timeout + slack = %v", d, bound)
	}
	if st := s.breakerState(hung.Addr()); st != "closed" {
		t.Errorf("breaker %s after a successful probe", st)
	}
}
