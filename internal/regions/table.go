package regions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter/storage"
)

// A region's item in the table, regions/<Name>/<r> (the ledger entry's
// item, docs/regions.md "Processes and agent through the table"), is all
// its processes and its agent share:
//
//	s   the ledger entry (State, JSON): read by the other regions
//	b   the board (JSON): the share entry the processes decide by, and
//	    the agent's state a successor resumes from
//	d   the demand counter: the units the processes were offered, a
//	    running total they ADD to
//	ep  the agent role's epoch, h its holder, x when the role lapses
//	    (Unix ns, the holder's clock)
//
// Only region r's processes and agent write it (last-writer-wins never
// meets two regions). Every agent write is conditional on ep, so a holder
// that lost the role (a frozen container) writes nothing after its
// successor took it.

// TableClient is the part of the DynamoDB client the table-backed path
// uses.
type TableClient interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
}

var _ TableClient = (*dynamodb.Client)(nil)

// Table places a region's processes and agent in a table with the dynamo
// store's layout (partition key "pk") and times their exchange.
type Table struct {
	Client TableClient
	Table  string
	// Name names the limit's items: regions/<Name>/<r> (the ledger's).
	Name   string
	Region int
	// Refresh (P) is how long a process uses the entry it read before
	// it reads it again (default 100 ms).
	Refresh time.Duration
	// Flush is the least time between a process's demand writes
	// (default 100 ms, Refresh: every read that has demand to write
	// writes it). A longer Flush leaves more of a process's demand
	// unwritten until its next decision, which for a process whose
	// traffic stopped may be seconds later: its agent then counts past
	// demand as present.
	Flush time.Duration
	// Validity (V) is how long after its publication (its save's send)
	// an entry may be used: for decisions stamped before then (default
	// 1 s). It must exceed Refresh and LockLife; a successor's take
	// publishes the entry again (Table.extend).
	Validity time.Duration
	// Deadline (D) bounds a decision: a process gives up its store
	// requests D after the decision's stamp (default 1 s). Through a
	// store that does not fence, an agent reads its region's count only
	// D after a lowered cap took effect.
	Deadline time.Duration
	// LockLife is how long the agent role stays with a holder that stops
	// ticking (default 750 ms).
	LockLife time.Duration
	// FenceRaises (experimental, off by default): a bucket with leases
	// on a store that fences buckets fences its raises where the lease
	// hold costs less than the wait, so that a raise takes force just
	// after the old item's fence rose rather than a validity after the
	// tick; its lowerings still wait. Off: its gain over a run is small
	// and not yet firm (about 0.04 of exact where demand moves), and an
	// older process ignores the fence during a rolling deploy
	// (docs/regions.md, "A raise fenced").
	FenceRaises bool

	// brokenLapse (tests): the rule before the entry kept (lapse_test.go).
	brokenLapse bool
	// fenceLeased (tests): a bucket WITH leases on a store that fences
	// buckets fences its lowerings too (the lease hold, holdLeases), not
	// its raises only. Not enabled: measured below the wait
	// (docs/regions.md, "Bucket: a fence instead of the wait").
	fenceLeased bool
}

// Table defaults.
const (
	defaultRefresh  = 100 * time.Millisecond
	defaultFlush    = 100 * time.Millisecond
	defaultValidity = time.Second
	defaultDeadline = time.Second
	defaultLockLife = 750 * time.Millisecond
)

func (t *Table) withDefaults() Table {
	c := *t
	c.Refresh = orDefault(c.Refresh, defaultRefresh)
	c.Flush = orDefault(c.Flush, defaultFlush)
	c.Validity = orDefault(c.Validity, defaultValidity)
	c.Deadline = orDefault(c.Deadline, defaultDeadline)
	c.LockLife = orDefault(c.LockLife, defaultLockLife)
	return c
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func (t *Table) validate(regions int) error {
	if t == nil || t.Client == nil || t.Table == "" || t.Name == "" || t.Region < 0 || t.Region >= regions {
		return fmt.Errorf("%w: a table needs a client, a table, a name and a region of %d", ErrInvalidConfig, regions)
	}
	if t.Refresh >= t.Validity || t.LockLife >= t.Validity {
		return fmt.Errorf("%w: refresh %v and lock life %v must be shorter than the validity %v", ErrInvalidConfig, t.Refresh, t.LockLife, t.Validity)
	}
	return nil
}

func (t *Table) key() map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "regions/" + t.Name + "/" + strconv.Itoa(t.Region)}}
}

