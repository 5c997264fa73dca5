package authz

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

// TestScheduledEvent: events/scheduled.json (an EventBridge schedule's
// event) reaches Config.Scheduled through Invoke and Handle, its result is
// the invocation's; Decide refuses it as not an authorizer event; without
// a keeper it is ErrNoKeeper (the golden file shows the message).
func TestScheduledEvent(t *testing.T) {
	raw, err := os.ReadFile("../../events/scheduled.json")
	if err != nil {
		t.Fatal(err)
	}
	var got []*events.CloudWatchEvent
	h := newGoldenHandler(t, io.Discard)
	h.cfg.Scheduled = func(ctx context.Context, ev *events.CloudWatchEvent) (any, error) {
		got = append(got, ev)
		return map[string]int{"rounds": len(got)}, nil
	}
	out, err := h.Invoke(t.Context(), raw)
	if err != nil || string(out) != `{"rounds":1}` {
		t.Fatalf("Invoke: %s, %v", out, err)
	}
	if r, err := h.Handle(t.Context(), json.RawMessage(raw)); err != nil || r.(map[string]int)["rounds"] != 2 {
		t.Fatalf("Handle: %v, %v", r, err)
	}
	if len(got) != 2 || got[0].Source != ScheduledSource || got[0].DetailType != ScheduledDetailType ||
		len(got[0].Resources) != 1 || got[0].Region != "us-east-1" {
		t.Fatalf("the keeper got %+v", got)
	}
	var ee *EventError
	if _, _, err := h.Decide(t.Context(), raw); !errors.As(err, &ee) || ee.Kind != KindScheduled {
		t.Errorf("Decide: %v, want an EventError of a scheduled event", err)
	}
	h.cfg.Scheduled = nil
	if _, err := h.Invoke(t.Context(), raw); !errors.Is(err, ErrNoKeeper) {
		t.Errorf("no keeper: %v, want ErrNoKeeper", err)
	}
	// A scheduled event from another source is not one.
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["source"] = "aws.s3"
	other, _ := json.Marshal(m)
	if _, err := h.Invoke(t.Context(), other); !errors.As(err, &ee) || ee.Kind != 0 {
		t.Errorf("another source: %v, want an unknown event type", err)
	}
}
