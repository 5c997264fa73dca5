package wiring

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/internal/regions"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// SharesSkew bounds how far apart the regions' clocks are taken to be: a
// region uses a grant only this long after its giver published it (AWS
// keeps Lambda hosts' clocks within about a millisecond of UTC).
const SharesSkew = 10 * time.Millisecond

// buildShares returns the policy's regional shares when the state table
// is a global table in the default mode (config.TableEventual): each
// limit of a rule with scope global is a regions.Keys on the table, this
// process deciding its region's share of each key and running the key's
// agent in line with its decisions, and writing each limit's counts to
// metrics every minute (regions.Counts, authz.Metrics.Shares). Nil for
// any other table mode: a global rule's limits are then plain limits (an
// MRSC table keeps them).
func (b *Built) buildShares(ddb *dynamodb.Client, metrics *authz.Metrics) (*policy.Shares, error) {
	env := b.Env
	if env.TableMode != config.TableEventual {
		return nil, nil
	}
	holder, err := holderName()
	if err != nil {
		return nil, fmt.Errorf("wiring: regional shares: %w", err)
	}
	n := len(env.Regions)
	if ddb != nil {
		ddb = sharesClient(ddb)
	}
	if b.sharesSet == nil {
		b.sharesSet = &sharesSet{held: map[sharesID]*sharedKeys{}}
	}
	set := b.sharesSet
	build := func(l *policy.Limit, cost int64, leases bool) (limiter.Limiter, error) {
		store, ok := b.Stores[BackendDynamo]
		if !ok || ddb == nil {
			return nil, fmt.Errorf("scope global on an eventual table needs the table: set %s", config.EnvDynamoTable)
		}
		kc := SharesKeys(l, env.Regions, leases)
		return set.take(kc, func() (*regions.Keys, error) {
			kc.Table = regions.Table{Client: ddb, Table: env.DynamoTable, Region: env.Region, Deadline: env.Deadline}
			kc.Store, kc.Holder = store, holder
			kc.Report = func(now time.Time, c regions.Counts) { metrics.Shares(now, sharesLine(l.Name, c)) }
			k, err := regions.NewKeys(kc)
			if err != nil {
				return nil, fmt.Errorf("regional shares of %s: %w", l.Name, err)
			}
			return k, nil
		})
	}
	b.Logger.Info("scope global kept as regional shares", "table_mode", env.TableMode, "regions", env.Regions, "region", env.Regions[env.Region])
	return &policy.Shares{Regions: n, Build: build}, nil
}

// sharesClient is ddb with the store's retryer (dynamo.NewRetryer) for
// the shares' own requests (ledger entries, boards, the wants index),
// which go to the table through the client, not the store: the SDK's
// default retries a throttled request after backoffs of up to seconds,
// from a retry quota that every key in the container shares, so one hot
// key's throttled ledger entry would hold its decisions for seconds and
// drain the quota the other keys' retries need. A throttle now fails the
// request at once (a tick that fails is resumed by the next one; a
// process keeps deciding by the entry it holds while that is valid).
func sharesClient(ddb *dynamodb.Client) *dynamodb.Client {
	return dynamodb.New(ddb.Options(), func(o *dynamodb.Options) { o.Retryer = dynamo.NewRetryer(dynamo.RetryerConfig{}) })
}

// SharesKeys is the part of l's regional shares among the regions names
// (SLUICE_REGIONS, in order) that the rule decides (policy.CheckShares
// accepted l; leases as policy.Shares.Build is given it): the limit and
// its prefix in the table, the limit's name (regions.KeysConfig.ItemPrefix
// adds a tag of its numbers and of the names in order, so a reload that
// changes the numbers, or a reordered list, names other items). The
// caller sets the table, the store and, to decide, the holder
// (sluice inspect reads a region's share with it).
func SharesKeys(l *policy.Limit, names []string, leases bool) regions.KeysConfig {
	n := len(names)
	cfg := regions.Config{Regions: n, Leases: leases, Skew: SharesSkew}
	switch l.Algorithm {
	case policy.TokenBucket:
		cfg.Bucket = &limiter.TokenBucketConfig{Name: l.Name, MaxAmount: l.MaxAmount, RefillTime: l.RefillTime, RefillAmount: max(l.RefillAmount, 1)}
	default: // a sliding window (policy.CheckShares)
		cfg.Limit, cfg.Window, cfg.SubWindows = l.Limit, l.Window, l.SubWindows
		if cfg.SubWindows == 0 {
			cfg.SubWindows = limiter.DefaultSubWindows
		}
	}
	if brokenSharesSum {
		cfg.Limit *= int64(n)
		if cfg.Bucket != nil {
			cfg.Bucket.MaxAmount *= int64(n)
		}
	}
	return regions.KeysConfig{Config: cfg, Prefix: l.Name + ":", Names: names}
}