// Entry is a region's share as its processes use it: for decisions
// stamped before Until, a window's cap (the last step of Caps at or
// before the stamp) or a bucket's item (the last of Items from at or
// before the stamp).
type Entry struct {
	Seq   int64      `json:"n"`
	Until int64      `json:"u"`
	Caps  []CapStep  `json:"c,omitempty"`
	Items []ItemStep `json:"i,omitempty"`
	// Fence is a window's fence number (limiter.Item.Fence): the Seq of
	// the publication that made the latest lowering in force at every
	// stamp, carried by every later entry (0: none; the store does not
	// fence). The agent raises the region's counters' fence to it before
	// it reads their count for a grant, so that a decision by an entry
	// published before (a higher cap, a lower fence) either reached the
	// store by then or is refused (storage.ErrFenced) and decided again
	// by a newer entry.
	Fence int64 `json:"f,omitempty"`
}

// CapStep is a window's cap from stamp At (Unix ns) on.
type CapStep struct {
	At  int64 `json:"t"`
	Cap int64 `json:"c"`
}

// ItemStep is a bucket share of Share units on item Key, for decisions
// stamped from From (Unix ns) on.
type ItemStep struct {
	Key   string `json:"k"`
	From  int64  `json:"t"`
	Share int64  `json:"s"`
	// Extra is the tokens the item held at its first stamp, besides the
	// old item's free ones the carry adds: what the units it adds
	// refilled while it waited to take over (the agent's; processes
	// ignore it), and what a grant's tokens read while the item was
	// ahead added to it (lateTokens).
	Extra int64 `json:"x,omitempty"`
	// Held, once its carry is made, is the tokens it held at its first
	// stamp (Extra and the carry's) plus the grants' tokens added since
	// (lateTokens); nil: not known here (a successor's carry).
	Held *int64 `json:"h,omitempty"`
}

// capAt is the cap for a decision stamped t (false: none).
func (e *Entry) capAt(t int64) (int64, bool) {
	for i := len(e.Caps) - 1; i >= 0; i-- {
		if e.Caps[i].At <= t {
			return e.Caps[i].Cap, true
		}
	}
	return 0, false
}

// itemAt is the item for a decision stamped t (nil: none).
func (e *Entry) itemAt(t int64) *ItemStep {
	for i := len(e.Items) - 1; i >= 0; i-- {
		if e.Items[i].From <= t {
			return &e.Items[i]
		}
	}
	return nil
}

// board is the item's "b": the entry and what a successor to the agent
// resumes from (the ledger entry, "s", holds the grants given).
type board struct {
	Entry Entry `json:"e"`
	// Lows are the units withheld for window grants, oldest first: the
	// cap is lower by each one's units for decisions stamped from its
	// From on, and the region's count may be read for a grant of them
	// from its Ready (From + Deadline) on.
	Lows []lowering `json:"pl,omitempty"`
	// Pending, From and Ready are one lowering as boards before Lows
	// held it (read only).
	Pending int64 `json:"p,omitempty"`
	From    int64 `json:"pf,omitempty"`
	Ready   int64 `json:"pr,omitempty"`
	// MaxUntil is the latest Until of an entry published.
	MaxUntil int64 `json:"mu,omitempty"`
	// Seen is the demand counter as the last tick read it, at Tick.
	Seen int64 `json:"ds,omitempty"`
	Tick int64 `json:"lt,omitempty"`
	// Wants: the key is listed in the region's wants index; WantsTry:
	// when it may try to list it again (wants.go).
	Wants    bool  `json:"w,omitempty"`
	WantsTry int64 `json:"wt,omitempty"`
	// In is, per giving region, its running total of a bucket's units
	// given this one through which the grants have left transit: their
	// refill in transit is in an item listed here, or they joined a
	// share that kept its rate (transit). Written with the items, so a
	// successor credits no grant twice.
	In []int64 `json:"mi,omitempty"`
	// Took are the grants that left transit in a new item before their
	// tokens were read (at most moveMax): what each was credited there,
	// so that the tokens its giver carries later are added at most once
	// (a grant leaves Took as its tokens are taken), to at most what the
	// grant would have held (lateTokens).
	Took []took `json:"mt,omitempty"`
}

