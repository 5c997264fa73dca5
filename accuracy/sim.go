package accuracy

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// SimKey is the key every simulated request is counted under (16 bytes, the
// size of a key naming a client by IP address; memcached sizes depend on
// it).
const SimKey = "ip:198.51.100.23"

// Result is what one configuration did with one trace.
type Result struct {
	Config Config
	// Requests is the number of requests in the trace; Admitted how many
	// the configuration allowed.
	Requests, Admitted int
	// AdmittedUnits is the cost of the admitted requests (Admitted when
	// every request costs 1).
	AdmittedUnits int64
	// WorstWindow is the largest number of admitted units within any
	// window-length interval (t-W, t]. WorstWindow/Limit is the overshoot.
	WorstWindow int64
	// Excess counts admissions that took the admitted requests of the
	// trailing window above the limit.
	Excess int
	// Needless counts denials made while the trailing window had room for
	// the request (an exact limiter would have allowed it).
	Needless int
	// StoreCalls counts calls to the store (Add and Sub for the windows,
	// UpdateBucket, UpdateLog).
	StoreCalls int
	// MaxCounter is the largest value a window counter held.
	MaxCounter int64
	// MaxLogEntries is the largest number of timestamps the sliding log
	// held.
	MaxLogEntries int
	// Memcached is what the configuration would keep in memcached for the
	// key (backends/memcached's keys and values).
	Memcached Footprint
	// Admits are the times of the admitted requests.
	Admits []int64
}

func (r Result) callsPerDecision() float64 {
	return float64(r.StoreCalls) / float64(max(r.Requests, 1))
}

// Overshoot is the worst window-length count over the limit.
func (r Result) Overshoot(p Params) float64 { return float64(r.WorstWindow) / float64(p.Limit) }

// simClock is the simulated time, shared by the limiter's caller and the
// memory store's expiry.
type simClock struct{ t int64 }

func (c *simClock) now() time.Time { return time.Unix(0, c.t) }

// countingStore wraps the memory store, counting calls and recording the
// largest counter value and sub-window index.
type countingStore struct {
	s          *memory.Store
	calls      int
	maxCounter int64
	space      string
	maxIdx     int64
}

var (
	_ storage.Counter     = (*countingStore)(nil)
	_ storage.BucketStore = (*countingStore)(nil)
	_ storage.LogStore    = (*countingStore)(nil)
)

func (c *countingStore) Add(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration) (storage.Counts, error) {
	c.calls++
	r, err := c.s.Add(ctx, k, cur, span, n, ttl)
	c.maxCounter = max(c.maxCounter, r.C[0])
	c.space, c.maxIdx = k.Space, max(c.maxIdx, cur)
	return r, err
}

func (c *countingStore) Sub(ctx context.Context, k storage.Key, idx int64, n int64) error {
	c.calls++
	return c.s.Sub(ctx, k, idx, n)
}

func (c *countingStore) UpdateBucket(ctx context.Context, k storage.Key, op storage.BucketOp, ttl time.Duration) (storage.Decision, error) {
	c.calls++
	c.space = k.Space
	return c.s.UpdateBucket(ctx, k, op, ttl)
}

func (c *countingStore) UpdateLog(ctx context.Context, k storage.Key, op storage.LogOp, ttl time.Duration) (storage.Decision, error) {
	c.calls++
	c.space = k.Space
	return c.s.UpdateLog(ctx, k, op, ttl)
}