// brokenSharesSum (tests): the regions share n times the limit (as if
// each region's share were the whole limit), so the shares sum above it.
var brokenSharesSum = false

// holderName names this process in the agent roles it takes: the host,
// the process and a random part (two Lambda containers may share a host
// name).
func holderName() (string, error) {
	host, _ := os.Hostname()
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(r[:])), nil
}

// keeper returns the handler's keeper of the regional shares (nil without
// them): on a scheduled event (an EventBridge schedule every minute, which
// the construct adds with a global rule on an eventual table) it sweeps
// the limits' keys the other regions want until the invocation's deadline
// less regions.DefaultKeeperMargin (regions.Keeper), so that a region
// without traffic of a key still gives its share of it away.
func (b *Built) keeper(shares *policy.Shares, clock limiter.Clock) func(context.Context, *events.CloudWatchEvent) (any, error) {
	if shares == nil {
		return nil
	}
	kp := &regions.Keeper{Keys: b.sharesSet.list, Now: clock.Now}
	return func(ctx context.Context, ev *events.CloudWatchEvent) (any, error) {
		rep, err := kp.Run(ctx)
		// The counts of the run go out before the container is frozen.
		for _, k := range b.sharesSet.list() {
			k.Flush(clock.Now())
		}
		attrs := []any{"event", ev.ID, "limits", rep.Limits, "rounds", rep.Rounds, "ran", rep.Ran.String(), "index_reads", rep.IndexReads,
			"index_errors", rep.IndexErrors, "wanted", rep.Wanted, "expired", rep.Expired, "ticks", rep.Ticks, "tick_errors", rep.TickErrors, "skipped", rep.Skipped,
			"pruned", rep.Pruned, "prune_errors", rep.PruneErrors}
		if err != nil {
			// The keeper's errors are its sweeps' (a tick or a read that
			// failed is tried again next round): logged, not the
			// invocation's, which an asynchronous invoke would retry.
			b.Logger.Warn("keeper ran with errors", append(attrs, "error", err.Error())...)
		} else {
			b.Logger.Info("keeper ran", attrs...)
		}
		return map[string]any{"keeper": rep}, nil
	}
}

// sharesLine is limit's metric line of counts c.
func sharesLine(limit string, c regions.Counts) authz.SharesLine {
	return authz.SharesLine{Limit: limit, Given: c.Given, Received: c.Received, Ticks: c.Ticks, TickErrors: c.TickErrors,
		Takeovers: c.Takeovers, RoleLost: c.RoleLost, Stale: c.Stale, StaleEntries: c.StaleEntries,
		Sweeps: c.Sweeps, Expired: c.Expired, Wanted: c.Wanted, Listed: c.Listed, Dropped: c.Dropped}
}

// sharesSet holds the regional shares (regions.Keys) of the policies a
// process built, one per global limit: a rebuilt policy (a rules table
// reload that read changed rules) whose global limit has the same name
// and parameters takes the Keys the replaced policy holds, with its
// processes' entries, leases and agent roles, rather than a cold one that
// would stand by on the table beside it until the old one's roles lapse.
// A Keys is swept (list) while a policy holds it, and dropped, its
// processes' leases given back, once the last one that held it gave its
// leases back (a replaced policy retired by policy.Cache, or the process
// at Close). Safe for concurrent use: the keeper and the metrics read it
// while a reload builds.
type sharesSet struct {
	mu    sync.Mutex
	held  map[sharesID]*sharedKeys
	order []*sharedKeys // held, in the order made
	// building serializes builds (build); pending are the references
	// the build under way took.
	building sync.Mutex
	pending  []*sharesRef
}

// sharesID is a global limit's Keys' identity: its name (the table
// prefix) and its parameters.
type sharesID struct {
	prefix string
	cfg    regions.Config // Bucket nil
	bucket limiter.TokenBucketConfig
}

