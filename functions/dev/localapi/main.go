// Command localapi is Sluice's local developer loop (`make run`): an HTTP
// API on localhost that runs the authorizer's handler for every request,
// exactly as the Lambda does, in front of a small echo upstream. A denied
// request gets 429 with Retry-After and RateLimit-* headers, as the
// deployed REST API answers.
//
//	localapi [-addr 127.0.0.1:8080] [-rules rules.yaml] [-event rest|http|token]
//	         [-memcached host:port] [-dynamo-endpoint http://127.0.0.1:8000 -dynamo-table t]
//	         [-backend memory|memcached|dynamo] [-deadline 250ms] [-upstream URL] [-echo-delay 0s] [-metrics]
//
// Allowed requests reach the upstream as a Lambda integration would: inside
// lambdawrap.ReleaseLeases, so the concurrency leases the authorizer passed
// in its context are released when the upstream has answered.
//
// By default it uses the embedded rules and the in-process memory store.
// The SLUICE_* environment variables of the Lambda apply too (flags win).
// `localapi -h` prints the flags. Ctrl-C (SIGINT) or SIGTERM finishes the
// requests in flight and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/functions/wiring"
	"github.com/sluicehq/sluice/lambdawrap"
)

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		// -h: the usage went to stderr; asking for it is no failure.
	case err != nil:
		fmt.Fprintf(os.Stderr, "localapi: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	overrides := o.overrides()
	env, err := wiring.ParseEnv(func(k string) string {
		if v, ok := overrides[k]; ok {
			return v
		}
		return os.Getenv(k)
	})
	if err != nil {
		return flagError(err, overrides)
	}
	if err := checkBackends(env, o.ddbEndpoint); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.ddbEndpoint == "" && os.Getenv("AWS_ENDPOINT_URL_DYNAMODB") == "" && os.Getenv("AWS_ENDPOINT_URL") == "" {
		// Real DynamoDB: say now, in one line, what would otherwise fail
		// every request.
		if err := wiring.CheckAWS(ctx, env, 3*time.Second); err != nil {
			return fmt.Errorf("DynamoDB table %q: %v; for DynamoDB Local add -dynamo-endpoint http://127.0.0.1:8000", env.DynamoTable+env.RulesTable, err)
		}
	}
	out := wiring.Outputs{Stdout: io.Discard, Stderr: stderr}
	if o.ddbEndpoint != "" {
		localAWS(o.ddbEndpoint)
		out.CreateTable = true
	}
	if o.metrics {
		out.Stdout = stdout
	}
	built, err := wiring.Build(ctx, env, out)
	if err != nil {
		return flagError(err, overrides)
	}
	defer built.Close()
	return serve(ctx, stop, o, built, stdout, stderr)
}

// options are the command's flags.
type options struct {
	addr, rules, kind, stage           string
	mc, ddbEndpoint, ddbTable, backend string
	deadline                           string
	up                                 *url.URL // nil: the built-in echo
	echoDelay                          time.Duration
	metrics, legacy                    bool
}

