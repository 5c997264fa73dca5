package memcached

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

var _ storage.Batcher = (*Store)(nil)

// Do implements [storage.Batcher]: the steps of a request go to their nodes
// (all of a key's items live on one node), and each node gets one pipelined
// write on one connection, nodes in parallel; the replies are then read in
// order. One round trip per node. Every step's writes go first; what the
// steps read goes last, as one get (a gets when a bucket or log step needs
// its CAS id) naming every key, so memcached answers the whole pipeline in
// one segment (see pipeline). With Config.Proxy the reads go only after
// every write's reply: two round trips, whatever the number of steps.
// Per step:
//
//   - StepAdd: the window's add and incr, and its reads, as [Store.Add].
//   - StepSub: decr <key> <n> noreply. Memcached sends no reply, so a
//     refund costs no wait; StepResult.Err reports only a failure to send.
//     A Sync step (any kind) goes by its single-step method instead.
//   - StepPackedAdd: the packed window's adds and incrs, and its reads, as
//     [Store.AddPacked].
//   - StepPackedSub: decr <key|pl:idx> <delta> noreply per level, as
//     StepSub.
//   - StepBucket, StepLog refunds: sent without waiting, on their own
//     goroutine, as [Store.UpdateBucket] does (a cas on the item the take
//     cached, the cas loop after a lost race), under the store's timeout
//     and detached from ctx; at most maxDetached at once (more are sent
//     in the pipeline and waited for). A later bucket or log step of this
//     store on the same key waits for them, so a process reads its own
//     refunds. One that fails is lost (its units stay counted, stricter,
//     never laxer) and counted in Stats.LostRefunds. [Store.WaitRefunds]
//     waits for them all.
//   - Other StepBucket, StepLog: a speculative conditional write, and the
//     item read back (with its CAS id) in the batch's gets. With a cached item (value and CAS id from an
//     earlier gets), the op is applied to it and sent as cas; with none,
//     it is applied to an empty key and sent as add (a new key). If the
//     write is STORED, the op's decision stands, and the gets reply (the
//     item after it, with its new CAS id) is cached for the next call. If
//     it lost (EXISTS, NOT_FOUND, NOT_STORED), the gets reply is cached and
//     the step goes on as [Store.UpdateBucket] does, from that item: more
//     round trips, only on a lost race or a cold cache on an existing key.
//     When the op on the cached item would write nothing (a denial), only
//     the gets is sent and the op is applied to its fresh reply.
//
// A step whose window counter vanished between add and incr (evicted) is
// sent again on its own, as Add does (a packed step: only its levels that
// vanished, and its get).
func (s *Store) Do(ctx context.Context, steps []storage.Step, out []storage.StepResult) {
	if err := ctx.Err(); err != nil {
		for i := range steps {
			out[i] = storage.StepResult{Err: errorf("batch", err)}
		}
		return
	}
	var bs []bstep
	if len(steps) <= doScratchSteps {
		sc := doPool.Get().(*doScratch)
		defer sc.release(len(steps))
		bs = sc.bs[:len(steps)]
	} else {
		bs = make([]bstep, len(steps))
	}
	var addrBuf [doScratchSteps]net.Addr
	addrs := s.route(ctx, steps, bs, out, addrBuf[:0])
	// The steps of node j are idx[start(j):ends[j]], in order.
	var idxBuf, endBuf [doScratchSteps]int
	idx, ends := idxBuf[:0], endBuf[:0]
	for j := range addrs {
		for i := range bs {
			if !bs[i].done && bs[i].node == j {
				idx = append(idx, i)
			}
		}
		ends = append(ends, len(idx))
	}
	switch len(addrs) {
	case 0:
	case 1:
		s.send(ctx, addrs[0], bs, idx, out)
	default:
		s.sendParallel(ctx, slices.Clone(addrs), bs, slices.Clone(idx), slices.Clone(ends), out)
	}
	s.again(ctx, steps, bs, out)
}

