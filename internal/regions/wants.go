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

// short reports whether the region is short of the key: another
// region's plan, as this region reads the states, would give it units
// (a surplus above that region's hysteresis while this region lacks
// against its target), and its demand over the share's horizon (a
// window; a bucket's share refills at share/units of the bucket's rate)
// is at least shortFill of its share. A lack that no region would give
// (under the givers' hysteresis) does not list the key, so the key is
// not ticked elsewhere for nothing. Tick's state.
func (a *Agent) short() bool {
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
	if d*horizon < shortFill*float64(share) {
		return false
	}
	for o := range a.states {
		if o == a.r {
			continue
		}
		if g := a.cfg.plan(o, a.states, false); g != nil && g[a.r] > 0 {
			return true
		}
	}
	return false
}

// updateWants lists the key in its region's wants index when the region
// is short of it and unlists it when not, one write on a change (the
// board records what was written, so a successor knows). A key the
// index cannot take is retried after wantsRetry.
func (a *Agent) updateWants(ctx context.Context, now time.Time) {
	tb := a.tbl
	w := tb.wants
	if w == nil {
		return
	}
	short, t := a.short(), now.UnixNano()
	switch {
	case short == tb.listed:
		return
	case short && t < tb.wantsTry:
		return
	case short && len(w.key) > MaxWantKey:
		w.count(func(s *WantsStats) { s.Dropped++ })
		tb.wantsTry = t + int64(wantsRetry)
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
		tb.wantsTry = t + int64(wantsRetry)
		return
	}
	if err != nil {
		w.count(func(s *WantsStats) { s.Errors++ })
		tb.wantsTry = t + int64(wantsRetry)
		return
	}
	tb.listed = short
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
