package authz

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// stallLeases is the memory lease store behind a switch: while hang is
// set an acquire never answers (it waits for its context and returns its
// error: an outcome the caller cannot know), and a release passes to the
// store, fails, or waits for its context, as release says.
type stallLeases struct {
	*memory.Leases
	hang    atomic.Bool
	release atomic.Int32
}

// stallLeases.release values.
const (
	releasePass = iota
	releaseFail
	releaseHang
)

func (s *stallLeases) AcquireLease(ctx context.Context, k storage.Key, op storage.LeaseOp) (storage.Decision, error) {
	if s.hang.Load() {
		<-ctx.Done()
		return storage.Decision{}, ctx.Err()
	}
	return s.Leases.AcquireLease(ctx, k, op)
}

func (s *stallLeases) ReleaseLease(ctx context.Context, k storage.Key, op storage.ReleaseOp) error {
	switch s.release.Load() {
	case releaseFail:
		return fmt.Errorf("%w: the test's store", storage.ErrUnavailable)
	case releaseHang:
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Leases.ReleaseLease(ctx, k, op)
}

// concurrencyRules: in-flight has a concurrency limit (failing open, so
// that a request cut short still gets both rules' lines), per-ip none.
const concurrencyRules = `
rules:
  - name: in-flight
    key: "{ip}"
    fail: open
    concurrency: {limit: 100}
    limits: [{algorithm: fixed_window, limit: 1000, window: 1m}]
  - name: per-ip
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 1000, window: 1m}]
`

// ccLine is a decision line's concurrency clean-up counts.
type ccLine struct {
	Rule                                                                                          string
	FailOpen                                                                                      int
	ConcurrencyUnknown, ConcurrencyCleanups, ConcurrencyCleanupErrors, ConcurrencyCleanupsSkipped *int64
}

// ccSums are sums of ccLine's counts.
type ccSums struct{ unknown, cleanups, errors, skipped int64 }

// TestMetricsConcurrencyCleanups drives a rule's concurrency acquires
// into a store that never answers, through the handler, on synctest's
// clock, and reads the decision lines: each declares the four clean-up
// metrics; each request cut short (one after another) says
// ConcurrencyUnknown 1 on its line of the rule; the clean-up releases (two per acquire: at once and 1 s
// later) appear as deltas on the rule's later lines, so that their sums
// over the rule's lines are the scenario's counts and equal the limit's
// own counters (policy.Policy.ConcurrencyStats); the rule without a
// concurrency limit says 0.
func TestMetricsConcurrencyCleanups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, err := memory.NewLeases(memory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		store := &stallLeases{Leases: mem}
		h := newTestHandler(t, oneRule, func(c *Config) {
			c.Deadline = 50 * time.Millisecond
			c.Policy = concurrencyPolicy(t, store)
		})
		ev := readEvent(t, "rest-request")
		var read int // lines of h.metrics already checked
		// step sends requests that the store cuts short, one after
		// another or all at once, then one that it answers.
		step := func(name string, want ccSums, requests int, atOnce bool) {
			t.Helper()
			store.hang.Store(true)
			var wg sync.WaitGroup
			for range requests {
				if !atOnce {
					h.Decide(t.Context(), ev)
					continue
				}
				wg.Go(func() { h.Decide(t.Context(), ev) })
			}
			wg.Wait()
			// Both releases of every acquire run (the second 1 s after
			// the first), then a request that is not cut short carries
			// the rest to the rule's line.
			time.Sleep(3 * time.Second)
			synctest.Wait()
			store.hang.Store(false)
			if _, _, err := h.Decide(t.Context(), ev); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(h.metrics.String()), "\n")
			got := sumCleanups(t, lines[read:], requests, !atOnce)
			read = len(lines)
			if got != want {
				t.Errorf("%s: the rule's lines sum to %+v, want %+v", name, got, want)
			}
		}
		// Releases that reach the store; releases that fail; releases
		// that hang (500 ms each): 70 acquires cut short at once run 64
		// releases and skip 6, twice.
		store.release.Store(releasePass)
		step("releases pass", ccSums{unknown: 3, cleanups: 6}, 3, false)
		store.release.Store(releaseFail)
		step("releases fail", ccSums{unknown: 2, cleanups: 4, errors: 4}, 2, false)
		store.release.Store(releaseHang)
		step("releases hang", ccSums{unknown: 70, cleanups: 128, errors: 128, skipped: 12}, 70, true)

		st := h.cfg.Policy.Policy().ConcurrencyStats("in-flight")
		if want := (limiter.ConcurrencyStats{Unknown: 75, Releases: 138, Failed: 132, Skipped: 12}); st != want {
			t.Errorf("the limit's counters %+v, want %+v", st, want)
		}
	})
}

