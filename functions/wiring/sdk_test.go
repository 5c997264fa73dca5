package wiring

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/aws/smithy-go/logging"
)

// The SDK's log lines become JSON lines of the structured log, at WARN
// for its warnings and DEBUG for its debug lines.
func TestSDKLogger(t *testing.T) {
	var buf bytes.Buffer
	l := sdkLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	l.Logf(logging.Warn, "Response has no supported checksum. Not validating response payload: %d", 7)
	l.Logf(logging.Debug, "request %s", "dropped at INFO")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("log lines %q, want the warning only", lines)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatalf("not JSON: %q: %v", lines[0], err)
	}
	if m["level"] != "WARN" || m["source"] != "aws-sdk" || m["msg"] != "Response has no supported checksum. Not validating response payload: 7" {
		t.Errorf("log line %v", m)
	}
}
