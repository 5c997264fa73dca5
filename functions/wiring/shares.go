package wiring

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
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
	build := func(l *policy.Limit, cost int64, leases bool) (limiter.Limiter, error) {
		store, ok := b.Stores[BackendDynamo]
		if !ok || ddb == nil {
			return nil, fmt.Errorf("scope global on an eventual table needs the table: set %s", config.EnvDynamoTable)
		}
		kc := SharesKeys(l, n, leases)
		kc.Table = regions.Table{Client: ddb, Table: env.DynamoTable, Region: env.Region, Deadline: env.Deadline}
		kc.Store, kc.Holder = store, holder
		kc.Report = func(now time.Time, c regions.Counts) { metrics.Shares(now, sharesLine(l.Name, c)) }
		k, err := regions.NewKeys(kc)
		if err != nil {
			return nil, fmt.Errorf("regional shares of %s: %w", l.Name, err)
		}
		b.shares = append(b.shares, k)
		return k, nil
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

// SharesKeys is the part of l's regional shares among n regions that
// the rule decides (policy.CheckShares accepted l; leases as
// policy.Shares.Build is given it): the limit and its prefix in the
// table. The caller sets the table, the store and, to decide, the holder
// (sluice inspect reads a region's share with it).
func SharesKeys(l *policy.Limit, n int, leases bool) regions.KeysConfig {
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
	return regions.KeysConfig{Config: cfg, Prefix: l.Name + ":"}
}

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
	kp := &regions.Keeper{Keys: func() []*regions.Keys { return b.shares }, Now: clock.Now}
	return func(ctx context.Context, ev *events.CloudWatchEvent) (any, error) {
		rep, err := kp.Run(ctx)
		// The counts of the run go out before the container is frozen.
		for _, k := range b.shares {
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
