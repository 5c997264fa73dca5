package dynamo

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter/storage"
)

var _ storage.PackedCounter = (*Store)(nil)

const packedKind = "packed window"

// A packed counter (storage.PackedCell) is a top-level Number attribute
// named by five base64url characters of a 30-bit value: the level minus one
// in the top 2 bits, the counter's index modulo 2^28 in the others. Index i
// of level l aliases i+2^28 only 2^(28+2l) slots later (at least 2^30
// slots: 12 days at the smallest slot of 1 ms), long after the older one
// has been removed. The names have the length of a window's sub-window
// counters but never share an item with them (a packed window's keys have
// their own space).
const (
	packedIdxBits = 28
	packedIdxMod  = 1 << packedIdxBits
)

// packedName is the attribute name of counter c.
func packedName(c storage.PackedCell) string {
	return slotName(int64(c.Level-1)<<packedIdxBits | mod(c.Index, packedIdxMod))
}

// parsePackedName returns the level and the index modulo 2^28 of a counter
// attribute name, or false for other names.
func parsePackedName(name string) (level int, idx int64, ok bool) {
	v, ok := parseSlot(name)
	if !ok {
		return 0, 0, false
	}
	return int(v>>packedIdxBits) + 1, v & (packedIdxMod - 1), true
}

// resolve returns the index, modulo 2^28 in a name, of the level-l counter
// nearest to the one of slot f (within 2^27 counters either side).
func resolve(idx int64, l int, f int64) int64 {
	ref := f >> (2 * l)
	d := mod(idx-ref, packedIdxMod)
	if d >= packedIdxMod/2 {
		d -= packedIdxMod
	}
	return ref + d
}

// keepFrom is the oldest slot whose counters a store at newest slot f
// holds: counters whose Last() is below it may be removed. The newest slot
// is tracked in the item at the resolution of a level-1 counter (4 slots:
// the newest level-1 counter present), so the bound is taken from the first
// slot of the level-1 counter of f: 4*floor(f/4) - keep, which is at most
// f - keep (a counter the contract lets a store drop may be held up to 3
// slots longer, never less).
func keepFrom(f, keep int64) int64 { return f&^3 - keep }

// AddPacked implements [storage.PackedCounter]: ONE UpdateItem that ADDs
// each level's delta to its counter attribute, removes counters past the
// writer's own keep bound (keepFrom(op.Slot, op.Keep): the two just behind
// it at every level by name, and the ones the last response of this
// process showed), sets the TTL and returns the whole item (ALL_NEW), from
// which the added counters and op.Reads are read, each value taken modulo
// 2^64 (DynamoDB's numbers do not wrap; the remainder is what wrapping
// additions give).
//
// The newest slot added to the key is the newest level-1 counter in the
// item. If a counter the op names is older than keepFrom(newest, op.Keep)
// (it may have been removed, and the add created it again), the op is
// Stale: its add is taken back with a second UpdateItem (as SubPacked;
// Stats.PackedStale) and it answers Stale. An op that adds nothing is a
// consistent GetItem.
func (s *Store) AddPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) (storage.PackedCounts, error) {
	var c storage.PackedCounts
	if err := validPacked(op); err != nil {
		return c, err
	}
	a, err := s.attrsOf(k)
	if err != nil {
		return c, err
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	if err := s.waitRefunds(ctx, a.pk); err != nil {
		return c, err
	}
	if !packedAdds(op) {
		s.counter.reads.Add(1)
		out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
			TableName: s.table, Key: keyAttr(a.pk), ConsistentRead: aws.Bool(true),
		}, s.optFns...)
		if err != nil {
			return c, mapError("packed window read", err)
		}
		it, err := decodePacked(a, out.Item, op.Slot, op.Keep)
		if err != nil {
			return c, err
		}
		return it.answer(op), nil
	}
	p := &packedAdd{s: s, a: a, op: op}
	err = s.writeOne(ctx, a.pk, p)
	return p.res.Packed, err
}

// packedAdds reports whether op adds anything (else it is a read).
func packedAdds(op *storage.PackedOp) bool {
	for _, a := range op.Adds {
		if a.Delta != 0 {
			return true
		}
	}
	return false
}

// packedAdd is a packed window's add as a part of a write (AddPacked).
type packedAdd struct {
	s      *Store
	a      attrs
	op     *storage.PackedOp
	shadow bool // a Shadow step: never skipped
	res    storage.StepResult
}

