package regions

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// The wants index: per limit and region, one item,
// regions/<prefix>/wants/<r>/index, holding in "ws" a map from each key
// whose region r is short (its demand near or above its share, and its
// share below its target) to when it was last listed (Unix ns, region
// r's clock). Region r's agents of those keys list their key, list it
// again every third of WantsLife while still short, and remove it once
// satisfied; it replicates to the other regions, whose processes and
// keepers tick the agents of the keys listed there ([Keys.Sweep]) so that
// a region without traffic of a key still gives its share away
// (docs/regions.md, "Processes and agent through the table"). A listing
// older than WantsLife is out of force: the readers ignore it, and region
// r's sweeps remove it. So a key whose region stopped deciding it (its
// agent is ticked no more, and cannot remove it) is ticked elsewhere for
// at most WantsLife after it was last listed. The item never collides
// with a key's own item, regions/<prefix><key>/<r>, which ends in a
// region's number. Only region r writes its index item.

// Wants index bounds: an item holds at most MaxWants keys of at most
// MaxWantKey bytes each (about 256 KB, under DynamoDB's 400 KB item
// limit); a key that does not fit is not listed, and counted
// (WantsStats.Dropped).
const (
	MaxWants   = 1000
	MaxWantKey = 256
)

// DefaultWantsLife is how long a listing stays in force after it was
// last written (KeysConfig.WantsLife).
const DefaultWantsLife = 15 * time.Second

const (
	// wantsRetry is how long an agent waits before it lists its key
	// again after the index was full (or its write failed).
	wantsRetry = 5 * time.Second
	// wantsHold is how long a listed key stays listed after the region
	// last needed units, while a plan would still give.
	wantsHold = 5 * time.Second
	// shortFill: a region is short of a key when its demand over the
	// share's horizon is at least this much of its share...
	shortFill = 0.8
	// pruneBatch is the most stale listings one write removes.
	pruneBatch = 50
)

// wantsRef is a key agent's place in its limit's wants index.
type wantsRef struct {
	client TableClient
	table  string
	prefix string
	key    string
	region int
	life   time.Duration // WantsLife

	mu    sync.Mutex
	stats WantsStats
}

// WantsStats counts an agent's writes to its region's wants index.
type WantsStats struct {
	// Added is the key's listings (a first one, or one again: every
	// third of WantsLife while short), Deleted its removals; Dropped the
	// times it could not be listed (the index full of listings in force,
	// or the key empty or longer than MaxWantKey); Errors the writes
	// that failed.
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
// is at least shortFill of its share. A lack that no region would give
// (under the givers' hysteresis) does not list the key, so the key is not
// ticked elsewhere for nothing.
//
// held reports a listed key that is not short now but was within
// wantsHold, whether or not a plan gives as this tick reads the states:
// it is neither unlisted nor listed again (its listing lapses in its own
// time), so that a noisy estimate, or a holder that has just taken the
// role over (its hold restarts then) and has not yet read what its
// predecessor did, does not unlist it before a giver gave (under load,
// takeovers that unlisted at once kept a short region's key out of the
// index for most of a run), and a region whose demand stopped does not
// renew it. Tick's state.
func (a *Agent) short(t int64) (short, held bool) {
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
	if gives {
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
			return true, false
		}
	}
	return false, tb.listed && tb.shortAt != 0 && t-tb.shortAt < int64(wantsHold)
}

// updateWants lists the key in its region's wants index when the region
// is short of it and removes it when not, one write on a change (the
// board records what was written, so a successor knows). A listed key
// is listed again every third of WantsLife (its stamp renewed: a listing
// not renewed for WantsLife is out of force), and a tick that took the
// role writes what it finds whatever the board says: a predecessor whose
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
	short, held := a.short(t)
	if held {
		return
	}
	switch {
	case short && (len(w.key) == 0 || len(w.key) > MaxWantKey):
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
	var (
		listed bool
		err    error
	)
	if short {
		listed, err = w.list(ctx, t)
	} else {
		err = w.unlist(ctx)
	}
	switch {
	case err != nil:
		// One try a takeover: then as the board says, the next write
		// after wantsRetry (a renewal, or a change).
		w.count(func(s *WantsStats) { s.Errors++ })
		tb.wantsTry, tb.resync = t+int64(wantsRetry), false
		return
	case short && !listed:
		w.count(func(s *WantsStats) { s.Dropped++ })
		tb.wantsTry, tb.resync = t+int64(wantsRetry), false
		return
	}
	tb.listed, tb.wantsTry, tb.resync = short, 0, false
	if short {
		tb.wantsTry = t + int64(w.life/3)
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

func conditionFailed(err error) bool {
	_, ok := errors.AsType[*types.ConditionalCheckFailedException](err)
	return ok
}

// list sets the key's listing to stamp t; false (and no error) when the
// index holds MaxWants listings in force. A full index first loses its
// listings out of force (pruneWants), then the key is tried once more.
func (w *wantsRef) list(ctx context.Context, t int64) (bool, error) {
	set := func() error {
		_, err := w.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(w.table),
			Key:                       wantsItem(w.prefix, w.region),
			UpdateExpression:          aws.String("SET ws.#k = :t"),
			ConditionExpression:       aws.String("attribute_exists(ws) AND (size(ws) < :max OR attribute_exists(ws.#k))"),
			ExpressionAttributeNames:  map[string]string{"#k": w.key},
			ExpressionAttributeValues: map[string]types.AttributeValue{":t": n(t), ":max": n(MaxWants)},
		})
		return err
	}
	err := set()
	if !conditionFailed(err) {
		return err == nil, err
	}
	// No map yet (a nested path needs its parent), or the index is full.
	_, err = w.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           aws.String(w.table),
		Key:                 wantsItem(w.prefix, w.region),
		UpdateExpression:    aws.String("SET ws = :m"),
		ConditionExpression: aws.String("attribute_not_exists(ws)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{w.key: n(t)}},
		},
	})
	if !conditionFailed(err) {
		return err == nil, err
	}
	if err = set(); !conditionFailed(err) { // made meanwhile
		return err == nil, err
	}
	removed, err := pruneWants(ctx, w.client, w.table, w.prefix, w.region, t-int64(w.life))
	if err != nil || removed == 0 {
		return false, err
	}
	if err = set(); conditionFailed(err) {
		return false, nil
	}
	return err == nil, err
}

