package memcached

import (
	"context"
	"fmt"
	"strconv"

	"github.com/sluicehq/sluice/limiter/storage"
)

var _ storage.PackedCounter = (*Store)(nil)

// AddPacked implements [storage.PackedCounter]. On one connection to the
// key's node it sends, pipelined in one write, for each level l whose
// delta is not zero:
//
//	add <key|pl:idx> 0 <exp> 1 / 0    creates the counter at 0 if missing
//	incr <key|pl:idx> <delta>         adds the packed delta; the reply is Added[l-1]
//
// (the add left out for a counter this Store created and whose TTL has not
// run out since: knownCache; if it vanished anyway, its incr answers
// NOT_FOUND and it goes again with its add)
//
// then one get of op.Reads (each counter once; a read of the counter the
// last incr went to takes that incr's reply instead, except through a
// proxy), and reads the replies: one round trip. memcached's incr is atomic on the 64-bit
// unsigned value and wraps modulo 2^64, as the contract wants (a field
// that overflows carries into the next, which the limiter detects). The
// add gives the counter the delta's TTL (rounded up to whole seconds, plus
// one, plus jitter, as Add does); incr does not extend it. It never
// answers Stale: counters are forgotten by age. With Config.Proxy the get
// is sent after the incrs' replies (two round trips). On error the adds
// may or may not have happened.
func (s *Store) AddPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) (storage.PackedCounts, error) {
	if err := ctx.Err(); err != nil {
		return storage.PackedCounts{}, errorf("packed add", err)
	}
	var p packedAdd
	if err := p.init(s, k, op); err != nil {
		return storage.PackedCounts{}, err
	}
	p.proxy = s.proxy
	if err := s.finishPacked(ctx, &p); err != nil {
		return storage.PackedCounts{}, err
	}
	return p.res, nil
}

// SubPacked implements [storage.PackedCounter]: incr <key|pl:idx>
// <2^64-delta> for each level whose delta is not zero, pipelined, and
// their replies read (one round trip). memcached's incr wraps modulo 2^64,
// so this subtracts the delta modulo 2^64: exact whenever the add being
// refunded is in the counter, also when adds in flight carried out of its
// top field and wrapped it below the delta (a decr would stop at 0 there
// and lose every unit the counter held: over-admission). A counter that is
// gone (expired, evicted) has nothing to give back and is not created. One
// created again after an eviction does not hold the add: the subtraction
// then borrows into its top field, which reads as a full window until the
// counter expires (stricter, never laxer). [Store.Do] sends the same incrs
// with noreply.
func (s *Store) SubPacked(ctx context.Context, k storage.Key, op *storage.PackedOp) error {
	if err := ctx.Err(); err != nil {
		return errorf("packed sub", err)
	}
	if err := checkPackedAdds(op); err != nil {
		return err
	}
	if packedLevels(op) == 0 {
		return nil
	}
	base := s.keys.packedBase(k)
	addr, err := s.ring.pickTag(base)
	if err != nil {
		return errorf("packed sub", err)
	}
	err = s.pool.exec(ctx, addr, func(pc *pconn) error {
		var num [24]byte
		writePackedSub(pc, base, op, false, &num)
		if err := pc.w.Flush(); err != nil {
			return err
		}
		for l := range storage.PackedLevels {
			if op.Adds[l].Delta == 0 {
				continue
			}
			line, err := pc.r.ReadSlice('\n')
			if err != nil {
				return err
			}
			if string(line) == "NOT_FOUND\r\n" {
				continue
			}
			if _, ok := parseUintLine(line); !ok {
				return replyError("incr", line)
			}
		}
		return nil
	})
	if err != nil {
		return errorf("packed sub", err)
	}
	return nil
}

// finishPacked sends the rest of a batch's packed step whose counter
// vanished: the levels still pending, and the get.
func (s *Store) finishPacked(ctx context.Context, p *packedAdd) error {
	addr, err := s.ring.pickTag(p.base)
	if err == nil {
		err = s.pool.exec(ctx, addr, p.run)
	}
	if err != nil {
		return errorf("packed add", err)
	}
	return nil
}

