package memcached

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// Add implements [storage.Counter]. On one connection to the key's node it
// sends, pipelined in one write:
//
//	add <key|c cur> 0 <exp> 1 / 0    creates the counter at 0 if missing
//	incr <key|c cur> n               adds n; the reply is the new count
//	get <key|c cur+1> ... <key|c cur+span-1> <key|c cur-1> ... <key|c cur-span+1>
//
// and reads the three replies: one round trip. The newer sub-windows' total
// is Counts.Later. With n == 0 only the get is sent (and includes cur).
// With Config.Proxy the get is sent after the incr's reply (two round
// trips). On error the add may or may not have happened.
func (s *Store) Add(ctx context.Context, k storage.Key, cur int64, span int, n int64, ttl time.Duration) (storage.Counts, error) {
	if span < 1 || span > storage.MaxSpan || n < 0 {
		return storage.Counts{}, fmt.Errorf("memcached: bad window add (span %d, n %d)", span, n)
	}
	ahead := storage.Ahead(span)
	if cur > math.MaxInt64-ahead-1 || cur < math.MinInt64+int64(span) {
		return storage.Counts{}, fmt.Errorf("memcached: sub-window index %d out of range", cur)
	}
	if err := ctx.Err(); err != nil {
		return storage.Counts{}, errorf("add", err)
	}
	w := window{cur: cur, span: int64(span), ahead: ahead, n: n, proxy: s.proxy}
	w.init(s, k, ttl)
	addr, err := s.ring.pickTag(w.base)
	if err != nil {
		return storage.Counts{}, errorf("add", err)
	}
	var c storage.Counts
	err = s.pool.exec(ctx, addr, func(pc *pconn) (err error) {
		c, err = w.run(pc)
		return err
	})
	if err != nil {
		return storage.Counts{}, errorf("add", err)
	}
	return c, nil
}

// window is one Add's request.
type window struct {
	base      string
	cur, span int64
	ahead     int64 // newer sub-windows read for Later
	n         int64
	exp       int32
	proxy     bool
	// The known-counter cache (knownCache), as packedAdd's for one level:
	// noAdd when this Store created the current sub-window's counter and
	// its TTL has not run out (the incr goes alone; a NOT_FOUND sends it
	// again with its add); ttl and sentAt make the until of a counter the
	// add creates.
	keys   keyer
	key    storage.Key
	noAdd  bool
	ttl    time.Duration
	sentAt int64
}

// init fills the request's base, expiry and known counter for k (cur, n
// and span set).
func (w *window) init(s *Store, k storage.Key, ttl time.Duration) {
	var kc knownCounter
	w.base, kc = s.keys.windowKnown(k)
	if w.n > 0 {
		w.exp = s.expiry(ttl)
		w.keys, w.key, w.ttl = s.keys, k, ttl
		w.noAdd = kc.hasIdx(w.cur, knownNow())
	}
}

func (w *window) run(pc *pconn) (storage.Counts, error) {
	// The counter can vanish between add and incr (evicted, flush_all):
	// the incr then finds nothing and the whole request is sent again. A
	// first round that sent the incr alone (noAdd: a counter this Store
	// created, perhaps evicted early) gets one round more.
	rounds := 3
	if w.noAdd {
		rounds = 4
	}
	for range rounds {
		c, vanished, err := w.once(pc)
		if err != nil || !vanished {
			return c, err
		}
	}
	return storage.Counts{}, fmt.Errorf("%w: counter %s|c%d kept vanishing between add and incr", storage.ErrConflict, w.base, w.cur)
}

func (w *window) once(pc *pconn) (c storage.Counts, vanished bool, err error) {
	if w.proxy && w.n > 0 {
		// The get only after the incr's reply.
		var num [24]byte
		w.writeIncr(pc, &num)
		if err := pc.w.Flush(); err != nil {
			return c, false, err
		}
		if c.C[0], vanished, err = w.readIncr(pc); err != nil {
			return c, false, err
		}
		if w.get() {
			w.writeGet(pc, &num)
			if err := pc.w.Flush(); err != nil {
				return c, false, err
			}
			if err := w.readGet(pc, &c); err != nil {
				return c, false, err
			}
		}
		return c, vanished, nil
	}
	var num [24]byte
	w.write(pc, &num)
	if err := pc.w.Flush(); err != nil {
		return c, false, err
	}
	return w.read(pc)
}

// get reports whether the request reads other counters: a fixed window
// (span 1, nothing ahead) reads only its own, which the incr returns.
func (w *window) get() bool { return w.n == 0 || w.span > 1 || w.ahead > 0 }

