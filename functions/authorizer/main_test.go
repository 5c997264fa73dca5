package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/functions/dev/golden"
	"github.com/sluicehq/sluice/functions/dev/runtimeapi"
	"github.com/sluicehq/sluice/internal/testserver"
)

// buildBootstrap builds this command as `make build` does, for the host's
// OS and architecture, into a temporary directory.
func buildBootstrap(tb testing.TB) string {
	tb.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		tb.Fatalf("the go tool is needed to build the bootstrap: %v", err)
	}
	out := filepath.Join(tb.TempDir(), "bootstrap")
	cmd := exec.Command(goTool, "build", "-tags", "lambda.norpc", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// goldenEnv makes the binary's runs comparable with the goldens: the clock
// frozen, the embedded rules, the memory store, whatever the host has set.
var goldenEnv = []string{
	"SLUICE_TEST_CLOCK=" + golden.Clock.Format(time.RFC3339),
	"SLUICE_RULES_FILE=", "SLUICE_RULES_YAML=", "SLUICE_RULES_TABLE=",
	"SLUICE_MEMCACHED_ADDRS=", "SLUICE_DYNAMO_TABLE=", "SLUICE_DEFAULT_BACKEND=",
}

// TestBootstrapGolden runs every file in events/ through the built binary
// under the Runtime API harness and compares the last result of its
// invocations with events/golden/<name>.json, as the handler test does.
func TestBootstrapGolden(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the bootstrap")
	}
	cases, err := golden.Load("../../events")
	if err != nil {
		t.Fatalf("loading the events: %v", err)
	}
	bin := buildBootstrap(t)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			if c.Want == nil {
				t.Fatalf("no golden file %s; run go test ./functions/authz -run TestGolden -update", c.GoldenPath)
			}
			events := make([][]byte, c.Invocations)
			for i := range events {
				events[i] = c.Event
			}
			var stdout, stderr bytes.Buffer
			rep, err := runtimeapi.Run(t.Context(), runtimeapi.Config{
				Bootstrap: bin, Events: events, Env: goldenEnv, Stdout: &stdout, Stderr: &stderr,
			})
			if err != nil {
				t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
			}
			if rep.InitError != nil || rep.Exit != nil || len(rep.Results) != c.Invocations {
				t.Fatalf("init error %v, exit %v, %d results; stderr:\n%s", rep.InitError, rep.Exit, len(rep.Results), stderr.String())
			}
			last := rep.Results[len(rep.Results)-1]
			got := &golden.Result{Invocations: c.Invocations, Response: last.Response}
			if last.Error != nil {
				got.Response = nil
				got.Error = &golden.Error{Message: last.Error.Message, Type: last.Error.Type}
			}
			if !golden.Equal(got, c.Want) {
				g, _ := golden.Format(got)
				w, _ := golden.Format(c.Want)
				t.Errorf("got:\n%s\nwant:\n%s", g, w)
			}
			// stdout holds only EMF lines, each one JSON object.
			for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
				if line != "" && (!json.Valid([]byte(line)) || !strings.HasPrefix(line, `{"_aws":`)) {
					t.Errorf("stdout line is not an EMF document: %s", line)
				}
			}
		})
	}
}

// TestBootstrapInitError checks that invalid rules fail the init with a
// message naming the rule and the field, reported to the Runtime API.
func TestBootstrapInitError(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the bootstrap")
	}
	bin := buildBootstrap(t)
	env := append(goldenEnv[:len(goldenEnv):len(goldenEnv)], `SLUICE_RULES_YAML=rules: [{name: broken, key: "{ip}", limits: [{algorithm: fixed_window, limit: 0, window: 1m}]}]`)
	rep, err := runtimeapi.Run(t.Context(), runtimeapi.Config{Bootstrap: bin, Events: [][]byte{[]byte(`{}`)}, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	if rep.InitError == nil || !strings.Contains(rep.InitError.Message, `rule "broken" (rules[0]): limits[0]: limit: 0 is outside`) {
		t.Fatalf("init error %+v", rep.InitError)
	}
	if rep.Exit == nil {
		t.Error("the process did not exit")
	}
}

// BenchmarkInit measures the init time as Lambda reports it: from process
// start to the first Runtime API request (target under 50 ms), and the
// first invocation's duration: with the embedded rules on the memory store,
// and with the memcached or DynamoDB backend configured against the servers
// of scripts/testenv (init then includes the warm-up round trip).
func BenchmarkInit(b *testing.B) {
	bin := buildBootstrap(b)
	event, err := os.ReadFile("../../events/rest-request.json")
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		env  func(b *testing.B) []string
	}{
		{"memory", func(*testing.B) []string { return nil }},
		{"memcached", func(b *testing.B) []string {
			return []string{"SLUICE_MEMCACHED_ADDRS=" + testserver.Memcached(b)}
		}},
		{"dynamo", func(b *testing.B) []string {
			endpoint := testserver.DynamoDB(b)
			env := []string{"AWS_ENDPOINT_URL_DYNAMODB=" + endpoint, "AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local",
				"AWS_REGION=us-east-1", "SLUICE_DYNAMO_TABLE=sluice-bench-init"}
			for _, kv := range env[:4] {
				k, v, _ := strings.Cut(kv, "=")
				b.Setenv(k, v)
			}
			cfg, err := config.LoadDefaultConfig(b.Context())
			if err != nil {
				b.Fatal(err)
			}
			if err := dynamo.CreateTable(b.Context(), dynamodb.NewFromConfig(cfg), "sluice-bench-init"); err != nil {
				b.Fatal(err)
			}
			return env
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			env := append(append([]string{}, goldenEnv...), bc.env(b)...)
			var initTotal, firstTotal time.Duration
			n := 0
			for b.Loop() {
				rep, err := runtimeapi.Run(b.Context(), runtimeapi.Config{Bootstrap: bin, Events: [][]byte{event}, Env: env})
				if err != nil || rep.Failed(1) {
					b.Fatalf("run: %v %+v", err, rep)
				}
				initTotal += rep.Init
				firstTotal += rep.Results[0].Duration
				n++
			}
			b.ReportMetric(float64(initTotal.Microseconds())/1000/float64(n), "init-ms")
			b.ReportMetric(float64(firstTotal.Microseconds())/1000/float64(n), "first-invoke-ms")
		})
	}
}

// TestBootstrapSize builds the deployed binary (linux/arm64) and logs its
// size, for docs/benchmarks.md.
func TestBootstrapSize(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the bootstrap")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "bootstrap")
	cmd := exec.Command(goTool, "build", "-tags", "lambda.norpc", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	st, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("linux/arm64 bootstrap: %d bytes (%.1f MiB)", st.Size(), float64(st.Size())/(1<<20))
}