// sharedKeys is a Keys and the policies' references to it.
type sharedKeys struct {
	id   sharesID
	keys *regions.Keys
	refs int
}

// sharesRef is one policy's limiter of a shared Keys. It has no
// LeaseStats: the policies the metrics follow (authz.Metrics) may share a
// Keys, whose counts would be summed twice.
type sharesRef struct {
	keys *regions.Keys
	set  *sharesSet
	sk   *sharedKeys
	once sync.Once
}

// take returns a new policy's reference to the Keys of kc (its prefix and
// Config), made by newKeys when none is held.
func (s *sharesSet) take(kc regions.KeysConfig, newKeys func() (*regions.Keys, error)) (limiter.Limiter, error) {
	id := sharesID{prefix: kc.Prefix, cfg: kc.Config}
	if b := kc.Config.Bucket; b != nil {
		id.cfg.Bucket, id.bucket = nil, *b
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sk := s.held[id]
	if sk == nil || brokenSharesKeep {
		k, err := newKeys()
		if err != nil {
			return nil, err
		}
		sk = &sharedKeys{id: id, keys: k}
		if !brokenSharesKeep {
			s.held[id] = sk
		}
		s.order = append(s.order, sk)
	}
	sk.refs++
	r := &sharesRef{keys: sk.keys, set: s, sk: sk}
	s.pending = append(s.pending, r)
	return r, nil
}

// build runs f, a build of a policy (policy.New), and, when it fails,
// gives back the references it took: a Keys only it made is dropped.
func (s *sharesSet) build(f func() (*policy.Policy, error)) (*policy.Policy, error) {
	if s == nil {
		return f()
	}
	s.building.Lock()
	defer s.building.Unlock()
	s.mu.Lock()
	s.pending = nil
	s.mu.Unlock()
	p, err := f()
	s.mu.Lock()
	failed := s.pending
	s.pending = nil
	s.mu.Unlock()
	if err != nil && !brokenSharesKeep {
		for _, r := range failed {
			r.ReturnLeases(context.Background(), time.Now()) //nolint:errcheck // it never decided: no lease to return
		}
	}
	return p, err
}

// release drops r's reference, and reports whether it was the last one
// (the Keys is then no longer held).
func (s *sharesSet) release(sk *sharedKeys) (last bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sk.refs--; sk.refs > 0 {
		return false
	}
	delete(s.held, sk.id)
	s.order = slices.DeleteFunc(s.order, func(o *sharedKeys) bool { return o == sk })
	return true
}

// list returns the Keys held now (a copy: the keeper reads it while a
// reload builds), nil for a nil set.
func (s *sharesSet) list() []*regions.Keys {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := make([]*regions.Keys, len(s.order))
	for i, sk := range s.order {
		ks[i] = sk.keys
	}
	return ks
}

// ReturnLeases gives back the policy's reference (once): when it was the
// last, the Keys stops being swept and its processes' leases go back at
// now; otherwise another policy still decides with them.
func (r *sharesRef) ReturnLeases(ctx context.Context, now time.Time) error {
	if brokenSharesKeep {
		return nil
	}
	last := false
	r.once.Do(func() { last = r.set.release(r.sk) })
	if !last {
		return nil
	}
	if r.keys.Len() > 0 {
		r.keys.Flush(now) // its counts, which the keeper no longer flushes
	}
	return r.keys.ReturnLeases(ctx, now)
}

// AllowN decides on the shared Keys.
func (r *sharesRef) AllowN(ctx context.Context, key string, now time.Time, n int64) (limiter.Decision, error) {
	return r.keys.AllowN(ctx, key, now, n)
}

// Refund gives nothing back (regions.Keys.Refund).
func (r *sharesRef) Refund(ctx context.Context, key string, now time.Time, n int64) error {
	return r.keys.Refund(ctx, key, now, n)
}

var _ limiter.Limiter = (*sharesRef)(nil)

// shares yields the Keys held now (for range; tests).
func (b *Built) shares(yield func(int, *regions.Keys) bool) {
	for i, k := range b.sharesSet.list() {
		if !yield(i, k) {
			return
		}
	}
}

// brokenSharesKeep (tests): every build of a global limit makes a cold
// Keys that is swept for ever and whose leases never go back, and a
// failed build's stay too, as before.
var brokenSharesKeep = false