// newLimiter builds the configuration's limiter enforcing p on store.
func newLimiter(store *countingStore, p Params, c Config) (limiter.Limiter, error) {
	name := c.Name()
	switch c.Algorithm {
	case Log:
		return limiter.NewSlidingLog(store, limiter.SlidingLogConfig{Name: name, Limit: p.Limit, Window: p.Window})
	case Fixed:
		return limiter.NewFixedWindow(store, limiter.FixedWindowConfig{Name: name, Limit: p.Limit, Window: p.Window})
	case Bounded, Interpolated:
		est := limiter.Bounded
		if c.Algorithm == Interpolated {
			est = limiter.Interpolated
		}
		return limiter.NewSlidingWindow(store, limiter.SlidingWindowConfig{
			Name: name, Limit: p.Limit, Window: p.Window, SubWindows: c.SubWindows, Estimator: est,
		})
	case Bucket:
		// Limit tokens refilled at Limit per Window, in the smallest
		// whole steps: refillAmount/refillTime = Limit/Window exactly.
		g := gcd(p.Limit, int64(p.Window))
		return limiter.NewTokenBucket(store, limiter.TokenBucketConfig{
			Name: name, MaxAmount: p.Limit, RefillAmount: p.Limit / g, RefillTime: p.Window / time.Duration(g),
		})
	case Sliced:
		return NewSlicedWindow(store, p, c.SubWindows, c.Slices)
	case Moment:
		return NewMomentWindow(store, p, c.SubWindows)
	}
	return nil, fmt.Errorf("accuracy: unknown algorithm %v", c.Algorithm)
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Simulate replays tr through configuration c enforcing p, on a fresh
// in-process store (backends/memory) whose clock is the trace's time.
func Simulate(tr Trace, p Params, c Config) (Result, error) {
	if err := p.validate(); err != nil {
		return Result{}, err
	}
	clock := &simClock{}
	mem, err := memory.New(memory.Config{Clock: clock.now})
	if err != nil {
		return Result{}, err
	}
	store := &countingStore{s: mem}
	lim, err := newLimiter(store, p, c)
	if err != nil {
		return Result{}, fmt.Errorf("accuracy: %s: %w", c.Name(), err)
	}
	ctx := context.Background()
	w := int64(p.Window)
	res := Result{Config: c, Requests: len(tr.Times)}
	head := 0         // res.Admits[head:] are the admissions in the trailing window
	var costs []int64 // the admissions' costs, when the trace has costs
	var units int64   // the admitted units in the trailing window
	// The length of storage.AppendLog of the log's entries (the admissions
	// in view), kept up to date: the count, the first entry, and the
	// deltas between consecutive entries, whose lengths are summed here.
	deltas, maxLogBytes := 0, 0
	for i, t := range tr.Times {
		clock.t = t
		n := tr.cost(i)
		d, err := lim.AllowN(ctx, SimKey, time.Unix(0, t), n)
		if err != nil {
			return Result{}, fmt.Errorf("accuracy: %s at %v: %w", c.Name(), time.Unix(0, t).UTC(), err)
		}
		for head < len(res.Admits) && res.Admits[head] <= t-w {
			if head+1 < len(res.Admits) {
				deltas -= varintLen(res.Admits[head+1] - res.Admits[head])
			}
			if costs != nil {
				units -= costs[head]
			} else {
				units--
			}
			head++
		}
		inView := int64(len(res.Admits) - head)
		if !d.Allowed {
			if units+n <= p.Limit {
				res.Needless++
			}
			continue
		}
		if inView > 0 {
			deltas += varintLen(t - res.Admits[len(res.Admits)-1])
		}
		res.Admits = append(res.Admits, t)
		if tr.Costs != nil {
			costs = append(costs, n)
		}
		inView++
		units += n
		res.AdmittedUnits += n
		res.WorstWindow = max(res.WorstWindow, units)
		if units > p.Limit {
			res.Excess++
		}
		if c.Algorithm == Log {
			res.MaxLogEntries = max(res.MaxLogEntries, int(inView))
			size := uvarintLen(uint64(inView)) + varintLen(res.Admits[head]) + deltas
			maxLogBytes = max(maxLogBytes, size)
		}
	}
	res.Admitted = len(res.Admits)
	res.StoreCalls = store.calls
	res.MaxCounter = store.maxCounter
	res.Memcached = footprint(store, p, c, tr.End(), maxLogBytes)
	return res, nil
}

func varintLen(x int64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutVarint(b[:], x)
}

func uvarintLen(x uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], x)
}

