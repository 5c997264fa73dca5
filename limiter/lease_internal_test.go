package limiter

import (
	"testing"
	"time"
)

// A lease is sized by the key's store round trip as well as its rate: on
// a store a few milliseconds away a key deciding 5 a second is cold
// (under minLease), on one 45 ms away (a cross-region write) it leases a
// few units, and a hot key's lease lives at least leaseRoundTrips round
// trips. Each row fails without the round trip in want.
func TestLeaseWantRoundTrip(t *testing.T) {
	const sec = int64(time.Second)
	for _, tc := range []struct {
		name string
		rate float64 // decisions a second, steadily, for 2 s
		rtt  time.Duration
		want int64
	}{
		{"cold, regional", 5, 2 * time.Millisecond, 1},
		{"cold, cross-region", 5, 45 * time.Millisecond, 5}, // 5 a second for MaxLeaseLife
		{"cold, unmeasured", 5, 0, 1},
		{"hot, regional", 200, 2 * time.Millisecond, 20},             // 16 decisions, at least minLeaseLife
		{"hot, cross-region", 200, 45 * time.Millisecond, 72},        // 8 round trips
		{"hot, slow cross-region", 200, 300 * time.Millisecond, 200}, // MaxLeaseLife
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLeaser(1 << 20)
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
				t.Errorf("want = %d, want about %d (rate %.0f/s, round trip %v)", got, tc.want, tc.rate, tc.rtt)
			}
		})
	}
}

// The minimum lease falls from minLease to 2 as the round trip grows.
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
}
