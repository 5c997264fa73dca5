package accuracy

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestReadTrace(t *testing.T) {
	in := `# a comment
2026-11-21T12:00:00Z
1795262400.5

2026-11-21T12:00:00.25+00:00
  1795262399  
1795262400.000000001
`
	tr, err := ReadTrace("in", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC).UnixNano()
	want := []int64{base - int64(time.Second), base, base + 1, base + int64(250*time.Millisecond), base + int64(500*time.Millisecond)}
	if !slices.Equal(tr.Times, want) {
		t.Errorf("times %v, want %v (sorted, exact to the nanosecond)", tr.Times, want)
	}
	if tr.Name != "in" {
		t.Errorf("name %q", tr.Name)
	}
}

func TestReadTraceErrors(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", "no timestamps"},
		{"# only a comment\n", "no timestamps"},
		{"1\nyesterday\n", "line 2"},
		{"1.5.5\n", "line 1"},
		{"-5\n", "line 1"},
		{"1.1234567891\n", "line 1"}, // finer than a nanosecond
		{"99999999999\n", "out of range"},
		{"2026-13-01T00:00:00Z\n", "RFC 3339"},
		{"3000-01-01T00:00:00Z\n", "outside the range"},
	}
	for _, tt := range tests {
		_, err := ReadTrace("bad", strings.NewReader(tt.in))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ReadTrace(%q) = %v, want an error containing %q", tt.in, err, tt.want)
		}
	}
}

// TestTracesAreDeterministic: the same seed gives the same trace, another
// seed another one.
func TestTracesAreDeterministic(t *testing.T) {
	p := DefaultParams
	gens := map[string]func(seed uint64) Trace{
		"steady":     func(s uint64) Trace { return Steady(p, 1.5, time.Hour, s) },
		"bursty":     func(s uint64) Trace { return Bursty(p, time.Hour, s) },
		"edge-start": func(s uint64) Trace { return EdgeStart(p, 3, s) },
		"edge-end":   func(s uint64) Trace { return EdgeEnd(p, 3, s) },
	}
	for name, gen := range gens {
		a, b, c := gen(1), gen(1), gen(2)
		if !slices.Equal(a.Times, b.Times) || a.About != b.About {
			t.Errorf("%s: two traces of seed 1 differ", name)
		}
		if slices.Equal(a.Times, c.Times) {
			t.Errorf("%s: seeds 1 and 2 give the same trace", name)
		}
		if !slices.IsSorted(a.Times) || len(a.Times) == 0 {
			t.Errorf("%s: empty or unsorted", name)
		}
	}
}

func TestTraceShapes(t *testing.T) {
	p := DefaultParams
	w := int64(p.Window)
	start := Epoch.UnixNano()

	st := Steady(p, 1.5, 10*time.Hour, 1)
	if rate := float64(len(st.Times)) / 600; rate < 1.5*100*0.97 || rate > 1.5*100*1.03 {
		t.Errorf("steady: %.1f requests per minute, want about 150", rate)
	}

	// Bursty: rates of on periods between 0.2x and 6x, silences between.
	bt := Bursty(p, 24*time.Hour, 1)
	peak, quiet := int64(0), 0
	counts := windowCounts(bt.Times, bt.Times, w)
	for i, c := range counts {
		peak = max(peak, c)
		if i > 0 && bt.Times[i]-bt.Times[i-1] > w {
			quiet++
		}
	}
	if peak < 4*p.Limit || peak > 7*p.Limit {
		t.Errorf("bursty: busiest window holds %d requests, want between 4x and 7x the limit", peak)
	}
	if quiet < 50 {
		t.Errorf("bursty: %d silences longer than a window in a day, want many", quiet)
	}

	// The edge bursts sit at the start and at the end of a window.
	for _, tc := range []struct {
		tr     Trace
		lo, hi int64 // burst bounds, offsets in a 4-window cycle
	}{
		{EdgeStart(p, 5, 1), 0, w / 60},
		{EdgeEnd(p, 5, 1), w - w/60, w},
	} {
		for c := int64(0); c < 5; c++ {
			n := int64(0)
			for _, x := range tc.tr.Times {
				if off := x - start - c*4*w; off >= tc.lo && off < tc.hi {
					n++
				}
			}
			if n != p.Limit {
				t.Errorf("%s cycle %d: %d requests in the burst, want %d", tc.tr.Name, c, n, p.Limit)
			}
		}
	}
}
