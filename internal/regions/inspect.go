package regions

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// ShareView is a region's share of one key as its processes decide it at
// a stamp ([KeysConfig.Inspect]).
type ShareView struct {
	// Region is the region's place; Item its item of the key in the
	// table (regions/<ItemPrefix()+key>/<Region>).
	Region int
	Item   string
	// Published: the region's agent published an entry. Until: the
	// entry is used for decisions stamped before it; a decision stamped
	// later first waits for a tick of the key's agent, which publishes
	// anew (the share below is the last entry's).
	Published bool
	Seq       int64
	Until     time.Time
	// Share is the share in force at the stamp: a window's cap, or the
	// capacity of a bucket's item (0: none, every decision is denied
	// until a grant). Withheld is a window's units withheld for grants
	// to other regions (in the cap from their stamps on; 0 for a bucket).
	Share, Withheld int64
	// Ahead are a window's caps the entry holds for later stamps (a
	// withholding or a grant taking effect), in order.
	Ahead []CapStep
	// Counter names what the processes decide on in the store: a
	// window's counters (the key, '@', the region) or a bucket's item.
	Counter string
	// Decision is the state under Share at the stamp, as [limiter.Inspector]
	// Peek reports it: Limit (Share), Remaining, ResetAfter, and Allowed
	// and RetryAfter for a request of cost 1. RetryKnown is false when no
	// wait can be told: no share is in force (the region waits for a
	// grant), RetryAfter is then zero.
	Decision   limiter.Decision
	RetryKnown bool
	// Ledger is each region's share as the ledger entries this replica
	// holds show it (its base, less what it gave, plus what the others
	// gave it): shares held, which a window's cap follows once withheld
	// units are given and grants take effect.
	Ledger []int64
}

// Inspect reads the region's share of key at now (the wall clock) and
// what is left of it, without taking anything or writing: one consistent
// read of the region's item, one of each other region's ledger entry,
// and a peek at the counters or item the processes decide on (a window's
// under the cap in force: Remaining less the units above the cap, and a
// read at each later sub-window boundary, a binary search, for the
// RetryAfter of a window of the cap on the same counts, as the cap's
// decisions compute it). It needs c's Config, Table (client, table and
// region), Prefix and Store; not a Holder.
func (c KeysConfig) Inspect(ctx context.Context, key string, now time.Time) (ShareView, error) {
	lc, t := c.Config, c.Table.withDefaults()
	lc.Key, t.Name = c.ItemPrefix()+key, c.ItemPrefix()+key
	if c.Prefix == "" {
		return ShareView{}, fmt.Errorf("%w: keys need a prefix", ErrInvalidConfig)
	}
	if err := lc.validate(); err != nil {
		return ShareView{}, err
	}
	if err := t.validate(lc.Regions); err != nil {
		return ShareView{}, err
	}
	v := ShareView{Region: t.Region, Item: "regions/" + t.Name + "/" + strconv.Itoa(t.Region)}
	it, err := t.load(ctx)
	if err != nil {
		return ShareView{}, fmt.Errorf("regions: read %s: %w", v.Item, err)
	}
	if v.Ledger, err = c.ledgerShares(ctx, lc, t, it); err != nil {
		return ShareView{}, err
	}
	b := it.board
	e := b.Entry
	v.Published = e.Until != 0
	if v.Published {
		v.Seq, v.Until = e.Seq, time.Unix(0, e.Until)
	}
	stamp := now.UnixNano()
	if lc.Bucket != nil {
		return c.inspectBucket(ctx, lc, e.itemAt(stamp), now, v)
	}
	v.Withheld = b.Pending
	if len(b.Lows) > 0 {
		v.Withheld = 0
		for _, l := range b.Lows {
			v.Withheld += l.Units
		}
	}
	v.Counter = lc.Key + "@" + strconv.Itoa(t.Region)
	for _, c := range e.Caps {
		if c.At > stamp {
			v.Ahead = append(v.Ahead, c)
		}
	}
	cp, _ := e.capAt(stamp)
	return c.inspectWindow(ctx, lc, min(max(cp, 0), lc.Limit), now, v)
}

