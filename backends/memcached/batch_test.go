package memcached_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestBatchOneRoundTrip counts, at a proxy in front of the real server, the
// request segments memcached receives for one decision of three limits of
// different kinds on one key: one for an allowed decision (cold and warm),
// one for a denied one plus its refunds sent without waiting (noreply,
// counted apart; a bucket's, sent on its own goroutine, is one more request
// segment the decision does not wait for), and none for a denial the deny
// cache answers.
func TestBatchOneRoundTrip(t *testing.T) {
	proxy := testserver.NewProxy(t, testserver.Memcached(t))
	s := newStore(t, memcached.Config{Addrs: []string{proxy.Addr()}})
	window, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "w", Limit: 50, Window: time.Minute})
	bucket, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 3, RefillTime: time.Hour})
	fixed, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "f", Limit: 100, Window: time.Minute})
	stack, err := limiter.NewStack(window, bucket, fixed)
	if err != nil {
		t.Fatal(err)
	}
	ctx, now := context.Background(), time.Now()
	key := fmt.Sprintf("batch-%d", now.UnixNano())

	step := func(what string, wantAllowed bool, wantSegments, wantNoReply int64) limiter.Decision {
		t.Helper()
		before := proxy.Counts()
		d, err := stack.Allow(ctx, key, now)
		if err != nil || d.Allowed != wantAllowed {
			t.Fatalf("%s: %+v, %v; want allowed=%v", what, d, err, wantAllowed)
		}
		// noreply segments are written before Allow returns, but the proxy
		// may read them a moment later.
		deadline := time.Now().Add(time.Second)
		for {
			after := proxy.Counts()
			seg, nr := after.Segments-before.Segments, after.NoReply-before.NoReply
			if seg == wantSegments && nr == wantNoReply {
				return d
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d request segments and %d noreply segments at the server, want %d and %d", what, seg, nr, wantSegments, wantNoReply)
			}
			time.Sleep(time.Millisecond)
		}
	}
	step("cold key, allowed", true, 1, 0)
	step("warm key, allowed", true, 1, 0)
	if d := step("third, allowed", true, 1, 0); d.Remaining != 0 || d.Name != "b" {
		t.Fatalf("tightest: %+v, want the bucket with 0 left", d)
	}
	// The bucket denies: the windows' takes go back with noreply decrs.
	if d := step("denied by the bucket", false, 1, 1); d.Name != "b" || d.RetryAfter <= 0 {
		t.Fatalf("denial: %+v", d)
	}
	step("denied from the cache", false, 0, 0)

	// What the windows hold: exactly the three allowed requests.
	c, err := s.Add(ctx, storage.Key{Space: "fw:100:1m0s", Name: key}, now.UnixNano()/int64(time.Minute), 1, 0, time.Minute)
	if err != nil || c.C[0] != 3 {
		t.Fatalf("fixed window holds %d (%v), want 3: a refund was lost or doubled", c.C[0], err)
	}

	// A bucket refunded by another limit's denial: cas noreply on the item
	// the take cached, and the token is back.
	bucket2, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b2", MaxAmount: 10, RefillTime: time.Hour})
	fixed2, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "f2", Limit: 1, Window: time.Minute})
	stack, _ = limiter.NewStack(bucket2, fixed2)
	step("bucket then fixed, allowed", true, 1, 0)
	// The bucket's refund goes on its own goroutine (a cas on the item the
	// take cached): 1 segment waited for, 1 sent without waiting, and the
	// window's decr noreply.
	if d := step("fixed denies, bucket refunded", false, 2, 1); d.Name != "f2" {
		t.Fatalf("denial by %q, want f2", d.Name)
	}
	if err := s.WaitRefunds(ctx); err != nil || s.LostRefunds() != 0 {
		t.Fatalf("refunds: %v, %d lost", err, s.LostRefunds())
	}
	if d, err := bucket2.Get(ctx, key, now); err != nil || d.Remaining != 9 {
		t.Fatalf("bucket after the refund: %+v, %v; want 9 left (one take, one refund)", d, err)
	}
}

