package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/config"
)

// samConfig is a run through SAM: `sam local start-lambda` keeps the
// function's container warm (--warm-containers EAGER), so that n
// invocations of it share one process as they do on Lambda, which
// `sam local invoke` (a new container each time) cannot.
type samConfig struct {
	sam, template, function string
	event                   []byte
	n                       int
	ready                   time.Duration // how long start-lambda may take to listen
}

// runSAM starts start-lambda on a free loopback port, sends the event n
// times through its Lambda Invoke API, prints each response (or function
// error) as runtime.go's harness does, and stops it. It reports whether
// every invocation returned a response.
func runSAM(ctx context.Context, c samConfig, stdout, stderr io.Writer) (ok bool, err error) {
	// SAM's output is copied to stderr by exec's goroutine while this one
	// writes its progress there too.
	stderr = &lockedWriter{w: stderr}
	port, err := freePort()
	if err != nil {
		return false, err
	}
	arch := "x86_64"
	if runtime.GOARCH == "arm64" {
		arch = "arm64"
	}
	cmd := exec.CommandContext(ctx, c.sam, "local", "start-lambda", "-t", c.template,
		"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--warm-containers", "EAGER",
		"--parameter-overrides", "Arch="+arch)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return false, fmt.Errorf("starting %s local start-lambda: %w", c.sam, err)
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) // its process group: SAM and its children
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := waitListening(ctx, addr, c.ready); err != nil {
		return false, fmt.Errorf("sam local start-lambda: %w", err)
	}
	url := "http://" + addr + "/2015-03-31/functions/" + c.function + "/invocations"
	ok = true
	for i := 1; i <= c.n; i++ {
		start := time.Now()
		resp, err := http.Post(url, "application/json", bytes.NewReader(c.event))
		if err != nil {
			return false, fmt.Errorf("invocation %d: %w", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start).Round(time.Microsecond)
		switch {
		case resp.StatusCode != http.StatusOK:
			ok = false
			fmt.Fprintf(stderr, "invoke: invocation %d: HTTP %d from start-lambda in %v\n", i, resp.StatusCode, took)
		case resp.Header.Get("X-Amz-Function-Error") != "":
			ok = false
			fmt.Fprintf(stderr, "invoke: invocation %d: function error (%s) in %v\n", i, resp.Header.Get("X-Amz-Function-Error"), took)
		default:
			fmt.Fprintf(stderr, "invoke: invocation %d: response in %v\n", i, took)
		}
		var buf bytes.Buffer
		if json.Indent(&buf, body, "", "  ") != nil {
			buf.Reset()
			buf.Write(body)
		}
		buf.WriteByte('\n')
		stdout.Write(buf.Bytes())
	}
	return ok, nil
}

// freePort returns a loopback port nothing listens on (for the moment).
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitListening waits until addr accepts connections, for at most d.
func waitListening(ctx context.Context, addr string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on %s after %v", addr, d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// envHarness, set to anything, makes invoke use the Runtime API harness
// even where SAM is installed.
const envHarness = config.Prefix + "INVOKE_HARNESS"

// samPath is the sam executable to use: -sam, else "sam" on PATH when
// envHarness is not set; "" means the Runtime API harness.
func samPath(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if os.Getenv(envHarness) != "" {
		return ""
	}
	p, _ := exec.LookPath("sam")
	return p
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
