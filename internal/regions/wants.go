package regions

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// The wants index: per limit and region, one item,
// regions/<prefix>/wants/<r>/index, holding in "w" the string set of the
// keys whose region r is short (its demand near or above its share, and
// its share below its target). Region r's agents of those keys ADD their
// key to it and DELETE it once satisfied; it replicates to the other
// regions, whose processes and keepers tick the agents of the keys listed
// there ([Keys.Sweep]) so that a region without traffic of a key still
// gives its share away (docs/regions.md, "A rule's scope"). The item
// never collides with a key's own item, regions/<prefix><key>/<r>, which
// ends in a region's number.

// Wants index bounds: an item holds at most MaxWants keys of at most
// MaxWantKey bytes each (about 256 KB, under DynamoDB's 400 KB item
// limit); a key that does not fit is not listed, and counted
// (WantsStats.Dropped).
const (
	MaxWants   = 1000
	MaxWantKey = 256
)

const (
	// wantsRetry is how long an agent waits before it lists its key
	// again after the index was full (or its write failed).
	wantsRetry = 5 * time.Second
	// wantsRefresh is how often a listed key is listed again (an ADD of
	// a key listed already changes nothing).
	wantsRefresh = 5 * time.Second
	// wantsHold is how long a listed key stays listed after the region
	// last needed units, while a plan would still give.
	wantsHold = 5 * time.Second
	// shortFill: a region is short of a key when its demand over the
	// share's horizon is at least this much of its share...
	shortFill = 0.8
)

// wantsRef is a key agent's place in its limit's wants index.
type wantsRef struct {
	client TableClient
	table  string
	prefix string
	key    string
	region int

	mu    sync.Mutex
	stats WantsStats
}

// WantsStats counts an agent's writes to its region's wants index.
type WantsStats struct {
	// Added and Deleted are the key's ADDs and DELETEs; Dropped the
	// times it could not be listed (the index full, or the key longer
	// than MaxWantKey); Errors the writes that failed.
	Added, Deleted, Dropped, Errors int64
	// Listed reports whether the key is listed, as the agent last wrote.
	Listed bool
}

// wantsItem is the key of region r's index item of the limit prefix.
func wantsItem(prefix string, r int) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "regions/" + prefix + "/wants/" + strconv.Itoa(r) + "/index"}}
}

func (w *wantsRef) count(f func(*WantsStats)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(&w.stats)
}

// short reports whether the region is short of the key at t: another
// region's plan, as this region reads the states, would give it units
// (a surplus above that region's hysteresis while this region lacks
// against its target), and the region needs them: its share bound (this
// process's decisions of the key were denied by it since the last tick:
// the demand estimate counts what the processes were offered, averaged
// over ticks, and under a bursty or slowed load it stays under the share
// while the region denies), or its demand over the share's horizon (a
// window; a bucket's share refills at share/units of the bucket's rate)
// is at least shortFill of its share. A listed key stays listed while a
// plan would give and the region needed units within wantsHold, so that
// a noisy estimate does not unlist it before a giver gave. A lack that
// no region would give (under the givers' hysteresis) does not list the
// key, so the key is not ticked elsewhere for nothing. Tick's state.
func (a *Agent) short(t int64) bool {
	tb := a.tbl
	gives := false
	for o := range a.states {
		if o != a.r {
			if g := a.cfg.plan(o, a.states, false); g != nil && g[a.r] > 0 {
				gives = true
				break
			}
		}
	}
	if !gives {
		return false
	}
	a.mu.Lock()
	share := a.owned
	a.mu.Unlock()
	d := a.states[a.r].Demand // units a second
	var horizon float64       // seconds a share's units last at its rate
	if b := a.cfg.Bucket; b != nil {
		horizon = float64(a.cfg.units()) * b.RefillTime.Seconds() / float64(b.RefillAmount)
	} else {
		horizon = a.cfg.Window.Seconds()
	}
	if tb.bound || d*horizon >= shortFill*float64(share) {
		tb.shortAt = t
		return true
	}
	return tb.listed && tb.shortAt != 0 && t-tb.shortAt < int64(wantsHold)
}

// updateWants lists the key in its region's wants index when the region
// is short of it and unlists it when not, one write on a change (the
// board records what was written, so a successor knows). A listed key
// is listed again every wantsRefresh, and a tick that took the role
// writes what it finds whatever the board says: a predecessor whose
// write landed after its last save (its role lost meanwhile) may have
// undone what the board records. A key the index cannot take is retried
// after wantsRetry.
func (a *Agent) updateWants(ctx context.Context, now time.Time) {
	tb := a.tbl
	w := tb.wants
	if w == nil {
		return
	}
	t := now.UnixNano()
	short := a.short(t)
	switch {
	case short && len(w.key) > MaxWantKey:
		if t >= tb.wantsTry {
			w.count(func(s *WantsStats) { s.Dropped++ })
			tb.wantsTry = t + int64(wantsRetry)
		}
		return
	case tb.resync:
		// Write, whatever the board says.
	case short == tb.listed && !(short && t >= tb.wantsTry):
		return
	case short && t < tb.wantsTry:
		return
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                 aws.String(w.table),
		Key:                       wantsItem(w.prefix, w.region),
		ExpressionAttributeValues: map[string]types.AttributeValue{":k": &types.AttributeValueMemberSS{Value: []string{w.key}}},
	}
	if short {
		in.UpdateExpression = aws.String("ADD w :k")
		in.ConditionExpression = aws.String("attribute_not_exists(w) OR size(w) < :max OR contains(w, :s)")
		in.ExpressionAttributeValues[":max"] = n(MaxWants)
		in.ExpressionAttributeValues[":s"] = &types.AttributeValueMemberS{Value: w.key}
	} else {
		in.UpdateExpression = aws.String("DELETE w :k")
	}
	_, err := w.client.UpdateItem(ctx, in)
	if _, full := errors.AsType[*types.ConditionalCheckFailedException](err); full {
		w.count(func(s *WantsStats) { s.Dropped++ })
		tb.wantsTry, tb.resync = t+int64(wantsRetry), false
		return
	}
	if err != nil {
		// One try a takeover: then as the board says, the next write
		// after wantsRetry (a refresh, or a change).
		w.count(func(s *WantsStats) { s.Errors++ })
		tb.wantsTry, tb.resync = t+int64(wantsRetry), false
		return
	}
	tb.listed, tb.wantsTry, tb.resync = short, 0, false
	if short {
		tb.wantsTry = t + int64(wantsRefresh)
	}
	w.count(func(s *WantsStats) {
		s.Listed = short
		if short {
			s.Added++
		} else {
			s.Deleted++
		}
	})
}

// readWants returns the keys region r lists in the limit prefix's index
// as this region's replica holds them (an eventually consistent read: the
// index replicates with the lag anyway, and the read costs half).
func readWants(ctx context.Context, c TableClient, table, prefix string, r int) ([]string, error) {
	out, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: wantsItem(prefix, r), ProjectionExpression: aws.String("w")})
	if err != nil {
		return nil, err
	}
	ss, _ := out.Item["w"].(*types.AttributeValueMemberSS)
	if ss == nil {
		return nil, nil
	}
	return ss.Value, nil
}

// WantsStats returns the agent's counts of its wants index (zero for an
// agent without one).
func (a *Agent) WantsStats() WantsStats {
	if a.tbl == nil || a.tbl.wants == nil {
		return WantsStats{}
	}
	w := a.tbl.wants
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}