// checkPackedAdds checks the cells of op's non-zero deltas: level l's at
// level l.
func checkPackedAdds(op *storage.PackedOp) error {
	for l := range storage.PackedLevels {
		if d := &op.Adds[l]; d.Delta != 0 && int(d.Cell.Level) != l+1 {
			return fmt.Errorf("memcached: bad packed op: delta %d names a level-%d counter", l+1, d.Cell.Level)
		}
	}
	return nil
}

// packedLevels returns the levels of op with a non-zero delta, as a bit
// set (bit l-1 for level l).
func packedLevels(op *storage.PackedOp) uint8 {
	var m uint8
	for l := range storage.PackedLevels {
		if op.Adds[l].Delta != 0 {
			m |= 1 << l
		}
	}
	return m
}

// writePackedSub buffers a refund's incrs of 2^64-delta (with noreply
// when asked).
func writePackedSub(pc *pconn, base string, op *storage.PackedOp, noreply bool, num *[24]byte) {
	for l := range storage.PackedLevels {
		d := &op.Adds[l]
		if d.Delta == 0 {
			continue
		}
		// incr of 2^64-delta: a subtraction modulo 2^64, exact when
		// the counter has wrapped below the delta (see SubPacked).
		pc.w.WriteString("incr ")
		writePackedKey(pc, base, d.Cell, num)
		pc.w.WriteByte(' ')
		pc.w.Write(strconv.AppendUint(num[:0], -d.Delta, 10))
		if noreply {
			pc.w.WriteString(" noreply")
		}
		pc.w.WriteString("\r\n")
	}
}

// writePackedKey buffers the key of a packed window's counter c of base
// (see appendPackedKey).
func writePackedKey(pc *pconn, base string, c storage.PackedCell, num *[24]byte) {
	pc.w.WriteString(base)
	pc.w.WriteString("|p")
	pc.w.WriteByte('0' + c.Level)
	pc.w.WriteByte(':')
	pc.w.Write(strconv.AppendInt(num[:0], c.Index, 10))
}

// packedAdd is one AddPacked's request on its way. It survives a round in
// which a counter vanished between its add and its incr (evicted,
// flush_all): the next round sends only the levels still pending, so no
// level is added twice.
type packedAdd struct {
	base  string
	op    *storage.PackedOp
	exp   [storage.PackedLevels]int32
	proxy bool
	// pending holds the levels whose add and incr are still to be sent
	// (bit l-1 for level l).
	pending uint8
	// noAdd holds the pending levels whose counter the Store knows to
	// exist (knownCache): their round sends the incr alone. One that
	// answers NOT_FOUND (evicted early, flushed) leaves noAdd and goes
	// with its add in the next round.
	noAdd uint8
	// The known-counter cache's key, the levels' counters (known or
	// created), the levels to record or forget, and the knownNow before
	// the round was written (a counter its add creates lives its TTL
	// from then on at least).
	keys      keyer
	key       storage.Key
	known     [storage.PackedLevels]knownCounter
	set, drop uint8
	sentAt    int64
	// last is the level of the last incr of the round (0: none): a read
	// of its counter takes that incr's reply, which every add of the op
	// precedes.
	last int
	res  storage.PackedCounts
	num  [24]byte // formatting
}

