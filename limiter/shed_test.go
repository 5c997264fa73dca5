package limiter_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// shedSignal is a utilization the test sets.
type shedSignal struct {
	u   float64
	err error
}

func (s *shedSignal) Utilization(context.Context) (float64, error) { return s.u, s.err }

func newShedder(t testing.TB, sig limiter.Utilization, cfg limiter.UtilizationShedderConfig) *limiter.UtilizationShedder {
	t.Helper()
	cfg.Utilization = sig
	if cfg.Rand == nil {
		cfg.Rand = rand.NewPCG(2026, 3)
	}
	s, err := limiter.NewUtilizationShedder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func shedCheck(t testing.TB, s *limiter.UtilizationShedder, p limiter.Priority, now time.Time) bool {
	t.Helper()
	d, err := s.Check(context.Background(), p, now)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed && d.RetryAfter <= 0 {
		t.Fatalf("shed without RetryAfter: %+v", d)
	}
	return !d.Allowed
}

// stripeRun is Stripe's test_check_worker_utilization_load_shedder on a fake
// clock: 1001 requests at utilization 0 ("business as usual"), then
// utilization 1 ("workers are exhausted") with one request per second for
// 0..NUMBER_OF_SECONDS_BEFORE_SHEDDING_STARTS+NUMBER_OF_SECONDS_TO_SHED_ALL_TRAFFIC
// (149 requests, 148 simulated seconds). It returns the drops among those
// 149, the sum of their drop chances, and whether one more request, a
// second later, is dropped.
func stripeRun(t testing.TB, s *limiter.UtilizationShedder, sig *shedSignal, p limiter.Priority) (drops int, expected float64, last bool) {
	t.Helper()
	t0 := time.Unix(1_700_000_000, 0)
	sig.u = 0
	for range 1001 {
		if shedCheck(t, s, p, t0) {
			t.Fatal("dropped a request at utilization 0")
		}
	}
	sig.u = 1
	now := t0
	for range 28 + 120 + 1 {
		dropped := shedCheck(t, s, p, now)
		expected += s.DropChance(p)
		if dropped {
			drops++
		}
		now = now.Add(time.Second) // sleep 1
	}
	return drops, expected, shedCheck(t, s, p, now)
}

// TestUtilizationShedderStripe reproduces Stripe's test: "Should be ~60"
// requests dropped, and then shedding all traffic.
//
// The expected count follows from the controller. The shedder starts at
// rest, s = -28/120, and utilization 0 keeps it there. At utilization 1 the
// derivative is (1-0.8)/(1-0.8)/120 = 1/120 per second, so the request at
// second i sees s = (i-28)/120, and is dropped with chance s when s > 0
// (one class of non-critical traffic: Uniform). The expected drops are
// sum_{j=1..120} j/120 = 121/2 = 60.5, with variance sum p(1-p) = 60.5 -
// sum j^2/120^2 = 60.5 - 40.5 = 20 (standard deviation 4.5): 50..70 is
// about +-2.2 standard deviations. Over 20,000 seeds of this generator 0.7%
// of runs drop fewer than 50 and 2.2% more than 70 (the PCG seed 1,2 drops
// 49, for instance), so one run is checked against the range with a fixed
// seed, and the mean of 400 seeds against 60.5. The sum of the drop chances
// is checked exactly. A second after the last request s = 121/120, clamped
// to 1: everything non-critical is dropped.
func TestUtilizationShedderStripe(t *testing.T) {
	sig := &shedSignal{}
	s := newShedder(t, sig, limiter.UtilizationShedderConfig{Uniform: true})
	drops, expected, last := stripeRun(t, s, sig, limiter.PriorityNormal)
	t.Logf("%d requests were dropped (expected %.4f)", drops, expected)
	if math.Abs(expected-60.5) > 1e-6 {
		t.Fatalf("sum of drop chances %v, want 60.5", expected)
	}
	if drops < 50 || drops > 70 {
		t.Fatalf("%d requests were dropped, want about 60 (50..70)", drops)
	}
	if !last {
		t.Fatal("after 148 s at utilization 1 a request got through: want all traffic shed")
	}
	if st := s.State(); st.Amount != 1 || st.Utilization != 1 {
		t.Fatalf("state %+v, want amount 1", st)
	}
	// Critical traffic still passes, and does not even read the signal.
	sig.err = errors.New("not read")
	if shedCheck(t, s, limiter.PriorityCritical, time.Unix(1_700_000_200, 0)) {
		t.Fatal("critical request shed")
	}

	// Over many seeds the mean is 60.5.
	total := 0
	const seeds = 400
	for seed := range uint64(seeds) {
		sig := &shedSignal{}
		s := newShedder(t, sig, limiter.UtilizationShedderConfig{Uniform: true, Rand: rand.NewPCG(seed, seed^0x5eed)})
		n, _, _ := stripeRun(t, s, sig, limiter.PriorityNormal)
		total += n
	}
	if mean := float64(total) / seeds; math.Abs(mean-60.5) > 1 { // 4.5 standard errors
		t.Fatalf("mean drops over %d seeds %.2f, want 60.5", seeds, mean)
	}
}

// TestUtilizationShedderIdle: with utilization 0 nothing is ever dropped.
func TestUtilizationShedderIdle(t *testing.T) {
	sig := &shedSignal{}
	for _, uniform := range []bool{true, false} {
		s := newShedder(t, sig, limiter.UtilizationShedderConfig{Uniform: uniform})
		now := time.Unix(1_700_000_000, 0)
		for i := range 5000 {
			for p := limiter.PriorityLow; p <= limiter.PriorityCritical; p++ {
				if shedCheck(t, s, p, now) {
					t.Fatalf("request %d of priority %v dropped at utilization 0", i, p)
				}
			}
			now = now.Add(100 * time.Millisecond)
		}
		if a := s.State().Amount; a != -28.0/120 {
			t.Fatalf("amount at rest %v, want -28/120", a)
		}
	}
}

// TestUtilizationShedderPriorities: by default low traffic is shed first,
// then normal, then high; critical never. Over Stripe's run the expected
// drops per priority are sum_j clamp(j/40-k, 0, 1) for j = 1..120: 100.5
// for low (k=0), 60.5 for normal (k=1), 20.5 for high (k=2).
func TestUtilizationShedderPriorities(t *testing.T) {
	sig := &shedSignal{}
	s := newShedder(t, sig, limiter.UtilizationShedderConfig{})
	prios := []limiter.Priority{limiter.PriorityLow, limiter.PriorityNormal, limiter.PriorityHigh, limiter.PriorityCritical}
	want := []float64{100.5, 60.5, 20.5, 0}
	drops := make([]int, len(prios))
	expected := make([]float64, len(prios))
	now := time.Unix(1_700_000_000, 0)
	shedCheck(t, s, limiter.PriorityNormal, now)
	sig.u = 1
	for range 149 {
		for i, p := range prios {
			if shedCheck(t, s, p, now) {
				drops[i]++
			}
			expected[i] += s.DropChance(p)
		}
		for i := 1; i < len(prios); i++ {
			if s.DropChance(prios[i]) > s.DropChance(prios[i-1]) {
				t.Fatalf("at %v %v traffic is shed more than %v", now, prios[i], prios[i-1])
			}
		}
		now = now.Add(time.Second)
	}
	t.Logf("drops low/normal/high/critical: %v (expected %v)", drops, expected)
	for i, p := range prios {
		if math.Abs(expected[i]-want[i]) > 1e-6 {
			t.Fatalf("%v: expected drops %v, want %v", p, expected[i], want[i])
		}
		// 4.5 standard deviations at most (each variance is below 20).
		if math.Abs(float64(drops[i])-want[i]) > 20 {
			t.Fatalf("%v: %d drops, expected %v", p, drops[i], want[i])
		}
	}
	if drops[3] != 0 {
		t.Fatal("critical traffic was shed")
	}
	for _, p := range prios[:3] {
		if !shedCheck(t, s, p, now) {
			t.Fatalf("%v request passed at full shedding", p)
		}
	}
}

// TestUtilizationShedderController checks the controller's shape: the dead
// zone, partial derivatives, the 28 s cap on one step, slow recovery, time
// going backwards.
func TestUtilizationShedderController(t *testing.T) {
	sig := &shedSignal{}
	s := newShedder(t, sig, limiter.UtilizationShedderConfig{Uniform: true})
	t0 := time.Unix(1_700_000_000, 0)
	const rest = -28.0 / 120
	amount := func() float64 { return s.State().Amount }
	at := func(d time.Duration, u float64) {
		t.Helper()
		sig.u = u
		if _, err := s.Check(context.Background(), limiter.PriorityNormal, t0.Add(d)); err != nil {
			t.Fatal(err)
		}
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Fatalf("%s: amount %v, want %v", what, got, want)
		}
	}
	at(0, 1) // the first check only starts the clock
	near("first check", amount(), rest)
	at(10*time.Second, 1)
	near("10 s at utilization 1", amount(), rest+10.0/120)
	// One step counts at most 28 s (Stripe's clamp): the utilization just
	// read says little about a long gap.
	at(10*time.Minute, 1)
	near("a 590 s gap", amount(), rest+38.0/120)
	// The dead zone holds.
	at(11*time.Minute, 0.75)
	near("dead zone", amount(), rest+38.0/120)
	// Half-bad utilization moves at half speed.
	at(11*time.Minute+20*time.Second, 0.9)
	near("0.9 for 20 s", amount(), rest+48.0/120)
	// Time going backwards changes nothing and is not counted twice.
	at(10*time.Minute, 1)
	near("backwards", amount(), rest+48.0/120)
	at(11*time.Minute+21*time.Second, 1)
	near("after backwards", amount(), rest+49.0/120)
	// Up to full shedding, then recovery at 1/120 per second when idle.
	for i := range 200 {
		at(12*time.Minute+time.Duration(i)*time.Second, 1)
	}
	near("full", amount(), 1)
	base := 12*time.Minute + 199*time.Second
	at(base+30*time.Second, 0)
	near("30 s idle", amount(), 1-28.0/120) // capped step
	at(base+60*time.Second, 0)
	near("60 s idle", amount(), 1-56.0/120)
	if c := s.DropChance(limiter.PriorityNormal); c < 0.5 {
		t.Fatalf("after a minute of idle workers the shedder already lets %.0f%% back: too fast", 100*(1-c))
	}
	// Utilization 0.35 recovers at half speed: (0.35/0.7 - 1)/120.
	at(base+80*time.Second, 0.35)
	near("0.35 for 20 s", amount(), 1-56.0/120-10.0/120)
	for i := range 300 {
		at(base+81*time.Second+time.Duration(i)*time.Second, 0)
	}
	near("recovered", amount(), rest)
}