// route readies each step of a batch for its node's pipeline and returns
// the nodes, each once (appended to addrs), with bs[i].node the index of
// step i's. A step answered on the way (a Sync step, by its single-step
// method; a refund sent without waiting; a bad step; no node) is marked
// done, its answer in out[i].
func (s *Store) route(ctx context.Context, steps []storage.Step, bs []bstep, out []storage.StepResult, addrs []net.Addr) []net.Addr {
	for i := range steps {
		b := &bs[i]
		if steps[i].Sync {
			// A public Refund's: its single-step method, which waits.
			out[i] = storage.DoStep(ctx, s, &steps[i])
			b.done = true
			continue
		}
		if s.detach(ctx, &steps[i], b) {
			b.done = true
			out[i] = storage.StepResult{}
			continue
		}
		if err := s.prepare(&steps[i], b); err != nil {
			out[i] = storage.StepResult{Err: err}
			b.done = true
			continue
		}
		addr, err := s.ring.pickTag(b.base)
		if err != nil {
			out[i] = storage.StepResult{Err: errorf("batch", err)}
			b.done = true
			continue
		}
		j := 0
		for j < len(addrs) && addrs[j].String() != addr.String() {
			j++
		}
		if j == len(addrs) {
			addrs = append(addrs, addr)
		}
		b.node = j
	}
	return addrs
}

// again decides, each on its own, the steps the pipelines left to be sent
// again: the rare second round of a lost race, a cold cache or a vanished
// counter.
func (s *Store) again(ctx context.Context, steps []storage.Step, bs []bstep, out []storage.StepResult) {
	for i := range steps {
		b, st := &bs[i], &steps[i]
		if b.done || !b.again {
			continue
		}
		switch st.Kind {
		case storage.StepAdd:
			out[i].Counts, out[i].Err = s.Add(ctx, st.Key, st.Idx, st.Span, st.N, st.TTL)
		case storage.StepPackedAdd:
			out[i] = storage.StepResult{}
			if err := s.finishPacked(ctx, &b.pa); err != nil {
				out[i].Err = err
			} else {
				out[i].Packed = b.pa.res
			}
		case storage.StepBucket, storage.StepLog:
			out[i] = s.settle(ctx, b)
		}
	}
}

// doScratchSteps is the largest batch whose working memory Do pools.
const doScratchSteps = 4

// doScratch is the working memory of a Do of up to doScratchSteps steps,
// pooled so that the common batch of one to a few steps allocates none.
type doScratch struct {
	bs [doScratchSteps]bstep
}

var doPool = sync.Pool{New: func() any { return new(doScratch) }}

// release clears what a batch of n steps used (the pool keeps nothing
// alive) and returns sc to the pool.
func (sc *doScratch) release(n int) {
	clear(sc.bs[:n])
	doPool.Put(sc)
}

// send sends the steps bs[idx...] to the node at addr in one pipeline and
// writes their answers to out.
func (s *Store) send(ctx context.Context, addr net.Addr, bs []bstep, idx []int, out []storage.StepResult) {
	err := s.pool.exec(ctx, addr, func(pc *pconn) error { return s.pipeline(pc, bs, idx) })
	for _, i := range idx {
		if err != nil {
			out[i] = storage.StepResult{Err: errorf("batch", err)}
			bs[i].done = true
			continue
		}
		out[i] = bs[i].res
	}
}

// sendParallel sends the steps of every node (node j's are
// idx[ends[j-1]:ends[j]]), nodes in parallel.
func (s *Store) sendParallel(ctx context.Context, addrs []net.Addr, bs []bstep, idx, ends []int, out []storage.StepResult) {
	var wg sync.WaitGroup
	for j, addr := range addrs {
		lo := 0
		if j > 0 {
			lo = ends[j-1]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.send(ctx, addr, bs, idx[lo:ends[j]], out)
		}()
	}
	wg.Wait()
}