// init checks op and prepares the request for k.
func (p *packedAdd) init(s *Store, k storage.Key, op *storage.PackedOp) error {
	base, known := s.keys.packedKnown(k)
	p.base = base
	if op.NReads < 0 || op.NReads > storage.MaxPackedReads {
		return fmt.Errorf("memcached: bad packed op: %d reads", op.NReads)
	}
	for i := range op.NReads {
		if l := op.Reads[i].Level; l < 1 || l > storage.PackedLevels {
			return fmt.Errorf("memcached: bad packed op: read of level %d", l)
		}
	}
	if err := checkPackedAdds(op); err != nil {
		return err
	}
	*p = packedAdd{base: base, op: op, pending: packedLevels(op), keys: s.keys, key: k, known: known}
	now := knownNow()
	wall := s.now() // one clock read for every level's expiry
	for l := range storage.PackedLevels {
		if op.Adds[l].Delta != 0 {
			p.exp[l] = expiration(wall, op.Adds[l].TTL, s.jitter)
			if known[l].has(op.Adds[l].Cell, now) {
				p.noAdd |= 1 << l
			}
		}
	}
	return nil
}

// run sends the request on pc. Without Config.Proxy each round is one
// write, the pending levels' adds and incrs and the get, and one read of
// the replies; a round in which a counter vanished (its get reply is then
// dropped) is followed by one of the levels still pending, at most three
// in all (four when the first sends incrs alone: see rounds). With Config.Proxy the get goes out only after the incrs'
// replies.
func (p *packedAdd) run(pc *pconn) error {
	if p.proxy {
		for range p.rounds() {
			if p.pending == 0 {
				break
			}
			p.writeIncrs(pc)
			if err := pc.w.Flush(); err != nil {
				return err
			}
			if err := p.readIncrs(pc); err != nil {
				return err
			}
		}
		if p.pending != 0 {
			return p.vanished()
		}
		if p.writeGet(pc) {
			if err := pc.w.Flush(); err != nil {
				return err
			}
			return p.readGet(pc)
		}
		p.fillLast()
		return nil
	}
	for range p.rounds() {
		get := p.send(pc)
		if err := pc.w.Flush(); err != nil {
			return err
		}
		done, err := p.recv(pc, get)
		if err != nil || done {
			return err
		}
	}
	return p.vanished()
}

// rounds is how many rounds run sends at most: three, and one more when
// a round sends incrs without their adds (a counter known to exist may
// have been evicted early: its first NOT_FOUND is not a race).
func (p *packedAdd) rounds() int {
	if p.noAdd&p.pending != 0 {
		return 4
	}
	return 3
}

func (p *packedAdd) vanished() error {
	return fmt.Errorf("%w: a packed counter of %s kept vanishing between add and incr", storage.ErrConflict, p.base)
}

// send buffers one round without flushing: the pending levels' adds and
// incrs, then the get. It reports whether a get was written.
func (p *packedAdd) send(pc *pconn) bool {
	p.writeIncrs(pc)
	return p.writeGet(pc)
}

// recv reads the replies to what send wrote (get: whether it wrote a get)
// and reports whether the request is done (no level pending).
func (p *packedAdd) recv(pc *pconn, get bool) (bool, error) {
	if err := p.readIncrs(pc); err != nil {
		return false, err
	}
	if get {
		if err := p.readGet(pc); err != nil {
			return false, err
		}
	}
	if p.pending != 0 {
		return false, nil
	}
	if !get {
		p.fillLast()
	}
	return true, nil
}

// writeIncrs buffers the pending levels' adds and incrs.
func (p *packedAdd) writeIncrs(pc *pconn) {
	p.last = 0
	if p.pending&^p.noAdd != 0 {
		p.sentAt = knownNow()
	}
	for l := range storage.PackedLevels {
		if p.pending&(1<<l) == 0 {
			continue
		}
		d := &p.op.Adds[l]
		if p.noAdd&(1<<l) == 0 {
			pc.w.WriteString("add ")
			writePackedKey(pc, p.base, d.Cell, &p.num)
			pc.w.WriteString(" 0 ")
			pc.w.Write(strconv.AppendInt(p.num[:0], int64(p.exp[l]), 10))
			pc.w.WriteString(" 1\r\n0\r\n")
		}
		pc.w.WriteString("incr ")
		writePackedKey(pc, p.base, d.Cell, &p.num)
		pc.w.WriteByte(' ')
		pc.w.Write(strconv.AppendUint(p.num[:0], d.Delta, 10))
		pc.w.WriteString("\r\n")
		p.last = l + 1
	}
	if p.proxy {
		// Through a proxy the incrs run on their shards in any order, so
		// no incr's reply is known to follow every other writer's incrs
		// that preceded this request's: every read goes in the get.
		p.last = 0
	}
}