// TestUtilizationShedderSignalLost: a failing signal is reported with a
// valid decision, and the controller recedes as if idle.
func TestUtilizationShedderSignalLost(t *testing.T) {
	sig := &shedSignal{u: 1}
	s := newShedder(t, sig, limiter.UtilizationShedderConfig{Uniform: true})
	t0 := time.Unix(1_700_000_000, 0)
	for i := range 200 {
		shedCheck(t, s, limiter.PriorityNormal, t0.Add(time.Duration(i)*time.Second))
	}
	sig.err = errors.New("store down")
	d, err := s.Check(context.Background(), limiter.PriorityNormal, t0.Add(200*time.Second))
	if !errors.Is(err, limiter.ErrNoUtilization) || !strings.Contains(err.Error(), "store down") {
		t.Fatalf("error %v, want ErrNoUtilization wrapping the signal's", err)
	}
	if d.Name != "utilization" || (d.Allowed && d.RetryAfter != 0) {
		t.Fatalf("decision %+v", d)
	}
	if st := s.State(); math.Abs(st.Amount-(1-1.0/120)) > 1e-9 || st.Err == nil || st.Utilization != 1 {
		t.Fatalf("state after a lost signal: %+v", st)
	}
	sig.err, sig.u = nil, math.NaN()
	if _, err := s.Check(context.Background(), limiter.PriorityNormal, t0.Add(201*time.Second)); !errors.Is(err, limiter.ErrNoUtilization) {
		t.Fatalf("NaN utilization: %v", err)
	}
}

