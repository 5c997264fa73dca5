package testserver

import (
	"context"
	"time"
)

// What the registry knows of one item, and how its writes go through.
//
// DynamoDB serves an item's writes as they come (one at a time inside, but
// without holding the next for a client's round trip), so the proxy
// forwards single-item writes (PutItem, DeleteItem, UpdateItem returning
// ALL_NEW) at once, however many of one item are in flight. Their bill
// needs the item's size before each write, which a write in flight with
// others does not know: the server applied them in an order the proxy does
// not see. It knows a write's after (its own answer: ALL_NEW, the item put,
// nothing deleted, the item a failed condition returns), and real time
// bounds the order: a write whose answer came back before another was sent
// was applied first. So the before of a write W is the after of either a
// write that overlapped W in flight or a write that ended before W was sent
// and is not followed by another write that also did (the item's cands when
// W was sent). A PutItem or DeleteItem has its before from the server
// (ALL_OLD), a failed condition its item; an UpdateItem is billed on the
// largest candidate (never less than DynamoDB), and the units it may be
// billed above the least candidate are counted (CapStats.UncertainUnits: 0
// means every bill was exact). With no other write of the item in flight
// there is one candidate: exact, as before.
//
// Writes that need the item alone take it exclusively, waiting for the
// writes in flight to end and holding new ones back: an UpdateItem whose
// before is unknown (probed first) or whose after is probed (ReturnValues
// other than NONE or ALL_NEW), and every TransactWriteItems and
// BatchWriteItem item (their befores are probed when ambiguous). Those
// waits are CapStats.ItemWaits; a wait ends when the client's context does.
type itemState struct {
	shared      int           // writes in flight that may overlap
	excl        bool          // a write holds the item alone
	exclWaiting int           // exclusive writes waiting: no new shared write starts
	waiting     int           // writes waiting, exclusive or not
	wake        chan struct{} // closed (and replaced) when the above change

	seq    int64     // the item's events: a write sent or ended
	last   int64     // the latest seq at which an ended write was sent
	cands  []cand    // the sizes the item may have: afters of writes that ended after last
	flight []*flight // writes in flight
}

// cand is a possible size of an item (-1: unknown), the after of a write
// that ended at seq end.
type cand struct{ end, size int64 }

// flight is one write of an item, from when it is sent to its end.
type flight struct {
	excl  bool
	start int64
	pred  []int64   // the item's cands when it was sent
	links []*flight // writes of the item in flight at the same time
	done  bool
	state bool  // it left a state: its after is a size the item had (-1: unknown)
	after int64 //

	// For an UpdateItem whose before is one of the candidates: its bill,
	// corrected as linked writes end.
	bill *overlapBill
}

// overlapBill is the bill of an UpdateItem that overlapped other writes of
// its item: writeUnits(max(after, before)) for the largest and the least
// candidate before.
type overlapBill struct {
	p            *CapProxy
	op           string
	ch           charge // units: what it is billed now
	least        float64
	after        int64
	lo, hi       int64 // candidate befores seen so far
	unknown      bool  // a candidate's size is unknown
	uncertainCnt bool  // counted in UncertainWrites
}

// newItemState is an item no write has passed: absent (size 0) in a table
// this process created, unknown otherwise.
func newItemState(known bool) *itemState {
	size := int64(-1)
	if known {
		size = 0
	}
	return &itemState{wake: make(chan struct{}), cands: []cand{{0, size}}}
}

func (s *itemState) broadcast() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// begin waits until the item can take a write (alone if excl), registers
// it in flight and returns it, with how long it waited (0: it did not). It
// gives up when ctx ends.
func (t *tableInfo) begin(ctx context.Context, id string, excl bool) (*flight, time.Duration, error) {
	s := t.state(id)
	var start time.Time
	queued := false
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		if excl && !s.excl && s.shared == 0 || !excl && !s.excl && s.exclWaiting == 0 {
			break
		}
		if start.IsZero() {
			start = time.Now()
		}
		if excl && !queued {
			queued = true
			s.exclWaiting++
		}
		wake := s.wake
		s.waiting++
		t.mu.Unlock()
		select {
		case <-wake:
			t.mu.Lock()
			s.waiting--
		case <-ctx.Done():
			t.mu.Lock()
			s.waiting--
			if queued {
				s.exclWaiting--
				s.broadcast()
			}
			return nil, 0, ctx.Err()
		}
	}
	if queued {
		s.exclWaiting--
	}
	if excl {
		s.excl = true
	} else {
		s.shared++
	}
	s.seq++
	f := &flight{excl: excl, start: s.seq}
	for _, c := range s.cands {
		f.pred = append(f.pred, c.size)
	}
	for _, o := range s.flight {
		o.links = append(o.links, f)
		f.links = append(f.links, o)
	}
	s.flight = append(s.flight, f)
	var waited time.Duration
	if !start.IsZero() {
		waited = max(time.Since(start), time.Nanosecond)
	}
	return f, waited, nil
}