// settle decides a bucket or log step that lost its speculative write, or
// whose op on the cached item needed a write after all: it repeats the
// step's own pipeline, the conditional write computed on the item the last
// gets returned followed by a gets of the item, so every attempt is one
// round trip and leaves the item after it (with its CAS id) cached for the
// next. The cas loop instead spends two per attempt (gets, then cas) and
// drops the cached item after a write, so the process's next call on a
// hot key starts cold. A lost race on a fresh item backs off as the cas
// loop does (the first retry follows the speculative round at once: its
// item came from the cache and may have been stale) and gives up after
// maxRetries lost races or at the deadline, with storage.ErrConflict.
func (s *Store) settle(ctx context.Context, b *bstep) storage.StepResult {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	kind := b.kind.String()
	one := []bstep{*b}
	lost := 0
	for {
		if err := ctx.Err(); err != nil {
			if lost > 0 {
				err = fmt.Errorf("%w: %d lost races, then: %w", storage.ErrConflict, lost, err)
			}
			return storage.StepResult{Err: errorf(kind, err)}
		}
		s.speculate(&one[0])
		addr, err := s.ring.pickTag(one[0].base)
		if err == nil {
			err = s.pool.exec(ctx, addr, func(pc *pconn) error { return s.pipeline(pc, one, []int{0}) })
		}
		if err != nil {
			if lost > 0 && ctx.Err() != nil {
				err = fmt.Errorf("%w: %d lost races, then: %w", storage.ErrConflict, lost, err)
			}
			return storage.StepResult{Err: errorf(kind, err)}
		}
		if !one[0].again {
			return one[0].res
		}
		if one[0].write == nil {
			continue // a stale cached denial: the next attempt writes
		}
		lost++
		if lost > s.maxRetries {
			return storage.StepResult{Err: errorf(kind, fmt.Errorf("%w: gave up after %d lost races", storage.ErrConflict, lost))}
		}
		if err := wait(ctx, s.backoff, lost); err != nil {
			return storage.StepResult{Err: errorf(kind, fmt.Errorf("%w: %d lost races, then: %w", storage.ErrConflict, lost, err))}
		}
	}
}

// maxDetached bounds the refunds in flight without a waiter, per store.
const maxDetached = 64

// detach sends a bucket or log refund on its own goroutine and reports
// true, or reports false for other steps (and when maxDetached refunds are
// in flight, or ctx is done). Other bucket and log steps first wait for
// the refunds in flight on their key. It fills b's base and item key for
// a bucket or log step (prepare uses them).
func (s *Store) detach(ctx context.Context, st *storage.Step, b *bstep) bool {
	var (
		key, kind string
		apply     applyFunc
	)
	switch {
	case st.Kind == storage.StepBucket:
		b.base = s.keys.base(st.Key)
		b.key, kind = bucketKey(b.base), "bucket"
		key = b.key
		if !st.Bucket.Refund() {
			s.refunds.Wait(ctx, key) //nolint:errcheck // ctx's end is reported by the step itself
			return false
		}
		apply = s.bucketApply(st.Bucket, st.TTL)
	case st.Kind == storage.StepLog:
		b.base = s.keys.base(st.Key)
		b.key, kind = logKey(b.base), "log"
		key = b.key
		if !st.Log.Refund() {
			s.refunds.Wait(ctx, key) //nolint:errcheck // as above
			return false
		}
		apply = s.logApply(st.Log, st.TTL)
	default:
		return false
	}
	if ctx.Err() != nil {
		return false
	}
	return s.refunds.Go(key, s.timeout, func(ctx context.Context) error {
		_, err := s.casLoop().update(ctx, kind, key, apply)
		return err
	}, func() { s.lostRefunds.Add(1) })
}

// WaitRefunds waits until every refund Do sent without waiting has landed
// (or failed), or ctx is done. A Lambda handler need not call it; tests and
// a process about to exit may.
func (s *Store) WaitRefunds(ctx context.Context) error { return s.refunds.WaitAll(ctx) }

// LostRefunds returns how many refunds sent without waiting failed (their
// units stay counted).
func (s *Store) LostRefunds() int64 { return s.lostRefunds.Load() }

// bstep is one step of a batch on its way.
type bstep struct {
	kind storage.StepKind
	base string // the key's tag: its node
	key  string // the item (sub, bucket, log)
	w    window // StepAdd
	n    int64  // StepSub

	pa   packedAdd         // StepPackedAdd
	pget bool              // pa's round wrote a get
	psub *storage.PackedOp // StepPackedSub

	apply applyFunc      // StepBucket, StepLog
	write *memcache.Item // the speculative write; nil: gets only
	found bool           // write is a cas (else an add)
	d     storage.Decision
	// The pipeline's answers: the write was stored; the gets's item.
	stored bool
	item   *memcache.Item

	res   storage.StepResult
	node  int  // Do's index of the step's node
	done  bool // answered before the pipeline (an error)
	again bool // to be sent again on its own
}

// prepare fills b for st.
func (s *Store) prepare(st *storage.Step, b *bstep) error {
	b.kind = st.Kind
	switch st.Kind {
	case storage.StepPackedAdd:
		err := b.pa.init(s, st.Key, &st.Packed)
		b.base, b.pa.proxy = b.pa.base, s.proxy
		return err
	case storage.StepPackedSub:
		b.base = s.keys.packedBase(st.Key)
	case storage.StepBucket, storage.StepLog:
		// detach computed the base and the item's key
		if st.Kind == storage.StepBucket && st.Fence > 0 && st.Bucket.Take() {
			return fmt.Errorf("memcached: %w: a fenced bucket take (memcached keeps no fence: not a storage.BucketFencer)", storage.ErrUnsupported)
		}
	case storage.StepAdd:
		// the window's init computes it (from the known-counter cache)
		if st.Fence > 0 && st.N > 0 {
			return fmt.Errorf("memcached: %w: a fenced add (memcached keeps no fence: not a storage.Fencer)", storage.ErrUnsupported)
		}
	default:
		b.base = s.keys.base(st.Key)
	}
	switch st.Kind {
	case storage.StepAdd:
		span, n, cur := st.Span, st.N, st.Idx
		if span < 1 || span > storage.MaxSpan || n < 0 {
			return fmt.Errorf("memcached: bad window add (span %d, n %d)", span, n)
		}
		ahead := storage.Ahead(span)
		if cur > math.MaxInt64-ahead-1 || cur < math.MinInt64+int64(span) {
			return fmt.Errorf("memcached: sub-window index %d out of range", cur)
		}
		b.w = window{cur: cur, span: int64(span), ahead: ahead, n: n}
		b.w.init(s, st.Key, st.TTL)
		b.base = b.w.base
	case storage.StepSub:
		if st.N < 0 {
			return fmt.Errorf("memcached: bad window sub (n %d)", st.N)
		}
		b.key, b.n = counterKey(b.base, st.Idx), st.N
	case storage.StepPackedSub:
		b.psub = &st.Packed
		return checkPackedAdds(b.psub)
	case storage.StepBucket:
		b.apply = s.bucketApply(st.Bucket, st.TTL)
		s.speculate(b)
	case storage.StepLog:
		b.apply = s.logApply(st.Log, st.TTL)
		s.speculate(b)
	default:
		return fmt.Errorf("%w: memcached: cannot batch a %s step", limiter.ErrInvalidConfig, st.Kind)
	}
	return nil
}

// speculate picks the conditional write of a bucket or log step: cas on the
// cached item, or add on an empty key; none when the op writes nothing.
func (s *Store) speculate(b *bstep) {
	it := s.cache.get(b.key)
	b.found = false
	var (
		w   *memcache.Item
		d   storage.Decision
		err error
	)
	if it != nil {
		w, d, err = b.apply(it.Value, it.CasID, true)
		if err != nil {
			s.cache.drop(b.key)
			w = nil
		} else if w != nil {
			w.CasID, b.found = it.CasID, true
		}
	} else {
		w, d, err = b.apply(nil, 0, false)
		if err != nil {
			w = nil
		}
	}
	b.write, b.d = w, d
}