func TestUtilizationShedderConfig(t *testing.T) {
	sig := &shedSignal{}
	s := newShedder(t, sig, limiter.UtilizationShedderConfig{})
	cfg := s.Config()
	if cfg.GoodMark != 0.7 || cfg.BadMark != 0.8 || cfg.Wait != 28*time.Second || cfg.Ramp != 120*time.Second || cfg.Name != "utilization" || cfg.RetryAfter != time.Second {
		t.Fatalf("defaults: %+v", cfg)
	}
	for _, c := range []struct {
		cfg   limiter.UtilizationShedderConfig
		field string
	}{
		{limiter.UtilizationShedderConfig{}, "utilization"},
		{limiter.UtilizationShedderConfig{Utilization: sig, GoodMark: 0.9, BadMark: 0.8}, "marks"},
		{limiter.UtilizationShedderConfig{Utilization: sig, BadMark: 1}, "marks"},
		{limiter.UtilizationShedderConfig{Utilization: sig, GoodMark: -0.1}, "marks"},
		{limiter.UtilizationShedderConfig{Utilization: sig, GoodMark: math.NaN()}, "marks"},
		{limiter.UtilizationShedderConfig{Utilization: sig, Ramp: -time.Second}, "ramp"},
		{limiter.UtilizationShedderConfig{Utilization: sig, Wait: -time.Second}, "wait"},
		{limiter.UtilizationShedderConfig{Utilization: sig, Wait: time.Millisecond}, "wait"},
		{limiter.UtilizationShedderConfig{Utilization: sig, RetryAfter: -time.Second}, "retry after"},
	} {
		if _, err := limiter.NewUtilizationShedder(c.cfg); !errors.Is(err, limiter.ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: %v, want ErrInvalidConfig naming %q", c.cfg, err, c.field)
		}
	}
	// A short wait: shedding starts after 1 s of bad utilization.
	s = newShedder(t, sig, limiter.UtilizationShedderConfig{Wait: time.Second, Uniform: true})
	sig.u = 1
	t0 := time.Unix(1_700_000_000, 0)
	for i := range 3 {
		shedCheck(t, s, limiter.PriorityNormal, t0.Add(time.Duration(i)*time.Second))
	}
	if c := s.DropChance(limiter.PriorityNormal); math.Abs(c-1.0/120) > 1e-9 {
		t.Fatalf("1 s wait: drop chance after 2 s %v, want 1/120", c)
	}
}