// concurrencyPolicy is concurrencyRules on the memory store, with the
// concurrency leases on leases.
func concurrencyPolicy(t *testing.T, leases storage.LeaseStore) *policy.Policy {
	t.Helper()
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load([]byte(concurrencyRules), policy.Options{Stores: map[string]storage.Store{"memory": mem}, Leases: leases})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sumCleanups checks lines (those of cutShort requests cut short, then one
// that was not) and sums the in-flight rule's clean-up counts: every line
// declares and carries the four metrics, in-flight's lines of the requests
// cut short fail open (and, when they ran one after another, each says
// ConcurrencyUnknown 1: the acquire counts it before its line), the last
// one says ConcurrencyUnknown 0, and per-ip's lines say 0 throughout.
func sumCleanups(t *testing.T, lines []string, cutShort int, oneByOne bool) ccSums {
	t.Helper()
	if len(lines) != 2*(cutShort+1) {
		t.Fatalf("%d lines, want %d", len(lines), 2*(cutShort+1))
	}
	var sum ccSums
	for i, s := range lines {
		var meta struct {
			AWS struct {
				CloudWatchMetrics []struct{ Metrics []struct{ Name, Unit string } }
			} `json:"_aws"`
		}
		var l ccLine
		if err := json.Unmarshal([]byte(s), &meta); err != nil {
			t.Fatalf("line %q: %v", s, err)
		}
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("line %q: %v", s, err)
		}
		declared := meta.AWS.CloudWatchMetrics[0].Metrics
		for _, name := range []string{"ConcurrencyUnknown", "ConcurrencyCleanups", "ConcurrencyCleanupErrors", "ConcurrencyCleanupsSkipped"} {
			if !slices.Contains(declared, struct{ Name, Unit string }{name, "Count"}) {
				t.Fatalf("line %d does not declare %s (Count): %s", i, name, s[:min(len(s), 200)])
			}
		}
		if l.ConcurrencyUnknown == nil || l.ConcurrencyCleanups == nil || l.ConcurrencyCleanupErrors == nil || l.ConcurrencyCleanupsSkipped == nil {
			t.Fatalf("line %d lacks a clean-up count: %s", i, tail(s))
		}
		c := ccSums{*l.ConcurrencyUnknown, *l.ConcurrencyCleanups, *l.ConcurrencyCleanupErrors, *l.ConcurrencyCleanupsSkipped}
		switch l.Rule {
		case "per-ip":
			if c != (ccSums{}) {
				t.Errorf("line %d: per-ip has no concurrency limit: %s", i, tail(s))
			}
			continue
		case "in-flight":
		default:
			t.Fatalf("line %d: rule %q", i, l.Rule)
		}
		if last := i >= len(lines)-2; last && (c.unknown != 0 || l.FailOpen != 0) {
			t.Errorf("line %d: a request that was not cut short: %s", i, tail(s))
		} else if !last && (l.FailOpen != 1 || oneByOne && c.unknown != 1) {
			t.Errorf("line %d: a request cut short (fail open, ConcurrencyUnknown 1 one by one): %s", i, tail(s))
		}
		sum.unknown += c.unknown
		sum.cleanups += c.cleanups
		sum.errors += c.errors
		sum.skipped += c.skipped
	}
	return sum
}

// tail is a metric line from its Rule on: its values.
func tail(line string) string {
	if i := strings.Index(line, `"Rule":`); i >= 0 {
		return line[i:]
	}
	return line
}
