package memcached

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter/storage"
)

// windowDecide makes one window add of k (sub-window cur, span, n 1)
// through Add or through Do.
func windowDecide(s *Store, k storage.Key, cur int64, span int, batch bool) (storage.Counts, error) {
	ctx := context.Background()
	if !batch {
		return s.Add(ctx, k, cur, span, 1, time.Minute)
	}
	out := make([]storage.StepResult, 1)
	s.Do(ctx, []storage.Step{{Kind: storage.StepAdd, Key: k, Idx: cur, Span: span, N: 1, TTL: time.Minute}}, out)
	return out[0].Counts, out[0].Err
}

// TestWindowKnownCounters: a window's add is sent only for a counter this
// Store has not created within its TTL, counted at the wire (the commands
// of each segment at a proxy in front of the real server), for a fixed
// window (span 1) and a sliding one (span 3), through Add and through Do:
//   - cold: add+incr; warm: the incr alone (the counter's value exact);
//   - a counter deleted on the server (an early eviction): the incr
//     answers NOT_FOUND and the next round sends add+incr, counting the
//     decision once;
//   - a counter whose TTL ran out in the cache: its add again;
//   - a new sub-window: its add;
//   - a second Store knows nothing: its add is sent, answers NOT_STORED
//     (age unknown), and is sent again next time.
func TestWindowKnownCounters(t *testing.T) {
	addr := testserver.Memcached(t)
	for _, span := range []int{1, 3} {
		for _, batch := range []bool{false, true} {
			t.Run(fmt.Sprintf("span=%d/batch=%v", span, batch), func(t *testing.T) {
				proxy := testserver.NewProxy(t, addr)
				s := testStore(t, Config{Addrs: []string{proxy.Addr()}, Jitter: -1})
				k := storage.Key{Space: fmt.Sprintf("sw:test:%d", span), Name: uniqueName(t)}
				cur := time.Now().UnixNano() / int64(time.Second)
				key := counterKey(s.keys.base(k), cur)
				// decide checks the write commands of the decision's
				// segments (a sliding window's get left out) and the count.
				decide := func(what string, wantWrites string, wantCount int64) {
					t.Helper()
					mark := proxy.Len()
					c, err := windowDecide(s, k, cur, span, batch)
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					var writes []string
					for _, seg := range proxy.Log(mark) {
						writes = append(writes, stripReads(seg))
					}
					if got := fmt.Sprint(writes); got != wantWrites {
						t.Fatalf("%s: segments %v (writes %s), want %s", what, proxy.Log(mark), got, wantWrites)
					}
					if c.C[0] != wantCount {
						t.Fatalf("%s: the counter is %d, want %d", what, c.C[0], wantCount)
					}
					if v, ok := rawValue(t, addr, key); !ok || int64(v) != wantCount {
						t.Fatalf("%s: the server holds %d (%v), want %d", what, v, ok, wantCount)
					}
				}
				decide("cold", "[add+incr]", 1)
				decide("warm", "[incr]", 2)
				decide("warm again", "[incr]", 3)

				rawCommand(t, addr, "delete "+key, "DELETED")
				// The incr alone, then a round of add+incr (Do sends the
				// vanished step again through Add).
				decide("deleted on the server", "[incr add+incr]", 1)
				decide("re-created by this Store", "[incr]", 2)

				// Its TTL run out in the cache.
				lv := [storage.PackedLevels]knownCounter{{idx: cur, until: knownNow() - 1}}
				s.keys.record(k, s.keys.base(k), 1, 0, &lv)
				decide("aged in the cache", "[add+incr]", 3)
				decide("the add left it unknown", "[add+incr]", 4) // NOT_STORED: age unknown

				// A second Store on the same key knows nothing.
				s2 := testStore(t, Config{Addrs: []string{proxy.Addr()}, Jitter: -1})
				mark := proxy.Len()
				if _, err := windowDecide(s2, k, cur, span, batch); err != nil {
					t.Fatal(err)
				}
				if got := stripReads(proxy.Log(mark)[0]); got != "add+incr" {
					t.Fatalf("second Store: %s, want add+incr", got)
				}
			})
		}
	}
}

// stripReads removes the reads (get, gets) from a segment's commands.
func stripReads(seg string) string {
	var out []string
	for _, c := range strings.Split(seg, "+") {
		if c != "get" && c != "gets" {
			out = append(out, c)
		}
	}
	return strings.Join(out, "+")
}
