package dynamo_test

import (
	"testing"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// TestConformanceWaitRefunds runs the conformance suite with the batch's
// refunds waited for (Config.WaitRefunds); TestConformance runs it with
// the default, refunds sent without waiting.
func TestConformanceWaitRefunds(t *testing.T) {
	s, r, _ := newStore(t, dynamo.Config{WaitRefunds: true})
	limitertest.Run(t, limitertest.BucketsAtStamp(s))
	st := s.Stats()
	t.Logf("%d requests; %d conflicts, %d lost refunds", r.load(), st.Conflicts, st.LostRefunds)
}
