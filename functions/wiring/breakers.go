package wiring

import (
	"fmt"
	"log/slog"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/breaker"
	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// Circuit breakers (env.Breaker, SLUICE_BREAKER_*), on by default:
//
//   - memcached: one breaker per node, inside the store
//     (memcached.Config.Breaker, see memcachedBreaker), so that a dead node
//     fails its own keys fast while the other nodes' keys stay on the
//     store. The store is not also wrapped by a whole-backend breaker: its
//     count of failures in a row is reset only by answers from any node,
//     so while one of two nodes is down it would open on an unlucky run of
//     that node's failures and refuse the healthy node's keys for OpenFor;
//     every call that can wait on the network already goes through a node
//     breaker, so all nodes down is all node breakers open.
//   - DynamoDB: one breaker for the backend (wrapBreakers; a regional
//     service endpoint has no nodes to tell apart).
//
// The breakers run on the wall clock, whatever the decisions' clock.

// memcachedBreaker returns the node breakers' configuration for the
// memcached store, nil when the breakers are off. Transitions are logged
// (backend, node) and written as metric lines (dimension Backend
// "memcached", property Node).
func memcachedBreaker(env Env, logger *slog.Logger, metrics *authz.Metrics) *memcached.BreakerConfig {
	if !env.Breaker.Enabled() {
		return nil
	}
	logger.Info("circuit breaker on", "backend", BackendMemcached, "per", "node", "failures", env.Breaker.Failures, "open_for", env.Breaker.OpenFor.String())
	return &memcached.BreakerConfig{
		Failures: env.Breaker.Failures, OpenFor: env.Breaker.OpenFor, Logger: logger,
		OnChange: func(node, from, to string) {
			metrics.NodeBreaker(limiter.SystemClock.Now(), BackendMemcached, node, from, to)
		},
	}
}

// wrapBreakers puts each network backend of stores that has no breakers
// of its own (dynamo; memcached has its node breakers, memory none)
// behind a circuit breaker configured by env.Breaker, in place, and
// returns the breakers by backend; nil when the breakers are off.
// Transitions are logged and written as metric lines.
func wrapBreakers(env Env, stores map[string]storage.Store, logger *slog.Logger, metrics *authz.Metrics) (map[string]*breaker.Breaker, error) {
	if !env.Breaker.Enabled() {
		return nil, nil
	}
	out := map[string]*breaker.Breaker{}
	for _, name := range []string{BackendDynamo} {
		st, ok := stores[name]
		if !ok {
			continue
		}
		w, err := breaker.Wrap(st, breaker.Config{
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

// BreakerStates returns the state ("closed", "half-open", "open") of
// every circuit breaker: a backend's under its name ("dynamo"), a
// memcached node's as "memcached <address>" (the nodes called so far).
// Empty when the breakers are off.
func (b *Built) BreakerStates() map[string]string {
	out := map[string]string{}
	for name, br := range b.Breakers {
		out[name] = br.State().String()
	}
	if mc, ok := unwrap(b.Stores[BackendMemcached]).(*memcached.Store); ok {
		for _, n := range mc.Breakers() {
			out[BackendMemcached+" "+n.Node] = n.State
		}
	}
	return out
}

// memcachedBreakers returns the memcached store's node breakers (nil
// without memcached or breakers).
func (b *Built) memcachedBreakers() []memcached.BreakerState {
	if mc, ok := unwrap(b.Stores[BackendMemcached]).(*memcached.Store); ok {
		return mc.Breakers()
	}
	return nil
}

// unwrap returns the store behind a breaker, or s itself.
func unwrap(s storage.Store) storage.Store {
	if w, ok := s.(*breaker.Store); ok {
		return w.Unwrap()
	}
	return s
}
