package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

func newStore(t testing.TB) *memory.Store {
	t.Helper()
	s, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMaxCost: Auto keeps a sliding window packed up to PackedMaxCost
// and uses sub-window counters above it; a call costing more than MaxCost
// is refused with ErrInvalidCost and takes nothing.
func TestMaxCost(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	for _, c := range []struct {
		maxCost int64
		want    limiter.Representation
	}{{0, limiter.Packed}, {1, limiter.Packed}, {limiter.PackedMaxCost, limiter.Packed}, {limiter.PackedMaxCost + 1, limiter.SubWindowCounters}} {
		w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "w", Limit: 100, Window: time.Minute, MaxCost: c.maxCost})
		if err != nil {
			t.Fatal(err)
		}
		if got := w.Config().Representation; got != c.want {
			t.Errorf("MaxCost %d: %v, want %v", c.maxCost, got, c.want)
		}
		if c.maxCost == 0 {
			continue
		}
		key := fmt.Sprint("max-cost-", c.maxCost)
		now := time.Now()
		if _, err := w.AllowN(ctx, key, now, c.maxCost+1); !errors.Is(err, limiter.ErrInvalidCost) {
			t.Errorf("MaxCost %d, a call of %d: %v, want ErrInvalidCost", c.maxCost, c.maxCost+1, err)
		}
		if err := w.Refund(ctx, key, now, c.maxCost+1); !errors.Is(err, limiter.ErrInvalidCost) {
			t.Errorf("MaxCost %d, a refund of %d: %v, want ErrInvalidCost", c.maxCost, c.maxCost+1, err)
		}
		d, err := w.AllowN(ctx, key, now, c.maxCost)
		if err != nil || !d.Allowed || d.Remaining != 100-c.maxCost {
			t.Errorf("MaxCost %d, a call of %d: %+v, %v; want allowed with %d left (the refused call took nothing)", c.maxCost, c.maxCost, d, err, 100-c.maxCost)
		}
	}
}

// TestPackedDefaultMaxCost: a packed window given no MaxCost takes calls
// up to PackedMaxCost (or its limit, if smaller), not up to its limit: a
// call above is refused with ErrInvalidCost, takes nothing, and its error
// says to set MaxCost. A sub-window window given none takes calls up to
// its limit, as before.
func TestPackedDefaultMaxCost(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	now := time.Now()
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "w", Limit: 100, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if c := w.Config(); c.Representation != limiter.Packed || c.MaxCost != limiter.PackedMaxCost {
		t.Fatalf("no MaxCost: %v with MaxCost %d, want packed with %d", c.Representation, c.MaxCost, limiter.PackedMaxCost)
	}
	_, err = w.AllowN(ctx, "k", now, limiter.PackedMaxCost+1)
	if !errors.Is(err, limiter.ErrInvalidCost) || !strings.Contains(err.Error(), "SlidingWindowConfig.MaxCost") {
		t.Errorf("a call of %d on a packed window without MaxCost: %v; want ErrInvalidCost saying to set SlidingWindowConfig.MaxCost", limiter.PackedMaxCost+1, err)
	}
	if err := w.Refund(ctx, "k", now, limiter.PackedMaxCost+1); !errors.Is(err, limiter.ErrInvalidCost) {
		t.Errorf("a refund of %d: %v, want ErrInvalidCost", limiter.PackedMaxCost+1, err)
	}
	if d, err := w.AllowN(ctx, "k", now, limiter.PackedMaxCost); err != nil || !d.Allowed || d.Remaining != 100-limiter.PackedMaxCost {
		t.Errorf("a call of %d: %+v, %v; want allowed with %d left (the refused call took nothing)", limiter.PackedMaxCost, d, err, 100-limiter.PackedMaxCost)
	}
	// The same window named again with its own Config (defaults applied)
	// is valid and keeps its keys (a packed window at MaxCost 32).
	again, err := limiter.NewSlidingWindow(s, w.Config())
	if err != nil {
		t.Fatalf("NewSlidingWindow(w.Config()): %v", err)
	}
	if d, err := again.AllowN(ctx, "k", now, 1); err != nil || d.Remaining != 100-limiter.PackedMaxCost-1 {
		t.Errorf("the window built from its Config: %+v, %v; want %d left (the same counters)", d, err, 100-limiter.PackedMaxCost-1)
	}

	small, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "small", Limit: 10, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if c := small.Config(); c.Representation != limiter.Packed || c.MaxCost != 10 {
		t.Errorf("limit 10, no MaxCost: %v with MaxCost %d, want packed with 10", c.Representation, c.MaxCost)
	}
	if _, err := limiter.NewSlidingWindow(s, small.Config()); err != nil {
		t.Errorf("NewSlidingWindow(small.Config()): %v", err)
	}

	sub, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "sub", Limit: 100, Window: time.Minute, Representation: limiter.SubWindowCounters})
	if err != nil {
		t.Fatal(err)
	}
	if c := sub.Config(); c.MaxCost != 0 {
		t.Errorf("sub-windows, no MaxCost: MaxCost %d, want 0 (calls up to the limit)", c.MaxCost)
	}
	if d, err := sub.AllowN(ctx, "k", now, 100); err != nil || !d.Allowed {
		t.Errorf("sub-windows, a call of the whole limit: %+v, %v; want allowed", d, err)
	}
}

