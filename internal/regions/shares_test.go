package regions

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// lagLedger is an in-memory ledger whose reads see each region's entry as
// it was lag publications ago (replication lag, in ticks).
type lagLedger struct {
	hist [][]State
	lag  int
}

func newLagLedger(n, lag int) *lagLedger { return &lagLedger{hist: make([][]State, n), lag: lag} }

func (l *lagLedger) Publish(_ context.Context, r int, st State) error {
	st.Given = slices.Clone(st.Given)
	l.hist[r] = append(l.hist[r], st)
	return nil
}

func (l *lagLedger) Read(_ context.Context, r int) (State, bool, error) {
	i := len(l.hist[r]) - 1 - l.lag
	if i < 0 {
		return State{}, false, nil
	}
	return l.hist[r][i], true, nil
}

// Shares follow the demand through grants, and the shares the regions
// hold, each from its own lagging view, never sum above the limit.
func TestSharesFollowDemand(t *testing.T) {
	cfg := Config{Regions: 3, Limit: 1000, Window: 4 * time.Second, SubWindows: 4}
	for _, step := range []struct {
		name  string
		split []float64
		lag   int
	}{
		{"98/1/1, lag 4 ticks", []float64{0.98, 0.01, 0.01}, 4},
		{"60/30/10, lag 1 tick", []float64{0.6, 0.3, 0.1}, 1},
		{"1/1/98, lag 0", []float64{0.01, 0.01, 0.98}, 0},
	} {
		t.Run(step.name, func(t *testing.T) {
			ledger := newLagLedger(3, step.lag)
			agents := make([]*Agent, 3)
			for i := range agents {
				a, err := NewAgent(cfg, i, ledger)
				if err != nil {
					t.Fatal(err)
				}
				agents[i] = a
			}
			now := time.Unix(1000, 0)
			for tick := range 200 {
				for i, a := range agents {
					a.offered.Add(int64(300 * step.split[i] / 4)) // 300 a second, ticks of 250 ms
					if err := a.Tick(t.Context(), now); err != nil {
						t.Fatal(err)
					}
				}
				var sum int64
				for _, a := range agents {
					sum += a.Stats().Share
				}
				if sum > cfg.Limit {
					t.Fatalf("tick %d: the shares sum to %d, above the limit %d", tick, sum, cfg.Limit)
				}
				now = now.Add(250 * time.Millisecond)
			}
			var sum int64
			for i, a := range agents {
				s := a.Stats().Share
				sum += s
				want := step.split[i] * float64(cfg.Limit)
				if float64(s) < 0.9*want-15 || float64(s) > 1.1*want+15 {
					t.Errorf("region %d holds %d, far from its demand's share %.0f", i, s, want)
				}
			}
			if sum < cfg.Limit*95/100 {
				t.Errorf("the shares sum to %d: more than 5%% of the limit %d in transit for good", sum, cfg.Limit)
			}
		})
	}
}

// Random demands and lags: no region ever gives more than it holds, and
// the shares never sum above the limit.
func TestSharesNeverSumAboveLimit(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	cfg := Config{Regions: 3, Limit: 500, Window: time.Second, SubWindows: 10}
	ledger := newLagLedger(3, 0)
	agents := make([]*Agent, 3)
	for i := range agents {
		agents[i], _ = NewAgent(cfg, i, ledger)
	}
	now := time.Unix(0, 0)
	for tick := range 2000 {
		ledger.lag = rng.IntN(6)
		for _, a := range agents {
			a.offered.Add(int64(rng.ExpFloat64() * 50))
			a.Tick(t.Context(), now)
			if s := a.Stats().Share; s < 0 {
				t.Fatalf("tick %d: a region holds %d", tick, s)
			}
		}
		var sum int64
		for _, a := range agents {
			sum += a.Stats().Share
		}
		if sum > cfg.Limit {
			t.Fatalf("tick %d: the shares sum to %d, above %d", tick, sum, cfg.Limit)
		}
		now = now.Add(100 * time.Millisecond)
	}
}

// A share that stopped being current keeps bounding decisions for a
// window and a sub-window.
func TestSharesInForce(t *testing.T) {
	cfg := Config{Regions: 2, Limit: 100, Window: 4 * time.Second, SubWindows: 4}
	a, err := NewAgent(cfg, 0, newLagLedger(2, 0))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(100, 0)
	a.mu.Lock()
	a.setShare(t0, 30)
	a.setShare(t0.Add(time.Second), 70)
	a.mu.Unlock()
	for _, step := range []struct {
		at   time.Duration
		want []int64
	}{
		{0, []int64{50, 30, 70}},
		{4999 * time.Millisecond, []int64{50, 30, 70}},
		{5 * time.Second, []int64{30, 70}},
		{6 * time.Second, []int64{70}},
	} {
		got := a.InForce(t0.Add(step.at))
		slices.Sort(got)
		want := slices.Sorted(slices.Values(step.want))
		if !slices.Equal(got, want) {
			t.Errorf("at +%v: in force %v, want %v", step.at, got, want)
		}
	}
}

func TestSharesConfig(t *testing.T) {
	for _, c := range []Config{
		{Regions: 1, Limit: 10, Window: time.Second, SubWindows: 1},
		{Regions: 3, Limit: 2, Window: time.Second, SubWindows: 1},
		{Regions: 3, Limit: 10, Window: 0, SubWindows: 1},
		{Regions: 3, Limit: 10, Window: time.Second},
	} {
		if _, err := NewAgent(c, 0, newLagLedger(3, 0)); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := NewAgent(Config{Regions: 3, Limit: 10, Window: time.Second, SubWindows: 1}, 3, newLagLedger(3, 0)); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("region 3 of 3: %v, want ErrInvalidConfig", err)
	}
}
