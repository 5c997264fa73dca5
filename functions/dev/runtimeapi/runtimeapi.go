// Package runtimeapi runs a Lambda bootstrap binary locally under an
// implementation of the Lambda Runtime API (2018-06-01): the endpoints a
// custom runtime such as aws-lambda-go calls.
//
//	GET  /2018-06-01/runtime/invocation/next            the next event, with the
//	     Lambda-Runtime-Aws-Request-Id, -Deadline-Ms, -Invoked-Function-Arn
//	     and -Trace-Id headers
//	POST /2018-06-01/runtime/invocation/{id}/response   the function's result
//	POST /2018-06-01/runtime/invocation/{id}/error      the function's error
//	POST /2018-06-01/runtime/init/error                 a failed initialization
//
// [Run] starts the binary with AWS_LAMBDA_RUNTIME_API pointing at a server
// on 127.0.0.1, hands it the events one at a time, collects the results,
// and stops the process (by PID) once the last result is in. It measures
// the init time as Lambda reports it: from process start to the first
// request for an event.
package runtimeapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/config"
)

// Config configures a [Run].
type Config struct {
	// Bootstrap is the executable to run.
	Bootstrap string
	// Events are delivered in order, one per invocation.
	Events [][]byte
	// Env is added to the process's environment (KEY=VALUE), after the
	// Lambda variables Run sets.
	Env []string
	// Timeout bounds each invocation (the deadline the function sees) and
	// the wait for each result. Zero means 30s.
	Timeout time.Duration
	// InitTimeout bounds the wait for the first request. Zero means 10s.
	InitTimeout time.Duration
	// Stdout and Stderr receive the process's output (its logs and
	// metrics); nil discards them.
	Stdout, Stderr io.Writer
	// FunctionARN is the Lambda-Runtime-Invoked-Function-Arn. Zero means a
	// local placeholder.
	FunctionARN string
}

// Error is a function or init error as the Runtime API receives it.
type Error struct {
	Message    string   `json:"errorMessage"`
	Type       string   `json:"errorType"`
	StackTrace []string `json:"stackTrace,omitempty"`
}

func (e *Error) Error() string { return e.Type + ": " + e.Message }

// Result is the outcome of one invocation.
type Result struct {
	RequestID string
	// Response is the body the function posted to /response (nil on
	// error).
	Response []byte
	// Error is what it posted to /error.
	Error *Error
	// Duration is the time from handing out the event to the result.
	Duration time.Duration
}

// Report is the outcome of a Run.
type Report struct {
	// Init is the time from process start to its first request for an
	// event (zero if it never asked).
	Init time.Duration
	// InitError is what the process posted to /runtime/init/error.
	InitError *Error
	// Results has one entry per event delivered and answered.
	Results []Result
	// Exit is the process's exit error when it exited on its own before
	// the last result (nil when Run stopped it).
	Exit error
}

// Failed reports whether anything went wrong: an init error, an early
// exit, a missing result or an invocation error.
func (r *Report) Failed(events int) bool {
	if r.InitError != nil || r.Exit != nil || len(r.Results) != events {
		return true
	}
	for _, res := range r.Results {
		if res.Error != nil {
			return true
		}
	}
	return false
}

const prefix = "/2018-06-01/runtime/"

type server struct {
	cfg     Config
	started time.Time

	mu        sync.Mutex
	next      int                // index of the next event to hand out
	pending   map[string]pending // request id -> invocation in progress
	firstNext time.Time          // when the first GET next arrived
	initErr   *Error             //
	results   []Result           //
	changed   chan struct{}      // closed and replaced on every change
	idle      chan struct{}      // closed when no more events will be given
	seq       int                //
}

type pending struct {
	index int
	since time.Time
}

