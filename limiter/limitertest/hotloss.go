package limitertest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// HotLoss compares a [RunHot]'s decisions, call by call, with what exact
// (a limiter without leases, on a store of its own) decides on the same
// calls replayed in stamp order, one at a time: where the run admitted
// less than exact, and when.
type HotLoss struct {
	// Exact is the units exact admits (ExactAdmitted's figure).
	Exact int64
	// Lost counts, per way of deciding (HotKind) and for process 0 and
	// the others, the calls the run denied and exact admitted; Gained
	// those the run admitted and exact denied.
	Lost, Gained [HotFailed + 1][2]int64
	// Step is the width of the timeline's steps, stamps since the run's
	// first; Admitted and ExactAdmitted are the units admitted in each.
	Step                    time.Duration
	Admitted, ExactAdmitted []int64
	// Span is the time from the first call's stamp to the last's.
	Span time.Duration
}

// HotLossOf replays rep's calls on exact and compares (see [HotLoss]);
// step is the timeline's step.
func HotLossOf(ctx context.Context, exact limiter.Limiter, rep HotReport, step time.Duration) (HotLoss, error) {
	l := HotLoss{Step: step}
	if len(rep.Kinds) != len(rep.Calls) || len(rep.Calls) == 0 {
		return l, fmt.Errorf("limitertest: %d calls, %d kinds", len(rep.Calls), len(rep.Kinds))
	}
	order := make([]int, len(rep.Calls))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return rep.Calls[a].Stamp.Compare(rep.Calls[b].Stamp) })
	first := rep.Calls[order[0]].Stamp
	l.Span = rep.Calls[order[len(order)-1]].Stamp.Sub(first)
	for _, i := range order {
		c, k := rep.Calls[i], rep.Kinds[i]
		if c.Err != nil {
			continue
		}
		d, err := exact.AllowN(ctx, c.Key, c.Stamp, c.Cost)
		if err != nil {
			return l, err
		}
		s := int(c.Stamp.Sub(first) / step)
		for len(l.Admitted) <= s {
			l.Admitted, l.ExactAdmitted = append(l.Admitted, 0), append(l.ExactAdmitted, 0)
		}
		g := min(max(c.Worker, 0), 1)
		if d.Allowed {
			l.Exact += c.Cost
			l.ExactAdmitted[s] += c.Cost
		}
		if c.Allowed {
			l.Admitted[s] += c.Cost
		}
		switch {
		case d.Allowed && !c.Allowed:
			l.Lost[k][g]++
		case !d.Allowed && c.Allowed:
			l.Gained[k][g]++
		}
	}
	return l, nil
}

// String is the comparison on a few lines: the calls lost and gained by
// way of deciding, and the timeline's shortfall (exact less admitted) per
// step and in total.
func (l HotLoss) String() string {
	var b strings.Builder
	names := [...]string{"store", "leased", "cached", "throttled", "failed"}
	b.WriteString("denied here, admitted by exact (process 0 / others):")
	for k, n := range names {
		fmt.Fprintf(&b, " %s %d/%d", n, l.Lost[k][0], l.Lost[k][1])
	}
	b.WriteString("; admitted here, denied by exact:")
	for k, n := range names {
		fmt.Fprintf(&b, " %s %d/%d", n, l.Gained[k][0], l.Gained[k][1])
	}
	fmt.Fprintf(&b, "; stamps span %v; shortfall per %v (exact - admitted, cumulative):", l.Span.Round(time.Millisecond), l.Step)
	var sum int64
	for i := range l.Admitted {
		sum += l.ExactAdmitted[i] - l.Admitted[i]
		fmt.Fprintf(&b, " %d(%d)", l.ExactAdmitted[i]-l.Admitted[i], sum)
	}
	return b.String()
}