// footprint is what c would keep in memcached, with keys and values as
// backends/memcached writes them: the key "k:" Space "/" Name and a suffix
// ("|c" and the sub-window index for a counter, "|b" for a bucket, "|l" for
// a log); a counter's value is its decimal digits, a bucket's 'B' and two
// varints (tokens, update time), a log's 'L' and storage.AppendLog.
func footprint(s *countingStore, p Params, c Config, last int64, maxLogBytes int) Footprint {
	base := len("k:") + len(s.space) + len("/") + len(SimKey)
	var f Footprint
	switch c.Algorithm {
	case Log:
		f = Footprint{Items: 1, KeyLen: base + 2, ValueLen: 1 + maxLogBytes}
	case Bucket:
		v := binary.AppendVarint(binary.AppendVarint([]byte{'B'}, p.Limit), last)
		f = Footprint{Items: 1, KeyLen: base + 2, ValueLen: len(v)}
	case Fixed:
		f = Footprint{Items: 1}
	default:
		f = Footprint{Items: c.SubWindows + 1}
	}
	if c.Algorithm != Log && c.Algorithm != Bucket {
		f.KeyLen = base + len("|c") + digits(s.maxIdx)
		f.ValueLen = digits(s.maxCounter)
	}
	f.Bytes = f.Items * ItemSize(f.KeyLen, f.ValueLen)
	return f
}

// countLimit is the limit of the windows in counting mode: high enough
// that nothing is denied on the report's traces, low enough for the
// prototypes' packed fields.
const countLimit = 1<<15 - 1

// Count replays tr through configuration c (a window) with a limit so high
// that every request is allowed, and returns what the configuration counts
// at each time of at (ascending): its estimate of the requests in the last
// window, as Criteo's figures draw it. At a request's time the request is
// counted; at other times a probe is counted and refunded, which leaves the
// counters as they were.
func Count(tr Trace, p Params, c Config, at []int64) ([]int64, error) {
	if c.Algorithm == Log || c.Algorithm == Bucket {
		return nil, fmt.Errorf("accuracy: %s does not count a window", c.Name())
	}
	clock := &simClock{}
	mem, err := memory.New(memory.Config{Clock: clock.now})
	if err != nil {
		return nil, err
	}
	q := Params{Limit: countLimit, Window: p.Window}
	lim, err := newLimiter(&countingStore{s: mem}, q, c)
	if err != nil {
		return nil, fmt.Errorf("accuracy: %s: %w", c.Name(), err)
	}
	ctx := context.Background()
	allow := func(t int64) (int64, error) {
		clock.t = t
		d, err := lim.AllowN(ctx, SimKey, time.Unix(0, t), 1)
		if err != nil {
			return 0, err
		}
		if !d.Allowed {
			return 0, fmt.Errorf("accuracy: %s counted more than %d requests in a window", c.Name(), countLimit)
		}
		return countLimit - d.Remaining, nil
	}
	counts := make([]int64, len(at))
	i := 0 // next request
	for j, t := range at {
		for ; i < len(tr.Times) && tr.Times[i] <= t; i++ {
			n, err := allow(tr.Times[i])
			if err != nil {
				return nil, err
			}
			if tr.Times[i] == t {
				counts[j] = n
			}
		}
		if i > 0 && tr.Times[i-1] == t {
			continue
		}
		n, err := allow(t)
		if err != nil {
			return nil, err
		}
		if err := lim.Refund(ctx, SimKey, time.Unix(0, t), 1); err != nil {
			return nil, err
		}
		counts[j] = n - 1
	}
	return counts, nil
}

// windowCounts returns, for each time in at (ascending), the number of
// times in ts (ascending) within (at-w, at].
func windowCounts(ts, at []int64, w int64) []int64 {
	out := make([]int64, len(at))
	lo, hi := 0, 0
	for i, t := range at {
		for hi < len(ts) && ts[hi] <= t {
			hi++
		}
		for lo < hi && ts[lo] <= t-w {
			lo++
		}
		out[i] = int64(hi - lo)
	}
	return out
}
