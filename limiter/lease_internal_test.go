package limiter

import (
	"testing"
	"time"
)

// farStore is a store that says its writes cross regions.
type farStore struct{}

func (farStore) WritesCrossRegions() bool { return true }

// A lease on a store whose writes cross regions is sized by the key's
// store round trip as well as its rate: a key deciding 5 a second is cold
// (under minLease) on a store a few milliseconds away, and leases a few
// units on one 45 ms away; a hot key's lease lives at least
// leaseRoundTrips round trips. On a regional store (one that does not
// say its writes cross regions) the same round trips change nothing: a
// slow regional store is sized by the rate alone. Each far row with a
// round trip above a few milliseconds fails without the rule, each
// regional row with it applied to every store.
func TestLeaseWantRoundTrip(t *testing.T) {
	const sec = int64(time.Second)
	for _, tc := range []struct {
		name string
		far  bool
		rate float64 // decisions a second, steadily, for 2 s
		rtt  time.Duration
		want int64
	}{
		{"cold, regional", false, 5, 2 * time.Millisecond, 1},
		{"cold, slow regional", false, 5, 300 * time.Millisecond, 1},
		{"hot, slow regional", false, 200, 300 * time.Millisecond, 20}, // 16 decisions, at least minLeaseLife
		{"cold, far, near", true, 5, 2 * time.Millisecond, 1},
		{"cold, cross-region", true, 5, 45 * time.Millisecond, 5}, // 5 a second for MaxLeaseLife
		{"cold, far, unmeasured", true, 5, 0, 1},
		{"hot, far, near", true, 200, 2 * time.Millisecond, 20},
		{"hot, cross-region", true, 200, 45 * time.Millisecond, 72},        // 8 round trips
		{"hot, slow cross-region", true, 200, 300 * time.Millisecond, 200}, // MaxLeaseLife
	} {
		t.Run(tc.name, func(t *testing.T) {
			var store any
			if tc.far {
				store = farStore{}
			}
			l := newLeaser(1<<20, store)
			if l.far != tc.far {
				t.Fatalf("far = %v, want %v", l.far, tc.far)
			}
			const key = "k"
			t0 := int64(1000 * sec)
			step := int64(float64(sec) / tc.rate)
			now := t0
			for ; now < t0+2*sec; now += step {
				l.spend(key, now, 1)
			}
			l.took(key, now, 1, 1, 0, now+10*sec, 0, Decision{Allowed: true, Remaining: 1 << 20})
			if tc.rtt > 0 {
				l.roundTrip(key, now, tc.rtt)
			}
			got := l.want(key, now, 1, now+10*sec)
			// The rate estimate decays between decisions: within 10%.
			if lo, hi := tc.want*9/10, tc.want*11/10+1; got < lo || got > hi {
				t.Errorf("want = %d, want about %d (rate %.0f/s, round trip %v, far %v)", got, tc.want, tc.rate, tc.rtt, tc.far)
			}
		})
	}
}

// Near the limit a far key's lease does not grow to its round trips: a
// longer lease would only hold units the other processes are denied.
func TestLeaseWantRoundTripNearLimit(t *testing.T) {
	const sec = int64(time.Second)
	l := newLeaser(1<<20, farStore{})
	const key = "k"
	now := int64(1000 * sec)
	for end := now + 2*sec; now < end; now += sec / 200 {
		l.spend(key, now, 1)
	}
	// 200 a second: 8 round trips of 45 ms are 72 units, above an eighth
	// of 400; the lease stays sized by the rate (16 decisions: 20 units,
	// minLeaseLife).
	l.took(key, now, 1, 1, 0, now+10*sec, 0, Decision{Allowed: true, Remaining: 400})
	l.roundTrip(key, now, 45*time.Millisecond)
	if got := l.want(key, now, 1, now+10*sec); got < 18 || got > 23 {
		t.Errorf("want = %d, want about 20 (sized by the rate: 8 round trips would not fit an eighth of 400)", got)
	}
}