func (p *packedAdd) next(_ context.Context, u *update) (bool, error) {
	var ttl time.Duration
	z := u.num(0)
	for _, ad := range p.op.Adds {
		if ad.Delta == 0 {
			continue
		}
		ttl = max(ttl, ad.TTL)
		ph := u.name(p.a.pre + packedName(ad.Cell))
		u.add = append(u.add, ph+" "+u.value(&types.AttributeValueMemberN{Value: strconv.FormatUint(ad.Delta, 10)}))
		u.cond = append(u.cond, fmt.Sprintf("(attribute_not_exists(%s) OR (attribute_type(%s, %s) AND %s >= %s))", ph, ph, u.typeN(), ph, z))
	}
	u.keepTTL(ttl)
	u.allNew = true
	for _, name := range p.s.packedRemovals(p.a, p.op) {
		u.removeAttr(name)
	}
	return true, nil
}

func (p *packedAdd) written(ctx context.Context, item map[string]types.AttributeValue) error {
	s, a, op := p.s, p.a, p.op
	it, err := decodePacked(a, item, op.Slot, op.Keep-s.packedEarly)
	if err != nil {
		s.cache.remove(a.cacheKey())
		return err
	}
	switch {
	case len(it.stale) == 0:
		s.cache.remove(a.cacheKey())
	case len(it.stale) >= cleanupStale && writeUnits(it.size) > writeUnits(it.size-it.staleSize):
		// Worth a request now: the next decisions on the key cost fewer
		// write units without them.
		s.cleanup(ctx, a, it.stale)
	default:
		s.cache.put(a.cacheKey(), windowState{stale: it.stale})
	}
	if it.staleOp(op) && !s.packedNoStale {
		// Past the horizon: what the op names may have been removed
		// before this add created it again. Take the add back and answer
		// Stale (the limiter denies it). If the undo fails, the units
		// stay counted: in counters no writer within the horizon reads,
		// or in coarse ones it does (stricter), never free.
		s.counter.packedStale.Add(1)
		if err := s.writeOne(ctx, a.pk, newPackedSub(a, op, keepFrom(it.newest1<<2, op.Keep))); err != nil {
			s.counter.lostRefunds.Add(1)
		}
		p.res.Packed = storage.PackedCounts{Stale: true}
		return nil
	}
	if s.packedNoStale {
		it.has1 = false
	}
	p.res.Packed = it.answer(op)
	return nil
}

func (p *packedAdd) lost(old map[string]types.AttributeValue) (bool, error) {
	p.s.cache.remove(p.a.cacheKey())
	// Only a counter of the wrong type or sign fails this part's
	// condition.
	if _, err := decodePacked(p.a, old, p.op.Slot, p.op.Keep); err != nil {
		return false, err
	}
	return true, nil
}

func (p *packedAdd) skip() bool {
	p.res.NotApplied = !p.shadow
	return p.res.NotApplied
}
func (p *packedAdd) result() storage.StepResult { return p.res }

// packedRemovals returns the counters an add at op.Slot removes: at every
// level the two just behind keepFrom(op.Slot, op.Keep), and the names this
// process saw past it in the key's last response. Every one is older than
// the writer's own keep bound, so never one that a writer within the
// horizon of the newest names (the newest is at or after op.Slot).
func (s *Store) packedRemovals(a attrs, op *storage.PackedOp) []string {
	from := keepFrom(op.Slot, op.Keep-s.packedEarly)
	remove := make([]string, 0, 2*storage.PackedLevels)
	for l := 1; l <= storage.PackedLevels; l++ {
		idx := from >> (2 * l) // counters before idx end before from
		for i := int64(1); i <= 2; i++ {
			remove = append(remove, a.pre+packedName(storage.PackedCell{Level: uint8(l), Index: idx - i}))
		}
	}
	if v, ok := s.cache.get(a.cacheKey()); ok {
		if st, ok := v.(windowState); ok {
			for _, name := range st.stale {
				l, idx, ok := parsePackedName(name[len(a.pre):])
				if !ok || contains(remove, name) || len(remove) >= maxRemove {
					continue
				}
				if c := (storage.PackedCell{Level: uint8(l), Index: resolve(idx, l, op.Slot)}); c.Last() < from {
					remove = append(remove, name)
				}
			}
		}
	}
	return remove
}

