package contention

import (
	"strings"
	"testing"
	"time"
)

// The checker must fail an over-admitting history, or a benchmark passing
// it proves nothing.
func TestExactnessFailsOverAdmission(t *testing.T) {
	wl := Workload{Name: "cap3", Max: 3, Interval: 10 * time.Millisecond}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	at := func(ms int64, ok bool) Sample { return Sample{Stamp: base + ms*int64(time.Millisecond), Allowed: ok} }

	// Serial Smyte: 3 at once, then one per 10 ms.
	exact := []Sample{at(0, true), at(1, true), at(2, true), at(3, false), at(10, true), at(11, false)}
	allowed, _, serial, worst := Exactness(exact, wl)
	if allowed != 4 || serial != 4 || strings.HasPrefix(worst, "OVER") {
		t.Errorf("exact history: allowed %d, serial %d, worst %q; want 4, 4, no OVER", allowed, serial, worst)
	}

	// A fourth token within the first 10 ms: past max plus the refills.
	over := []Sample{at(0, true), at(1, true), at(2, true), at(3, true), at(4, true)}
	allowed, _, serial, worst = Exactness(over, wl)
	if !strings.HasPrefix(worst, "OVER") {
		t.Errorf("over-admitting history passed the interval check: worst %q", worst)
	}
	if allowed <= serial {
		t.Errorf("over-admitting history: allowed %d not above the serial bucket's %d", allowed, serial)
	}

	// The order of the samples does not matter: they are sorted by stamp.
	shuffled := []Sample{exact[4], exact[0], exact[5], exact[2], exact[1], exact[3]}
	if a, _, s, _ := Exactness(shuffled, wl); a != 4 || s != 4 {
		t.Errorf("shuffled exact history: allowed %d, serial %d; want 4, 4", a, s)
	}
}

func TestPercentileAndErrors(t *testing.T) {
	var ss []Sample
	for i := 1; i <= 100; i++ {
		ss = append(ss, Sample{Took: time.Duration(101-i) * time.Millisecond})
	}
	if p := Percentile(ss, .5); p != 51*time.Millisecond {
		t.Errorf("p50 = %v, want 51ms", p)
	}
	if p := Percentile(ss, .99); p != 100*time.Millisecond {
		t.Errorf("p99 = %v, want 100ms", p)
	}
	ss[7].Err, ss[9].Err = errTest("a"), errTest("b")
	if n, first := Errors(ss); n != 2 || first.Error() != "a" {
		t.Errorf("Errors = %d, %v; want 2, a", n, first)
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }
