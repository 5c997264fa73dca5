package runtimeapi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The test binary doubles as a hand-written custom runtime when
// RUNTIMEAPI_HELPER names a behaviour, so the harness is tested against the
// protocol itself, without aws-lambda-go.
func TestMain(m *testing.M) {
	if mode := os.Getenv("RUNTIMEAPI_HELPER"); mode != "" {
		os.Exit(helper(mode))
	}
	os.Exit(m.Run())
}

func helper(mode string) int {
	base := "http://" + os.Getenv("AWS_LAMBDA_RUNTIME_API") + "/2018-06-01/runtime/"
	post := func(path, body string) int {
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	switch mode {
	case "exit":
		return 3
	case "init-error":
		post("init/error", `{"errorMessage":"bad rules","errorType":"InitError"}`)
		return 1
	case "hang":
		time.Sleep(time.Hour)
		return 0
	}
	for {
		resp, err := http.Get(base + "invocation/next")
		if err != nil {
			return 1
		}
		event, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		id := resp.Header.Get("Lambda-Runtime-Aws-Request-Id")
		deadline, _ := strconv.ParseInt(resp.Header.Get("Lambda-Runtime-Deadline-Ms"), 10, 64)
		if resp.StatusCode != http.StatusOK || id == "" || deadline < time.Now().UnixMilli() ||
			resp.Header.Get("Lambda-Runtime-Invoked-Function-Arn") == "" {
			fmt.Fprintf(os.Stderr, "bad next: %d %v\n", resp.StatusCode, resp.Header)
			return 1
		}
		switch {
		case mode == "stray" && post("invocation/not-a-request/response", `{}`) != http.StatusBadRequest:
			fmt.Fprintln(os.Stderr, "a stray request id was accepted")
			return 1
		case bytes.Contains(event, []byte("fail")):
			post("invocation/"+id+"/error", `{"errorMessage":"Unauthorized","errorType":"errorString"}`)
		default:
			if post("invocation/"+id+"/response", `{"echo":`+string(event)+`}`) != http.StatusAccepted {
				return 1
			}
		}
		if mode == "once" {
			return 0 // exits after one invocation
		}
	}
}

func run(t *testing.T, mode string, events ...string) (*Report, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	evs := make([][]byte, len(events))
	for i, e := range events {
		evs[i] = []byte(e)
	}
	return Run(context.Background(), Config{
		Bootstrap: self, Events: evs, Env: []string{"RUNTIMEAPI_HELPER=" + mode},
		Timeout: 5 * time.Second, InitTimeout: 5 * time.Second, Stderr: os.Stderr,
	})
}

func TestInvocations(t *testing.T) {
	rep, err := run(t, "serve", `{"n":1}`, `"fail"`, `{"n":3}`)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Init <= 0 || rep.InitError != nil || rep.Exit != nil || len(rep.Results) != 3 {
		t.Fatalf("report %+v", rep)
	}
	if got := string(rep.Results[0].Response); got != `{"echo":{"n":1}}` {
		t.Errorf("first response %s", got)
	}
	if e := rep.Results[1].Error; e == nil || e.Message != "Unauthorized" || e.Type != "errorString" {
		t.Errorf("second: %+v", rep.Results[1])
	}
	if string(rep.Results[2].Response) != `{"echo":{"n":3}}` {
		t.Errorf("third: %+v", rep.Results[2])
	}
	if !rep.Failed(3) {
		t.Error("an invocation error does not count as a failure")
	}
	if ids := map[string]bool{rep.Results[0].RequestID: true, rep.Results[1].RequestID: true, rep.Results[2].RequestID: true}; len(ids) != 3 {
		t.Error("request ids repeat")
	}
}

func TestStrayRequestID(t *testing.T) {
	rep, err := run(t, "stray", `{}`)
	if err != nil || rep.Failed(1) {
		t.Fatalf("%v %+v", err, rep)
	}
}

func TestInitError(t *testing.T) {
	rep, err := run(t, "init-error", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if rep.InitError == nil || rep.InitError.Message != "bad rules" || rep.InitError.Type != "InitError" || rep.Exit == nil || !rep.Failed(1) {
		t.Fatalf("report %+v", rep)
	}
}

func TestEarlyExit(t *testing.T) {
	rep, err := run(t, "exit", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Exit == nil || len(rep.Results) != 0 || !rep.Failed(1) {
		t.Fatalf("report %+v", rep)
	}
	// Exiting after the first of two events.
	rep, err = run(t, "once", `{}`, `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Exit == nil || len(rep.Results) != 1 || !rep.Failed(2) {
		t.Fatalf("report %+v", rep)
	}
}

func TestInitTimeout(t *testing.T) {
	self, _ := os.Executable()
	rep, err := Run(context.Background(), Config{
		Bootstrap: self, Events: [][]byte{[]byte(`{}`)}, Env: []string{"RUNTIMEAPI_HELPER=hang"},
		InitTimeout: 200 * time.Millisecond,
	})
	if err == nil || !strings.Contains(err.Error(), "timed out") || rep == nil || rep.Init != 0 {
		t.Fatalf("%v %+v", err, rep)
	}
}