// readIncrs reads the replies to writeIncrs: a level whose counter
// vanished stays pending (and is sent with its add next). It records in
// the known-counter cache the counters the round's adds created, and
// forgets those that vanished.
func (p *packedAdd) readIncrs(pc *pconn) error {
	sent := p.pending
	p.set, p.drop = 0, 0
	for l := range storage.PackedLevels {
		if sent&(1<<l) == 0 {
			continue
		}
		created := false
		if p.noAdd&(1<<l) == 0 {
			line, err := pc.r.ReadSlice('\n')
			if err != nil {
				return err
			}
			created = string(line) == "STORED\r\n"
			if !created && string(line) != "NOT_STORED\r\n" {
				return replyError("add", line)
			}
		}
		line, err := pc.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if string(line) == "NOT_FOUND\r\n" {
			// vanished: sent again, with its add, in the next round
			p.noAdd &^= 1 << l
			p.drop |= 1 << l
			continue
		}
		v, ok := parseUintLine(line)
		if !ok {
			return replyError("incr", line)
		}
		p.res.Added[l] = v
		p.pending &^= 1 << l
		if d := &p.op.Adds[l]; created && d.TTL > 0 {
			p.known[l] = knownCounter{idx: d.Cell.Index, until: p.sentAt + int64(d.TTL)}
			p.set |= 1 << l
		}
	}
	if p.set|p.drop != 0 {
		for l := range storage.PackedLevels {
			if p.drop&(1<<l) != 0 {
				p.known[l].idx = p.op.Adds[l].Cell.Index
			}
		}
		p.keys.record(p.key, p.base, p.set, p.drop, &p.known)
	}
	if p.last != 0 && p.pending&(1<<(p.last-1)) != 0 {
		p.last = 0 // the last incr vanished: its counter is read in the next round
	}
	return nil
}

// lastCell reports the counter of the round's last incr, if it answered.
func (p *packedAdd) lastCell() (storage.PackedCell, bool) {
	if p.last == 0 || p.pending != 0 {
		return storage.PackedCell{}, false
	}
	return p.op.Adds[p.last-1].Cell, true
}

// writeGet buffers the get of the reads (sentRead) and reports whether
// there was anything to read. If the last incr's counter vanished after
// all, the round is sent again.
func (p *packedAdd) writeGet(pc *pconn) bool {
	n := 0
	for j := range p.op.NReads {
		if !p.sentRead(j) {
			continue
		}
		if n == 0 {
			pc.w.WriteString("get")
		}
		pc.w.WriteByte(' ')
		writePackedKey(pc, p.base, p.op.Reads[j], &p.num)
		n++
	}
	if n > 0 {
		pc.w.WriteString("\r\n")
	}
	return n > 0
}

// sentRead reports whether the get names op.Reads[j]: each counter once,
// and not the last incr's, whose reply gives its value after every add of
// the op.
func (p *packedAdd) sentRead(j int) bool {
	c := p.op.Reads[j]
	if p.last != 0 && c == p.op.Adds[p.last-1].Cell {
		return false
	}
	return !dupRead(p.op, j)
}

// dupRead reports whether op.Reads[i] repeats an earlier read.
func dupRead(op *storage.PackedOp, i int) bool {
	for j := range i {
		if op.Reads[j] == op.Reads[i] {
			return true
		}
	}
	return false
}

// fillLast copies the last incr's reply into the reads of its counter.
func (p *packedAdd) fillLast() {
	c, ok := p.lastCell()
	if !ok {
		return
	}
	for i := range p.op.NReads {
		if p.op.Reads[i] == c {
			p.res.Read[i] = p.res.Added[p.last-1]
		}
	}
}