// Run starts cfg.Bootstrap under a local Runtime API, invokes it with each
// event in turn, and stops it. The error is for failures of the harness
// itself (the binary cannot start, a timeout); the function's own errors
// are in the Report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.InitTimeout <= 0 {
		cfg.InitTimeout = 10 * time.Second
	}
	if cfg.FunctionARN == "" {
		cfg.FunctionARN = "arn:aws:lambda:us-east-1:123456789012:function:sluice-authorizer-local"
	}
	s := &server{cfg: cfg, pending: map[string]pending{}, changed: make(chan struct{}), idle: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("runtimeapi: listen: %w", err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // Serve returns when Close is called
	defer srv.Close()
	defer s.stopServing()

	cmd := exec.Command(cfg.Bootstrap)
	cmd.Env = append(lambdaEnv(ln.Addr().String()), cfg.Env...)
	cmd.Stdout, cmd.Stderr = orDiscard(cfg.Stdout), orDiscard(cfg.Stderr)
	s.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("runtimeapi: start %s: %w", cfg.Bootstrap, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	stop := func() {
		if cmd.Process != nil {
			cmd.Process.Kill() // by PID; the process is ours
		}
	}
	rep := &Report{}
	var runErr error
	rep.Exit, runErr = s.watch(ctx, stop, exited)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.firstNext.IsZero() {
		rep.Init = s.firstNext.Sub(s.started)
	}
	rep.InitError = s.initErr
	rep.Results = append(rep.Results, s.results...)
	return rep, runErr
}

// watch waits for the function to take every event, or to exit, fail its
// init, time out (the init and each invocation have their own timeout) or
// be cancelled; stop kills it. It returns how the function exited, when it
// did on its own, and the harness's error.
func (s *server) watch(ctx context.Context, stop func(), exited <-chan error) (exit, err error) {
	cfg := s.cfg
	deadline := time.NewTimer(cfg.InitTimeout)
	defer deadline.Stop()
	phase := "init"
	for {
		s.mu.Lock()
		changed := s.changed
		done := s.initErr != nil || len(s.results) == len(cfg.Events)
		if phase == "init" && !s.firstNext.IsZero() {
			phase = "invoke"
			deadline.Reset(cfg.Timeout)
		}
		nres := len(s.results)
		initFailed := s.initErr != nil
		s.mu.Unlock()
		if done {
			if initFailed {
				// A runtime exits after reporting an init error; give it
				// a moment, then stop it.
				select {
				case err := <-exited:
					return exitError(err), nil
				case <-time.After(2 * time.Second):
				}
			}
			stop()
			<-exited
			return nil, nil
		}
		select {
		case err := <-exited:
			return exitError(err), nil
		case <-changed:
			s.mu.Lock()
			progressed := len(s.results) != nres
			s.mu.Unlock()
			if progressed {
				deadline.Reset(cfg.Timeout)
			}
		case <-deadline.C:
			stop()
			<-exited
			return nil, fmt.Errorf("runtimeapi: timed out after %v waiting for the %s", map[string]time.Duration{"init": cfg.InitTimeout, "invoke": cfg.Timeout}[phase], map[string]string{"init": "first request for an event", "invoke": "function's result"}[phase])
		case <-ctx.Done():
			stop()
			<-exited
			return nil, ctx.Err()
		}
	}
}

// exitError is how a function that exited on its own exited (an error
// even for status 0: a runtime never exits by itself).
func exitError(err error) error {
	if err == nil {
		return errors.New("exited with status 0")
	}
	return err
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// lambdaEnv is the environment Lambda gives a provided.al2023 function,
// with the host's PATH, SLUICE_* and AWS_* variables passed through.
func lambdaEnv(api string) []string {
	env := []string{
		"AWS_LAMBDA_RUNTIME_API=" + api,
		"AWS_LAMBDA_FUNCTION_NAME=sluice-authorizer-local",
		"AWS_LAMBDA_FUNCTION_VERSION=$LATEST",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=256",
		"AWS_LAMBDA_LOG_FORMAT=JSON",
		"_HANDLER=bootstrap",
		"TZ=:UTC",
		"LANG=en_US.UTF-8",
		"PATH=" + os.Getenv("PATH"),
	}
	region := false
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, config.Prefix) || strings.HasPrefix(k, "AWS_") && k != "AWS_LAMBDA_RUNTIME_API" && !strings.HasPrefix(k, "AWS_LAMBDA_FUNCTION_") {
			env = append(env, kv)
			region = region || k == "AWS_REGION"
		}
	}
	if !region {
		env = append(env, "AWS_REGION=us-east-1", "AWS_DEFAULT_REGION=us-east-1")
	}
	return env
}

// stopServing makes pending GET next requests return (with 503) so that
// the server can close.
func (s *server) stopServing() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.idle:
	default:
		close(s.idle)
	}
}