// pipeline writes the steps of bs[idx...] on pc and reads every reply in
// order. The writes (add, incr, decr, cas) go first, step after step, then
// one gets of every key any step reads (mget): memcached sends the replies
// it holds when a retrieval command ends, so a get in mid-pipeline splits
// the reply in two segments and the client waits for the second (measured
// with the server's own replies: BenchmarkThreeLimits,
// docs/benchmarks.md). A read after every write of the pipeline sees each
// step's own writes, as it did right after them.
//
// Without Config.Proxy it is all one write and one read: one round trip.
// With it, the node is a proxy that may run the commands of one pipeline
// on different shards in any order (replies still come back in order), so
// a read written after a write on another key may run before it. The
// writes then go first, with the reads of a bucket or log step (the item
// its cas or add wrote: the same key, which a proxy sends to one shard in
// order, as it does a window's add and incr), and the windows' reads
// (other keys than the incrs they follow) only once every write has
// answered: two round trips whatever the number of steps, one when no
// window reads.
func (s *Store) pipeline(pc *pconn, bs []bstep, idx []int) error {
	m, m1 := &pc.mg, &pc.mg
	if s.proxy {
		m1 = &pc.mg1
		m1.reset()
	}
	m.reset()
	s.writeSteps(pc, bs, idx, m, m1)
	if s.proxy {
		m1.write(pc, maxProxyGet)
		if pc.w.Buffered() > 0 {
			if err := pc.w.Flush(); err != nil {
				return err
			}
			if err := readWrites(pc, bs, idx); err != nil {
				return err
			}
			if m1.cmds > 0 {
				if err := readMget(pc, bs, m1); err != nil {
					return err
				}
			}
		}
		m.write(pc, maxProxyGet)
		if err := pc.w.Flush(); err != nil {
			return err
		}
	} else {
		m.write(pc, 0)
		if err := pc.w.Flush(); err != nil {
			return err
		}
		if err := readWrites(pc, bs, idx); err != nil {
			return err
		}
	}
	// The gets: each item to the step that asked for it.
	if m.cmds > 0 {
		if err := readMget(pc, bs, m); err != nil {
			return err
		}
	}
	for _, i := range idx {
		b := &bs[i]
		switch b.kind {
		case storage.StepPackedAdd:
			done := b.pa.pending == 0
			if done && !b.pget {
				b.pa.fillLast()
			}
			b.res.Packed, b.again = b.pa.res, !done
		case storage.StepBucket, storage.StepLog:
			s.decideCAS(b)
		}
	}
	return nil
}

// maxProxyGet bounds a retrieval command line sent to a proxy: ElastiCache
// Serverless limits a get or gets to 16 KB
// (https://docs.aws.amazon.com/AmazonElastiCache/latest/mem-ug/SupportedCommandsMem.html).
// A longer one is split into several gets, which a proxy answers in one
// go anyway.
const maxProxyGet = 16000

// writeSteps buffers the writes of the steps bs[idx...] on pc and adds
// the keys the windows read to m, those the buckets and logs read to m1
// (which may be m).
func (s *Store) writeSteps(pc *pconn, bs []bstep, idx []int, m, m1 *mget) {
	num := &pc.num
	for _, i := range idx {
		b := &bs[i]
		b.res, b.again, b.stored, b.item = storage.StepResult{}, false, false, nil
		switch b.kind {
		case storage.StepAdd:
			if b.w.n > 0 {
				b.w.writeIncr(pc, num)
			}
			if b.w.get() {
				b.w.addReads(m, i)
			}
		case storage.StepSub:
			if b.n == 0 {
				continue
			}
			pc.w.WriteString("decr ")
			pc.w.WriteString(b.key)
			pc.w.WriteByte(' ')
			pc.w.Write(strconv.AppendInt(num[:0], b.n, 10))
			pc.w.WriteString(" noreply\r\n")
		case storage.StepPackedAdd:
			b.pa.writeIncrs(pc)
			b.pget = b.pa.addReads(m, i)
		case storage.StepPackedSub:
			writePackedSub(pc, b.base, b.psub, true, num)
		default:
			if w := b.write; w != nil {
				writeCAS(pc, b, w, num)
			}
			m1.keys = append(m1.keys, ' ')
			m1.keys = append(m1.keys, b.key...)
			m1.mark(i)
			m1.cas = true
		}
	}
}

// writeCAS buffers a bucket or log step's speculative write w: cas on the
// cached item's CAS id, or add.
func writeCAS(pc *pconn, b *bstep, w *memcache.Item, num *[24]byte) {
	if b.found {
		pc.w.WriteString("cas ")
	} else {
		pc.w.WriteString("add ")
	}
	pc.w.WriteString(b.key)
	pc.w.WriteString(" 0 ")
	pc.w.Write(strconv.AppendInt(num[:0], int64(w.Expiration), 10))
	pc.w.WriteByte(' ')
	pc.w.Write(strconv.AppendInt(num[:0], int64(len(w.Value)), 10))
	if b.found {
		pc.w.WriteByte(' ')
		pc.w.Write(strconv.AppendUint(num[:0], w.CasID, 10))
	}
	pc.w.WriteString("\r\n")
	pc.w.Write(w.Value)
	pc.w.WriteString("\r\n")
}

