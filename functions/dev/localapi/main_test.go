package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/sluicehq/sluice/functions/wiring"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// build builds this command once per test run, into a directory that
// outlives the test that asked first.
func build(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "localapi-test")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "localapi")
		if b, err := exec.Command(goTool, "build", "-o", binary, ".").CombinedOutput(); err != nil {
			buildErr = errors.New(string(b))
		}
	})
	if buildErr != nil {
		t.Fatalf("go build: %v", buildErr)
	}
	return binary
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binary != "" {
		os.RemoveAll(filepath.Dir(binary))
	}
	os.Exit(code)
}

// localEnv is the environment without the authorizer's variables, so that
// the host's cannot change what the binary does.
func localEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") || strings.HasPrefix(kv, "SLUICE_TEST_") {
			env = append(env, kv)
		}
	}
	return env
}

// TestHelp: -h prints the usage and exits 0.
func TestHelp(t *testing.T) {
	cmd := exec.Command(build(t), "-h")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("localapi -h: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"usage: localapi", "-dynamo-table", "-backend"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, stderr.String())
		}
	}
}

// TestSignalExitsZero: SIGINT (Ctrl-C) and SIGTERM stop a serving local
// API after a graceful shutdown, with exit status 0.
func TestSignalExitsZero(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.Command(build(t), "-addr", "127.0.0.1:0")
			cmd.Env = localEnv()
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			// The first line names the address: the server is serving.
			sc := bufio.NewScanner(stdout)
			if !sc.Scan() {
				t.Fatalf("no output; stderr: %s", stderr.String())
			}
			base, ok := strings.CutPrefix(sc.Text(), "Sluice local API on ")
			if !ok {
				t.Fatalf("first line %q", sc.Text())
			}
			go io.Copy(io.Discard, stdout)
			resp, err := http.Get(base + "/pets/1")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /pets/1: %s", resp.Status)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("after %v: %v (want exit status 0)\nstderr: %s", sig, err, stderr.String())
			}
			if !strings.Contains(stderr.String(), "localapi: stopped") {
				t.Errorf("stderr lacks the shutdown line:\n%s", stderr.String())
			}
		})
	}
}

// buildFrom builds the authorizer's handler as main does (wiring.Build
// from the environment vars gives), closed when tb ends.
func buildFrom(tb testing.TB, vars map[string]string, out wiring.Outputs) *wiring.Built {
	tb.Helper()
	env, err := wiring.ParseEnv(func(k string) string { return vars[k] })
	if err != nil {
		tb.Fatal(err)
	}
	built, err := wiring.Build(tb.Context(), env, out)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(built.Close)
	return built
}
