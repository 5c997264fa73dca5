package dynamo

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/limiter/storage"
)

const logKind = "sliding log"

// logState is a sliding log as last seen: its entries and version.
type logState struct {
	entries []int64 // never modified once cached
	version int64
}

// UpdateLog implements [storage.LogStore]: the log is one Binary attribute
// (storage.AppendLog) written with a condition on a version number.
func (s *Store) UpdateLog(ctx context.Context, k storage.Key, op storage.LogOp, ttl time.Duration) (storage.Decision, error) {
	if err := validLog(op); err != nil {
		return storage.Decision{}, err
	}
	a, err := s.attrsOf(k)
	if err != nil {
		return storage.Decision{}, err
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	if err := s.waitRefunds(ctx, a.pk); err != nil {
		return storage.Decision{}, err
	}
	p := s.newLogPart(a, op, ttl)
	if err := s.writeOne(ctx, a.pk, p); err != nil {
		// The write may or may not have happened: what is remembered may
		// be stale, which the next write's condition catches.
		return storage.Decision{}, err
	}
	return p.d, nil
}

func validLog(op storage.LogOp) error {
	if op.Limit <= 0 || op.Window <= 0 || op.N < 0 {
		return fmt.Errorf("dynamo: bad log op (limit %d, window %v, n %d)", op.Limit, op.Window, op.N)
	}
	return nil
}

// logPart is a sliding log's op as a part of a write (UpdateLog).
type logPart struct {
	s                 *Store
	a                 attrs
	op                storage.LogOp
	ttl               time.Duration
	shadow            bool
	cur, stored       logState
	found, fromServer bool
	d                 storage.Decision
	final             bool // decided without a write
	notApplied        bool
	buf               []int64
}

func (s *Store) newLogPart(a attrs, op storage.LogOp, ttl time.Duration) *logPart {
	p := &logPart{s: s, a: a, op: op, ttl: ttl}
	if v, ok := s.cache.get(a.cacheKey()); ok {
		p.cur, p.found = v.(logState), true
	}
	p.buf = make([]int64, 0, len(p.cur.entries)+int(min(op.N, storage.MaxLogLimit)))
	return p
}

func (p *logPart) next(ctx context.Context, u *update) (bool, error) {
	next, d, write := p.op.Apply(append(p.buf[:0], p.cur.entries...))
	if !write && !p.fromServer {
		// Confirm a decision made on a remembered log with a read.
		st, ok, err := p.s.readLog(ctx, p.a)
		if err != nil {
			return false, err
		}
		p.cur, p.found, p.fromServer = st, ok, true
		next, d, write = p.op.Apply(append(p.buf[:0], p.cur.entries...))
	}
	p.d, p.final = d, !write
	if !write {
		return false, nil
	}
	p.stored = logState{entries: append([]int64(nil), next...), version: p.cur.version + 1}
	return true, p.s.logClauses(u, p.a, p.cur, p.found, p.stored, p.ttl)
}

func (p *logPart) denied() bool {
	return p.final && !p.op.Refund() && p.op.N > 0 && !p.d.Allowed && !p.shadow
}

func (p *logPart) written(context.Context, map[string]types.AttributeValue) error {
	p.s.cache.put(p.a.cacheKey(), p.stored)
	return nil
}

func (p *logPart) lost(old map[string]types.AttributeValue) (bool, error) {
	var err error
	p.cur, p.found, err = p.s.logFromItem(p.a, old)
	p.fromServer = true
	return err == nil, err
}

func (p *logPart) skip() bool {
	if p.op.Refund() || p.op.N == 0 || p.shadow {
		return false
	}
	p.notApplied = true
	return true
}

func (p *logPart) result() storage.StepResult {
	if p.notApplied {
		return storage.StepResult{NotApplied: true}
	}
	return storage.StepResult{Decision: p.d}
}

// logClauses adds the conditional write that replaces the log cur (absent
// when !found) by next to u, or returns an error wrapping ErrItemTooLarge
// when the log's own attributes would pass ItemBudget.
func (s *Store) logClauses(u *update, a attrs, cur logState, found bool, next logState, ttl time.Duration) error {
	enc := storage.AppendLog(nil, next.entries)
	size := len(AttrPK) + len(a.pk) + len(a.pre+attrLog) + len(enc) + len(a.pre+attrVersion) + numberSize(next.version) +
		len(AttrTTL) + 6
	if size > ItemBudget {
		return fmt.Errorf("dynamo: sliding log %q: %w: %d entries take %d bytes; lower the limit (a log item holds roughly 300 entries a few ms apart) or use a sliding window",
			a.pk, ErrItemTooLarge, len(next.entries), size)
	}
	l, v := u.name(a.pre+attrLog), u.name(a.pre+attrVersion)
	u.set = append(u.set, l+" = "+u.value(&types.AttributeValueMemberB{Value: enc}), v+" = "+u.num(next.version))
	u.keepTTL(ttl)
	if found {
		// The version alone would let an item rewritten outside this
		// protocol with the same version be overwritten: require the exact
		// log seen too (no extra capacity, a few hundred bytes of request).
		u.cond = append(u.cond, v+" = "+u.num(cur.version)+" AND "+l+" = "+u.value(&types.AttributeValueMemberB{Value: storage.AppendLog(nil, cur.entries)}))
	} else {
		u.cond = append(u.cond, "attribute_not_exists("+v+") AND attribute_not_exists("+l+")")
	}
	return nil
}

func (s *Store) readLog(ctx context.Context, a attrs) (logState, bool, error) {
	s.counter.reads.Add(1)
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      s.table,
		Key:            keyAttr(a.pk),
		ConsistentRead: aws.Bool(true),
	}, s.optFns...)
	if err != nil {
		return logState{}, false, mapError("sliding log read", err)
	}
	return s.logFromItem(a, out.Item)
}

func (s *Store) logFromItem(a attrs, item map[string]types.AttributeValue) (logState, bool, error) {
	_, hasLog := item[a.pre+attrLog]
	_, hasVersion := item[a.pre+attrVersion]
	if !hasLog && !hasVersion {
		s.cache.remove(a.cacheKey())
		return logState{}, false, nil
	}
	st, err := decodeLog(a, item)
	if err != nil {
		s.cache.remove(a.cacheKey())
		return st, false, err
	}
	s.cache.put(a.cacheKey(), st)
	return st, true, nil
}

func decodeLog(a attrs, item map[string]types.AttributeValue) (logState, error) {
	pk := a.pk
	version, err := getInt(logKind, pk, item, a.pre+attrVersion)
	if err != nil {
		return logState{}, err
	}
	av, ok := item[a.pre+attrLog]
	if !ok {
		return logState{}, corrupt(logKind, pk, a.pre+attrLog, "missing")
	}
	b, ok := av.(*types.AttributeValueMemberB)
	if !ok {
		return logState{}, corrupt(logKind, pk, a.pre+attrLog, "want a Binary, got %s", typeName(av))
	}
	entries, err := storage.ParseLog(b.Value, nil)
	if err != nil {
		return logState{}, fmt.Errorf("dynamo: sliding log item %q (version %s): %w", pk, strconv.FormatInt(version, 10), err)
	}
	return logState{entries: entries, version: version}, nil
}
