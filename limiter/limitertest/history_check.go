package limitertest

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/sluicehq/sluice/limiter"
)

// Call is one recorded limiter call of a history.
type Call struct {
	// Worker is the goroutine that made the call.
	Worker int
	// Key is the limiter key (the caller's, not the store's).
	Key string
	// Stamp is the time passed to the limiter.
	Stamp time.Time
	// Cost is the number of units asked for.
	Cost int64
	// Start and End bound the call in real time: monotonic durations since
	// the run began, read just before the call and just after it returned.
	Start, End time.Duration
	// Reached tells that the call was handed to the store under test, at
	// Arrived (since the run began; after Start, once its delay was over),
	// and that the store last returned at Returned (before End): the call
	// took effect in between. When the store reported its requests (see
	// [Narrow]), they bound its last request instead. A call that failed
	// without reaching the store had no effect.
	Reached           bool
	Arrived, Returned time.Duration
	// Late tells that one of the call's store calls arrived after one
	// stamped newer; PastHorizon that one may have taken effect more than
	// the store contract's horizon behind the newest; Idle that a bucket
	// call reached a key idle for half its TTL or more (see
	// [ArrivalStats]).
	Late, PastHorizon, Idle bool
	// Allowed and Remaining are the decision's.
	Allowed   bool
	Remaining int64
	// Cached marks a denial answered by the limit's deny cache, without a
	// store request: the model must deny the call too, at a point between
	// Start and End, and it changes nothing; its Remaining is not the
	// store's and is not checked.
	Cached bool
	// Err is the call's error; a call that failed was not admitted, but
	// may or may not have changed the store.
	Err error
}

// Violation is a window of stamps in which a history admitted more units
// than the limit.
type Violation struct {
	Key string
	// From and To bound the window of stamps: [From, To) for a calendar
	// window, (From, To] for a trailing window.
	From, To time.Time
	Trailing bool
	// Units is the sum of the costs of the admitted calls stamped in the
	// window, Calls their number.
	Units, Limit int64
	Calls        int
	// PastHorizon counts the admitted calls in the window that reached the
	// store past the contract's horizon, where it promises no exactness.
	PastHorizon int
}

func (v Violation) String() string {
	const f = "15:04:05.000000"
	s := fmt.Sprintf("key %q: %d units admitted (%d calls) with stamps in the calendar window [%s, %s), limit %d (+%d)",
		v.Key, v.Units, v.Calls, v.From.UTC().Format(f), v.To.UTC().Format(f), v.Limit, v.Units-v.Limit)
	if v.Trailing {
		s = fmt.Sprintf("key %q: %d units admitted (%d calls) with stamps in the trailing window (%s, %s], limit %d (+%d)",
			v.Key, v.Units, v.Calls, v.From.UTC().Format(f), v.To.UTC().Format(f), v.Limit, v.Units-v.Limit)
	}
	if v.PastHorizon > 0 {
		s += fmt.Sprintf(" (%d of them past the horizon)", v.PastHorizon)
	}
	return s
}

func countPastHorizon(cs []Call) int {
	n := 0
	for _, c := range cs {
		if c.PastHorizon {
			n++
		}
	}
	return n
}