// end ends a write in flight: state says it left the item at size after
// (-1: unknown, a write that may or may not have been applied); without
// state (throttled, refused, never sent) the item is as if it never was.
// bill, for a successful UpdateItem whose before is a candidate, is filled
// in, its units returned (and corrected as its linked writes end). It
// returns the corrections of bills this end makes (the write's own
// uncertainty among them); apply them with applyCorrections once t.mu is
// released.
func (t *tableInfo) end(id string, f *flight, state bool, after int64, bill *overlapBill) (e ended) {
	s := t.state(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if f.excl {
		s.excl = false
	} else {
		s.shared--
	}
	s.broadcast()
	for i, o := range s.flight {
		if o == f {
			s.flight = append(s.flight[:i], s.flight[i+1:]...)
			break
		}
	}
	f.done, f.state, f.after = true, state, after
	if state {
		s.seq++
		s.last = max(s.last, f.start)
		keep := s.cands[:0]
		for _, c := range s.cands {
			if c.end > s.last {
				keep = append(keep, c)
			}
		}
		s.cands = append(keep, cand{s.seq, after})
	}
	if bill != nil {
		f.bill = bill
		bill.lo, bill.hi = -2, -2
		for _, sz := range f.pred {
			bill.see(sz)
		}
		for _, o := range f.links {
			if o.done && o.state && !brokenPredOnly {
				bill.see(o.after)
			}
		}
		bill.ch.units, bill.least = bill.units()
		e.units = bill.ch.units
		c := correction{b: bill, table: bill.ch.table, partition: bill.ch.partition, uncertain: bill.ch.units - bill.least}
		if c.uncertain > 0 || bill.unknown {
			bill.uncertainCnt, c.newUncertain = true, true
			e.cs = append(e.cs, c)
		}
	}
	if state && !brokenPredOnly {
		for _, o := range f.links {
			if o.done && o.bill != nil {
				if c, ok := o.bill.correct(after); ok {
					e.cs = append(e.cs, c)
				}
			}
		}
	}
	e.overlapped = len(f.links) > 0
	return e
}

// ended is what the end of a write tells its proxy: its units (when
// billed on candidates), whether it overlapped another write of its item,
// and the corrections of bills it makes.
type ended struct {
	units      float64
	overlapped bool
	cs         []correction
}

// ended counts a write's end (ItemWaits' neighbours: Overlaps, Uncertain*)
// and applies the corrections it made, each to its write's proxy.
func (p *CapProxy) ended(e ended) {
	if e.overlapped {
		p.mu.Lock()
		p.overlaps++
		p.mu.Unlock()
	}
	applyCorrections(e.cs)
}

// withdraw ends a write that was never sent (or that the server refused):
// it left no state.
func (t *tableInfo) withdraw(id string, f *flight) { t.end(id, f, false, 0, nil) }

// see adds a candidate before.
func (b *overlapBill) see(size int64) {
	if size < 0 {
		b.unknown = true
		return
	}
	if b.lo == -2 || size < b.lo {
		b.lo = size
	}
	if size > b.hi {
		b.hi = size
	}
}

// units is the bill on the largest candidate before, and on the least.
func (b *overlapBill) units() (hi, lo float64) {
	return writeUnits(max(b.after, b.hi)), writeUnits(max(b.after, b.lo))
}

// correction is a change of a write's bill after it was settled: delta
// units more, of which uncertain more above its least candidate.
type correction struct {
	b                *overlapBill // only b.p is read outside t.mu
	table, partition string
	delta, uncertain float64
	newUncertain     bool // the write is newly uncertain
}

// correct takes the after of a linked write that ended after b's: another
// candidate before.
func (b *overlapBill) correct(size int64) (correction, bool) {
	hi0, lo0 := b.ch.units, b.least
	b.see(size)
	hi, lo := b.units()
	b.ch.units, b.least = hi, lo
	c := correction{b: b, table: b.ch.table, partition: b.ch.partition, delta: hi - hi0, uncertain: (hi - lo) - (hi0 - lo0)}
	if (hi > lo || b.unknown) && !b.uncertainCnt {
		b.uncertainCnt, c.newUncertain = true, true
	}
	return c, c.delta != 0 || c.uncertain != 0 || c.newUncertain
}

// applyCorrections charges the corrections to the writes' proxies.
func applyCorrections(cs []correction) {
	for _, c := range cs {
		p := c.b.p
		p.mu.Lock()
		now := time.Now()
		if c.partition != "" {
			p.bucketLocked(true, c.table, c.partition, now).tokens -= c.delta
		}
		p.bucketLocked(true, c.table, "", now).tokens -= c.delta
		p.addWriteUnitsLocked(c.table, c.partition, c.delta)
		p.uncertainUnits += c.uncertain
		if c.newUncertain {
			p.uncertainWrites++
		}
		p.mu.Unlock()
	}
}

// size returns an item's size (the largest it may have), and whether it
// is known.
func (t *tableInfo) size(id string) (int64, bool) {
	s := t.state(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	var size int64
	for _, c := range s.cands {
		if c.size < 0 {
			return 0, false
		}
		size = max(size, c.size)
	}
	return size, true
}

// exact returns an item's size if the registry knows it exactly (one
// candidate).
func (t *tableInfo) exact(id string) (int64, bool) {
	s := t.state(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(s.cands) != 1 || s.cands[0].size < 0 {
		return 0, false
	}
	return s.cands[0].size, true
}

// addWriteUnitsLocked adds units to the write units counted on a table and
// its partition key (a correction: no request is counted).
func (p *CapProxy) addWriteUnitsLocked(table, partition string, units float64) {
	if c := p.tables[table]; c != nil {
		c.WriteUnits += units
	}
	if c := p.keys[table+"\x00"+partition]; c != nil {
		c.WriteUnits += units
	}
}

// brokenSerial makes every write hold its item alone, as the proxy did
// before (a test's broken variant).
var brokenSerial bool

// brokenPredOnly bills an overlapping UpdateItem on the item's sizes when
// it was sent, not the afters of the writes it overlapped (a test's broken
// variant).
var brokenPredOnly bool

// waiters returns how many writes wait for an item (for tests).
func (t *tableInfo) waiters(id string) int {
	s := t.state(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.waiting
}
