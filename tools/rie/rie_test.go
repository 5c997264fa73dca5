// Package rie runs the authorizer's bootstrap under AWS's Runtime Interface
// Emulator (the component inside `sam local invoke`'s container), pinned in
// this module's go.mod as a tool so that the main module's go.mod never
// sees it, and compares its answers on the golden events with the
// project's own Runtime API harness (functions/dev/runtimeapi).
//
//	cd tools/rie && go test ./...    (make test runs it)
//
// The emulator (github.com/aws/aws-lambda-runtime-interface-emulator
// cmd/aws-lambda-rie, Apache-2.0; needs Go 1.26.6) runs on the host, without
// a container. Both of its ports are picked here (it listens on
// 0.0.0.0:8080 by default). It crashes on concurrent invocations, so each
// event is sent one invocation at a time; it merges the function's stdout
// and stderr into its own, so this test compares answers only (the
// harness's tests check the EMF lines on stdout); and it reports an init
// error on the first invocation, as the answer to it.
package rie

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/functions/dev/golden"
	"github.com/sluicehq/sluice/functions/dev/runtimeapi"
)

// emulatorPkg is the emulator's command, at the version go.mod's tool
// directive pins.
const emulatorPkg = "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie"

// goldenEnv makes runs comparable with the goldens, as the authorizer's
// own tests set it: the clock frozen, the embedded rules, the memory store.
var goldenEnv = []string{
	"SLUICE_TEST_CLOCK=" + golden.Clock.Format(time.RFC3339),
	"SLUICE_RULES_FILE=", "SLUICE_RULES_YAML=", "SLUICE_RULES_TABLE=",
	"SLUICE_MEMCACHED_ADDRS=", "SLUICE_DYNAMO_TABLE=", "SLUICE_DEFAULT_BACKEND=",
}

func goBuild(t *testing.T, dir, out string, args ...string) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed: %v", err)
	}
	cmd := exec.Command(goTool, append([]string{"build", "-o", out}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", args, err, b)
	}
}

// binaries builds the emulator (Go caches it) and the authorizer's
// bootstrap for the host, as the harness tests build it.
func binaries(t *testing.T) (emulator, bootstrap string) {
	t.Helper()
	dir := t.TempDir()
	emulator, bootstrap = filepath.Join(dir, "aws-lambda-rie"), filepath.Join(dir, "bootstrap")
	goBuild(t, ".", emulator, emulatorPkg)
	goBuild(t, "../..", bootstrap, "-tags", "lambda.norpc", "-trimpath", "./functions/authorizer")
	return emulator, bootstrap
}

// emulator is one running aws-lambda-rie with its function.
type emulator struct {
	cmd    *exec.Cmd
	url    string
	output bytes.Buffer // the emulator's and the function's merged output
}

