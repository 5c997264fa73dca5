// Package golden reads and writes the golden responses of the sample
// events in events/: events/golden/<name>.json holds, for events/<name>.json,
// how many times to invoke the authorizer with it (one process, the
// embedded rules, the memory store, the clock frozen at Clock) and what the
// last invocation returns, a response or an error:
//
//	{"invocations": 4, "response": {...}}
//	{"invocations": 1, "error": {"errorMessage": "Unauthorized", "errorType": "errorString"}}
//
// The handler test (functions/authz) and the built-binary test
// (functions/authorizer, under the Runtime API harness) share them.
package golden

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Clock is the frozen time of golden runs (SLUICE_TEST_CLOCK).
var Clock = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Case is one sample event and its golden result.
type Case struct {
	Name        string // file name without .json
	EventPath   string
	Event       []byte
	GoldenPath  string
	Invocations int
	// Want is the golden result (nil when the golden file is missing).
	Want *Result
}

// Result is what an invocation returned.
type Result struct {
	Invocations int             `json:"invocations"`
	Response    json.RawMessage `json:"response,omitempty"`
	Error       *Error          `json:"error,omitempty"`
}

// Error is a Lambda function error, as the Runtime API carries it.
type Error struct {
	Message string `json:"errorMessage"`
	Type    string `json:"errorType"`
}

// Load reads every events/*.json under dir and its golden file. A golden
// file that exists but does not parse is an error; a missing one gives a
// Case with Want nil and one invocation.
func Load(dir string) ([]Case, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	if len(paths) == 0 {
		return nil, fmt.Errorf("golden: no events in %s", dir)
	}
	var cases []Case
	for _, p := range paths {
		ev, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		name := strings.TrimSuffix(filepath.Base(p), ".json")
		c := Case{Name: name, EventPath: p, Event: ev, GoldenPath: filepath.Join(dir, "golden", name+".json"), Invocations: 1}
		b, err := os.ReadFile(c.GoldenPath)
		switch {
		case os.IsNotExist(err):
		case err != nil:
			return nil, err
		default:
			var r Result
			dec := json.NewDecoder(bytes.NewReader(b))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&r); err != nil {
				return nil, fmt.Errorf("golden: %s: %w", c.GoldenPath, err)
			}
			if r.Invocations < 1 || (r.Response == nil) == (r.Error == nil) {
				return nil, fmt.Errorf("golden: %s: want invocations >= 1 and exactly one of response and error", c.GoldenPath)
			}
			c.Want, c.Invocations = &r, r.Invocations
		}
		cases = append(cases, c)
	}
	return cases, nil
}

// Equal reports whether two results are the same, comparing responses as
// JSON values.
func Equal(a, b *Result) bool {
	if a == nil || b == nil || a.Invocations != b.Invocations || (a.Error == nil) != (b.Error == nil) {
		return false
	}
	if a.Error != nil {
		return *a.Error == *b.Error
	}
	return canonical(a.Response) == canonical(b.Response)
}

// Format renders a result as the golden file's content.
func Format(r *Result) ([]byte, error) {
	c := *r
	if c.Response != nil {
		var v any
		if err := json.Unmarshal(c.Response, &v); err != nil {
			return nil, fmt.Errorf("golden: response is not JSON: %w", err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		c.Response = b
	}
	b, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Write writes the golden file of c.
func Write(c *Case, r *Result) error {
	b, err := Format(r)
	if err != nil {
		return err
	}
	return os.WriteFile(c.GoldenPath, b, 0o644)
}

func canonical(b []byte) string {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return "invalid JSON: " + string(b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}