// readGet reads the get's reply into res.Read (a counter missing from it
// reads 0), then fills the last incr's reads.
func (p *packedAdd) readGet(pc *pconn) error {
	p.startReads()
	for {
		line, err := pc.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if string(line) == "END\r\n" {
			return nil
		}
		if err := p.value(pc, line); err != nil {
			return err
		}
	}
}

// startReads readies res.Read for the get's reply: every read 0 but the
// last incr's counter, which takes that incr's reply.
func (p *packedAdd) startReads() {
	p.res.Read = [storage.MaxPackedReads]uint64{}
	p.fillLast()
}

// value reads the item whose VALUE line is line (a counter the op reads)
// into res.Read.
func (p *packedAdd) value(pc *pconn, line []byte) error {
	key, size, ok := parseValueLine(line)
	if !ok || size > maxCountLen {
		return replyError("get", line)
	}
	c, ok := parsePackedSuffix(key, p.base)
	matched := false
	for i := range p.op.NReads {
		if ok && p.op.Reads[i] == c {
			matched = true
		}
	}
	if !matched {
		return replyError("get", line) // not a counter we asked for
	}
	// line aliases the reader's buffer: done with it. The value
	// (at most maxCountLen bytes) fits in the reader's buffer.
	data, err := pc.r.Peek(size + 2)
	if err != nil {
		return err
	}
	if string(data[size:size+2]) != "\r\n" {
		return fmt.Errorf("%w: get value not terminated by CRLF", errProtocol)
	}
	v, err := parseUcount(data[:size])
	pc.r.Discard(size + 2) //nolint:errcheck // peeked: cannot fail
	if err != nil {
		return fmt.Errorf("packed counter %d:%d: %w", c.Level, c.Index, err)
	}
	for i := range p.op.NReads {
		if p.op.Reads[i] == c {
			p.res.Read[i] = v
		}
	}
	return nil
}

// addReads adds the counters writeGet would read to m, as step i's, and
// reports whether there were any.
func (p *packedAdd) addReads(m *mget, i int) bool {
	n := 0
	for j := range p.op.NReads {
		if !p.sentRead(j) {
			continue
		}
		m.keys = append(m.keys, ' ')
		m.keys = appendPackedKey(m.keys, p.base, p.op.Reads[j])
		m.mark(i)
		n++
	}
	return n > 0
}

// parsePackedSuffix parses the cell of a packed counter's key of base.
func parsePackedSuffix(key []byte, base string) (storage.PackedCell, bool) {
	if len(key) < len(base)+5 || string(key[:len(base)]) != base {
		return storage.PackedCell{}, false
	}
	s := key[len(base):]
	if s[0] != tagSep || s[1] != 'p' || s[2] < '1' || s[2] > '0'+storage.PackedLevels || s[3] != ':' {
		return storage.PackedCell{}, false
	}
	idx, err := strconv.ParseInt(string(s[4:]), 10, 64)
	if err != nil {
		return storage.PackedCell{}, false
	}
	return storage.PackedCell{Level: s[2] - '0', Index: idx}, true
}

// parseUintLine parses an incr or decr reply: a decimal 64-bit unsigned
// number and CRLF.
func parseUintLine(line []byte) (uint64, bool) {
	digits, ok := cutCRLF(line)
	if !ok || len(digits) == 0 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(digits), 10, 64)
	return v, err == nil
}

func cutCRLF(line []byte) ([]byte, bool) {
	if n := len(line); n >= 2 && line[n-2] == '\r' && line[n-1] == '\n' {
		return line[:n-2], true
	}
	return nil, false
}

// parseUcount parses a packed counter's value: all 64 bits (memcached may
// leave trailing spaces after a decr).
func parseUcount(b []byte) (uint64, error) {
	for len(b) > 0 && b[len(b)-1] == ' ' {
		b = b[:len(b)-1]
	}
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: counter value %.40q is not a number", storage.ErrCorruptState, b)
	}
	return v, nil
}