// start runs the emulator on two free loopback ports with bootstrap as its
// function and env added to the environment.
func start(t *testing.T, rie, bootstrap string, env []string) *emulator {
	t.Helper()
	api, rieAddr := freeAddr(t), freeAddr(t)
	e := &emulator{url: "http://" + rieAddr + "/2015-03-31/functions/function/invocations"}
	e.cmd = exec.Command(rie, "--runtime-api-address", api, "--runtime-interface-emulator-address", rieAddr, bootstrap)
	e.cmd.Env = append(os.Environ(), env...)
	e.cmd.Stdout, e.cmd.Stderr = &e.output, &e.output
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the emulator and the function it starts
	if err := e.cmd.Start(); err != nil {
		t.Fatalf("starting the emulator: %v", err)
	}
	t.Cleanup(func() {
		syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
		e.cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", rieAddr, time.Second)
		if err == nil {
			c.Close()
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("the emulator does not listen on %s:\n%s", rieAddr, e.output.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// invoke sends one event and returns the answer as a golden result of one
// invocation (an error when the body is the emulator's error document),
// and the HTTP status: 200, or 502 for an init error.
func (e *emulator) invoke(t *testing.T, event []byte) (*golden.Result, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(event))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("invoke: %v\n%s", err, e.output.String())
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var ge golden.Error
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if dec.Decode(&ge) == nil && ge.Type != "" {
		return &golden.Result{Invocations: 1, Error: &ge}, resp.StatusCode
	}
	return &golden.Result{Invocations: 1, Response: body}, resp.StatusCode
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// harness runs the same invocations under the project's harness.
func harness(t *testing.T, bootstrap string, event []byte, n int, env []string) *runtimeapi.Report {
	t.Helper()
	events := make([][]byte, n)
	for i := range events {
		events[i] = event
	}
	rep, err := runtimeapi.Run(t.Context(), runtimeapi.Config{Bootstrap: bootstrap, Events: events, Env: env})
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	return rep
}

// TestEmulatorMatchesHarness: every golden event, invoked as many times as
// its golden file says in one emulator (one warm function), answers as the
// harness answers and as the golden file says.
func TestEmulatorMatchesHarness(t *testing.T) {
	cases, err := golden.Load("../../events")
	if err != nil {
		t.Fatalf("loading the events: %v", err)
	}
	rie, bootstrap := binaries(t)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			if c.Want == nil {
				t.Fatalf("no golden file %s", c.GoldenPath)
			}
			e := start(t, rie, bootstrap, goldenEnv)
			var got *golden.Result
			for i := range c.Invocations { // one at a time: the emulator crashes on concurrent invocations
				var status int
				if got, status = e.invoke(t, c.Event); status != http.StatusOK {
					t.Fatalf("invocation %d: HTTP %d\n%s", i+1, status, e.output.String())
				}
			}
			got.Invocations = c.Invocations

			rep := harness(t, bootstrap, c.Event, c.Invocations, goldenEnv)
			if rep.InitError != nil || len(rep.Results) != c.Invocations {
				t.Fatalf("harness: init error %v, %d results", rep.InitError, len(rep.Results))
			}
			last := rep.Results[len(rep.Results)-1]
			fromHarness := &golden.Result{Invocations: c.Invocations, Response: last.Response}
			if last.Error != nil {
				fromHarness = &golden.Result{Invocations: c.Invocations, Error: &golden.Error{Message: last.Error.Message, Type: last.Error.Type}}
			}
			if !golden.Equal(got, fromHarness) {
				g, _ := golden.Format(got)
				h, _ := golden.Format(fromHarness)
				t.Errorf("the emulator answered:\n%s\nthe harness:\n%s\nemulator output:\n%s", g, h, e.output.String())
			}
			if !golden.Equal(got, c.Want) {
				g, _ := golden.Format(got)
				w, _ := golden.Format(c.Want)
				t.Errorf("the emulator answered:\n%s\nthe golden file says:\n%s", g, w)
			}
		})
	}
}

// TestEmulatorInitError: invalid rules fail the function's init; the
// emulator reports it as the answer to the first invocation, with the
// errorType and message the harness records from /runtime/init/error.
func TestEmulatorInitError(t *testing.T) {
	rie, bootstrap := binaries(t)
	env := append(goldenEnv[:len(goldenEnv):len(goldenEnv)],
		`SLUICE_RULES_YAML=rules: [{name: broken, key: "{ip}", limits: [{algorithm: fixed_window, limit: 0, window: 1m}]}]`)
	event, err := os.ReadFile("../../events/rest-request.json")
	if err != nil {
		t.Fatal(err)
	}
	rep := harness(t, bootstrap, event, 1, env)
	if rep.InitError == nil {
		t.Fatal("the harness saw no init error")
	}
	e := start(t, rie, bootstrap, env)
	got, status := e.invoke(t, event)
	if status != http.StatusBadGateway || got.Error == nil || got.Error.Type != rep.InitError.Type || !strings.Contains(got.Error.Message, rep.InitError.Message) {
		t.Errorf("the emulator answered HTTP %d %+v; the harness recorded the init error %+v\n%s", status, got.Error, rep.InitError, e.output.String())
	}
	if !strings.Contains(rep.InitError.Message, `rule "broken"`) {
		t.Errorf("init error %q does not name the rule", rep.InitError.Message)
	}
}
