package memcached_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// sentCommands returns the commands the proxy kept from byte i on (see
// testserver.Proxy.Record): each command's name and keys (a storage
// command's data block skipped).
func sentCommands(t testing.TB, p *testserver.Proxy, i int) [][]string {
	t.Helper()
	b := p.Sent(i)
	var out [][]string
	for len(b) > 0 {
		line, rest, ok := bytes.Cut(b, []byte("\r\n"))
		if !ok {
			t.Fatalf("a command without CRLF: %q", b)
		}
		f := strings.Fields(string(line))
		if len(f) < 2 {
			t.Fatalf("command %q", line)
		}
		switch f[0] {
		case "get", "gets":
			out = append(out, f)
		case "incr", "decr":
			out = append(out, f[:2])
		case "add", "set", "cas":
			n, err := strconv.Atoi(f[4])
			if err != nil || len(rest) < n+2 {
				t.Fatalf("command %q", line)
			}
			rest = rest[n+2:]
			out = append(out, f[:2])
		default:
			t.Fatalf("unexpected command %q", line)
		}
		b = rest
	}
	return out
}

// packedKeys returns the distinct keys of cmds, and how many of them a get
// names.
func packedKeys(cmds [][]string) (keys, read int) {
	all, got := map[string]bool{}, map[string]bool{}
	for _, c := range cmds {
		for _, k := range c[1:] {
			all[k] = true
			if c[0] == "get" {
				got[k] = true
			}
		}
	}
	return len(all), len(got)
}

// TestPackedOneRoundTrip counts, at the wire, what one decision of a
// packed window (the default 160 slots) sends: one request segment for an
// allowed decision, one plus one of noreply decrs for a denied one (its
// own units given back), none for a denial the deny cache answers; and
// the keys it names, at every slot offset of a level-4 counter (256
// slots): at most 12 (the packed window's target; the plan reads at most 8
// counters and adds to 4, one of which it also reads), the get at most
// storage.MaxPackedReads; at the smallest and largest resolutions (64 and
// 512 slots) the figures are logged, and bounded by 4 adds and
// MaxPackedReads reads. A stack of the packed window, a token bucket and
// a fixed window is one segment too.
func TestPackedOneRoundTrip(t *testing.T) {
	proxy := testserver.NewProxy(t, testserver.Memcached(t))
	proxy.Record()
	s := newStore(t, memcached.Config{Addrs: []string{proxy.Addr()}})
	ctx := context.Background()
	slot := time.Minute / limiter.DefaultSlots
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "p", Limit: limiter.MaxPackedLimit, Window: time.Minute, Representation: limiter.Packed})
	if err != nil {
		t.Fatal(err)
	}
	waitCounts := func(what string, before testserver.ProxyCounts, seg, nr int64) {
		t.Helper()
		// noreply segments are written before the call returns, but the
		// proxy may read them a moment later.
		deadline := time.Now().Add(time.Second)
		for {
			after := proxy.Counts()
			gs, gn := after.Segments-before.Segments, after.NoReply-before.NoReply
			if gs == seg && gn == nr {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d request segments and %d noreply segments at the server, want %d and %d (log %v)", what, gs, gn, seg, nr, proxy.Log(max(0, proxy.Len()-4)))
			}
			time.Sleep(time.Millisecond)
		}
	}

	key := limitertestKey(t)
	sweep := func(w *limiter.SlidingWindow, slot time.Duration, maxWant int) {
		t.Helper()
		r := w.Config().Slots
		t0 := (time.Now().UnixNano()/int64(slot) + 255) &^ 255
		maxKeys, maxRead, sumKeys := 0, 0, 0
		for off := range int64(256) {
			at := time.Unix(0, (t0+off)*int64(slot)+int64(slot)/2)
			before, i := proxy.Counts(), proxy.SentLen()
			d, err := w.Allow(ctx, key, at)
			if err != nil || !d.Allowed {
				t.Fatalf("r=%d, slot t0+%d: %+v, %v", r, off, d, err)
			}
			waitCounts(fmt.Sprintf("r=%d, slot t0+%d", r, off), before, 1, 0)
			cmds := sentCommands(t, proxy, i)
			keys, read := packedKeys(cmds)
			if keys > maxWant || read > storage.MaxPackedReads {
				t.Fatalf("r=%d, slot t0+%d: the decision names %d keys, %d of them read (want at most %d and %d): %v", r, off, keys, read, maxWant, storage.MaxPackedReads, cmds)
			}
			incrs := 0
			for _, c := range cmds {
				if c[0] == "incr" {
					incrs++
				}
			}
			if incrs != storage.PackedLevels {
				t.Fatalf("r=%d, slot t0+%d: %d incrs, want one per level: %v", r, off, incrs, cmds)
			}
			maxKeys, maxRead, sumKeys = max(maxKeys, keys), max(maxRead, read), sumKeys+keys
		}
		t.Logf("r=%d: keys named per decision over 256 slots: at most %d (mean %.2f), at most %d read by the get", r, maxKeys, float64(sumKeys)/256, maxRead)
	}
	sweep(w, slot, 12) // the default: the packed window's target
	for _, r := range []int{limiter.MinSlots, limiter.MaxSlots} {
		wr, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "p", Limit: limiter.MaxPackedLimit, Window: time.Minute, Representation: limiter.Packed, Slots: r})
		if err != nil {
			t.Fatal(err)
		}
		sweep(wr, time.Minute/time.Duration(r), storage.PackedLevels+storage.MaxPackedReads)
	}
	t0 := (time.Now().UnixNano()/int64(slot) + 255) &^ 255

	// A denial: its own units go back with noreply decrs, one segment.
	small, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "small", Limit: 2, Window: time.Minute, Representation: limiter.Packed})
	at := time.Unix(0, t0*int64(slot))
	for i, want := range []bool{true, true, false} {
		before := proxy.Counts()
		d, err := small.Allow(ctx, key, at)
		if err != nil || d.Allowed != want {
			t.Fatalf("call %d: %+v, %v; want allowed=%v", i, d, err, want)
		}
		nr := int64(0)
		if !want {
			nr = 1
		}
		waitCounts(fmt.Sprintf("small window, call %d", i), before, 1, nr)
	}
	before := proxy.Counts()
	if d, err := small.Allow(ctx, key, at); err != nil || d.Allowed {
		t.Fatalf("after a denial: %+v, %v", d, err)
	}
	waitCounts("denied from the cache", before, 0, 0)

	// Three limits of three kinds on one key: one pipeline.
	tb, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 100, RefillTime: time.Hour})
	fw, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Name: "f", Limit: 100, Window: time.Minute})
	stack, err := limiter.NewStack(w, tb, fw)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		before := proxy.Counts()
		if d, err := stack.Allow(ctx, key+"-stack", time.Now()); err != nil || !d.Allowed {
			t.Fatalf("stack call %d: %+v, %v", i, d, err)
		}
		waitCounts(fmt.Sprintf("stack call %d", i), before, 1, 0)
	}
}