// TestBatchReadsLast checks, at the wire, that a batch sends its reads as
// one retrieval after all its writes: memcached sends the replies it holds
// when a retrieval command ends, so a get in mid-pipeline splits the reply
// and the client waits for a second segment. A batch of a sub-window
// window, a packed window, a token bucket and a fixed window, cold then
// warm, must send exactly one get or gets (gets when a bucket needs its
// CAS id), last, naming every counter and item the steps read; and its
// decisions must still count: the window limit of 3 denies the 4th.
func TestBatchReadsLast(t *testing.T) {
	proxy := testserver.NewProxy(t, testserver.Memcached(t))
	s := newStore(t, memcached.Config{Addrs: []string{proxy.Addr()}})
	sw, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "sw", Limit: 3, Window: time.Minute, Representation: limiter.SubWindowCounters})
	pw, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "pw", Limit: 50, Window: time.Minute, Representation: limiter.Packed, NoDenyCache: true})
	tb, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 50, RefillTime: time.Hour})
	fw, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "f", Limit: 50, Window: time.Minute})
	ctx, now := context.Background(), time.Now()
	key := fmt.Sprintf("reads-last-%d", now.UnixNano())
	for _, c := range []struct {
		limits []limiter.Limiter
		retr   string
	}{
		{[]limiter.Limiter{sw, pw, tb, fw}, "gets"},
		{[]limiter.Limiter{sw, pw, fw}, "get"},
	} {
		stack, err := limiter.NewStack(c.limits...)
		if err != nil {
			t.Fatal(err)
		}
		k := key + "-" + c.retr + "-"
		for i := range 4 {
			proxy.Record()
			mark := proxy.SentLen()
			d, err := stack.Allow(ctx, k, now)
			if err != nil || d.Allowed != (i < 3) {
				t.Fatalf("%s, decision %d: %+v, %v; want allowed=%v", c.retr, i, d, err, i < 3)
			}
			if i == 3 {
				break // a denial's refunds follow its reads
			}
			// This decision's commands: the last case's denial sent
			// refunds without waiting, which may arrive after mark.
			var cmds [][]string
			for _, cmd := range sentCommands(t, proxy, mark) {
				if strings.Contains(cmd[1], "/"+k+"|") {
					cmds = append(cmds, cmd)
				}
			}
			var retr []int
			for j, cmd := range cmds {
				if cmd[0] == "get" || cmd[0] == "gets" {
					retr = append(retr, j)
				}
			}
			if len(retr) != 1 || retr[0] != len(cmds)-1 || cmds[retr[0]][0] != c.retr {
				t.Fatalf("%s, decision %d: retrievals at %v of %d commands %v; want one %s, last", c.retr, i, retr, len(cmds), cmds, c.retr)
			}
			// The sub-window window reads its 19 older sub-windows and 19
			// newer ones, the packed window at least one counter, the
			// bucket its item.
			want := 2*limiter.DefaultSubWindows - 2 + 1
			if c.retr == "gets" {
				want++
			}
			if got := len(cmds[retr[0]]) - 1; got < want {
				t.Fatalf("%s, decision %d: the retrieval names %d keys, want at least %d: %v", c.retr, i, got, want, cmds[retr[0]])
			}
		}
	}
}

// TestBatchSameKeyTwice checks that two steps reading the same counters in
// one batch each get them: the batch's one retrieval names them twice, and
// memcached answers a key named twice twice.
func TestBatchSameKeyTwice(t *testing.T) {
	s := newStore(t, memcached.Config{})
	ctx := context.Background()
	k := storage.Key{Space: "twice", Name: fmt.Sprint(time.Now().UnixNano())}
	const span, cur = 20, 1000
	if _, err := s.Add(ctx, k, cur-1, span, 7, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(ctx, k, cur+1, span, 5, time.Hour); err != nil {
		t.Fatal(err)
	}
	steps := []storage.Step{
		{Kind: storage.StepAdd, Key: k, Idx: cur, Span: span, N: 1, TTL: time.Hour},
		{Kind: storage.StepAdd, Key: k, Idx: cur, Span: span, N: 2, TTL: time.Hour},
	}
	out := make([]storage.StepResult, len(steps))
	s.Do(ctx, steps, out)
	for i, r := range out {
		if r.Err != nil || r.Counts.C[1] != 7 || r.Counts.Later != 5 {
			t.Fatalf("step %d: %+v; want the older sub-window's 7 and the newer one's 5", i, r)
		}
	}
	if out[0].Counts.C[0] != 1 || out[1].Counts.C[0] != 3 {
		t.Fatalf("current sub-window: %d then %d, want 1 then 3", out[0].Counts.C[0], out[1].Counts.C[0])
	}
}
