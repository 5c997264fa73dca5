package accuracy

import (
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// Params are the limit every configuration enforces: Limit requests per
// Window, for one key.
type Params struct {
	Limit  int64
	Window time.Duration
}

// DefaultParams is the report's limit: Criteo's 100 requests per minute. A
// minute splits into whole nanoseconds for every sub-window count the report
// uses.
var DefaultParams = Params{Limit: 100, Window: time.Minute}

func (p Params) validate() error {
	switch {
	case p.Limit <= 0 || p.Limit > storage.MaxLogLimit:
		return fmt.Errorf("accuracy: limit must be between 1 and %d (the exact sliding log's maximum), got %d", storage.MaxLogLimit, p.Limit)
	case p.Window < time.Second:
		return fmt.Errorf("accuracy: window must be at least 1s, got %v", p.Window)
	}
	return nil
}

// Algorithm is what a configuration runs.
type Algorithm uint8

const (
	// Log is limiter.SlidingLog, the exact reference.
	Log Algorithm = iota
	// Fixed is limiter.FixedWindow.
	Fixed
	// Bounded is limiter.SlidingWindow with the Bounded estimator.
	Bounded
	// Interpolated is limiter.SlidingWindow with the Interpolated
	// estimator.
	Interpolated
	// Bucket is limiter.TokenBucket holding Limit tokens, refilled at
	// Limit per Window.
	Bucket
	// Sliced is the prototype [SlicedWindow]: the Bounded estimator on
	// counters that each pack one count per slice of their sub-window.
	Sliced
	// Moment is the prototype [MomentWindow]: each counter packs a count
	// and the sum of the arrival offsets.
	Moment
)

var algorithmNames = [...]string{"log", "fixed", "bounded", "interpolated", "bucket", "sliced", "moment"}

func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return "algorithm(" + strconv.Itoa(int(a)) + ")"
}

// Config is one limiter configuration to simulate.
type Config struct {
	Algorithm Algorithm
	// SubWindows is k, the counters per window, for the sliding windows.
	SubWindows int
	// Slices is the number of slices packed in each counter of a Sliced
	// window.
	Slices int
}

// Name is the configuration's label in tables and plots: "log", "fixed",
// "bucket", "bounded k=12", "sliced k=10x4".
func (c Config) Name() string {
	switch c.Algorithm {
	case Bounded, Interpolated, Moment:
		return c.Algorithm.String() + " k=" + strconv.Itoa(c.SubWindows)
	case Sliced:
		return c.Algorithm.String() + " k=" + strconv.Itoa(c.SubWindows) + "x" + strconv.Itoa(c.Slices)
	}
	return c.Algorithm.String()
}

// sliding reports whether c is an approximated sliding window.
func (c Config) sliding() bool {
	switch c.Algorithm {
	case Bounded, Interpolated, Sliced, Moment:
		return true
	}
	return false
}

// resolution is the number of parts per window the configuration tells
// apart: k, or k times the slices.
func (c Config) resolution() int {
	if c.Algorithm == Sliced {
		return c.SubWindows * c.Slices
	}
	return c.SubWindows
}

// IssueSubWindows are the sub-window counts the issue asks for.
var IssueSubWindows = []int{1, 2, 4, 6, 12, 30}

// Configs returns the report's configurations: the exact log, the fixed
// window, the sliding window for each k in ks under both estimators, and
// the token bucket.
func Configs(ks []int) []Config {
	cs := []Config{{Algorithm: Log}, {Algorithm: Fixed}}
	for _, a := range []Algorithm{Bounded, Interpolated} {
		for _, k := range ks {
			cs = append(cs, Config{Algorithm: a, SubWindows: k})
		}
	}
	return append(cs, Config{Algorithm: Bucket})
}

// divisors returns the sub-window counts from 1 to max that divide w into
// whole nanoseconds.
func divisors(w time.Duration, max int) []int {
	var ks []int
	for k := 1; k <= max; k++ {
		if w%time.Duration(k) == 0 {
			ks = append(ks, k)
		}
	}
	return ks
}
