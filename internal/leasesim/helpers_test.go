package leasesim

import "time"

// uniform is n processes sharing total decisions a second equally.
func uniform(n int, total float64) []float64 {
	r := make([]float64, n)
	for i := range r {
		r[i] = total / float64(n)
	}
	return r
}

// uneven is n processes, the first with half of total, the others sharing
// the other half.
func uneven(n int, total float64) []float64 {
	r := make([]float64, n)
	r[0] = total / 2
	for i := 1; i < n; i++ {
		r[i] = total / 2 / float64(n-1)
	}
	return r
}

// hotConfig is the hot key of docs/leases.md: 10,000 a second (a bucket of
// 10,000 refilled by one every 100us, or a window of 10,000 per second
// times window, at 160 slots), behind a partition of 1,000 writes a
// second (10x), with leases on.
func hotConfig(a Algo, window time.Duration, rates []float64) Config {
	return Config{
		Algo: a, Limit: 10000, Refill: 100 * time.Microsecond,
		Window: window, Slots: 160,
		Rates: rates, Duration: 6 * time.Second, Seed: 1,
		Latency: 2 * time.Millisecond, Jitter: 2 * time.Millisecond, WriteCap: 1000,
		Leases: true, Policy: DefaultPolicy(),
	}
}
