package limiter_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
)

// Stripe's concurrent-requests limiter: at most 2 requests of a user in
// flight. A lease whose release is lost (a crashed Lambda) stops counting
// after the lease TTL.
func ExampleConcurrency() {
	store, _ := memory.NewLeases(memory.Config{})
	c, _ := limiter.NewConcurrency(store, limiter.ConcurrencyConfig{
		Name: "in-flight", Capacity: 2, LeaseTTL: 30 * time.Second,
	})
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	a, d, _ := c.Acquire(ctx, "user:42", t0)
	fmt.Printf("first:  allowed=%v remaining=%d\n", d.Allowed, d.Remaining)
	_, d, _ = c.Acquire(ctx, "user:42", t0) // this holder crashes: never released
	fmt.Printf("second: allowed=%v remaining=%d\n", d.Allowed, d.Remaining)
	_, d, _ = c.Acquire(ctx, "user:42", t0.Add(time.Second))
	fmt.Printf("third:  allowed=%v retry-after=%v\n", d.Allowed, d.RetryAfter)

	c.Release(ctx, a) // the first request is done
	_, d, _ = c.Acquire(ctx, "user:42", t0.Add(time.Second))
	fmt.Printf("after a release: allowed=%v\n", d.Allowed)
	_, d, _ = c.Acquire(ctx, "user:42", t0.Add(30*time.Second))
	fmt.Printf("after the crashed lease's TTL: allowed=%v\n", d.Allowed)
	// Output:
	// first:  allowed=true remaining=1
	// second: allowed=true remaining=0
	// third:  allowed=false retry-after=29s
	// after a release: allowed=true
	// after the crashed lease's TTL: allowed=true
}

// The fleet-usage shedder keeps 20% of the fleet for critical traffic:
// non-critical requests are shed (503) once they hold 80% of it.
func ExampleFleetShedder() {
	store, _ := memory.NewLeases(memory.Config{})
	f, _ := limiter.NewFleetShedder(store, limiter.FleetShedderConfig{
		Capacity: 5, Reserve: 0.2, LeaseTTL: 30 * time.Second,
	})
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, p := range []limiter.Priority{
		limiter.PriorityNormal, limiter.PriorityLow, limiter.PriorityHigh, limiter.PriorityNormal,
		limiter.PriorityNormal, limiter.PriorityCritical, limiter.PriorityCritical,
	} {
		_, d, _ := f.Acquire(ctx, p, now)
		fmt.Printf("%-8v shed=%v\n", p, !d.Allowed)
	}
	// Output:
	// normal   shed=false
	// low      shed=false
	// high     shed=false
	// normal   shed=false
	// normal   shed=true
	// critical shed=false
	// critical shed=false
}

// Stripe's worker-utilization shedder with every worker busy: nothing is
// shed for 28 s, then the share of non-critical traffic shed ramps up over
// 120 s, low priority first.
func ExampleUtilizationShedder() {
	busy := limiter.UtilizationFunc(func(context.Context) (float64, error) { return 1, nil })
	s, _ := limiter.NewUtilizationShedder(limiter.UtilizationShedderConfig{
		Utilization: busy,
		Rand:        rand.NewPCG(1, 1), // deterministic for the example
	})
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for sec := 0; sec <= 150; sec++ {
		s.Check(ctx, limiter.PriorityNormal, t0.Add(time.Duration(sec)*time.Second))
		if sec%30 == 28 {
			fmt.Printf("t=%3ds drop chance: low %.2f normal %.2f high %.2f critical %.0f\n", sec,
				s.DropChance(limiter.PriorityLow), s.DropChance(limiter.PriorityNormal),
				s.DropChance(limiter.PriorityHigh), s.DropChance(limiter.PriorityCritical))
		}
	}
	// Output:
	// t= 28s drop chance: low 0.00 normal 0.00 high 0.00 critical 0
	// t= 58s drop chance: low 0.75 normal 0.00 high 0.00 critical 0
	// t= 88s drop chance: low 1.00 normal 0.50 high 0.00 critical 0
	// t=118s drop chance: low 1.00 normal 1.00 high 0.25 critical 0
	// t=148s drop chance: low 1.00 normal 1.00 high 1.00 critical 0
}