// unlist removes the key's listing (none: nothing to do).
func (w *wantsRef) unlist(ctx context.Context) error {
	err := removeListings(ctx, w.client, w.table, w.prefix, w.region, []string{w.key}, 0)
	if conditionFailed(err) {
		return nil
	}
	return err
}

// removeListings removes keys from region r's index, each only if it is
// listed, and stamped before cut when cut is not 0. When they are all the
// index holds, it removes the whole map (the item is left as before its
// first listing: no empty map, which the harness's replicator cannot
// copy). It returns a ConditionalCheckFailedException when a key is not
// listed (or listed since cut).
func removeListings(ctx context.Context, c TableClient, table, prefix string, r int, keys []string, cut int64) error {
	var (
		rm, cond []string
		names    = map[string]string{}
		values   = map[string]types.AttributeValue{":n": n(int64(len(keys)))}
	)
	for i, k := range keys {
		p := "#k" + strconv.Itoa(i)
		names[p] = k
		rm = append(rm, "ws."+p)
		if cut != 0 {
			cond = append(cond, "ws."+p+" < :cut")
			values[":cut"] = n(cut)
		} else {
			cond = append(cond, "attribute_exists(ws."+p+")")
		}
	}
	each := strings.Join(cond, " AND ")
	in := &dynamodb.UpdateItemInput{
		TableName:                 aws.String(table),
		Key:                       wantsItem(prefix, r),
		UpdateExpression:          aws.String("REMOVE " + strings.Join(rm, ", ")),
		ConditionExpression:       aws.String("size(ws) > :n AND " + each),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
	}
	_, err := c.UpdateItem(ctx, in)
	if !conditionFailed(err) {
		return err
	}
	in.UpdateExpression = aws.String("REMOVE ws")
	in.ConditionExpression = aws.String("size(ws) = :n AND " + each)
	_, err = c.UpdateItem(ctx, in)
	return err
}

// listings is region r's index of the limit prefix as this region's
// replica holds it (an eventually consistent read: the index replicates
// with the lag anyway, and the read costs half): each listed key's stamp.
func listings(ctx context.Context, c TableClient, table, prefix string, r int) (map[string]int64, error) {
	out, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: wantsItem(prefix, r), ProjectionExpression: aws.String("ws")})
	if err != nil {
		return nil, err
	}
	m, _ := out.Item["ws"].(*types.AttributeValueMemberM)
	if m == nil {
		return nil, nil
	}
	ls := make(map[string]int64, len(m.Value))
	for k, v := range m.Value {
		var at int64 // a stamp that does not parse: out of force
		if s, ok := v.(*types.AttributeValueMemberN); ok {
			at, _ = strconv.ParseInt(s.Value, 10, 64)
		}
		ls[k] = at
	}
	return ls, nil
}

// readWants returns the keys region r lists in the limit prefix's index
// with a listing in force at now (stamped within life of it), and how
// many it lists out of force.
func readWants(ctx context.Context, c TableClient, table, prefix string, r int, now int64, life time.Duration) (keys []string, stale int, err error) {
	ls, err := listings(ctx, c, table, prefix, r)
	if err != nil {
		return nil, 0, err
	}
	for k, at := range ls {
		if now-at < int64(life) {
			keys = append(keys, k)
		} else {
			stale++
		}
	}
	return keys, stale, nil
}

// pruneWants removes from region r's index the listings stamped before
// cut, at most pruneBatch a write, each removal conditional on the stamp
// being still before cut (a key listed again meanwhile stays), and
// returns how many it removed.
func pruneWants(ctx context.Context, c TableClient, table, prefix string, r int, cut int64) (int, error) {
	ls, err := listings(ctx, c, table, prefix, r)
	if err != nil {
		return 0, err
	}
	var old []string
	for k, at := range ls {
		if at < cut {
			old = append(old, k)
		}
	}
	removed := 0
	remove := func(keys []string) error {
		err := removeListings(ctx, c, table, prefix, r, keys, cut)
		if err == nil {
			removed += len(keys)
		}
		return err
	}
	for len(old) > 0 {
		batch := old[:min(len(old), pruneBatch)]
		old = old[len(batch):]
		err := remove(batch)
		if !conditionFailed(err) {
			if err != nil {
				return removed, err
			}
			continue
		}
		// One of them was listed again (or removed) meanwhile: one by one.
		for i := range batch {
			if err := remove(batch[i : i+1]); err != nil && !conditionFailed(err) {
				return removed, err
			}
		}
	}
	return removed, nil
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