func TestInvalidConfig(t *testing.T) {
	s := newStore(t)
	tb := func(c limiter.TokenBucketConfig) error { _, err := limiter.NewTokenBucket(s, c); return err }
	sw := func(c limiter.SlidingWindowConfig) error { _, err := limiter.NewSlidingWindow(s, c); return err }
	fw := func(c limiter.FixedWindowConfig) error { _, err := limiter.NewFixedWindow(s, c); return err }
	sl := func(c limiter.SlidingLogConfig) error { _, err := limiter.NewSlidingLog(s, c); return err }
	for _, c := range []struct {
		name  string
		err   error
		field string // the message must name it
	}{
		{"bucket zero max", tb(limiter.TokenBucketConfig{Name: "b", RefillTime: time.Second}), "max amount"},
		{"bucket negative max", tb(limiter.TokenBucketConfig{Name: "b", MaxAmount: -1, RefillTime: time.Second}), "max amount"},
		{"bucket zero refill time", tb(limiter.TokenBucketConfig{Name: "b", MaxAmount: 1}), "refill time"},
		{"bucket negative refill amount", tb(limiter.TokenBucketConfig{Name: "b", MaxAmount: 1, RefillTime: time.Second, RefillAmount: -2}), "refill amount"},
		{"bucket nil store", func() error {
			_, err := limiter.NewTokenBucket(nil, limiter.TokenBucketConfig{MaxAmount: 1, RefillTime: 1})
			return err
		}(), "store"},
		{"window zero limit", sw(limiter.SlidingWindowConfig{Name: "w", Window: time.Minute}), "limit"},
		{"window negative window", sw(limiter.SlidingWindowConfig{Name: "w", Limit: 1, Window: -time.Minute}), "window"},
		{"window sub-windows not dividing", sw(limiter.SlidingWindowConfig{Name: "w", Limit: 1, Window: time.Second, SubWindows: 7}), "sub-windows"},
		{"window negative sub-windows", sw(limiter.SlidingWindowConfig{Name: "w", Limit: 1, Window: time.Minute, SubWindows: -2}), "sub-windows"},
		{"window too many sub-windows", sw(limiter.SlidingWindowConfig{Name: "w", Limit: 1, Window: time.Hour, SubWindows: limiter.MaxSubWindows + 1}), "sub-windows"},
		{"window sub-window under 1ms", sw(limiter.SlidingWindowConfig{Name: "w", Limit: 1, Window: 10 * time.Millisecond, SubWindows: 20}), "sub-windows"},
		{"window unknown estimator", sw(limiter.SlidingWindowConfig{Name: "w", Limit: 1, Window: time.Minute, Estimator: 9}), "estimator"},
		{"window negative max cost", sw(limiter.SlidingWindowConfig{Name: "w", Limit: 10, Window: time.Minute, MaxCost: -1}), "max-cost"},
		{"window max cost above the limit", sw(limiter.SlidingWindowConfig{Name: "w", Limit: 10, Window: time.Minute, MaxCost: 11}), "max-cost"},
		{"packed window max cost above PackedMaxCost", sw(limiter.SlidingWindowConfig{Name: "w", Limit: 100, Window: time.Minute,
			Representation: limiter.Packed, MaxCost: limiter.PackedMaxCost + 1}), "max-cost"},
		{"fixed zero limit", fw(limiter.FixedWindowConfig{Name: "f", Window: time.Minute}), "limit"},
		{"fixed zero window", fw(limiter.FixedWindowConfig{Name: "f", Limit: 1}), "window"},
		{"log limit too big", sl(limiter.SlidingLogConfig{Name: "l", Limit: storage.MaxLogLimit + 1, Window: time.Minute}), "limit"},
		{"log zero window", sl(limiter.SlidingLogConfig{Name: "l", Limit: 1}), "window"},
		{"empty stack", func() error { _, err := limiter.NewStack(); return err }(), "at least one"},
		{"stack with nil", func() error { _, err := limiter.NewStack(nil); return err }(), "nil"},
	} {
		if !errors.Is(c.err, limiter.ErrInvalidConfig) {
			t.Errorf("%s: error %v, want ErrInvalidConfig", c.name, c.err)
			continue
		}
		if !strings.Contains(c.err.Error(), c.field) {
			t.Errorf("%s: %q does not name the field %q", c.name, c.err, c.field)
		}
	}
}

