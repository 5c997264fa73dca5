package accuracy

import (
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/storage"
)

// The tests use shorter traces than the report (the report's take seconds;
// `make test` runs under the race detector on small machines).

// testTraces returns short traces of every kind, for seeds seed..seed+n-1,
// plus the sample file.
func testTraces(t *testing.T, p Params, seed uint64, n int) []Trace {
	t.Helper()
	var trs []Trace
	for s := seed; s < seed+uint64(n); s++ {
		trs = append(trs,
			Steady(p, 1.5, 10*p.Window, s),
			Bursty(p, 20*p.Window, s),
			EdgeStart(p, 3, s),
			EdgeEnd(p, 3, s),
		)
	}
	f, err := os.Open("testdata/sample.txt")
	if err != nil {
		t.Fatalf("sample trace: %v", err)
	}
	defer f.Close()
	tr, err := ReadTrace("sample.txt", f)
	if err != nil {
		t.Fatalf("sample trace: %v", err)
	}
	return append(trs, tr)
}

// TestExactLogIsExact tests the reference before anything is measured
// against it: on every trace, limiter.SlidingLog makes the decisions of an
// independent exact sliding window (ExactAdmits), admits exactly the limit
// in its worst window (every test trace saturates it), never takes a window
// above the limit and never denies while a window has room.
func TestExactLogIsExact(t *testing.T) {
	for _, p := range []Params{DefaultParams, {Limit: 7, Window: 10 * time.Second}, {Limit: 300, Window: time.Hour}} {
		for _, tr := range testTraces(t, p, 1, 3) {
			res, err := Simulate(tr, p, Config{Algorithm: Log})
			if err != nil {
				t.Fatal(err)
			}
			admitted := ExactAdmits(tr.Times, p.Limit, p.Window)
			if len(admitted) != len(res.Admits) {
				t.Fatalf("%v, %s: the log admitted %d, an exact window %d", p, tr.Name, len(res.Admits), len(admitted))
			}
			for i := range admitted {
				if admitted[i] != res.Admits[i] {
					t.Fatalf("%v, %s: admission %d at %d, an exact window's at %d", p, tr.Name, i, res.Admits[i], admitted[i])
				}
			}
			// The log's stored size, tracked incrementally, is the largest
			// storage.AppendLog of the entries in view, plus a format byte.
			maxLen, head := 0, 0
			for i, a := range admitted {
				for admitted[head] <= a-int64(p.Window) {
					head++
				}
				maxLen = max(maxLen, 1+len(storage.AppendLog(nil, admitted[head:i+1])))
			}
			if res.Memcached.ValueLen != maxLen {
				t.Errorf("%v, %s: log value of %d bytes, AppendLog says %d", p, tr.Name, res.Memcached.ValueLen, maxLen)
			}
			if res.WorstWindow != p.Limit || res.Excess != 0 || res.Needless != 0 {
				t.Errorf("%v, %s: worst window %d (want the limit %d), excess %d, needless %d (want 0, 0)",
					p, tr.Name, res.WorstWindow, p.Limit, res.Excess, res.Needless)
			}
		}
	}
}

func TestWindowCounts(t *testing.T) {
	s := int64(time.Second)
	ts := []int64{0, s, s, 2 * s, 5 * s}
	tests := []struct {
		at   int64
		want int64
	}{
		{at: -1, want: 0},
		{at: 0, want: 1},
		{at: s, want: 3},
		{at: 2 * s, want: 4},
		{at: 3 * s, want: 3}, // (0, 3s]: 0 is out
		{at: 4 * s, want: 1}, // (s, 4s]
		{at: 5 * s, want: 1},
		{at: 8 * s, want: 0},
	}
	for _, tt := range tests {
		if got := windowCounts(ts, []int64{tt.at}, 3*s)[0]; got != tt.want {
			t.Errorf("count in (%d-3s, %d] = %d, want %d", tt.at, tt.at, got, tt.want)
		}
	}
}

// TestMetrics checks Simulate's metrics on a hand-made trace: the fixed
// window admits twice its limit across a window mark.
func TestMetrics(t *testing.T) {
	p := Params{Limit: 2, Window: time.Minute}
	at := func(d time.Duration) int64 { return Epoch.Add(d).UnixNano() }
	tr := Trace{Name: "mark", Times: []int64{
		at(59 * time.Second), at(59 * time.Second), at(59 * time.Second), // the third is denied: the window has 2
		at(61 * time.Second), at(61 * time.Second), // a new fixed window: both allowed, 4 in (1s, 61s]
		at(62 * time.Second), // denied by the fixed window, with 4 in view: not needless
	}}
	res, err := Simulate(tr, p, Config{Algorithm: Fixed})
	if err != nil {
		t.Fatal(err)
	}
	if res.Admitted != 4 || res.WorstWindow != 4 || res.Overshoot(p) != 2 || res.Excess != 2 || res.Needless != 0 {
		t.Errorf("fixed window: admitted %d, worst %d, overshoot %v, excess %d, needless %d; want 4, 4, 2, 2, 0",
			res.Admitted, res.WorstWindow, res.Overshoot(p), res.Excess, res.Needless)
	}
	// Bounded k=1 counts the previous minute's counter in full: at 61.5s
	// the two requests of 1s have left the window but still count, a
	// needless denial; at 121s their counter has left the view.
	tr.Times = []int64{at(time.Second), at(time.Second), at(61500 * time.Millisecond), at(121 * time.Second)}
	res, err = Simulate(tr, p, Config{Algorithm: Bounded, SubWindows: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Admitted != 3 || res.WorstWindow != 2 || res.Excess != 0 || res.Needless != 1 {
		t.Errorf("bounded k=1: admitted %d, worst %d, excess %d, needless %d; want 3, 2, 0, 1", res.Admitted, res.WorstWindow, res.Excess, res.Needless)
	}
	if got := res.StoreCalls; got != 4+1 { // an Add per request, a Sub per denial
		t.Errorf("bounded k=1: %d store calls, want 5", got)
	}
}
