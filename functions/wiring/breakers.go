package wiring

import (
	"fmt"
	"log/slog"

	"github.com/sluicehq/sluice/backends/breaker"
	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/limiter"
)

// wrapBreakers puts each network backend of stores (memcached, dynamo;
// never memory) behind a circuit breaker configured by env.Breaker, in
// place, and returns the breakers by backend; nil when the breakers are
// off. Transitions are logged and written as metric lines. The breakers
// run on the wall clock, whatever the decisions' clock.
func wrapBreakers(env Env, stores map[string]any, logger *slog.Logger, metrics *authz.Metrics) (map[string]*breaker.Breaker, error) {
	if !env.Breaker.Enabled() {
		return nil, nil
	}
	out := map[string]*breaker.Breaker{}
	for _, name := range []string{BackendMemcached, BackendDynamo} {
		st, ok := stores[name]
		if !ok {
			continue
		}
		be, ok := st.(breaker.Backend)
		if !ok {
			return nil, fmt.Errorf("wiring: %s store %T is not a breaker.Backend", name, st)
		}
		w, err := breaker.Wrap(be, breaker.Config{
			Name: name, Failures: env.Breaker.Failures, OpenFor: env.Breaker.OpenFor, Logger: logger,
			OnChange: func(name string, from, to breaker.State) {
				metrics.Breaker(limiter.SystemClock.Now(), name, from.String(), to.String())
			},
		})
		if err != nil {
			return nil, fmt.Errorf("wiring: %s breaker: %w", name, err)
		}
		stores[name] = w
		out[name] = w.Breaker()
		logger.Info("circuit breaker on", "backend", name, "failures", env.Breaker.Failures, "open_for", env.Breaker.OpenFor.String())
	}
	return out, nil
}

// unwrap returns the store behind a breaker, or s itself.
func unwrap(s any) any {
	if w, ok := s.(*breaker.Store); ok {
		return w.Unwrap()
	}
	return s
}