func TestCostAboveCapacity(t *testing.T) {
	b, err := limiter.NewTokenBucket(newStore(t), limiter.TokenBucketConfig{Name: "small", MaxAmount: 5, RefillTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.AllowN(context.Background(), "k", time.Unix(0, 0), 6)
	if !errors.Is(err, limiter.ErrInvalidCost) || !strings.Contains(err.Error(), "exceeds the capacity 5") {
		t.Fatalf("cost 6 on a bucket of 5: %v", err)
	}
}

// Extreme numbers never overflow into minted or negative tokens.
func TestBucketExtremes(t *testing.T) {
	s := newStore(t)
	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 1 << 62, RefillTime: time.Nanosecond, RefillAmount: 1 << 61})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Unix(0, 0)
	if d, err := b.AllowN(ctx, "k", start, 1<<62); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("draining: %+v %v", d, err)
	}
	// A century later the bucket is exactly full, not overflowed.
	d, err := b.Get(ctx, "k", start.Add(100*365*24*time.Hour))
	if err != nil || d.Remaining != 1<<62 {
		t.Fatalf("a century later: %+v %v", d, err)
	}
	// Times Unix nanoseconds cannot hold are refused; the extremes that fit
	// work, and counts near MaxInt64 saturate instead of wrapping.
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1 << 62, Window: time.Hour, SubWindows: 60, Estimator: limiter.Interpolated})
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range []time.Time{time.Unix(-1<<40, 0), time.Unix(1<<40, 0), {}} {
		if _, err := w.AllowN(ctx, "k", at, 1); !errors.Is(err, limiter.ErrInvalidTime) {
			t.Fatalf("at %v: error %v, want ErrInvalidTime", at, err)
		}
		if _, err := b.AllowN(ctx, "k", at, 1); !errors.Is(err, limiter.ErrInvalidTime) {
			t.Fatalf("bucket at %v: error %v, want ErrInvalidTime", at, err)
		}
	}
	for _, at := range []time.Time{time.Unix(0, -1), time.Date(1700, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2261, 1, 1, 0, 0, 0, 0, time.UTC)} {
		key := at.String()
		if d, err := w.AllowN(ctx, key, at, 1<<62); err != nil || !d.Allowed || d.Remaining != 0 {
			t.Fatalf("at %v: %+v %v", at, d, err)
		}
		if d, err := w.AllowN(ctx, key, at, 1); err != nil || d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("at %v, second: %+v %v", at, d, err)
		}
	}
}

// TestImportsStandardLibraryOnly keeps the dependency direction honest:
// limiter never imports a backend, the AWS SDK, gomemcache or aws-lambda-go.
// limiter and every package under it import the standard library and each
// other only, with one exception: limiter/limitertest may also import
// porcupine, the linearizability checker its history check (RunHistory)
// runs token-bucket histories through; writing our own would be a second,
// unproven checker. limitertest is test support, imported by _test.go files
// only, and the second half of this test keeps it so: no other package's
// build imports limitertest or porcupine, so neither reaches a Lambda
// binary.
func TestImportsStandardLibraryOnly(t *testing.T) {
	const (
		module    = "github.com/sluicehq/sluice/"
		test      = module + "limiter/limitertest"
		porcupine = "github.com/anishathalye/porcupine"
	)
	extra := map[string][]string{test: {porcupine}}
	goList := func(args ...string) []string {
		t.Helper()
		out, err := exec.Command("go", append([]string{"list"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %v: %v\n%s", args, err, out)
		}
		return strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	within := func(pkg, root string) bool { return pkg == root || strings.HasPrefix(pkg, root+"/") }
	for _, pkg := range goList("./...") {
		for _, dep := range goList("-deps", pkg) {
			first, _, _ := strings.Cut(dep, "/")
			if !strings.Contains(first, ".") || within(dep, module+"limiter") {
				continue // the standard library, or limiter itself
			}
			if slices.ContainsFunc(extra[pkg], func(root string) bool { return within(dep, root) }) {
				continue
			}
			t.Errorf("%s depends on %s", pkg, dep)
		}
	}
	for _, line := range goList("-f", "{{.ImportPath}} {{join .Deps \" \"}}", module+"...") {
		pkg, deps, _ := strings.Cut(line, " ")
		if within(pkg, test) {
			continue
		}
		for _, dep := range strings.Fields(deps) {
			if within(dep, test) || within(dep, porcupine) {
				t.Errorf("%s (not a test) depends on %s: test support would reach a binary", pkg, dep)
			}
		}
	}
}

// A clock far behind every sub-window a store holds must not get free
// admission: what it adds is still counted.
func TestFarBehindClockIsCounted(t *testing.T) {
	w, err := limiter.NewSlidingWindow(newStore(t), limiter.SlidingWindowConfig{Limit: 3, Window: time.Minute, SubWindows: 6})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if d, _ := w.Allow(ctx, "k", now); !d.Allowed {
		t.Fatal("first request denied")
	}
	late := now.Add(-24 * time.Hour)
	allowed := 0
	for range 10 {
		if d, err := w.Allow(ctx, "k", late); err != nil {
			t.Fatal(err)
		} else if d.Allowed {
			allowed++
		}
	}
	if allowed != 2 {
		t.Fatalf("a clock a day behind got %d requests through a limit of 3 with 1 used, want 2", allowed)
	}
}
