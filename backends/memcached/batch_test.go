package memcached_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
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
	c, err := s.Add(ctx, limiter.Key{Space: "fw:100:1m0s", Name: key}, now.UnixNano()/int64(time.Minute), 1, 0, time.Minute)
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