// admitted returns, per key, the admitted calls sorted by stamp.
func admitted(calls []Call) map[string][]Call {
	m := map[string][]Call{}
	for _, c := range calls {
		if c.Allowed && c.Err == nil {
			m[c.Key] = append(m[c.Key], c)
		}
	}
	for _, cs := range m {
		// By UnixNano, the limiter's time base: Time.Compare would use the
		// monotonic reading, which can order two wall-clock stamps
		// differently from their Unix times while the clock is slewed.
		slices.SortStableFunc(cs, func(a, b Call) int { return cmp.Compare(a.Stamp.UnixNano(), b.Stamp.UnixNano()) })
	}
	return m
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// CheckFixedWindow checks a [limiter.FixedWindow] history against the exact
// model: the units admitted per key with stamps in one calendar window
// (windows of length window from the Unix epoch) never exceed limit. It
// returns one Violation per window over the limit.
//
// why hand-written: a limit over windows of stamps is a property of the
// admitted set, not a sequential specification a linearizability checker
// takes; a sum per window is all it needs.
func CheckFixedWindow(calls []Call, limit int64, window time.Duration) []Violation {
	var out []Violation
	byKey := admitted(calls)
	for _, key := range sortedKeys(byKey) {
		cs := byKey[key]
		for i := 0; i < len(cs); {
			idx := floorDiv(cs[i].Stamp.UnixNano(), int64(window))
			var units int64
			j := i
			for ; j < len(cs) && floorDiv(cs[j].Stamp.UnixNano(), int64(window)) == idx; j++ {
				units += cs[j].Cost
			}
			if units > limit {
				from := time.Unix(0, idx*int64(window))
				out = append(out, Violation{Key: key, From: from, To: from.Add(window), Units: units, Limit: limit, Calls: j - i,
					PastHorizon: countPastHorizon(cs[i:j])})
			}
			i = j
		}
	}
	return out
}

// CheckTrailingWindow checks a bounded [limiter.SlidingWindow] or
// [limiter.SlidingLog] history against the exact model: for every admitted
// call at stamp t, the units admitted per key with stamps in (t-window, t]
// never exceed limit. (Any interval of length window holds no more admitted
// units than the trailing window ending at its last admitted stamp, so this
// covers every window of stamps.) Overlapping trailing windows over the
// limit are reported once, by the worst of them.
//
// why hand-written: as for [CheckFixedWindow]; two pointers over the
// admitted calls sorted by stamp.
func CheckTrailingWindow(calls []Call, limit int64, window time.Duration) []Violation {
	var out []Violation
	byKey := admitted(calls)
	for _, key := range sortedKeys(byKey) {
		cs := byKey[key]
		var (
			units  int64
			lo, hi int // cs[lo:hi] is the trailing window
			worst  *Violation
		)
		for i := 0; i < len(cs); {
			t := cs[i].Stamp.UnixNano()
			for hi < len(cs) && cs[hi].Stamp.UnixNano() <= t {
				units += cs[hi].Cost
				hi++
			}
			for cs[lo].Stamp.UnixNano() <= t-int64(window) {
				units -= cs[lo].Cost
				lo++
			}
			if units > limit {
				if worst == nil || units > worst.Units {
					worst = &Violation{Key: key, From: time.Unix(0, t-int64(window)), To: time.Unix(0, t), Trailing: true,
						Units: units, Limit: limit, Calls: hi - lo, PastHorizon: countPastHorizon(cs[lo:hi])}
				}
			} else if worst != nil {
				out = append(out, *worst)
				worst = nil
			}
			i = hi
		}
		if worst != nil {
			out = append(out, *worst)
		}
	}
	return out
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// bucketModelState is the serialized bucket of the model.
type bucketModelState struct {
	exists  bool
	tokens  int64
	updated int64 // Unix ns of the last refill accounting
}

// bucketInput is one AllowN: its stamp and cost; unknown marks a call that
// failed (it may or may not have happened), idle one that may have found
// the bucket expired.
type bucketInput struct {
	stamp   int64
	n       int64
	unknown bool
	idle    bool
	cached  bool
}

type bucketOutput struct {
	allowed   bool
	remaining int64
}

// bucketStep is Smyte's bucket, serialized, written from the documentation
// of [limiter.TokenBucket] and [storage.BucketOp]: a new bucket starts full
// at its first stamp; every whole RefillTime since the last refill adds
// RefillAmount (capped at MaxAmount) and the time left over is kept; a stamp
// behind the last refill refills nothing and moves nothing back; a take of n
// succeeds if n tokens are there; in strict mode a denial with a stamp newer
// than the last refill restarts the refill timer at the stamp. It returns
// the next state and the decision (allowed, tokens left).
//
// why hand-written: the history check needs an oracle independent of the
// code under test, so it does not call storage.BucketOp.Apply.
func bucketStep(cfg limiter.TokenBucketConfig, s bucketModelState, stamp, n int64) (bucketModelState, bucketOutput) {
	amount := cfg.RefillAmount
	if amount == 0 {
		amount = 1
	}
	period := int64(cfg.RefillTime)
	if !s.exists {
		s = bucketModelState{exists: true, tokens: cfg.MaxAmount, updated: stamp}
	}
	if stamp > s.updated {
		if k := (stamp - s.updated) / period; k > 0 {
			missing := cfg.MaxAmount - s.tokens
			if missing > 0 {
				if k > missing/amount { // k*amount >= missing, without overflow
					s.tokens = cfg.MaxAmount
				} else {
					s.tokens = min(cfg.MaxAmount, s.tokens+k*amount)
				}
			}
			s.updated += k * period
		}
	}
	var out bucketOutput
	switch {
	case n <= s.tokens:
		s.tokens -= n
		out.allowed = true
	case cfg.Strict && stamp > s.updated:
		s.updated = stamp
	}
	out.remaining = s.tokens
	return s, out
}

// bucketModel is the porcupine model of one key's bucket. A failed call
// (unknown) may have happened or not, and an idle one may have found the
// bucket expired (a new, full bucket at its stamp): both need the
// nondeterministic form; histories without them use the deterministic one.
func bucketModel(cfg limiter.TokenBucketConfig, choices bool) porcupine.Model {
	partition := func(history []porcupine.Operation) [][]porcupine.Operation {
		idx := map[string]int{}
		var parts [][]porcupine.Operation
		for _, op := range history {
			key := op.Metadata.(callRef).key
			i, ok := idx[key]
			if !ok {
				i = len(parts)
				idx[key] = i
				parts = append(parts, nil)
			}
			parts[i] = append(parts[i], op)
		}
		return parts
	}
	hash := func(st any) uint64 {
		s := st.(bucketModelState)
		h := uint64(s.tokens)*0x9e3779b97f4a7c15 ^ uint64(s.updated)
		if s.exists {
			h ^= 1 << 63
		}
		return h
	}
	describeOp := func(in, out any) string {
		i, o := in.(bucketInput), out.(bucketOutput)
		if i.unknown {
			return fmt.Sprintf("AllowN(stamp %d, n %d) -> failed", i.stamp, i.n)
		}
		if i.cached {
			return fmt.Sprintf("AllowN(stamp %d, n %d) -> allowed %v from the deny cache", i.stamp, i.n, o.allowed)
		}
		return fmt.Sprintf("AllowN(stamp %d, n %d) -> allowed %v, remaining %d", i.stamp, i.n, o.allowed, o.remaining)
	}
	describeState := func(st any) string {
		s := st.(bucketModelState)
		if !s.exists {
			return "no bucket"
		}
		return fmt.Sprintf("%d tokens, refilled up to %d", s.tokens, s.updated)
	}
	if !choices {
		return porcupine.Model{
			Partition: partition,
			Init:      func() any { return bucketModelState{} },
			Step: func(st, in, out any) (bool, any) {
				i := in.(bucketInput)
				next, o := bucketStep(cfg, st.(bucketModelState), i.stamp, i.n)
				if i.cached { // the model must deny it too; nothing changed
					return !o.allowed && !out.(bucketOutput).allowed, st
				}
				return o == out.(bucketOutput), next
			},
			Hash:              hash,
			DescribeOperation: describeOp,
			DescribeState:     describeState,
		}
	}
	nm := porcupine.NondeterministicModel{
		Partition: partition,
		Init:      func() []any { return []any{bucketModelState{}} },
		Step: func(st, in, out any) []any {
			s := st.(bucketModelState)
			return bucketChoices(s, s.exists, bucketModelState{}, in.(bucketInput), out.(bucketOutput),
				func(from bucketModelState, i bucketInput) (bucketModelState, bucketOutput) {
					return bucketStep(cfg, from, i.stamp, i.n)
				})
		},
		Equal:             func(a, b any) bool { return a == b },
		Hash:              hash,
		DescribeOperation: describeOp,
		DescribeState:     describeState,
	}
	return nm.ToModel()
}

// bucketChoices is the nondeterministic step of a bucket model from state s
// (exists: it holds a bucket; expired: the state of a key that holds none):
// an idle call may also start from expired, a failed one may or may not
// have happened, a cached denial must be a denial of the model that changes
// nothing, and any other call must give its output.
func bucketChoices[S any](s S, exists bool, expired S, i bucketInput, out bucketOutput, step func(S, bucketInput) (S, bucketOutput)) []any {
	var next []any
	starts := []S{s}
	if i.idle && exists {
		starts = append(starts, expired)
	}
	for _, from := range starts {
		n, o := step(from, i)
		switch {
		case i.cached:
			if !o.allowed && !out.allowed {
				next = append(next, from)
			}
		case i.unknown:
			next = append(next, n, from)
		case o == out:
			next = append(next, n)
		}
	}
	return next
}

// errCheckTimeout is wrapped when the linearizability check found no
// verdict in time.
var errCheckTimeout = errors.New("limitertest: the linearizability check timed out")

// CheckTokenBucket checks a [limiter.TokenBucket] history (AllowN calls
// only) for linearizability against a serialized Smyte bucket, with
// porcupine: is there, per key, an order of the calls consistent with their
// real times (a call that ended before another started comes first) in
// which the model gives every call's decision (allowed and remaining)? A
// call is placed no earlier than when it reached the store and no later than
// when the store returned (Arrived and Returned, when Reached; else Start
// and End). A store may drop a bucket its TTL after the last write (it is
// full by then, but its refill timer restarts): a call marked Idle (it
// reached a key no call had reached for half the TTL) may find a new, full
// bucket at its stamp. A failed call that reached the store may
// or may not have happened and is open until the end; one that did not
// reach it is left out. It
// returns nil when the history is linearizable, and an error naming the key
// and the longest explainable prefix otherwise. A check that finds no
// verdict within timeout is an error too: it proves nothing.
func CheckTokenBucket(calls []Call, cfg limiter.TokenBucketConfig, timeout time.Duration) error {
	ops := bucketOps(calls)
	choices := false
	for _, c := range calls {
		choices = choices || (c.Err == nil || c.Reached) && (c.Err != nil || c.Idle) // as bucketOps keeps it
	}
	model := bucketModel(cfg, choices)
	res := porcupine.CheckOperationsTimeout(model, ops, timeout)
	return bucketVerdict(res, func() string { return explainBucket(model, ops, timeout) }, len(ops), timeout)
}

// callRef names an operation of a bucket history: its key (the partition)
// and its index in the history.
type callRef struct {
	key string
	id  int
}

// bucketVerdict turns porcupine's result into an error; explain describes an
// illegal history.
func bucketVerdict(res porcupine.CheckResult, explain func() string, n int, timeout time.Duration) error {
	switch res {
	case porcupine.Ok:
		return nil
	case porcupine.Illegal:
		return fmt.Errorf("token bucket history of %d calls is not linearizable: no order consistent with the calls' real times explains the decisions; %s", n, explain())
	default:
		return fmt.Errorf("%w after %v on %d calls (result %q): no verdict is a failure, not a pass", errCheckTimeout, timeout, n, res)
	}
}

// explainBucket finds, key by key, the first that is not linearizable and
// describes its longest explainable prefix and the calls that follow it.
//
// why hand-written: porcupine reports an illegal history as an HTML
// visualization; a test log needs a few lines of words.
func explainBucket(model porcupine.Model, ops []porcupine.Operation, timeout time.Duration) string {
	for _, part := range model.Partition(ops) {
		res, info := porcupine.CheckOperationsVerbose(model, part, timeout)
		if res != porcupine.Illegal {
			continue
		}
		key := part[0].Metadata.(callRef).key
		var longest []porcupine.Operation
		for _, lin := range info.PartialLinearizationsOperations() {
			for _, seq := range lin {
				if len(seq) > len(longest) {
					longest = seq
				}
			}
		}
		var b strings.Builder
		fmt.Fprintf(&b, "key %q (%d calls): the longest explainable prefix has %d calls", key, len(part), len(longest))
		state := model.Init()
		for _, op := range longest {
			_, state = model.Step(state, op.Input, op.Output)
		}
		from := max(len(longest)-3, 0)
		for _, op := range longest[from:] {
			fmt.Fprintf(&b, "; ... %s [call %v, return %v]", model.DescribeOperation(op.Input, op.Output), time.Duration(op.Call), time.Duration(op.Return))
		}
		fmt.Fprintf(&b, "; model state after it: %s", describeModelState(model, state))
		// The calls that could come next (called before any remaining call
		// returned) and that the model rejects from that state.
		in := map[int]bool{}
		for _, op := range longest {
			in[op.Metadata.(callRef).id] = true
		}
		firstReturn := int64(math.MaxInt64)
		for _, op := range part {
			if !in[op.Metadata.(callRef).id] {
				firstReturn = min(firstReturn, op.Return)
			}
		}
		shown := 0
		for _, op := range part {
			if in[op.Metadata.(callRef).id] || op.Call > firstReturn || shown == 3 {
				continue
			}
			if ok, _ := model.Step(state, op.Input, op.Output); !ok {
				fmt.Fprintf(&b, "; rejected next: %s [call %v, return %v]", model.DescribeOperation(op.Input, op.Output), time.Duration(op.Call), time.Duration(op.Return))
				shown++
			}
		}
		return b.String()
	}
	return "(the per-key recheck found no illegal key within the timeout)"
}

func describeModelState(model porcupine.Model, st any) string {
	if model.DescribeState == nil {
		return fmt.Sprint(st)
	}
	return model.DescribeState(st)
}