// ledgerShares is each region's share as the ledger entries show it: the
// region's own from it, the others' read from their items.
func (c KeysConfig) ledgerShares(ctx context.Context, lc Config, t Table, it tableItem) ([]int64, error) {
	states := make([]State, lc.Regions)
	if it.hasState && len(it.state.Given) == lc.Regions {
		states[t.Region] = it.state
	}
	l := tableLedger{t}
	for o := range lc.Regions {
		if o == t.Region {
			continue
		}
		st, found, err := l.Read(ctx, o)
		if err != nil {
			return nil, fmt.Errorf("regions: read region %d's ledger entry: %w", o, err)
		}
		if found && len(st.Given) == lc.Regions {
			states[o] = st
		}
	}
	shares := make([]int64, lc.Regions)
	for r := range shares {
		shares[r] = lc.share(r, states)
	}
	return shares, nil
}

// inspectWindow peeks at the region's counters under cap cp (the limit:
// none).
func (c KeysConfig) inspectWindow(ctx context.Context, lc Config, cp int64, now time.Time, v ShareView) (ShareView, error) {
	store, ok := c.Store.(storage.Counter)
	if !ok {
		return ShareView{}, fmt.Errorf("%w: a window's store must be a storage.Counter, not %T", ErrInvalidConfig, c.Store)
	}
	// The window the processes decide on (Process): the same key space.
	w, err := lc.window(store, lc.Leases)
	if err != nil {
		return ShareView{}, err
	}
	d, err := w.Peek(ctx, v.Counter, now)
	if err != nil {
		return ShareView{}, err
	}
	// A cap counts as Limit-cp units ahead of the stamp (limiter's
	// Item.Cap): the bounded estimate under it is the limit's less them.
	above := lc.Limit - cp
	v.Share = cp
	v.Decision = limiter.Decision{Limit: cp, Name: d.Name, Remaining: max(d.Remaining-above, 0), ResetAfter: d.ResetAfter}
	v.Decision.Allowed = v.Decision.Remaining >= 1
	if cp < 1 || v.Decision.Allowed {
		v.RetryKnown = cp >= 1
		return v, nil
	}
	// The first later sub-window whose view leaves a unit under the cap
	// (a view only loses units as it moves on: a binary search), else
	// when every count in view has left it, as the limiter's retryAfter.
	t := now.UnixNano()
	sub := int64(lc.Window) / int64(lc.SubWindows)
	idx := t / sub
	if t < 0 && t%sub != 0 {
		idx--
	}
	elapsed := t - idx*sub
	var peekErr error
	j := sort.Search(lc.SubWindows, func(i int) bool {
		if peekErr != nil {
			return true
		}
		dj, err := w.Peek(ctx, v.Counter, time.Unix(0, (idx+int64(i)+1)*sub))
		if err != nil {
			peekErr = err
			return true
		}
		return dj.Remaining-above >= 1
	}) + 1
	if peekErr != nil {
		return ShareView{}, peekErr
	}
	v.Decision.RetryAfter = time.Duration(int64(j)*sub - elapsed)
	v.RetryKnown = true
	return v, nil
}

// inspectBucket peeks at the bucket's item in force, it (nil: none).
func (c KeysConfig) inspectBucket(ctx context.Context, lc Config, it *ItemStep, now time.Time, v ShareView) (ShareView, error) {
	if it == nil || it.Share <= 0 {
		return v, nil
	}
	store, ok := c.Store.(storage.BucketStore)
	if !ok {
		return ShareView{}, fmt.Errorf("%w: a bucket's store must be a storage.BucketStore, not %T", ErrInvalidConfig, c.Store)
	}
	tb, err := limiter.NewTokenBucket(store, lc.bucketFor(it.Share, lc.Leases))
	if err != nil {
		return ShareView{}, err
	}
	d, err := tb.Get(ctx, it.Key, now)
	if err != nil {
		return ShareView{}, err
	}
	v.Share, v.Counter, v.Decision, v.RetryKnown = it.Share, it.Key, d, true
	return v, nil
}