// TestHistoryPacked runs the history checker on the packed sliding window
// (limitertest.PackedScenario: 160 slots of 2.5 ms, arrivals reordered
// across slot and level boundaries), with the window's steps going through
// the batch path (Do) as in production, and in proxy mode (reads after the
// incrs' replies, one step at a time); and at the largest cost a packed
// window takes without MaxCost (limitertest.PackedMaxCostScenario: calls
// up to limiter.PackedMaxCost, no deny cache), on the wall clock.
func TestHistoryPacked(t *testing.T) {
	t.Run("Pipeline", func(t *testing.T) {
		limitertest.RunHistory(t, newStore(t, memcached.Config{KeyPrefix: "history-packed:"}), limitertest.HistoryOptions{
			Scenarios: []limitertest.Scenario{limitertest.PackedScenario()},
			Parallel:  true,
		})
	})
	t.Run("Proxy", func(t *testing.T) {
		t.Parallel()
		limitertest.RunHistory(t, newStore(t, memcached.Config{KeyPrefix: "history-packed-proxy:", Proxy: true}), limitertest.HistoryOptions{
			Scenarios: []limitertest.Scenario{limitertest.PackedScenario()},
			Clocks:    []limitertest.Clock{limitertest.WallClock},
		})
	})
	t.Run("MaxCost", func(t *testing.T) {
		t.Parallel()
		limitertest.RunHistory(t, newStore(t, memcached.Config{KeyPrefix: "history-packed-max-cost:"}), limitertest.HistoryOptions{
			Scenarios: []limitertest.Scenario{limitertest.PackedMaxCostScenario()},
			Clocks:    []limitertest.Clock{limitertest.WallClock},
		})
	})
}

// TestHistoryFailsBrokenPacked shows the checker fails a memcached store
// that skips the incrs of level 2 or of level 3, on the single-step and the
// batch path (limitertest.RunBrokenPacked).
func TestHistoryFailsBrokenPacked(t *testing.T) {
	limitertest.RunBrokenPacked(t, func(t *testing.T, level int) limitertest.Store {
		return newStore(t, memcached.Config{KeyPrefix: fmt.Sprintf("history-broken-%d-%d:", level, time.Now().UnixNano())})
	})
}