// readWrites reads the replies to the writes of the steps bs[idx...], in
// order.
func readWrites(pc *pconn, bs []bstep, idx []int) error {
	for _, i := range idx {
		b := &bs[i]
		switch b.kind {
		case storage.StepAdd:
			if b.w.n > 0 {
				c, vanished, err := b.w.readIncr(pc)
				if err != nil {
					return err
				}
				b.res.Counts.C[0], b.again = c, vanished
			}
		case storage.StepSub, storage.StepPackedSub:
			// noreply: nothing to read.
		case storage.StepPackedAdd:
			if err := b.pa.readIncrs(pc); err != nil {
				return err
			}
			if b.pget {
				b.pa.startReads()
			}
		default:
			stored, err := readWriteReply(pc, b)
			if err != nil {
				return err
			}
			b.stored = stored
		}
	}
	return nil
}

// mget is the one retrieval of a pipeline: the keys its steps read, in
// order, each with the step (index in the pipeline's bs) that reads it,
// sent as a get, or as a gets when a bucket or log step needs the CAS id.
// Memcached answers a get with the items it holds in the order asked (a
// miss is left out; a key asked twice is answered twice); a proxy that
// splits the get over shards may merge the replies in another order
// (nutcracker does, now and then), so each item goes to the first key not
// yet answered that it matches, looked for from the one after the last
// answered.
type mget struct {
	keys  []byte  // " k1 k2 ...", as sent
	ends  []int32 // the end of key j in keys
	owner []int32 // the step of key j
	got   []bool  // key j was answered
	cas   bool    // a gets
	cmds  int     // the get commands written (write)
}

func (m *mget) reset() {
	m.keys, m.ends, m.owner, m.got, m.cas, m.cmds = m.keys[:0], m.ends[:0], m.owner[:0], m.got[:0], false, 0
}

// mark ends the key just appended to keys, as step i's.
func (m *mget) mark(i int) {
	m.ends = append(m.ends, int32(len(m.keys)))
	m.owner = append(m.owner, int32(i))
	m.got = append(m.got, false)
}

// key returns key j (without its leading space).
func (m *mget) key(j int) []byte {
	start := int32(1)
	if j > 0 {
		start = m.ends[j-1] + 1
	}
	return m.keys[start:m.ends[j]]
}

// write buffers the retrieval of m's keys: one command, or, when limit is
// positive, as many as keep each command line within limit bytes (a key
// is at most 250 bytes).
func (m *mget) write(pc *pconn, limit int) {
	if len(m.owner) == 0 {
		return
	}
	cmd := "get"
	if m.cas {
		cmd = "gets"
	}
	from := 0 // the byte of keys the next command starts at
	for j := 0; j < len(m.ends); {
		k := j + 1
		if limit <= 0 {
			k = len(m.ends)
		}
		for k < len(m.ends) && len(cmd)+int(m.ends[k])-from+2 <= limit {
			k++
		}
		to := int(m.ends[k-1])
		pc.w.WriteString(cmd)
		pc.w.Write(m.keys[from:to])
		pc.w.WriteString("\r\n")
		m.cmds++
		from, j = to, k
	}
}

