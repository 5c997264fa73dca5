package lambdawrap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// NamedLease is a lease and the name of the limit that granted it (a
// rule's concurrency limit, or the fleet shedder), which the releasing side
// needs to find the lease's stored key.
type NamedLease struct {
	// Limit is the limiter.ConcurrencyConfig.Name (or the fleet shedder's
	// name) the lease was taken on.
	Limit string
	// Lease is the lease.
	Lease limiter.Lease
}

// String encodes l as Limit "@" Lease.String().
func (l NamedLease) String() string { return l.Limit + "@" + l.Lease.String() }

// MaxLeasesInContext bounds the leases one context value carries.
const MaxLeasesInContext = 16

// FormatLeases encodes leases for the authorizer context
// ([LeaseContextKey]): their Strings, comma-separated. Leases that hold
// nothing are left out.
func FormatLeases(leases []NamedLease) string {
	var b strings.Builder
	for _, l := range leases {
		if !l.Lease.Held() {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.String())
	}
	return b.String()
}

// ErrBadLeases is wrapped by ParseLeases' errors.
var ErrBadLeases = errors.New("lambdawrap: malformed leases")

// ParseLeases decodes what FormatLeases wrote. A bare lease
// (limiter.Lease.String, without a limit name) decodes with Limit "".
func ParseLeases(s string) ([]NamedLease, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > MaxLeasesInContext {
		return nil, fmt.Errorf("%w: %d leases, at most %d", ErrBadLeases, len(parts), MaxLeasesInContext)
	}
	out := make([]NamedLease, 0, len(parts))
	for _, p := range parts {
		name, lease, ok := strings.Cut(p, "@")
		if !ok {
			name, lease = "", p
		}
		l, err := limiter.ParseLease(lease)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadLeases, err)
		}
		out = append(out, NamedLease{Limit: name, Lease: l})
	}
	return out, nil
}

// LeasesFromContext returns every lease an authorizer put in its context
// under LeaseContextKey, given the authorizer map of the integration's
// event (as for [LeaseFromContext]). Malformed values give none.
func LeasesFromContext(authorizer map[string]any) []NamedLease {
	s, ok := authorizer[LeaseContextKey].(string)
	if !ok {
		return nil
	}
	l, err := ParseLeases(s)
	if err != nil {
		return nil
	}
	return l
}

// StoreReleaser releases leases of any named concurrency limit kept on one
// lease store: the store the authorizer's limits use (memcached.Leases,
// dynamo.Leases; memory.Leases in the same process). Safe for concurrent
// use.
type StoreReleaser struct {
	store storage.LeaseStore
	mu    sync.Mutex
	by    map[string]*limiter.Concurrency
}

// NewStoreReleaser returns a releaser on store.
func NewStoreReleaser(store storage.LeaseStore) *StoreReleaser {
	if store == nil {
		panic("lambdawrap: NewStoreReleaser needs a store")
	}
	return &StoreReleaser{store: store, by: map[string]*limiter.Concurrency{}}
}

// maxReleasers bounds the limits a StoreReleaser remembers (names come from
// events).
const maxReleasers = 256

// ReleaseNamed releases l on the limit it names. A lease without a limit
// name is an error: the releaser cannot know its key.
func (r *StoreReleaser) ReleaseNamed(ctx context.Context, l NamedLease) error {
	if l.Limit == "" {
		return fmt.Errorf("%w: lease %q names no limit", ErrBadLeases, l.Lease.ID)
	}
	r.mu.Lock()
	c := r.by[l.Limit]
	if c == nil {
		// Release uses only the name (the stored key) and the store;
		// capacity and TTL are the acquirer's business.
		var err error
		c, err = limiter.NewConcurrency(r.store, limiter.ConcurrencyConfig{Name: l.Limit, Capacity: 1, LeaseTTL: 1})
		if err != nil {
			r.mu.Unlock()
			return err
		}
		if len(r.by) < maxReleasers {
			r.by[l.Limit] = c
		}
	}
	r.mu.Unlock()
	return c.Release(ctx, l.Lease)
}

// ReleaseLeases wraps h so that every lease the authorizer passed on in its
// context (authorizerOf returns the event's authorizer map) is released on
// r after h returns, returns an error or panics, on a context detached from
// h's cancellation and bounded by cfg.ReleaseTimeout. An event without
// leases just calls h. It is the integration's half of the authorizer's
// concurrency limits (docs/shedding.md):
//
//	h := lambdawrap.ReleaseLeases(handle, lambdawrap.NewStoreReleaser(leases),
//		func(req events.APIGatewayProxyRequest) map[string]any { return req.RequestContext.Authorizer },
//		lambdawrap.ReleaseConfig{OnError: countIt})
func ReleaseLeases[In, Out any](h func(context.Context, In) (Out, error), r *StoreReleaser, authorizerOf func(In) map[string]any, cfg ReleaseConfig) func(context.Context, In) (Out, error) {
	if h == nil || r == nil || authorizerOf == nil {
		panic("lambdawrap: ReleaseLeases needs a handler, a releaser and an authorizer function")
	}
	return func(ctx context.Context, in In) (Out, error) {
		if leases := LeasesFromContext(authorizerOf(in)); len(leases) > 0 {
			defer func() {
				for _, l := range leases {
					release(ctx, namedReleaser{r, l.Limit}, l.Lease, cfg.ReleaseTimeout, cfg.OnError)
				}
			}()
		}
		return h(ctx, in)
	}
}

// namedReleaser is a Releaser for one limit of a StoreReleaser.
type namedReleaser struct {
	r     *StoreReleaser
	limit string
}

func (n namedReleaser) Release(ctx context.Context, l limiter.Lease) error {
	return n.r.ReleaseNamed(ctx, NamedLease{Limit: n.limit, Lease: l})
}