// write buffers the request's commands (add, incr, get) without flushing.
func (w *window) write(pc *pconn, num *[24]byte) {
	if w.n > 0 {
		w.writeIncr(pc, num)
	}
	if w.get() {
		w.writeGet(pc, num)
	}
}

func (w *window) writeIncr(pc *pconn, num *[24]byte) {
	if !w.noAdd {
		w.sentAt = knownNow()
		pc.w.WriteString("add ")
		w.writeKey(pc, w.cur, num)
		pc.w.WriteString(" 0 ")
		pc.w.Write(strconv.AppendInt(num[:0], int64(w.exp), 10))
		pc.w.WriteString(" 1\r\n0\r\n")
	}
	pc.w.WriteString("incr ")
	w.writeKey(pc, w.cur, num)
	pc.w.WriteByte(' ')
	pc.w.Write(strconv.AppendInt(num[:0], w.n, 10))
	pc.w.WriteString("\r\n")
}

func (w *window) writeGet(pc *pconn, num *[24]byte) {
	pc.w.WriteString("get")
	for idx := w.cur + w.ahead; idx > w.cur-w.span; idx-- {
		if idx == w.cur && w.n > 0 {
			continue
		}
		pc.w.WriteByte(' ')
		w.writeKey(pc, idx, num)
	}
	pc.w.WriteString("\r\n")
}

// read reads the replies to what write sent.
func (w *window) read(pc *pconn) (c storage.Counts, vanished bool, err error) {
	if w.n > 0 {
		if c.C[0], vanished, err = w.readIncr(pc); err != nil {
			return c, false, err
		}
	}
	if w.get() {
		if err := w.readGet(pc, &c); err != nil {
			return c, false, err
		}
	}
	return c, vanished, nil
}

func (w *window) writeKey(pc *pconn, idx int64, num *[24]byte) {
	pc.w.WriteString(w.base)
	pc.w.WriteString("|c")
	pc.w.Write(strconv.AppendInt(num[:0], idx, 10))
}

// readIncr reads the replies to add (unless noAdd) and incr, and records
// in the known-counter cache a counter the add created, or forgets one
// that vanished (the next round then sends its add).
func (w *window) readIncr(pc *pconn) (int64, bool, error) {
	created := false
	if !w.noAdd {
		line, err := pc.r.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		created = string(line) == "STORED\r\n"
		if !created && string(line) != "NOT_STORED\r\n" {
			return 0, false, replyError("add", line)
		}
	}
	line, err := pc.r.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	if string(line) == "NOT_FOUND\r\n" {
		if w.noAdd {
			lv := [storage.PackedLevels]knownCounter{{idx: w.cur}}
			w.keys.record(w.key, w.base, 0, 1, &lv)
			w.noAdd = false
		}
		return 0, true, nil
	}
	v, ok := parseNumberLine(line)
	if !ok {
		return 0, false, replyError("incr", line)
	}
	if created && w.ttl > 0 {
		lv := [storage.PackedLevels]knownCounter{{idx: w.cur, until: w.sentAt + int64(w.ttl)}}
		w.keys.record(w.key, w.base, 1, 0, &lv)
	}
	return v, false, nil
}

// readGet reads a get reply into c.
func (w *window) readGet(pc *pconn, c *storage.Counts) error {
	for {
		line, err := pc.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if string(line) == "END\r\n" {
			return nil
		}
		if err := w.value(pc, line, c); err != nil {
			return err
		}
	}
}

// value reads the item whose VALUE line is line (a sub-window's counter the
// window asked for) into c.
func (w *window) value(pc *pconn, line []byte, c *storage.Counts) error {
	var data [maxCountLen + 2]byte
	key, size, ok := parseValueLine(line)
	if !ok || size > maxCountLen || len(key) <= len(w.base)+2 ||
		string(key[:len(w.base)]) != w.base || string(key[len(w.base):len(w.base)+2]) != "|c" {
		return replyError("get", line)
	}
	idx, err := strconv.ParseInt(string(key[len(w.base)+2:]), 10, 64)
	if err != nil {
		return replyError("get", line)
	}
	j := w.cur - idx
	later := j < 0 && -j <= w.ahead
	if !later && (j < 0 || j >= w.span || (j == 0 && w.n > 0)) {
		return replyError("get", line) // not a sub-window we asked for
	}
	// line aliases the reader's buffer: done with it.
	if _, err := io.ReadFull(pc.r, data[:size+2]); err != nil {
		return err
	}
	if string(data[size:size+2]) != "\r\n" {
		return fmt.Errorf("%w: get value not terminated by CRLF", errProtocol)
	}
	v, err := parseCount(data[:size])
	if err != nil {
		return fmt.Errorf("sub-window %d: %w", idx, err)
	}
	if later {
		c.Later += v
	} else {
		c.C[j] = v
	}
	return nil
}