// notify wakes Run. Call with s.mu held.
func (s *server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path, ok := strings.CutPrefix(r.URL.Path, prefix)
	switch {
	case !ok:
		apiError(w, http.StatusNotFound, "UnknownEndpoint", "no such endpoint "+r.URL.Path)
	case path == "invocation/next" && r.Method == http.MethodGet:
		s.next_(w, r)
	case path == "init/error" && r.Method == http.MethodPost:
		e := readError(r)
		s.mu.Lock()
		if !s.firstNext.IsZero() {
			s.mu.Unlock()
			apiError(w, http.StatusForbidden, "InvalidStateTransition", "init error after initialization")
			return
		}
		s.initErr = e
		s.notify()
		s.mu.Unlock()
		accepted(w)
	case strings.HasPrefix(path, "invocation/") && r.Method == http.MethodPost:
		id, what, _ := strings.Cut(strings.TrimPrefix(path, "invocation/"), "/")
		if what != "response" && what != "error" {
			apiError(w, http.StatusNotFound, "UnknownEndpoint", "no such endpoint "+r.URL.Path)
			return
		}
		s.result(w, r, id, what)
	default:
		apiError(w, http.StatusNotFound, "UnknownEndpoint", r.Method+" "+r.URL.Path)
	}
}

// next_ hands out the next event, or blocks until the run ends.
func (s *server) next_(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.firstNext.IsZero() {
		s.firstNext = time.Now()
		s.notify()
	}
	if s.next >= len(s.cfg.Events) || len(s.pending) > 0 {
		s.mu.Unlock()
		select { // no more events: block like Lambda between invocations
		case <-s.idle:
		case <-r.Context().Done():
		}
		apiError(w, http.StatusServiceUnavailable, "ShuttingDown", "no more events")
		return
	}
	i := s.next
	s.next++
	s.seq++
	id := fmt.Sprintf("00000000-0000-4000-8000-%012d", s.seq)
	s.pending[id] = pending{index: i, since: time.Now()}
	s.mu.Unlock()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Lambda-Runtime-Aws-Request-Id", id)
	h.Set("Lambda-Runtime-Deadline-Ms", strconv.FormatInt(time.Now().Add(s.cfg.Timeout).UnixMilli(), 10))
	h.Set("Lambda-Runtime-Invoked-Function-Arn", s.cfg.FunctionARN)
	h.Set("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000;Parent=0000000000000000;Sampled=0")
	w.WriteHeader(http.StatusOK)
	w.Write(s.cfg.Events[i]) //nolint:errcheck // the process may be gone
}

func (s *server) result(w http.ResponseWriter, r *http.Request, id, what string) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 6<<20+1))
	if err != nil {
		apiError(w, http.StatusBadRequest, "InvalidRequest", err.Error())
		return
	}
	if len(body) > 6<<20 {
		apiError(w, http.StatusRequestEntityTooLarge, "RequestEntityTooLarge", "payload larger than 6 MB")
		return
	}
	res := Result{RequestID: id}
	if what == "response" {
		// aws-lambda-go reports a failure while streaming the body in
		// trailers.
		if t := r.Trailer.Get("Lambda-Runtime-Function-Error-Type"); t != "" {
			res.Error = &Error{Type: t, Message: "error while sending the response"}
			if b, err := base64.StdEncoding.DecodeString(r.Trailer.Get("Lambda-Runtime-Function-Error-Body")); err == nil {
				json.Unmarshal(b, res.Error) //nolint:errcheck // keep the type at least
			}
		} else {
			res.Response = body
		}
	} else {
		res.Error = parseError(body, r.Header.Get("Lambda-Runtime-Function-Error-Type"))
	}
	s.mu.Lock()
	p, ok := s.pending[id]
	if !ok {
		s.mu.Unlock()
		apiError(w, http.StatusBadRequest, "InvalidRequestID", "unknown or finished request id "+id)
		return
	}
	delete(s.pending, id)
	res.Duration = time.Since(p.since)
	s.results = append(s.results, res)
	s.notify()
	s.mu.Unlock()
	accepted(w)
}

func readError(r *http.Request) *Error {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	return parseError(body, r.Header.Get("Lambda-Runtime-Function-Error-Type"))
}

func parseError(body []byte, typ string) *Error {
	e := &Error{}
	if err := json.Unmarshal(body, e); err != nil || (e.Message == "" && e.Type == "") {
		e = &Error{Message: string(bytes.TrimSpace(body))}
	}
	if e.Type == "" {
		e.Type = typ
	}
	return e
}

func accepted(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	io.WriteString(w, `{"status":"OK"}`)
}

func apiError(w http.ResponseWriter, code int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	b, _ := json.Marshal(map[string]string{"errorType": typ, "errorMessage": msg})
	w.Write(b)
}