func TestPriority(t *testing.T) {
	for _, p := range []limiter.Priority{limiter.PriorityLow, limiter.PriorityNormal, limiter.PriorityHigh, limiter.PriorityCritical} {
		var got limiter.Priority
		if err := got.UnmarshalText([]byte(p.String())); err != nil || got != p {
			t.Fatalf("UnmarshalText(%q) = %v, %v", p.String(), got, err)
		}
	}
	if p := limiter.PriorityHigh; p.UnmarshalText(nil) != nil || p != limiter.PriorityNormal {
		t.Fatalf(`UnmarshalText("") = %v`, p)
	}
	if err := new(limiter.Priority).UnmarshalText([]byte("urgent")); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Fatalf("unknown priority: %v", err)
	}
	var zero limiter.Priority
	if zero != limiter.PriorityNormal || limiter.Priority(7).String() != "priority(7)" {
		t.Fatal("the zero Priority is not normal")
	}
}

func TestFleetShedder(t *testing.T) {
	store := ccLeases(t)
	f, err := limiter.NewFleetShedder(store, limiter.FleetShedderConfig{
		Capacity: 10, Reserve: 0.2, LeaseTTL: time.Minute,
		Shares: map[limiter.Priority]float64{limiter.PriorityLow: 0.5, limiter.PriorityNormal: 0.7},
	})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[limiter.Priority]int64{limiter.PriorityLow: 5, limiter.PriorityNormal: 7, limiter.PriorityHigh: 8, limiter.PriorityCritical: 0, -5: 5} {
		if got := f.Limit(p); got != want {
			t.Errorf("Limit(%v) = %d, want %d", p, got, want)
		}
	}
	ctx := context.Background()
	acq := func(p limiter.Priority) (limiter.Lease, limiter.Decision) {
		t.Helper()
		l, d, err := f.Acquire(ctx, p, ccBase)
		if err != nil {
			t.Fatal(err)
		}
		return l, d
	}
	var leases []limiter.Lease
	for i := range 5 {
		l, d := acq(limiter.PriorityLow)
		if !d.Allowed || d.Name != "fleet" || d.Limit != 5 {
			t.Fatalf("low request %d: %+v", i, d)
		}
		leases = append(leases, l)
	}
	if _, d := acq(limiter.PriorityLow); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("low request past the low share: %+v, want shed with RetryAfter 1s", d)
	}
	for range 2 {
		if _, d := acq(limiter.PriorityNormal); !d.Allowed {
			t.Fatalf("normal request within its share shed: %+v", d)
		}
	}
	if _, d := acq(limiter.PriorityNormal); d.Allowed {
		t.Fatalf("normal request past its share: %+v", d)
	}
	if _, d := acq(limiter.PriorityHigh); !d.Allowed {
		t.Fatalf("high request within its share shed: %+v", d)
	}
	if _, d := acq(limiter.PriorityHigh); d.Allowed {
		t.Fatalf("high request past 1-reserve: %+v", d)
	}
	for i := range 100 {
		if l, d := acq(limiter.PriorityCritical); !d.Allowed || l.Held() {
			t.Fatalf("critical request %d: %+v", i, d)
		}
	}
	if err := f.Release(ctx, leases[0]); err != nil {
		t.Fatal(err)
	}
	if _, d := acq(limiter.PriorityHigh); !d.Allowed {
		t.Fatalf("after a release: %+v", d)
	}

	// Critical traffic passes even when the store is down.
	down, err := limiter.NewFleetShedder(failingLeases{}, limiter.FleetShedderConfig{Capacity: 10, Reserve: 0.5, LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, d, err := down.Acquire(ctx, limiter.PriorityCritical, ccBase); err != nil || !d.Allowed {
		t.Fatalf("critical request with the store down: %+v, %v", d, err)
	}
	if _, _, err := down.Acquire(ctx, limiter.PriorityHigh, ccBase); !errors.Is(err, errLeaseStore) {
		t.Fatalf("non-critical request with the store down: %v", err)
	}

	for _, c := range []struct {
		cfg   limiter.FleetShedderConfig
		field string
	}{
		{limiter.FleetShedderConfig{Capacity: 10, Reserve: 1, LeaseTTL: time.Minute}, "reserve"},
		{limiter.FleetShedderConfig{Capacity: 10, Reserve: -0.1, LeaseTTL: time.Minute}, "reserve"},
		{limiter.FleetShedderConfig{Capacity: 10, Reserve: math.NaN(), LeaseTTL: time.Minute}, "reserve"},
		{limiter.FleetShedderConfig{Capacity: 0, LeaseTTL: time.Minute}, "capacity"},
		{limiter.FleetShedderConfig{Capacity: 10}, "lease TTL"},
		{limiter.FleetShedderConfig{Capacity: 10, LeaseTTL: time.Minute, Reserve: 0.2, Shares: map[limiter.Priority]float64{limiter.PriorityLow: 0.9}}, "shares"},
		{limiter.FleetShedderConfig{Capacity: 10, LeaseTTL: time.Minute, Shares: map[limiter.Priority]float64{limiter.PriorityLow: 0.6, limiter.PriorityNormal: 0.5}}, "shares"},
		{limiter.FleetShedderConfig{Capacity: 10, LeaseTTL: time.Minute, Shares: map[limiter.Priority]float64{limiter.PriorityCritical: 0.5}}, "shares"},
		{limiter.FleetShedderConfig{Capacity: 10, LeaseTTL: time.Minute, Shares: map[limiter.Priority]float64{limiter.PriorityNormal: 0}}, "shares"},
		{limiter.FleetShedderConfig{Capacity: 10, LeaseTTL: time.Minute, RetryAfter: -1}, "retry after"},
	} {
		if _, err := limiter.NewFleetShedder(store, c.cfg); !errors.Is(err, limiter.ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: %v, want ErrInvalidConfig naming %q", c.cfg, err, c.field)
		}
	}
}

// countingSignal counts its reads.
type countingSignal struct {
	reads int
	err   error
}

func (c *countingSignal) Utilization(context.Context) (float64, error) {
	c.reads++
	return float64(c.reads) / 10, c.err
}

func TestCachedUtilization(t *testing.T) {
	now := ccBase
	sig := &countingSignal{}
	c := &limiter.CachedUtilization{Signal: sig, Every: 5 * time.Second, Clock: limiter.ClockFunc(func() time.Time { return now })}
	ctx := context.Background()
	for _, st := range []struct {
		at    time.Duration
		want  float64
		reads int
	}{
		{0, 0.1, 1}, {4 * time.Second, 0.1, 1}, {5 * time.Second, 0.2, 2}, {9 * time.Second, 0.2, 2},
		{-time.Second, 0.3, 3}, // the clock went back: read again
		{20 * time.Second, 0.4, 4},
	} {
		now = ccBase.Add(st.at)
		u, err := c.Utilization(ctx)
		if err != nil || u != st.want || sig.reads != st.reads {
			t.Fatalf("at %v: %v, %v after %d reads; want %v after %d", st.at, u, err, sig.reads, st.want, st.reads)
		}
	}
	// An error is kept for the period too, unless it was the caller's.
	sig.err = errors.New("down")
	now = now.Add(time.Minute)
	for range 3 {
		if _, err := c.Utilization(ctx); err == nil || sig.reads != 5 {
			t.Fatalf("error reading: %v after %d reads", err, sig.reads)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	now = now.Add(time.Minute)
	if _, err := c.Utilization(cancelled); err == nil {
		t.Fatal("no error")
	}
	sig.err = nil
	if _, err := c.Utilization(ctx); err != nil || sig.reads != 7 {
		t.Fatalf("after a cancelled read the next caller reads again: %v after %d reads", err, sig.reads)
	}
}

// TestPublishedUtilizationShedder wires a published value into a shedder:
// the fleet publishes full utilization, the shedder ramps up; the publisher
// stops, the value goes stale, and the shedder recedes.
func TestPublishedUtilizationShedder(t *testing.T) {
	now := ccBase
	clock := limiter.ClockFunc(func() time.Time { return now })
	pub := &limiter.PublishedUtilization{Store: ccLeases(t), Name: "fleet", MaxAge: 30 * time.Second, Clock: clock}
	s, err := limiter.NewUtilizationShedder(limiter.UtilizationShedderConfig{
		Utilization: &limiter.CachedUtilization{Signal: pub, Every: time.Second, Clock: clock},
		Uniform:     true, Rand: rand.NewPCG(3, 4),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 200 {
		if i%8 == 0 { // the fleet publishes every 8 s
			if err := pub.Publish(ctx, 1.5, now); err != nil { // clamped to 1
				t.Fatal(err)
			}
		}
		if _, err := s.Check(ctx, limiter.PriorityNormal, now); err != nil {
			t.Fatalf("second %d: %v", i, err)
		}
		now = now.Add(time.Second)
	}
	if a := s.State().Amount; a != 1 {
		t.Fatalf("amount after 200 s of published full utilization: %v", a)
	}
	// The publisher stops. 30 s later the value is stale.
	var stale int
	for range 60 {
		if _, err := s.Check(ctx, limiter.PriorityNormal, now); errors.Is(err, limiter.ErrStaleUtilization) && errors.Is(err, limiter.ErrNoUtilization) {
			stale++
		}
		now = now.Add(time.Second)
	}
	// The value is fresh for 30 s after the last publication (at second
	// 192), then every stale read recedes by 1/120.
	if a := s.State().Amount; stale != 37 || math.Abs(a-(1-37.0/120)) > 1e-9 {
		t.Fatalf("after the publisher stopped: %d stale reads, amount %v; want 37 and 1-37/120", stale, a)
	}
	if err := pub.Publish(ctx, math.NaN(), now); err == nil {
		t.Fatal("published NaN")
	}
}

// TestFleetShedderCheck: without releases, a slot is held for the lease TTL.
func TestFleetShedderCheck(t *testing.T) {
	f, err := limiter.NewFleetShedder(ccLeases(t), limiter.FleetShedderConfig{Capacity: 4, Reserve: 0.5, LeaseTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	check := func(p limiter.Priority, at time.Duration) bool {
		t.Helper()
		d, err := f.Check(ctx, p, ccBase.Add(at))
		if err != nil {
			t.Fatal(err)
		}
		return d.Allowed
	}
	if !check(limiter.PriorityNormal, 0) || !check(limiter.PriorityNormal, time.Second) || check(limiter.PriorityNormal, time.Second) {
		t.Fatal("two non-critical slots: want two allowed, the third shed")
	}
	if !check(limiter.PriorityCritical, time.Second) {
		t.Fatal("critical shed")
	}
	if !check(limiter.PriorityLow, 2*time.Second) || check(limiter.PriorityLow, 2*time.Second) {
		t.Fatal("after the first lease's TTL: one slot free")
	}
}

// shedFunc adapts a function to limiter.Shedder.
type shedFunc func(context.Context, limiter.Priority, time.Time) (limiter.Decision, error)

func (f shedFunc) Check(ctx context.Context, p limiter.Priority, now time.Time) (limiter.Decision, error) {
	return f(ctx, p, now)
}

func TestShedders(t *testing.T) {
	var asked []string
	allow := func(name string) limiter.Shedder {
		return shedFunc(func(context.Context, limiter.Priority, time.Time) (limiter.Decision, error) {
			asked = append(asked, name)
			return limiter.Decision{Allowed: true, Name: name}, nil
		})
	}
	shed := func(name string, err error) limiter.Shedder {
		return shedFunc(func(context.Context, limiter.Priority, time.Time) (limiter.Decision, error) {
			asked = append(asked, name)
			return limiter.Decision{Name: name, RetryAfter: time.Second}, err
		})
	}
	fail := func(name string) limiter.Shedder {
		return shedFunc(func(context.Context, limiter.Priority, time.Time) (limiter.Decision, error) {
			asked = append(asked, name)
			return limiter.Decision{}, errors.New(name + " down")
		})
	}
	ctx := context.Background()
	for _, c := range []struct {
		s       limiter.Shedders
		p       limiter.Priority
		allowed bool
		by      string
		asked   string
		errs    string
	}{
		{limiter.Shedders{allow("u"), allow("f")}, limiter.PriorityNormal, true, "", "u,f", ""},
		{limiter.Shedders{shed("u", nil), allow("f")}, limiter.PriorityNormal, false, "u", "u", ""},
		{limiter.Shedders{allow("u"), shed("f", nil)}, limiter.PriorityLow, false, "f", "u,f", ""},
		{limiter.Shedders{fail("u"), shed("f", nil)}, limiter.PriorityLow, false, "f", "u,f", "u down"},
		{limiter.Shedders{fail("u"), fail("f")}, limiter.PriorityHigh, true, "", "u,f", "u down\nf down"},
		{limiter.Shedders{shed("u", limiter.ErrNoUtilization), allow("f")}, limiter.PriorityHigh, false, "u", "u", limiter.ErrNoUtilization.Error()},
		{limiter.Shedders{shed("u", nil), fail("f")}, limiter.PriorityCritical, true, "", "", ""},
	} {
		asked = nil
		d, err := c.s.Check(ctx, c.p, ccBase)
		got := strings.Join(asked, ",")
		errs := ""
		if err != nil {
			errs = err.Error()
		}
		if d.Allowed != c.allowed || (!d.Allowed && d.Name != c.by) || got != c.asked || errs != c.errs {
			t.Errorf("%v: %+v asked %q err %q; want allowed=%v by %q asked %q err %q", c.p, d, got, errs, c.allowed, c.by, c.asked, c.errs)
		}
	}
}