// took is a bucket's grant to this region that left transit in the new
// item whose first stamp is Item before its tokens were read: From's
// grant of Units (its running total Upto), Credit the tokens the item
// held for it at its first stamp (its refill in transit).
type took struct {
	From   int   `json:"o"`
	Upto   int64 `json:"n"`
	Units  int64 `json:"u"`
	Credit int64 `json:"c"`
	Item   int64 `json:"i"`
}

// tableItem is the region's item as read.
type tableItem struct {
	state    State
	hasState bool
	board    board
	demand   int64
	epoch    int64
	holder   string
	lapses   int64
	rawBoard string // b as read ("": none)
}

func (t *Table) parse(m map[string]types.AttributeValue) (tableItem, error) {
	var it tableItem
	if m == nil {
		return it, nil
	}
	if v, ok := m["s"].(*types.AttributeValueMemberS); ok {
		if err := json.Unmarshal([]byte(v.Value), &it.state); err != nil {
			return it, fmt.Errorf("regions: region %d's ledger entry: %w", t.Region, err)
		}
		it.hasState = true
	}
	if v, ok := m["b"].(*types.AttributeValueMemberS); ok {
		if err := json.Unmarshal([]byte(v.Value), &it.board); err != nil {
			return it, fmt.Errorf("regions: region %d's board: %w", t.Region, err)
		}
		it.rawBoard = v.Value
	}
	var err error
	num := func(name string, dst *int64) {
		if v, ok := m[name].(*types.AttributeValueMemberN); ok && err == nil {
			if *dst, err = strconv.ParseInt(v.Value, 10, 64); err != nil {
				err = fmt.Errorf("regions: region %d's %s: %w", t.Region, name, err)
			}
		}
	}
	num("d", &it.demand)
	num("ep", &it.epoch)
	num("x", &it.lapses)
	if v, ok := m["h"].(*types.AttributeValueMemberS); ok {
		it.holder = v.Value
	}
	return it, err
}

func n(v int64) *types.AttributeValueMemberN {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// load reads the item (strongly consistent).
func (t *Table) load(ctx context.Context) (tableItem, error) {
	out, err := t.Client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(t.Table), Key: t.key(), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return tableItem{}, err
	}
	return t.parse(out.Item)
}

// errLost: the write's condition on the agent role failed.
var errLost = errors.New("regions: the agent role is held by another")

// acquire takes the agent role from epoch seen (0: never held), which
// must have lapsed by now, for holder until lapses; it returns the item
// as of the take. With until after the Until of the entry in prev (the
// item as read before, unchanged since: the condition), the take also
// publishes that entry again, valid until until (see extend).
func (t *Table) acquire(ctx context.Context, seen int64, holder string, now, lapses int64, prev tableItem, until int64) (tableItem, error) {
	update, cond := "SET ep = :new, h = :h, x = :x", "attribute_not_exists(ep) OR (ep = :seen AND x < :now)"
	vals := map[string]types.AttributeValue{
		":new": n(seen + 1), ":seen": n(seen), ":now": n(now), ":x": n(lapses), ":h": &types.AttributeValueMemberS{Value: holder},
	}
	if b, ok := prev.extend(until); ok && !t.brokenLapse {
		bj, err := json.Marshal(b)
		if err != nil {
			return tableItem{}, err
		}
		update += ", b = :nb"
		cond = "b = :ob AND (" + cond + ")"
		vals[":nb"] = &types.AttributeValueMemberS{Value: string(bj)}
		vals[":ob"] = &types.AttributeValueMemberS{Value: prev.rawBoard}
	}
	out, err := t.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(t.Table),
		Key:                       t.key(),
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeValues: vals,
		ReturnValues:              types.ReturnValueAllNew,
	})
	if err != nil {
		if _, ok := errors.AsType[*types.ConditionalCheckFailedException](err); ok {
			return tableItem{}, errLost
		}
		return tableItem{}, err
	}
	return t.parse(out.Attributes)
}

