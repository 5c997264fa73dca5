// Command invoke runs a Lambda bootstrap binary locally under the Lambda
// Runtime API (functions/dev/runtimeapi), feeds it an event file and
// prints the response. It is what `make invoke EVENT=events/...` runs.
// When SAM is installed (sam on PATH, or -sam PATH; SLUICE_INVOKE_HARNESS=1
// forces the harness), it runs the function under `sam local start-lambda`
// with a warm container instead, from functions/authorizer/template.yaml,
// and sends the event -n times through its Lambda Invoke API.
//
//	invoke [-bootstrap build/authorizer/bootstrap] [-n 1] [-env KEY=VALUE]... EVENT.json
//	invoke -sam sam [-template functions/authorizer/template.yaml] [-n 1] EVENT.json
//
// The event goes to the function -n times in one process (warm
// invocations: -n 4 shows the denial of events/*-denied.json). Each
// response, or error, is printed to stdout as indented JSON; the function's
// own output (logs, EMF metrics) goes to stderr, as do the init time and
// each invocation's duration. The binary sees a Lambda-like environment plus
// the host's SLUICE_* and AWS_* variables and the -env ones.
//
// Exit status: 0 when every invocation returned a response; 1 when one
// returned an error (e.g. "Unauthorized"), initialization failed, or the
// process exited or timed out; 2 for bad usage.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/sluicehq/sluice/functions/dev/runtimeapi"
)

type envFlags []string

func (e *envFlags) String() string { return strings.Join(*e, " ") }

func (e *envFlags) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*e = append(*e, v)
	return nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("invoke", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bootstrap := fs.String("bootstrap", "build/authorizer/bootstrap", "the Lambda bootstrap binary to run")
	n := fs.Int("n", 1, "invoke the function this many times with the event, in one process")
	timeout := fs.Duration("timeout", 30*time.Second, "deadline of each invocation")
	quiet := fs.Bool("q", false, "do not copy the function's own output (logs, metrics) to stderr")
	samFlag := fs.String("sam", "", "run under this sam's `local start-lambda` (default: sam on PATH, unless "+envHarness+" is set)")
	template := fs.String("template", "functions/authorizer/template.yaml", "the SAM template (with -sam)")
	var env envFlags
	fs.Var(&env, "env", "set an environment variable of the function, KEY=VALUE (repeatable)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: invoke [flags] EVENT.json\n\nRuns a Lambda bootstrap under a local Runtime API and prints its responses.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0 // -h: the usage went to stderr
		}
		return 2
	}
	if fs.NArg() != 1 || *n < 1 {
		fs.Usage()
		return 2
	}
	event, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "invoke: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if sam := samPath(*samFlag); sam != "" {
		ok, err := runSAM(ctx, samConfig{sam: sam, template: *template, function: "Authorizer", event: event, n: *n, ready: 2 * time.Minute}, stdout, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "invoke: %v\n", err)
			return 1
		}
		if !ok {
			return 1
		}
		return 0
	}
	if _, err := os.Stat(*bootstrap); err != nil {
		fmt.Fprintf(stderr, "invoke: %v (run `make build` first, or pass -bootstrap)\n", err)
		return 2
	}
	events := make([][]byte, *n)
	for i := range events {
		events[i] = event
	}
	cfg := runtimeapi.Config{Bootstrap: *bootstrap, Events: events, Env: env, Timeout: *timeout}
	if !*quiet {
		cfg.Stdout, cfg.Stderr = stderr, stderr
	}
	rep, err := runtimeapi.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "invoke: %v\n", err)
	}
	if rep == nil {
		return 1
	}
	printReport(rep, stdout, stderr)
	if err != nil || rep.Failed(*n) {
		return 1
	}
	return 0
}

// printReport prints the responses (errors too) to stdout, and the init
// time, each invocation's time and how the function exited to stderr.
func printReport(rep *runtimeapi.Report, stdout, stderr io.Writer) {
	if rep.Init > 0 {
		fmt.Fprintf(stderr, "invoke: init %v (process start to first Runtime API request)\n", rep.Init.Round(10*time.Microsecond))
	}
	if rep.InitError != nil {
		fmt.Fprintf(stderr, "invoke: init error: %s\n", rep.InitError.Message)
		printJSON(stdout, rep.InitError)
	}
	for i, res := range rep.Results {
		if res.Error != nil {
			fmt.Fprintf(stderr, "invoke: invocation %d: error %s in %v\n", i+1, res.Error.Type, res.Duration.Round(time.Microsecond))
			printJSON(stdout, res.Error)
			continue
		}
		fmt.Fprintf(stderr, "invoke: invocation %d: response in %v\n", i+1, res.Duration.Round(time.Microsecond))
		var buf bytes.Buffer
		if json.Indent(&buf, res.Response, "", "  ") != nil {
			buf.Reset()
			buf.Write(res.Response)
		}
		buf.WriteByte('\n')
		stdout.Write(buf.Bytes())
	}
	if rep.Exit != nil {
		var ee interface{ ExitCode() int }
		if errors.As(rep.Exit, &ee) {
			fmt.Fprintf(stderr, "invoke: the function exited with status %d\n", ee.ExitCode())
		} else {
			fmt.Fprintf(stderr, "invoke: the function exited: %v\n", rep.Exit)
		}
	}
}

func printJSON(w io.Writer, v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	w.Write(append(b, '\n'))
}
