package authz

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/functions/dev/golden"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

var update = flag.Bool("update", false, "rewrite events/golden/*.json from the handler's results")

// newGoldenHandler is the handler golden runs use: the embedded rules, the
// memory store, the clock frozen at golden.Clock, metrics to stdout. It is
// built here, not by package wiring (which functions/authorizer's
// TestBootstrapGolden exercises through the built binary), so that this
// package's tests need no backend but memory.
func newGoldenHandler(t testing.TB, stdout io.Writer) *Handler {
	t.Helper()
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Load(DefaultRules, policy.Options{Stores: map[string]storage.Store{"memory": mem}, DefaultBackend: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	now := golden.Clock
	h, err := New(Config{
		Policy:  p,
		Clock:   limiter.ClockFunc(func() time.Time { return now }),
		Metrics: NewMetrics(stdout, ""),
	})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// invoke runs the event through h as lambda.Start would: the response
// marshalled to JSON, or the error as the Runtime API reports it.
func invoke(h *Handler, event []byte) *golden.Result {
	resp, err := h.Handle(context.Background(), json.RawMessage(event))
	if err != nil {
		return &golden.Result{Error: &golden.Error{Message: err.Error(), Type: ErrorType(err)}}
	}
	b, err := json.Marshal(resp)
	if err != nil {
		return &golden.Result{Error: &golden.Error{Message: "marshal: " + err.Error(), Type: "MarshalError"}}
	}
	return &golden.Result{Response: b}
}

// TestGolden feeds every file in events/ through the handler and compares
// the last of its invocations with events/golden/<name>.json. Run with
// -update to rewrite the goldens (the invocation counts are kept).
func TestGolden(t *testing.T) {
	cases, err := golden.Load("../../events")
	if err != nil {
		t.Fatalf("loading the events: %v", err)
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			var metrics bytes.Buffer
			h := newGoldenHandler(t, &metrics)
			var got *golden.Result
			for range c.Invocations {
				got = invoke(h, c.Event)
			}
			got.Invocations = c.Invocations
			if *update {
				if err := golden.Write(&c, got); err != nil {
					t.Fatal(err)
				}
				return
			}
			if c.Want == nil {
				t.Fatalf("no golden file %s; run go test ./functions/authz -run TestGolden -update", c.GoldenPath)
			}
			if !golden.Equal(got, c.Want) {
				g, _ := golden.Format(got)
				w, _ := golden.Format(c.Want)
				t.Errorf("%s:\n got: %s\nwant: %s", c.Name, g, w)
			}
			// Whatever the event, every metric line is one JSON object.
			for _, line := range bytes.Split(bytes.TrimSpace(metrics.Bytes()), []byte("\n")) {
				if len(line) > 0 && !json.Valid(line) {
					t.Errorf("metric line is not JSON: %s", line)
				}
			}
		})
	}
}