// packedItem is a packed item as seen from one writer.
type packedItem struct {
	values map[string]uint64
	// newest1 is the newest level-1 counter's index (has1: there is one).
	newest1 int64
	has1    bool
	// stale lists the counters older than the writer's keep bound.
	stale []string
	// size is the item's size as DynamoDB counts it (about), staleSize
	// the part of it the stale counters take.
	size, staleSize int
}

// writeUnits is the write capacity units of a write of an item of size
// bytes.
func writeUnits(size int) int { return (size + ItemBudget - 1) / ItemBudget }

// decodePacked reads the counters of item as seen from slot f.
func decodePacked(a attrs, item map[string]types.AttributeValue, f, keep int64) (packedItem, error) {
	it := packedItem{values: make(map[string]uint64, len(item))}
	from := keepFrom(f, keep)
	for name, av := range item {
		sz := len(name) + valueSize(av)
		it.size += sz
		short, ok := a.own(name)
		if !ok {
			continue
		}
		l, idx, ok := parsePackedName(short)
		if !ok {
			continue
		}
		v, err := packedValue(a.pk, name, av)
		if err != nil {
			return it, err
		}
		it.values[short] = v
		c := storage.PackedCell{Level: uint8(l), Index: resolve(idx, l, f)}
		if l == 1 && (!it.has1 || c.Index > it.newest1) {
			it.newest1, it.has1 = c.Index, true
		}
		if c.Last() < from {
			it.stale = append(it.stale, name)
			it.staleSize += sz
		}
	}
	return it, nil
}

// staleOp reports whether op names a counter older than the keep bound of
// the newest slot in the item.
func (it *packedItem) staleOp(op *storage.PackedOp) bool {
	if !it.has1 {
		return false
	}
	from := keepFrom(it.newest1<<2, op.Keep)
	for _, a := range op.Adds {
		if a.Delta != 0 && a.Cell.Last() < from {
			return true
		}
	}
	for _, r := range op.Reads[:op.NReads] {
		if r.Last() < from {
			return true
		}
	}
	return false
}

// answer is the op's PackedCounts from the item (Stale when staleOp).
func (it *packedItem) answer(op *storage.PackedOp) storage.PackedCounts {
	var c storage.PackedCounts
	if it.staleOp(op) {
		c.Stale = true
		return c
	}
	for i, a := range op.Adds {
		if a.Delta != 0 {
			c.Added[i] = it.values[packedName(a.Cell)]
		}
	}
	for i, r := range op.Reads[:op.NReads] {
		c.Read[i] = it.values[packedName(r)]
	}
	return c
}

// two64 is 2^64.
var two64 = new(big.Int).Lsh(big.NewInt(1), 64)

// packedNumber reads a counter attribute as a non-negative integer (a
// counter can pass 2^64: a carry out of its top field), or an error
// wrapping storage.ErrCorruptState.
func packedNumber(pk, name string, av types.AttributeValue) (*big.Int, error) {
	nv, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return nil, corrupt(packedKind, pk, name, "want a Number, got %s", typeName(av))
	}
	var r big.Rat
	if _, ok := r.SetString(nv.Value); !ok || !r.IsInt() || r.Sign() < 0 {
		return nil, corrupt(packedKind, pk, name, "want a count, got %q", nv.Value)
	}
	return new(big.Int).Set(r.Num()), nil
}

// packedValue is a counter's value modulo 2^64: the value the same
// additions give on a 64-bit counter that wraps.
func packedValue(pk, name string, av types.AttributeValue) (uint64, error) {
	if nv, ok := av.(*types.AttributeValueMemberN); ok {
		if v, err := strconv.ParseUint(nv.Value, 10, 64); err == nil {
			return v, nil
		}
	}
	z, err := packedNumber(pk, name, av)
	if err != nil {
		return 0, err
	}
	return z.Mod(z, two64).Uint64(), nil
}

