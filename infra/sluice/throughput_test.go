package sluice_test

import (
	"testing"
)

// TestTableThroughput: a created table is on demand with AWS's defaults
// unless TableThroughput sets its warm throughput (WarmThroughput) and
// maximum (WriteOnDemandThroughputSettings on the table,
// ReadOnDemandThroughputSettings on each replica).
func TestTableThroughput(t *testing.T) {
	stacks := synth(t)
	for name, want := range map[string]struct{ warm, maxWrite, maxRead string }{
		"RestUser":     {"", "", ""},
		"RestExplicit": {`{"ReadUnitsPerSecond":24000,"WriteUnitsPerSecond":8000}`, `{"MaxWriteRequestUnits":10000}`, `{"MaxReadRequestUnits":30000}`},
	} {
		s := stacks[name]
		p := s.res[tableID(t, s, "RateLimit")].Properties
		if p["BillingMode"] != "PAY_PER_REQUEST" {
			t.Errorf("%s: billing %v", name, p["BillingMode"])
		}
		if got := renderOrEmpty(p["WarmThroughput"]); got != want.warm {
			t.Errorf("%s: WarmThroughput %s, want %q", name, got, want.warm)
		}
		if got := renderOrEmpty(p["WriteOnDemandThroughputSettings"]); got != want.maxWrite {
			t.Errorf("%s: WriteOnDemandThroughputSettings %s, want %q", name, got, want.maxWrite)
		}
		replicas := asList(p["Replicas"])
		if len(replicas) != 1 {
			t.Fatalf("%s: replicas %v", name, replicas)
		}
		if got := renderOrEmpty(replicas[0].(map[string]any)["ReadOnDemandThroughputSettings"]); got != want.maxRead {
			t.Errorf("%s: replica ReadOnDemandThroughputSettings %s, want %q", name, got, want.maxRead)
		}
	}
}

func renderOrEmpty(v any) string {
	if v == nil {
		return ""
	}
	return render(v)
}