// extend is the board of it with its entry published again, unchanged
// but valid until until (false: no entry, or one valid as long). A
// successor's take publishes it, so that the region's processes have an
// entry to decide by while the successor's first tick runs (several
// requests; on a loaded host longer than the entries' validity). It is
// the entry the predecessor's next tick would have published had nothing
// changed: its caps and items are by stamp, and every change to them
// (a lowering, a grant, a rebase) is made by a later tick, from a stamp
// no earlier than the latest Until on record, which now includes until
// (MaxUntil). docs/regions.md, "The role under slow ticks".
func (it tableItem) extend(until int64) (board, bool) {
	b := it.board
	if it.rawBoard == "" || b.Entry.Seq == 0 || b.Entry.Until >= until {
		return board{}, false
	}
	b.Entry.Seq++
	b.Entry.Until = until
	b.MaxUntil = max(b.MaxUntil, until)
	return b, true
}

// save writes the ledger entry and the board, and extends the role to
// lapses, if epoch still holds it.
func (t *Table) save(ctx context.Context, epoch int64, st State, b board, lapses int64) error {
	sj, err := json.Marshal(st)
	if err != nil {
		return err
	}
	bj, err := json.Marshal(b)
	if err != nil {
		return err
	}
	_, err = t.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           aws.String(t.Table),
		Key:                 t.key(),
		UpdateExpression:    aws.String("SET s = :s, b = :b, x = :x"),
		ConditionExpression: aws.String("ep = :ep"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":s": &types.AttributeValueMemberS{Value: string(sj)}, ":b": &types.AttributeValueMemberS{Value: string(bj)}, ":x": n(lapses), ":ep": n(epoch),
		},
	})
	if _, ok := errors.AsType[*types.ConditionalCheckFailedException](err); ok {
		return errLost
	}
	return err
}

// read returns the region's entry (false: none published yet), adding
// offered units to the demand counter in the same request when offered
// is positive.
func (t *Table) read(ctx context.Context, offered int64) (Entry, bool, error) {
	var m map[string]types.AttributeValue
	if offered > 0 {
		out, err := t.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(t.Table),
			Key:                       t.key(),
			UpdateExpression:          aws.String("ADD d :n"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":n": n(offered)},
			ReturnValues:              types.ReturnValueAllNew,
		})
		if err != nil {
			return Entry{}, false, err
		}
		m = out.Attributes
	} else {
		out, err := t.Client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(t.Table), Key: t.key(), ConsistentRead: aws.Bool(true),
			ProjectionExpression: aws.String("b")})
		if err != nil {
			return Entry{}, false, err
		}
		m = out.Item
	}
	v, ok := m["b"].(*types.AttributeValueMemberS)
	if !ok {
		return Entry{}, false, nil
	}
	var b board
	if err := json.Unmarshal([]byte(v.Value), &b); err != nil {
		return Entry{}, false, fmt.Errorf("regions: region %d's board: %w", t.Region, err)
	}
	return b.Entry, true, nil
}

// ErrStale is returned for a decision with no share entry valid at its
// stamp (the agent has not published one lately, or it could not be
// read): the rule's fail mode decides it, as for a store that is down.
var ErrStale = fmt.Errorf("regions: no share entry valid at the decision's stamp: %w", storage.ErrUnavailable)

const minStamp = math.MinInt64