// SubPacked implements [storage.PackedCounter]: a refund. ONE UpdateItem
// that ADDs each level's negated delta on condition that every counter
// holds at least its delta (so it exists: none is created), which
// subtracts exactly (it borrows back a carry a denied add made). If the
// condition fails, the item it returns says which counters are gone
// (skipped) and which hold less than their delta (set to the value with
// each field taken down to at most 0, on condition of the value seen), and
// the write is tried again in the store's conditional-write loop. A
// counter past the horizon that is still held is refunded like any other.
// op.Reads are ignored.
func (s *Store) SubPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) error {
	if err := validPacked(op); err != nil {
		return err
	}
	a, err := s.attrsOf(k)
	if err != nil {
		return err
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	return s.writeOne(ctx, a.pk, newPackedSub(a, op, math.MinInt64))
}

// packedSub takes op's adds back from the item (SubPacked) as a part of a
// write; the counters of op that end before drop (older than the newest
// slot's keep bound: nobody within the horizon reads them) are removed
// instead.
type packedSub struct {
	a  attrs
	ls [storage.PackedLevels]packedSubLevel
}

// Modes of a level of a packedSub.
const (
	modeAdd    = iota // ADD -d on condition >= d
	modeSet           // SET the clamped value on condition = the old one
	modeSkip          // nothing to do
	modeRemove        // REMOVE, no condition
)

type packedSubLevel struct {
	name     string // the full attribute name
	d        uint64
	mode     int
	old, set string
}

func newPackedSub(a attrs, op *storage.PackedOp, drop int64) *packedSub {
	p := &packedSub{a: a}
	for i, ad := range op.Adds {
		p.ls[i].mode = modeSkip
		if ad.Delta != 0 {
			p.ls[i] = packedSubLevel{name: a.pre + packedName(ad.Cell), d: ad.Delta, mode: modeAdd}
			if ad.Cell.Last() < drop {
				p.ls[i].mode = modeRemove
			}
		}
	}
	return p
}

func (p *packedSub) next(_ context.Context, u *update) (bool, error) {
	write := false
	for i := range p.ls {
		l := &p.ls[i]
		switch l.mode {
		case modeAdd:
			ph := u.name(l.name)
			u.add = append(u.add, ph+" "+u.value(&types.AttributeValueMemberN{Value: "-" + strconv.FormatUint(l.d, 10)}))
			u.cond = append(u.cond, ph+" >= "+u.value(&types.AttributeValueMemberN{Value: strconv.FormatUint(l.d, 10)}))
		case modeSet:
			ph := u.name(l.name)
			u.set = append(u.set, ph+" = "+u.value(&types.AttributeValueMemberN{Value: l.set}))
			u.cond = append(u.cond, ph+" = "+u.value(&types.AttributeValueMemberN{Value: l.old}))
		case modeRemove:
			u.removeAttr(l.name)
		default:
			continue
		}
		write = true
	}
	return write, nil // nothing left: every counter is gone
}

func (p *packedSub) written(context.Context, map[string]types.AttributeValue) error { return nil }

func (p *packedSub) lost(old map[string]types.AttributeValue) (bool, error) {
	retry := false
	for i := range p.ls {
		l := &p.ls[i]
		if l.mode == modeSkip || l.mode == modeRemove {
			retry = retry || l.mode == modeRemove
			continue
		}
		av, ok := old[l.name]
		if !ok {
			l.mode = modeSkip // gone: nothing counted there any more
			continue
		}
		v, err := packedNumber(p.a.pk, l.name, av)
		if err != nil {
			return false, err
		}
		if v.Cmp(new(big.Int).SetUint64(l.d)) >= 0 {
			l.mode = modeAdd
			retry = true
			continue
		}
		// It holds less than the refund (it was removed and created
		// again): take each field down, at most to 0.
		u := new(big.Int).Mod(v, two64).Uint64()
		c := clampFields(u, l.d)
		if c == u {
			l.mode = modeSkip
			continue
		}
		l.mode, l.old, l.set = modeSet, v.String(), strconv.FormatUint(c, 10)
		retry = true
	}
	return retry, nil
}

func (p *packedSub) result() storage.StepResult { return storage.StepResult{} }

// clampFields subtracts each 16-bit field of d from the same field of v,
// at most down to 0.
func clampFields(v, d uint64) uint64 {
	var out uint64
	for j := range 64 / storage.PackedFieldBits {
		f, x := storage.FieldOf(v, j), storage.FieldOf(d, j)
		out |= (f - min(f, x)) << (storage.PackedFieldBits * j)
	}
	return out
}

// validPacked checks the shape of a packed op (storage.PackedOp.Check).
func validPacked(op *storage.PackedOp) error {
	if err := op.Check(); err != nil {
		return fmt.Errorf("dynamo: %w", err)
	}
	return nil
}