// parseFlags parses and checks the flags.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("localapi", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: localapi [flags]\n\n"+
			"A local HTTP API that runs Sluice's authorizer for every request, in front of\n"+
			"an echo upstream (`make run`). The authorizer's "+config.Prefix+"* variables apply too;\n"+
			"flags win. Ctrl-C stops it.\n\n")
		fs.PrintDefaults()
	}
	o := &options{}
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "listen address (keep it on loopback)")
	fs.StringVar(&o.rules, "rules", "", "rules file (default: the embedded rules, or "+config.Prefix+"RULES_*)")
	fs.StringVar(&o.kind, "event", kindREST, "authorizer event to emulate: rest (REQUEST), http (payload 2.0, simple responses) or token (TOKEN)")
	fs.StringVar(&o.stage, "stage", "local", "stage name of the emulated REST API")
	fs.StringVar(&o.mc, "memcached", "", "memcached address(es), comma-separated ("+config.EnvMemcachedAddrs+")")
	fs.StringVar(&o.ddbEndpoint, "dynamo-endpoint", "", "DynamoDB endpoint, e.g. DynamoDB Local's http://127.0.0.1:8000 (AWS_ENDPOINT_URL_DYNAMODB); needs -dynamo-table")
	fs.StringVar(&o.ddbTable, "dynamo-table", "", "DynamoDB state table ("+config.EnvDynamoTable+"); created if missing when -dynamo-endpoint is set")
	fs.StringVar(&o.backend, "backend", "", "backend of limits that name none: memory, memcached or dynamo ("+config.EnvDefaultBackend+")")
	fs.StringVar(&o.deadline, "deadline", "", "bound of one decision, a Go duration ("+config.EnvDeadline+"; default 250ms; DynamoDB Local's cold start may want 2s)")
	upstream := fs.String("upstream", "", "URL to proxy allowed requests to (default: a built-in echo)")
	fs.DurationVar(&o.echoDelay, "echo-delay", 0, "how long the built-in echo takes to answer (a slow backend, to watch concurrency limits)")
	fs.BoolVar(&o.metrics, "metrics", false, "print the EMF metric lines to stdout")
	fs.BoolVar(&o.legacy, "legacy-ratelimit-headers", false, "also send RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (the ratelimit-headers draft's earlier fields) beside RateLimit-Policy and RateLimit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch o.kind {
	case kindREST, kindHTTP, kindToken:
	default:
		return nil, fmt.Errorf("-event %q: want rest, http or token", o.kind)
	}
	if *upstream != "" {
		u, err := url.Parse(*upstream)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return nil, fmt.Errorf("-upstream %q is not an absolute URL", *upstream)
		}
		o.up = u
	}
	return o, nil
}

// overrides are the configuration variables the flags set.
func (o *options) overrides() map[string]string {
	m := map[string]string{}
	if o.rules != "" {
		m[config.EnvRulesFile] = o.rules
		m[config.EnvRulesYAML], m[config.EnvRulesTable] = "", ""
	}
	for _, f := range []struct{ name, v string }{
		{config.EnvMemcachedAddrs, o.mc}, {config.EnvDynamoTable, o.ddbTable},
		{config.EnvDefaultBackend, o.backend}, {config.EnvDeadline, o.deadline},
	} {
		if f.v != "" {
			m[f.name] = f.v
		}
	}
	return m
}

// serve serves the local API on o.addr until ctx ends (Ctrl-C or SIGTERM;
// stop lets a second one kill at once), then finishes the requests in
// flight.
func serve(ctx context.Context, stop func(), o *options, built *wiring.Built, stdout, stderr io.Writer) error {
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("%w (is another `make run` running? try -addr 127.0.0.1:0)", err)
	}
	api := newServer(built.Handler, o.kind, o.stage, o.up)
	api.legacyHeaders = o.legacy
	if o.up == nil {
		api.upstream = echoAfter(o.echoDelay)
	}
	// The integration's half of the concurrency limits: leases are
	// released when the upstream has answered.
	api.releaser = lambdawrap.NewStoreReleaser(built.Leases)
	api.onReleaseError = func(_ context.Context, err error) {
		built.Logger.Warn("releasing a lease failed; it lapses at its TTL", "error", err.Error())
	}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	banner(stdout, "http://"+ln.Addr().String(), o, built)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Ctrl-C or SIGTERM: finish the requests in flight, then exit 0.
	stop() // a second Ctrl-C kills at once
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shut); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	fmt.Fprintln(stderr, "localapi: stopped")
	return nil
}