// addReads adds the counters writeGet would read to m, as step i's.
func (w *window) addReads(m *mget, i int) {
	for idx := w.cur + w.ahead; idx > w.cur-w.span; idx-- {
		if idx == w.cur && w.n > 0 {
			continue
		}
		m.keys = append(m.keys, ' ')
		m.keys = append(m.keys, w.base...)
		m.keys = append(m.keys, tagSep, 'c')
		m.keys = strconv.AppendInt(m.keys, idx, 10)
		m.mark(i)
	}
}

// maxCountLen bounds a counter's value: 20 digits, and room for the spaces
// memcached may leave after a decr.
const maxCountLen = 64

// parseValueLine parses "VALUE <key> <flags> <bytes>[ <cas>]\r\n". The key
// aliases line.
func parseValueLine(line []byte) (key []byte, size int, ok bool) {
	rest, found := bytes.CutPrefix(line, []byte("VALUE "))
	if !found {
		return nil, 0, false
	}
	if rest, found = bytes.CutSuffix(rest, []byte("\r\n")); !found {
		return nil, 0, false
	}
	key, rest, found = bytes.Cut(rest, []byte(" "))
	if !found || len(key) == 0 {
		return nil, 0, false
	}
	_, rest, found = bytes.Cut(rest, []byte(" ")) // flags
	if !found {
		return nil, 0, false
	}
	sz, _, _ := bytes.Cut(rest, []byte(" ")) // an optional CAS id follows
	n, err := strconv.Atoi(string(sz))
	if err != nil || n < 0 {
		return nil, 0, false
	}
	return key, n, true
}

// parseNumberLine parses an incr or decr reply: a decimal number and CRLF.
func parseNumberLine(line []byte) (int64, bool) {
	digits, ok := bytes.CutSuffix(line, []byte("\r\n"))
	if !ok || len(digits) == 0 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(digits), 10, 64)
	if err != nil {
		return 0, false
	}
	return clampCount(v), true
}

// replyError describes an unexpected reply to cmd. A CLIENT_ERROR to incr
// or decr means the item is not a number: it is not ours, or was damaged.
func replyError(cmd string, line []byte) error {
	line = bytes.TrimRight(line, "\r\n")
	if (cmd == "incr" || cmd == "decr") && bytes.HasPrefix(line, []byte("CLIENT_ERROR ")) {
		return fmt.Errorf("%w: %s: %.100q", storage.ErrCorruptState, cmd, line)
	}
	return fmt.Errorf("%w to %s: %.100q", errProtocol, cmd, line)
}

// Sub implements [storage.Counter] with decr, which memcached stops at zero.
// A missing counter (expired, evicted) has nothing to give back.
func (s *Store) Sub(ctx context.Context, k storage.Key, idx int64, n int64) error {
	if n < 0 {
		return fmt.Errorf("memcached: bad window sub (n %d)", n)
	}
	if err := ctx.Err(); err != nil {
		return errorf("sub", err)
	}
	if n == 0 {
		return nil
	}
	base := s.keys.base(k)
	key := counterKey(base, idx)
	addr, err := s.ring.pickTag(base)
	if err != nil {
		return errorf("sub", err)
	}
	err = s.pool.exec(ctx, addr, func(pc *pconn) error {
		var num [24]byte
		pc.w.WriteString("decr ")
		pc.w.WriteString(key)
		pc.w.WriteByte(' ')
		pc.w.Write(strconv.AppendInt(num[:0], n, 10))
		pc.w.WriteString("\r\n")
		if err := pc.w.Flush(); err != nil {
			return err
		}
		line, err := pc.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if string(line) == "NOT_FOUND\r\n" {
			return nil
		}
		if _, ok := parseNumberLine(line); !ok {
			return replyError("decr", line)
		}
		return nil
	})
	if err != nil {
		return errorf("sub", err)
	}
	return nil
}

// parseCount parses a counter's value. Memcached may leave trailing spaces
// after a decr that shortened the number.
func parseCount(b []byte) (int64, error) {
	b = bytes.TrimRight(b, " ")
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: counter value %.40q is not a number", storage.ErrCorruptState, b)
	}
	return clampCount(v), nil
}

func clampCount(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}
