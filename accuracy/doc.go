// Package accuracy measures how close Sluice's limiters stay to an exact
// sliding window, and writes the report docs/accuracy.md with its figures.
//
// A simulation replays a [Trace] (request times) through one [Config] of the
// real limiter types (limiter.SlidingLog, FixedWindow, SlidingWindow under
// both estimators, TokenBucket) on a fresh backends/memory store whose clock
// is the trace's time, and measures the [Result]: what was admitted, the
// worst count within any window-length interval (overshoot when above the
// limit), admissions relative to the exact sliding log, store calls per
// decision, and the memcached [Footprint] per key. Traces are generated with
// fixed seeds ([Steady], [Bursty], [EdgeStart], [EdgeEnd]) or read from a
// file of timestamps ([ReadTrace]).
//
// [Run] simulates everything the report shows: every configuration on every
// trace, a sweep of sub-window counts over a seed sweep of bursty traces
// (the frontier), and the choice of a default for limiter.SlidingWindow;
// [Report.Write] writes the markdown and the figures (PNG and SVG, with
// gonum.org/v1/plot). The same options give the same bytes.
//
// The package also holds two prototype estimators, [SlicedWindow] and
// [MomentWindow], that never admit more than the limit in a window and
// admit more than the Bounded estimator with the same counters. They are
// here to be measured, not used: limiter/ is unchanged.
//
// [RunShapes] replays demanding traffic shapes ([Shapes]: bursts aligned
// to sub-window starts and ends, costs 1..10, Poisson 0.5x-10x, heavy-tailed
// on/off) on several limits and seeds through a fast model of the Bounded
// window at many resolutions (checked against the real type), and compares
// window representations ([Representation]) by the keys one memcached
// decision names: the frontier and the recommendation for the stores.
//
// Simulations are sequential and deterministic; Run spreads independent
// simulations over GOMAXPROCS goroutines. Nothing here is meant for the
// request path.
package accuracy