// A hot key's lease is leaseDecisions units at any rate whose 16
// decisions take from minLeaseLife to MaxLeaseLife: the life is
// leaseDecisions/rate, rounded down to whole nanoseconds, and truncating
// rate*life made 15 units of it (a take every 15 decisions, not 16:
// TestLeasesHotKeyCapped/bucket's takes were 0.068 a decision).
func TestLeaseWantWholeDecisions(t *testing.T) {
	const sec = int64(time.Second)
	for _, rate := range []float64{20, 50, 62.5, 100, 150} {
		l := newLeaser(1<<20, nil)
		now := int64(1000 * sec)
		step := int64(float64(sec) / rate)
		for end := now + 2*sec; now < end; now += step {
			l.spend("k", now, 1)
		}
		l.took("k", now, 1, 1, 0, now+10*sec, 0, Decision{Allowed: true, Remaining: 1 << 20})
		// The lease may be spent for 10 s: its life is the rate's alone.
		if got := l.want("k", now, 1, now+10*sec); got != leaseDecisions {
			t.Errorf("%v a second: want = %d, want %d (rate estimate %.2f)", rate, got, leaseDecisions, l.shard("k").m["k"].rate())
		}
	}
}

// The minimum lease falls from minLease to 2 as a far key's round trip
// grows; a regional key's round trip is never recorded.
func TestLeaseMinimumRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		rtt  time.Duration
		want int64
	}{{0, minLease}, {time.Millisecond, minLease}, {14 * time.Millisecond, minLease}, {20 * time.Millisecond, 6},
		{45 * time.Millisecond, 3}, {100 * time.Millisecond, 2}, {time.Second, 2}} {
		k := &leaseKey{rtt: tc.rtt}
		if got := k.minLease(); got != tc.want {
			t.Errorf("round trip %v: minimum lease %d, want %d", tc.rtt, got, tc.want)
		}
	}
	l := newLeaser(1<<20, nil)
	l.spend("k", 1, 1)
	l.roundTrip("k", 1, time.Second)
	if k := l.shard("k").m["k"]; k.rtt != 0 || k.minLease() != minLease {
		t.Errorf("a regional key's round trip %v, minimum lease %d: want 0, %d", k.rtt, k.minLease(), minLease)
	}
}

// backlogCalls runs one process's decisions on a window key's leases, as
// Decide does (spend, else want and a store step that grants all it
// asks): 100 a second, evenly, from a slot's start until pause+30 ms
// before its end; then a pause, and the calls that queued meanwhile (one
// per 10 ms) answered 20 µs apart, 30 ms before the slot's end (as a
// process paused on a loaded host or by a long GC). It returns the store
// steps of the steady part and of the backlog.
func backlogCalls(t *testing.T, pause time.Duration) (steady, backlog int) {
	t.Helper()
	const sec = int64(time.Second)
	sub := 3 * sec // a minute's window in 20 slots
	l := newLeaser(1<<20, nil)
	const key = "k"
	s0 := 1000 * sub
	decide := func(now int64) int {
		if _, _, ok, _ := l.spend(key, now, 1); ok {
			return 0
		}
		ref, end := now/sub, (now/sub+1)*sub
		w := l.want(key, now, 1, end)
		l.took(key, now, 1, w, w, end, ref, Decision{Allowed: true, Limit: 1 << 20, Remaining: 1 << 19})
		return 1
	}
	resume := s0 + sub - 30*int64(time.Millisecond)
	for now := s0; now < resume-int64(pause); now += sec / 100 {
		steady += decide(now)
	}
	for i := range int64(pause / (10 * time.Millisecond)) {
		backlog += decide(resume + i*20*int64(time.Microsecond))
	}
	return steady, backlog
}

// A backlog near the end of a window's slot (a process paused, then
// answering the calls that queued) leases what its run has shown rather
// than sending each call to the store: the rate spread over the 30 ms
// left calls for 3 units, under the smallest lease. The steady calls are
// unchanged by the rule (evenly spaced, they make no run). A pause of a
// second or more is no different: the key leased within a second of its
// last call before the pause.
func TestLeaseBacklogAtSlotEnd(t *testing.T) {
	for _, pause := range []time.Duration{250 * time.Millisecond, 1500 * time.Millisecond} {
		queued := int(pause / (10 * time.Millisecond))
		steady, backlog := backlogCalls(t, pause)
		brokenBacklog = true
		steadyOld, backlogOld := backlogCalls(t, pause)
		brokenBacklog = false
		brokenPause = true
		_, backlogNow := backlogCalls(t, pause)
		brokenPause = false
		t.Logf("pause %v: store steps: steady %d, backlog of %d %d (%d without the backlog rule, %d with it counted from now)",
			pause, steady, queued, backlog, backlogOld, backlogNow)
		if most := 8 + queued/40; backlog > most {
			t.Errorf("pause %v: a backlog of %d calls near the slot's end took %d store steps, want at most %d", pause, queued, backlog, most)
		}
		if steady != steadyOld {
			t.Errorf("pause %v: steady calls took %d store steps, %d without the backlog rule: the rule should not apply", pause, steady, steadyOld)
		}
	}
}
