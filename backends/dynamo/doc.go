// Package dynamo keeps limiter state in one DynamoDB table, with one
// request per decision in the common case and no lost update under any
// contention. [Store] implements [limiter.BucketStore] (token buckets),
// [limiter.Counter] (sliding and fixed windows), [limiter.PackedCounter]
// (packed sliding windows) and [limiter.LogStore] (sliding logs).
//
// # Table layout
//
// One table, partition key "pk" (String), no sort key, TTL attribute "ttl"
// (Number, Unix seconds). The CDK app creates it in AWS; [CreateTable]
// creates it for tests and local use. Every item is one key Name: the
// state of every limit whose key has that Name (the limits of one rule),
// each limit's attributes named with a 2-character prefix, base64url of
// the SHA-256 of its Space (a store refuses a second Space with a prefix it
// already served). pk is "#/" and the Name escaped ('%XX' for every byte
// that is not printable ASCII, and for '%', '/' and '#'); a key longer
// than 160 bytes becomes "#/#" and the SHA-256 of the Name in base64url.
// Every write sets ttl to the wall-clock time the state must be kept (the
// longest ttl any limit asked of the store, rounded up, plus a second), so
// idle keys expire. DynamoDB deletes expired items lazily (up to days
// later) and correctness never depends on it: an expired item still read
// is still a valid state (a bucket refills, old sub-windows are out of
// view, old log entries are dropped). Sizes: a bucket takes about 20 bytes,
// a full view and horizon of 42 counters (the default 20 sub-windows)
// about 420, a packed window at 160 slots with traffic in every slot about
// 1,750 (2 write units); the embedded rules' per-ip item is 576 bytes for
// a light client and 1,780 for one with traffic in every slot; a log is
// refused beyond 1 KB. The rest of this comment names attributes without
// their prefix.
//
// A write to an item is ONE UpdateItem: the union of the parts of the
// limits it updates (a single-step call is one part; [Store.Do] merges
// the steps of a batch on one Name), each part's conditions ANDed, the ttl
// set once, ReturnValues=ALL_NEW when a part reads its answer from the
// item. On a failed condition (ReturnValuesOnConditionCheckFailure=ALL_OLD)
// every part takes the item returned as its state and the write is sent
// again with the parts still to write, in the conditional-write loop
// below. docs/consistency.md ("Several limits in one item") says why this
// stays exact.
//
// # Token buckets
//
// Attributes: b (N, Unix ns, the base) and t (N, tokens, the tat): GCRA's "theoretical arrival
// time" counted in refill tokens on a refill grid. The grid is base,
// base+RefillTime, base+2*RefillTime, ...; an op stamped now is in step
// k = floor((now-base)/RefillTime) and sees min(max, RefillAmount*k - tat)
// tokens. A take of n adds n to tat; a refund subtracts it; a bucket full
// at k (tat below level-max, level = RefillAmount*k) is first brought to
// level-max, which is the cap. The refills are in the formula, not in the
// item, so nothing has to move when a refill is due: concurrent takes
// conflict over nothing but the tokens themselves, whatever the refill
// rate. The store remembers the last item it saw per key in a bounded
// in-process LRU (the warm Lambda) and sends ONE UpdateItem per decision,
// no read first; every condition includes base = :base (the grid only
// moves for a strict denial):
//
//   - A take: SET tat = tat + :n on condition tat BETWEEN :level-max AND
//     :level-n, for the op's own step. Every stored tat in the range
//     allows the take and gets the same update, so concurrent takers all
//     succeed without knowing the exact value; the decision is recomputed
//     from the new item (ReturnValues=ALL_NEW). A take the remembered item
//     says is denied is sent all the same: if the condition fails, the
//     item it returns (below) is the server's state and decides the
//     denial, with no second request.
//   - A take on a full bucket (the idle case): SET tat = :level-max+n on
//     condition tat < :level-max.
//   - A refund: SET tat = tat - :n on condition tat >= :level-max+n, or,
//     when it reaches the cap, SET tat = :level-max on condition
//     tat < :level-max+n.
//   - A strict denial off the grid (now > base + k*RefillTime): SET
//     base = :now, tat = tat - :level on condition tat > :level-n: the grid
//     restarts at now holding the tokens the op saw, as Smyte's strict mode
//     restarts the refill timer.
//   - A key the store has not seen: a new full bucket (base = now) on
//     condition that neither attribute exists.
//
// Each op is decided by [limiter.BucketOp.Apply] on the bucket at its own
// step (tokens as above, Updated = base + k*RefillTime), so Smyte's
// semantics hold exactly (steps of RefillAmount every RefillTime, the
// leftover time kept, strict mode, Get, refunds capped at max, caller
// timestamps) whenever ops reach the table in the order of their stamps.
// Where they do not, the difference is this: an op stamped in an earlier
// step than one that already reached the bucket is judged at its own step,
// so it does not see the refills of the later steps (Apply on the stored
// state would judge it at the newest refill), and a strict denial among
// them restarts the grid at its own stamp. It sees fewer tokens, never
// more, and in any interval of stamps the bucket admits at most max plus
// the refills of the interval, whatever the arrival order (Apply in arrival
// order can admit more: a late op gets refills stamped after it). Seeing
// the newest step would take a condition on it, and moving it a write by
// every op of a new step: the contention this layout removes.
// limitertest.BucketsAtStamp states this semantics for the conformance
// suite and the history checker.
//
// Size: about 20 bytes. With a tiny RefillTime and a large
// RefillAmount, a key busy for decades would make RefillAmount*k leave
// 2^61; the grid is then moved forward by an exact write (same phase).
//
// With Config.CacheSize < 0 nothing is remembered, and every decision on
// a key costs two requests (the guess that it is absent, then the write on
// the returned item). Tests can force exact writes (conditioned on the
// whole old item) instead of the ranges.
//
// The write runs in the package's one conditional-write loop, the same for
// buckets, logs, window refunds and leases ([Leases]):
// every write asks for ReturnValuesOnConditionCheckFailure=ALL_OLD, so when
// the condition fails DynamoDB returns the current item, and the store
// applies the op to it and writes again, still without a read. The first
// retry is immediate, later ones wait a full-jitter pause of up to
// Config.BackoffBase doubled per retry, capped at Config.BackoffMax; after
// Config.MaxAttempts lost races, or when the next pause would outlast the
// deadline, the call fails with an error wrapping [limiter.ErrConflict].
// Each retried lost race is counted in Stats.Conflicts.
//
// A denial is never decided on a remembered state alone (another process
// may have refunded tokens): it is the failed condition of the take, on
// the item DynamoDB returns, that decides it. A Get is a strongly
// consistent GetItem. So a warm key costs one request per decision,
// allowed or denied, and a key new to the process two.
//
// # Windows
//
// Attributes: one Number per sub-window, named by its index modulo 2^30
// in five base64url characters (so a name only recurs 2^30 sub-windows
// later). Add is ONE UpdateItem:
//
//	ADD <cur> :n  SET ttl = :ttl  REMOVE <cur-2span>, <cur-2span-1>, <stale names seen before>
//	condition: attribute_not_exists(<cur>) OR attribute_type(<cur>, N)
//	ReturnValues=ALL_NEW
//
// ADD is atomic, so concurrent adds never conflict and every caller sees a
// count that includes its own add and every add before it, in one
// linearizable step: a window never admits more than its estimator allows.
// The returned item gives the counts of the view (cur, cur-1, ...,
// cur-span+1) and, as Counts.Later, of the span-1 sub-windows after cur
// (another writer's clock is ahead, or its request arrived first).
//
// Out-of-order writers ([limiter.Counter]): a writer removes only counters
// more than 2*span-1 sub-windows behind its own, the view plus the horizon.
// Since no writer's sub-window is newer than the newest, no counter that a
// writer up to span sub-windows behind the newest needs is ever removed:
// a late writer within the horizon finds its whole view, and its refund
// lands on the counter it added to. Counters past that are removed: the two
// just behind by name in every Add, others (left by gaps in traffic) by
// the names the last response showed, in this process's next Add, or at
// once with a second UpdateItem when there are eight or more of them. A
// writer further behind than the horizon (the item holds a counter more
// than span sub-windows newer than its own) moves its add into the oldest
// sub-window of the newest writer's view with a second UpdateItem (ADD
// <that> :n, ADD <cur> -n, on condition <cur> >= n), and is judged from
// there against every newer counter (Counts.Moved); if the move fails,
// its add sits in a counter no punctual writer reads, so it is denied.
// Such a writer costs two requests (Stats.Moves counts them).
//
// Sub (a refund) is one UpdateItem, ADD <idx> -n on condition <idx> >= n; if
// the counter holds less, it is taken down to zero with a condition on the
// value the failed write returned, so it never goes negative; a counter
// that is gone has nothing to give back. An Add of 0 is a consistent
// GetItem.
//
// Size: a key with traffic in every sub-window holds 2*span counters, about
// 10 bytes each for counts under 1000 (7-byte name, number): a
// 20-sub-window window (the default) about 420 bytes, one write unit; 40
// sub-windows about 820 bytes; at 60 sub-windows an item passes 1 KB and
// costs two write units.
//
// # Packed windows
//
// A packed sliding window ([limiter.Packed], [limiter.PackedCounter]) has
// one Number attribute per counter (level, index),
// named by five base64url characters of (level-1)<<28 | index mod 2^28
// (an index recurs only 2^30 slots or more later). AddPacked is ONE
// UpdateItem:
//
//	ADD <L1> :d1, <L2> :d2, <L3> :d3, <L4> :d4  SET ttl = :ttl
//	REMOVE <2 counters per level just behind the keep bound>, <stale names seen before>
//	condition: (attribute_not_exists(<Li>) OR (attribute_type(<Li>, N) AND <Li> >= 0)) for each i
//	ReturnValues=ALL_NEW
//
// The added counters and the op's reads are read from the returned item.
// ADD is atomic, so concurrent adds never conflict, and each caller's
// reads include its own add and every add before it. DynamoDB numbers are
// decimal (38 digits) and do not wrap: a counter that a denied add carried
// out of its top field holds 2^64 or more, and the store answers every
// counter modulo 2^64, which is the value of a 64-bit counter that wraps
// (the limiter detects the carry and gives the units back; the refund
// subtracts exactly, so the number returns to what it was).
//
// Out-of-order writers: the newest slot added to the key is tracked in
// the item as its newest level-1 counter (the newest writer's level-1
// counter is never removed), so to 4 slots. The keep bound of slot f is
// keepFrom(f) = 4*floor(f/4) - Keep, at most f - Keep: a writer removes
// only counters that end before its own keep bound (at every level the
// two just behind it by name, and those its process saw in the key's last
// response), so no writer removes a counter that covers a slot in
// [newest-Keep, newest], and a writer within the horizon finds its whole
// view and refunds into the counters it added to. After the add, the
// returned item gives the newest level-1 counter: if a counter the op
// names ends before keepFrom(newest) (it may have been removed, and the
// add created it again) the op is Stale: a second UpdateItem takes the add
// back (ADD of the negated deltas on condition that each counter holds
// them; REMOVE of the counters that end before the bound) and the op
// answers Stale (the limiter denies it). Between the two requests the
// late units are visible only in counters no writer within the horizon
// reads, or in coarse fields one does (stricter). Stats.PackedStale counts
// them. A writer past the horizon whose counters all end at or after the
// bound (never removed) reads its view exactly and is decided on it. An op
// that adds nothing (a read) is a consistent GetItem. Counters past the
// writer's keep bound that the blind removals missed (left by gaps in
// traffic) are removed by name at this process's next add on the key, or
// at once with a second UpdateItem (Stats.Cleanups) when there are eight
// or more and removing them brings the item under a write-unit boundary
// (1 KB, 2 KB, ...).
//
// SubPacked (a refund) is ONE UpdateItem, ADD <Li> -di on condition
// <Li> >= di for each level, which never creates a counter and subtracts
// exactly. If the condition fails, the item it returns (ALL_OLD) says which
// counters are gone (skipped: their units went with them) and which hold
// less than the refund (a counter removed and created again: set to its
// value with each field taken down, at most to 0, on condition of that
// value), and the write is tried again in the conditional-write loop.
//
// Size: with traffic in every slot a key holds the counters covering
// [keep bound, newest]: at the default 160 slots 114 counters, about
// 1,650 bytes with a 60-byte key, so each decision costs 2 WCU (measured by
// TestPackedRemoval); traffic every other slot about 1,400 bytes; every 8th
// slot about 720 bytes (1 WCU). At 64 slots an item with traffic in every
// slot is about 740 bytes (1 WCU), at 96 slots about 1,050. A decision is
// one request (two for a Stale writer, or with a cleanup); a denial adds
// the refund of its own take, sent without waiting.
//
// # Sliding logs
//
// Attributes: l (Binary, limiter.AppendLog), v (N, version). The log is
// written with one UpdateItem on condition v = :remembered AND l =
// :remembered_log (neither exists for a new key), in the same
// conditional-write loop and with the same denial rules as buckets. Under
// contention on one key a log admits one writer per round trip. A log
// whose own attributes would exceed 1 KB is refused with an error wrapping [ErrItemTooLarge] (a few
// hundred entries; use a sliding window for larger limits).
//
// # Batches
//
// A [Store] is a limiter.Batcher: limiter.Decide hands it every step of a
// request bound for it in one [Store.Do]. Do merges the steps on one key
// Name into one write of their item (above; two steps of one limit go in
// separate writes) and sends the writes of different items at once, one
// goroutine each, under one deadline: a batch costs one round trip of
// latency and one write per Name when nothing conflicts (the embedded
// rules: 1 without a token, 2 with one). When a bucket or log take (not
// Shadow) is denied on the store's state, the takes of its item not
// written yet are not sent: limiter.StepResult.NotApplied. The batch is
// not all-or-nothing across items: Decide refunds the takes of a denied
// batch, in a second Do, merged per item the same way.
//
// Refunds (window Subs and SubPackeds, bucket and log refund ops:
// BucketOp.Refund, LogOp.Refund) are sent without waiting unless Config.WaitRefunds: Do
// returns at once for them and they run detached from the caller's context
// under Config.Timeout, at most Config.MaxDetached in flight (a refund over
// the bound is waited for). A later step of the store on the same key waits
// for that key's detached refunds, so a process reads its own refunds. A
// refund lost (failed, or frozen with a Lambda past its deadline) leaves
// its units counted: stricter, never free (Stats.LostRefunds). Refunds are
// safe to delay: a window Sub takes from the counter its add went to, or
// from nothing if that counter is gone; a bucket refund and a log refund
// are conditional writes like any other.
//
// All-or-nothing batches with TransactWriteItems were measured and not
// built (docs/benchmarks.md, "One batch per request: DynamoDB"): condition
// expressions have no arithmetic, so a window's decision must be a
// condition on the whole item the process last saw (a version), which
// turns every concurrent add on a hot key into a lost race; and a
// transaction costs 2 WCU per item.
//
// # Errors, deadlines and retries
//
// Every call runs under the caller's deadline (Config.Timeout when the
// context has none). A failed condition is never an error by itself. Every
// error of a DynamoDB request, for [Store] and [Leases] alike, goes through
// one mapping, so that the policy layer can apply the rule's fail mode and
// count the cause with errors.Is:
//
//   - Throttling wraps [ErrThrottled] (and so [limiter.ErrThrottled]):
//     ProvisionedThroughputExceededException, ThrottlingException,
//     RequestLimitExceeded, and the generic Throttling, ThrottledException,
//     RequestThrottledException and TooManyRequestsException, as the SDK's
//     retryer classifies them, or a transaction cancelled for throttling.
//   - Lost races wrap [limiter.ErrConflict]: retries spent or no time left
//     for the next pause, as above (and a failed condition, transaction
//     conflict or multi-Region write conflict no loop retries).
//   - Every other DynamoDB error wraps [ErrUnavailable] (and so
//     [limiter.ErrUnavailable]): network errors, timeouts and cancelled
//     contexts (also a context that ends between lost races), 5xx, a missing
//     table (ResourceNotFoundException), refused credentials or
//     permissions, and any other request the service did not carry out.
//   - An item with a missing attribute or one of the wrong type gives an
//     error wrapping [limiter.ErrCorruptState] naming the key and attribute;
//     the store never resets it to a full bucket or an empty window.
//     Conditions check the types of what a write updates in place, so a
//     damaged item fails the condition and is read back and reported,
//     rather than failing the request.
//
// The original error stays in the chain (errors.As finds the SDK's types).
// The only other errors are the caller's: an op with bad numbers, and a log
// that would outgrow its item ([ErrItemTooLarge]).
//
// The store's requests use [NewRetryer] (Config.Retryer) instead of the
// client's retryer: the SDK's standard retryer with 3 attempts, a 5-50 ms
// full-jitter backoff (the SDK default backs off up to 20 s) and no retry
// started with less than the maximum backoff left before the deadline, so a
// throttled request fails with its throttling error well within the
// deadline.
//
// The client's HTTP transport is the caller's; [NewHTTPClient] builds one
// bounded by the deadline (the authorizer uses it): connect and TLS
// handshake timeouts of the deadline, at most [MaxConnsPerHost] connections
// to the endpoint (dialing, in use and idle together), idle ones closed
// after [IdleConnTimeout]. With the SDK's default transport (30 s connect
// timeout, no useful per-host bound) a stalled endpoint makes the open
// connections grow with the request rate: each request whose deadline
// passes leaves its dial running. A circuit breaker in front of the store
// (backends/breaker) stops the calls altogether during an outage.
//
// # Regions
//
// Conditional writes and ADD are atomic within one region. With a global
// table in the default (asynchronous, last writer wins) mode, each region
// enforces its limit separately; see the infra documentation for the modes.
package dynamo
