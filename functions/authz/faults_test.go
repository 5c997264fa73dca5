package authz

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/functions/dev/golden"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// downStore is a backend that is down: every call fails unavailable.
type downStore struct{}

func (downStore) Add(context.Context, storage.Key, int64, int, int64, time.Duration) (storage.Counts, error) {
	return storage.Counts{}, storage.ErrUnavailable
}
func (downStore) Sub(context.Context, storage.Key, int64, int64) error { return storage.ErrUnavailable }
func (downStore) UpdateBucket(context.Context, storage.Key, storage.BucketOp, time.Duration) (storage.Decision, error) {
	return storage.Decision{}, storage.ErrUnavailable
}
func (downStore) UpdateLog(context.Context, storage.Key, storage.LogOp, time.Duration) (storage.Decision, error) {
	return storage.Decision{}, storage.ErrUnavailable
}

// TestPartialFailure: a rule whose per-minute limit answers and whose
// burst limit's backend is down. The answer, the decision log line and the
// metric line agree: allowed by the fail mode (reason fail_open, the
// unchecked burst limit's numbers, FailOpen 1), or denied by the limit
// that answered (reason limit, FailOpen 0, BackendErrors 1), or denied by
// a fail-closed rule's fail mode (reason fail_closed, FailClosed 1).
func TestPartialFailure(t *testing.T) {
	const rules = `
rules:
  - name: per-ip
    key: "{ip}"
    fail: %s
    limits:
      - {name: per-minute, algorithm: sliding_window, limit: %d, window: 1m}
      - {name: burst, algorithm: token_bucket, max_amount: 50, refill_time: 100ms, backend: down}
`
	type want struct {
		allowed              bool
		reason, limitName    string
		limit                int64
		failOpen, failClosed int
		logMsg               string
	}
	for _, tt := range []struct {
		name      string
		fail      string
		perMinute int
		calls     int
		want      want
	}{
		{"fail open, both allow", "open", 600, 1, want{true, "fail_open", "burst", 50, 1, 0, "backend failed, fail open"}},
		{"fail open, the answering limit denies", "open", 1, 2, want{false, "limit", "per-minute", 1, 0, 0, "backend error"}},
		{"fail closed", "closed", 600, 1, want{false, "fail_closed", "burst", 50, 0, 1, "backend failed, fail closed"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mem, err := memory.New(memory.Config{})
			if err != nil {
				t.Fatal(err)
			}
			doc := strings.Replace(strings.Replace(rules, "%s", tt.fail, 1), "%d", strconv.Itoa(tt.perMinute), 1)
			p, err := policy.Load([]byte(doc), policy.Options{Stores: map[string]storage.Store{"memory": mem, "down": downStore{}}})
			if err != nil {
				t.Fatal(err)
			}
			var metrics, logs bytes.Buffer
			h, err := New(Config{Policy: p, Clock: limiter.ClockFunc(func() time.Time { return golden.Clock }),
				Metrics: NewMetrics(&metrics, "Test"), Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			if err != nil {
				t.Fatal(err)
			}
			var resp Response
			for range tt.calls {
				metrics.Reset()
				logs.Reset()
				if resp, _, err = h.Decide(t.Context(), readEvent(t, "rest-request")); err != nil {
					t.Fatal(err)
				}
			}
			w := tt.want
			// The answer.
			c := resp.AuthContext()
			if resp.Allowed() != w.allowed || c.Reason != w.reason || c.Limit != w.limit || c.Rule != "per-ip" {
				t.Errorf("answer: allowed %v %+v; want allowed %v, reason %s, limit %d", resp.Allowed(), c, w.allowed, w.reason, w.limit)
			}
			// The metric line.
			var m struct {
				Allowed, Denied, FailOpen, FailClosed, BackendErrors int
				Reason                                               string
			}
			if err := json.Unmarshal(bytes.TrimSpace(metrics.Bytes()), &m); err != nil {
				t.Fatalf("metric line %q: %v", metrics.String(), err)
			}
			if m.Reason != w.reason || m.FailOpen != w.failOpen || m.FailClosed != w.failClosed || m.BackendErrors != 1 || (m.Allowed == 1) != w.allowed {
				t.Errorf("metric line %s; want reason %s, FailOpen %d, FailClosed %d, BackendErrors 1", metrics.String(), w.reason, w.failOpen, w.failClosed)
			}
			// The log lines: the backend's failure, then the decision.
			var decision struct{ Reason, Limit_name string }
			sawFailure := false
			for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				var l struct{ Msg string }
				json.Unmarshal([]byte(line), &l)
				switch l.Msg {
				case w.logMsg:
					sawFailure = true
				case "decision":
					json.Unmarshal([]byte(line), &decision)
				}
			}
			if !sawFailure || decision.Reason != w.reason || decision.Limit_name != w.limitName {
				t.Errorf("logs %s; want %q and a decision with reason %s, limit_name %s", logs.String(), w.logMsg, w.reason, w.limitName)
			}
		})
	}
}