// readMget reads the replies to m's commands and hands each item to its
// step.
func readMget(pc *pconn, bs []bstep, m *mget) error {
	next, ends := 0, 0
	for ends < m.cmds {
		line, err := pc.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if string(line) == "END\r\n" {
			ends++
			continue
		}
		key, _, ok := parseValueLine(line)
		if !ok {
			return replyError("gets", line)
		}
		j := m.find(key, next)
		if j < 0 {
			return replyError("gets", line) // not a key we asked for
		}
		m.got[j], next = true, j+1
		b := &bs[m.owner[j]]
		switch b.kind {
		case storage.StepAdd:
			err = b.w.value(pc, line, &b.res.Counts)
		case storage.StepPackedAdd:
			err = b.pa.value(pc, line)
		default:
			b.item, err = readGetsValue(pc, line, b.key)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// find returns the first key not yet answered that is key, looked for from
// from to the end and then from the start, or -1.
func (m *mget) find(key []byte, from int) int {
	n := len(m.owner)
	for d := range n {
		j := (from + d) % n
		if !m.got[j] && string(m.key(j)) == string(key) {
			return j
		}
	}
	return -1
}

// readWriteReply reads the reply to a bucket or log step's speculative
// write, if it sent one, and reports whether it was stored.
func readWriteReply(pc *pconn, b *bstep) (bool, error) {
	if b.write == nil {
		return false, nil
	}
	line, err := pc.r.ReadSlice('\n')
	if err != nil {
		return false, err
	}
	switch string(line) {
	case "STORED\r\n":
		return true, nil
	case "EXISTS\r\n", "NOT_FOUND\r\n", "NOT_STORED\r\n":
		return false, nil
	}
	if b.found {
		return false, replyError("cas", line)
	}
	return false, replyError("add", line)
}

// decideCAS decides a bucket or log step from its write's outcome
// (b.stored) and the item its gets returned (b.item, nil if none), or
// marks it to go on as a cas loop. The item is cached for the next call.
func (s *Store) decideCAS(b *bstep) {
	it := b.item
	if it != nil {
		s.cache.put(it)
	} else {
		s.cache.drop(b.key)
	}
	switch {
	case b.stored:
		b.res.Decision = b.d
	case b.write == nil && it != nil:
		// A decision that writes nothing, made on the fresh item.
		w, d, err := b.apply(it.Value, it.CasID, true)
		if err != nil {
			s.cache.drop(b.key)
			b.res.Err = errorf(b.kind.String(), err)
		} else if w == nil {
			b.res.Decision = d
		} else {
			b.again = true
		}
	default:
		b.again = true
	}
}

// readGets reads a gets reply for key: the item with its CAS id, or nil.
func readGets(pc *pconn, key string) (*memcache.Item, error) {
	line, err := pc.r.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	if string(line) == "END\r\n" {
		return nil, nil
	}
	it, err := readGetsValue(pc, line, key)
	if err != nil {
		return nil, err
	}
	if line, err = pc.r.ReadSlice('\n'); err != nil {
		return nil, err
	}
	if string(line) != "END\r\n" {
		return nil, replyError("gets", line)
	}
	return it, nil
}

// readGetsValue reads the item of key whose VALUE line (with its CAS id)
// is line.
func readGetsValue(pc *pconn, line []byte, key string) (*memcache.Item, error) {
	k, size, cas, ok := parseGetsLine(line)
	if !ok || string(k) != key || size > maxValueLen {
		return nil, replyError("gets", line)
	}
	val := make([]byte, size+2)
	if _, err := io.ReadFull(pc.r, val); err != nil {
		return nil, err
	}
	if !bytes.HasSuffix(val, []byte("\r\n")) {
		return nil, fmt.Errorf("%w: gets value not terminated by CRLF", errProtocol)
	}
	return &memcache.Item{Key: key, Value: val[:size], CasID: cas}, nil
}

// maxValueLen bounds a bucket or log value: memcached's default item size.
const maxValueLen = 1 << 20

// parseGetsLine parses "VALUE <key> <flags> <bytes> <cas>\r\n".
func parseGetsLine(line []byte) (key []byte, size int, cas uint64, ok bool) {
	key, size, ok = parseValueLine(line)
	if !ok {
		return nil, 0, 0, false
	}
	// The fifth field: "VALUE", key, flags and bytes are four fields
	// separated by single spaces (parseValueLine checked the first three).
	rest, _ := bytes.CutSuffix(line, []byte("\r\n"))
	for range 4 {
		_, after, found := bytes.Cut(rest, []byte(" "))
		if !found {
			return nil, 0, 0, false
		}
		rest = after
	}
	cas, err := strconv.ParseUint(string(rest), 10, 64)
	if err != nil {
		return nil, 0, 0, false
	}
	return key, size, cas, true
}