// banner says where the local API listens and what to try.
func banner(stdout io.Writer, base string, o *options, built *wiring.Built) {
	env := built.Env
	to := "the built-in echo upstream"
	if o.up != nil {
		to = o.up.String()
	}
	fmt.Fprintf(stdout, "Sluice local API on %s\n", base)
	fmt.Fprintf(stdout, "  authorizer: %s events, rules: %s, default backend: %s, deadline %v; allowed requests go to %s\n",
		eventName(o.kind), built.Rules, env.DefaultBackend, env.Deadline, to)
	if sh := built.Shedding; sh != nil {
		fmt.Fprintf(stdout, "  load shedding on %s: fleet capacity %d (reserve %g), utilization %q\n",
			sh.Backend, env.Shed.FleetCapacity, env.Shed.FleetReserve, env.Shed.Utilization)
	}
	fmt.Fprintf(stdout, "  try:  curl -i %s/pets/42\n", base)
	fmt.Fprintf(stdout, "        for i in 1 2 3 4; do curl -s -o /dev/null -w '%%{http_code}\\n' %s/demo/hello; done   # the 4th in a minute: 429\n", base)
	fmt.Fprintf(stdout, "  Ctrl-C stops it.\n")
}

// flagNames are the flags that set a configuration variable.
var flagNames = map[string]string{
	config.EnvRulesFile:      "-rules",
	config.EnvMemcachedAddrs: "-memcached",
	config.EnvDynamoTable:    "-dynamo-table",
	config.EnvDefaultBackend: "-backend",
	config.EnvDeadline:       "-deadline",
}

// flagError names the flag, not its variable, in an error about a value
// a flag gave (-backend mongo, not SLUICE_DEFAULT_BACKEND).
func flagError(err error, overrides map[string]string) error {
	var ce *config.Error
	if errors.As(err, &ce) {
		if name, ok := flagNames[ce.Name]; ok && overrides[ce.Name] != "" {
			return fmt.Errorf("%s: %s", name, ce.Msg)
		}
		return err
	}
	// wiring.Build's errors about a variable start "wiring: NAME: ".
	for env, name := range flagNames {
		if msg, ok := strings.CutPrefix(err.Error(), "wiring: "+env+": "); ok && overrides[env] != "" {
			return fmt.Errorf("%s: %s", name, msg)
		}
	}
	return err
}

// checkBackends refuses, naming the flags to add, a configuration whose
// default backend is a network backend that is not configured, or a
// DynamoDB endpoint without a table (the authorizer's own message names
// only its variables).
func checkBackends(env wiring.Env, ddbEndpoint string) error {
	if ddbEndpoint != "" && env.DynamoTable == "" {
		return fmt.Errorf("-dynamo-endpoint %s needs -dynamo-table NAME (the state table, created if missing)", ddbEndpoint)
	}
	if env.Configured()[env.DefaultBackend] || env.DefaultBackend == wiring.BackendMemory {
		return nil
	}
	switch env.DefaultBackend {
	case wiring.BackendDynamo:
		return fmt.Errorf("-backend dynamo: DynamoDB is not configured: add -dynamo-table NAME, and -dynamo-endpoint URL for DynamoDB Local (%s, %s)",
			config.EnvDynamoTable, "AWS_ENDPOINT_URL_DYNAMODB")
	case wiring.BackendMemcached:
		return fmt.Errorf("-backend memcached: memcached is not configured: add -memcached HOST:PORT (%s)", config.EnvMemcachedAddrs)
	}
	return nil
}

func eventName(kind string) string {
	switch kind {
	case kindHTTP:
		return "HTTP API payload 2.0"
	case kindToken:
		return "REST TOKEN"
	}
	return "REST REQUEST"
}

// localAWS points the AWS SDK at a local DynamoDB, with placeholder
// credentials and region when none are set.
func localAWS(endpoint string) {
	os.Setenv("AWS_ENDPOINT_URL_DYNAMODB", endpoint)
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": "us-east-1"} {
		if os.Getenv(k) == "" {
			os.Setenv(k, v)
		}
	}
}
