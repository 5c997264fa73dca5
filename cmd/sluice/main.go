// Command sluice answers an operator's two questions about a key, on the
// store the authorizer uses, with the rules file naming the limits: how
// much does it have left, and give it its capacity back.
//
//	sluice inspect -rules rules.yaml -rule per-ip -key 203.0.113.7 -memcached cache:11211
//	sluice reset   -rules rules.yaml -rule per-ip -key 203.0.113.7 -dynamo-table sluice-state
//
// inspect reads each limit of the rule (or of one of its tiers) without
// taking anything: a window's counters in view, a bucket's tokens, a log's
// timestamps. reset forgets each limit's state for the key, after asking
// for confirmation (unless -yes), and shows the state after. The key is
// the one the authorizer renders for a request (the rule's name, ':', and
// its key template with the request's values escaped or hashed): give the
// template's value with -key, or each of several with -attr name=value.
// `sluice -h` has the flags; docs/operator.md has the details.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

const usage = `Usage:
  sluice inspect -rule NAME [-key VALUE | -attr NAME=VALUE ...] [flags]
      how much the key has left, for each limit of the rule: limit,
      remaining now, reset-after (until full with no more traffic) and
      retry-after for a request of cost 1. Reads only: nothing is taken.
  sluice reset -rule NAME [-key VALUE | -attr NAME=VALUE ...] [-yes] [flags]
      gives the key its full capacity back for each limit of the rule
      (asks first unless -yes), then shows the state.

The store is the authorizer's: -memcached for memcached, -dynamo-table
(and -dynamo-endpoint for DynamoDB Local) for DynamoDB; the memory store is
per process, so here it always shows a new key.

A reset while requests for the key are in flight may at worst admit as if
the key were new (plus the units of denied requests whose refunds land
after it). An authorizer process that denied the key recently keeps
denying it from its deny cache until that denial's Retry-After.

A rule with scope global on an eventual table (-table-mode eventual) is
decided on each region's share, not on its key: both commands check
-region and -regions; inspect then shows that region's share of each
limit and what is left of it (on -dynamo-table), and reset refuses
(docs/operator.md).

Flags:
`

// usageError is a mistake in the command line (exit status 2).
type usageError struct{ error }

// env is what run works with: the terminal, the clock, and stores given by
// a test instead of the ones the flags would build.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	now            func() time.Time
	stores         map[string]storage.Store
}

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	default:
		fmt.Fprintln(os.Stderr, "sluice: "+oneLine(err.Error()))
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// oneLine keeps an error on one line (an SDK error may span several).
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// run is main without the process: args without the program name.
func run(args []string, stdout, stderr io.Writer) error {
	return runEnv(env{stdin: os.Stdin, stdout: stdout, stderr: stderr, now: time.Now}, args)
}

// attrFlags collects -attr name=value.
type attrFlags map[string]string

func (a attrFlags) String() string { return "" }
func (a attrFlags) Set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q is not NAME=VALUE", s)
	}
	if _, dup := a[name]; dup {
		return fmt.Errorf("%s given twice", name)
	}
	a[name] = value
	return nil
}

// options are the parsed flags.
type options struct {
	cmd                    string
	rulesFile, rule, tier  string
	key                    string
	keySet                 bool
	attrs                  attrFlags
	backend                string
	backendSet             bool
	memcached              string
	memcachedTLS           bool
	dynamoTable, dynamoURL string
	tableMode              string
	region, regions        string
	timeout                time.Duration
	json, yes              bool
}

func parse(args []string, stderr io.Writer) (*options, error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(stderr, usage)
		flags(&options{cmd: "reset", attrs: attrFlags{}}, stderr).PrintDefaults()
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			return nil, flag.ErrHelp
		}
		return nil, usageError{errors.New("missing command: inspect or reset")}
	}
	o := &options{cmd: args[0], attrs: attrFlags{}}
	if o.cmd != "inspect" && o.cmd != "reset" {
		return nil, usageError{fmt.Errorf("unknown command %q: want inspect or reset", o.cmd)}
	}
	fs := flags(o, stderr)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	return o, o.check(fs)
}

// flags is the flag set of o.cmd, filling o.
func flags(o *options, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice "+o.cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.rulesFile, "rules", "", "the rules document (YAML or JSON); default: the authorizer's embedded rules")
	fs.StringVar(&o.rule, "rule", "", "the rule whose limits to inspect or reset (required)")
	fs.StringVar(&o.tier, "tier", "", "the rule's tier (default: its own limits)")
	fs.StringVar(&o.key, "key", "", "the value of the rule's key template placeholder, e.g. the client IP for \"{ip}\" (a constant key needs none)")
	fs.Var(o.attrs, "attr", "a key attribute as NAME=VALUE, named as in templates (ip, token, api_key, header:X-Tenant, query:page, ...); repeatable")
	fs.StringVar(&o.backend, "backend", "", "the backend of limits that name none: memory, memcached or dynamo (default: memcached with -memcached, else dynamo with -dynamo-table, else memory)")
	fs.StringVar(&o.memcached, "memcached", "", "memcached nodes, host:port[,host:port...]")
	fs.BoolVar(&o.memcachedTLS, "memcached-tls", false, "connect to memcached with TLS (ElastiCache Serverless)")
	fs.StringVar(&o.dynamoTable, "dynamo-table", "", "the DynamoDB state table (the SDK's usual configuration: AWS_REGION, credentials chain)")
	fs.StringVar(&o.dynamoURL, "dynamo-endpoint", "", "a DynamoDB endpoint such as DynamoDB Local's http://127.0.0.1:8000 (dummy credentials unless set)")
	fs.StringVar(&o.tableMode, "table-mode", os.Getenv(config.EnvTableMode), "the state table's mode across regions, as the authorizer's "+config.EnvTableMode+
		" (the default): empty (a regional table), "+config.TableEventual+" or "+config.TableMRSC+" (a global table with multi-Region strong consistency: its writes cross regions)")
	fs.StringVar(&o.region, "region", os.Getenv(config.EnvAWSRegion), "with -table-mode "+config.TableEventual+", the region whose share of a global rule to read, as the authorizer's "+config.EnvAWSRegion+" (the default)")
	fs.StringVar(&o.regions, "regions", os.Getenv(config.EnvRegions), "with -table-mode "+config.TableEventual+", the deployment's regions in their order, comma-separated, as the authorizer's "+config.EnvRegions+" (the default)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "deadline of the whole command")
	fs.BoolVar(&o.json, "json", false, "print JSON instead of a table")
	if o.cmd == "reset" {
		fs.BoolVar(&o.yes, "yes", false, "reset without asking (reset only)")
	}
	return fs
}

// check checks the parsed flags and fills in the default backend.
func (o *options) check(fs *flag.FlagSet) error {
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "key":
			o.keySet = true
		case "backend":
			o.backendSet = true
		}
	})
	switch {
	case o.rule == "":
		return usageError{errors.New("-rule NAME is required")}
	case o.timeout <= 0:
		return usageError{fmt.Errorf("-timeout %v must be positive", o.timeout)}
	case o.dynamoURL != "" && o.dynamoTable == "":
		return usageError{errors.New("-dynamo-endpoint needs -dynamo-table NAME")}
	}
	switch o.tableMode = strings.TrimSpace(o.tableMode); o.tableMode {
	case config.TableRegional, config.TableEventual, config.TableMRSC:
	default:
		return usageError{fmt.Errorf("-table-mode (or %s) %q is not %s or %s (empty: a regional table)", config.EnvTableMode, o.tableMode, config.TableEventual, config.TableMRSC)}
	}
	if !o.backendSet {
		switch {
		case o.memcached != "":
			o.backend = "memcached"
		case o.dynamoTable != "":
			o.backend = "dynamo"
		default:
			o.backend = "memory"
		}
	}
	switch o.backend {
	case "memory", "memcached", "dynamo":
	default:
		return usageError{fmt.Errorf("-backend %q is not memory, memcached or dynamo", o.backend)}
	}
	return nil
}

// target is one limit to inspect or reset.
type target struct {
	def     policy.Limit
	backend string
	lim     limiter.Inspector
}

func runEnv(e env, args []string) error {
	o, err := parse(args, e.stderr)
	if err != nil {
		return err
	}
	data := authz.DefaultRules
	source := "embedded rules"
	if o.rulesFile != "" {
		if data, err = os.ReadFile(o.rulesFile); err != nil {
			return err
		}
		source = o.rulesFile
	}
	doc, err := policy.ParseDocument(data)
	if err != nil {
		return fmt.Errorf("%s: %w", source, err)
	}
	i := slices.IndexFunc(doc.Rules, func(r policy.Rule) bool { return r.Name == o.rule })
	if i < 0 {
		names := make([]string, len(doc.Rules))
		for j, r := range doc.Rules {
			names[j] = r.Name
		}
		return usageError{fmt.Errorf("%s has no rule %q (rules: %s)", source, o.rule, strings.Join(names, ", "))}
	}
	rule := doc.Rules[i]
	rule.Concurrency = nil // leases, not a rate limit: not inspected here
	shares := rule.Scope == policy.ScopeGlobal && o.tableMode == config.TableEventual
	if shares && o.cmd == "reset" {
		return o.refuseShares()
	}

	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	if shares {
		return inspectShares(ctx, e, o, rule, source)
	}
	stores, closeStores, err := buildStores(ctx, o, e, rule)
	if err != nil {
		return err
	}
	defer closeStores()
	p, err := policy.New([]policy.Rule{rule}, policy.Options{Stores: stores, DefaultBackend: o.backend})
	if err != nil {
		return fmt.Errorf("%s: %w", source, err)
	}
	key, err := renderKey(p, o)
	if err != nil {
		return err
	}
	lims, defs, err := p.Limits(o.rule, o.tier)
	if err != nil {
		return usageError{err}
	}
	targets := make([]target, len(lims))
	for j, l := range lims {
		in, ok := l.(limiter.Inspector)
		if !ok {
			return fmt.Errorf("limit %s: %T cannot be inspected", defs[j].Name, l)
		}
		b := defs[j].Backend
		if b == "" {
			b = o.backend
		}
		targets[j] = target{def: defs[j], backend: b, lim: in}
	}
	tier := o.tier
	if tier == "" {
		tier = policy.DefaultTier
	}
	head := header{Rule: o.rule, Tier: tier, Key: key}
	now := e.now()
	if o.cmd == "reset" {
		if err := reset(ctx, e, o, head, targets, now); err != nil {
			return err
		}
		now = e.now()
	}
	return inspect(ctx, e, o, head, targets, now)
}

// renderKey renders the rule's key from -key or the -attr values.
func renderKey(p *policy.Policy, o *options) (string, error) {
	need, err := p.KeyAttrs(o.rule)
	if err != nil {
		return "", err
	}
	attrs := map[string]string{}
	for n, v := range o.attrs {
		if !slices.Contains(need, n) {
			return "", usageError{fmt.Errorf("-attr %s: rule %s's key does not read it (it reads: %s)", n, o.rule, list(need))}
		}
		attrs[n] = v
	}
	if o.keySet {
		switch {
		case len(need) == 0:
			return "", usageError{fmt.Errorf("rule %s has a constant key: leave out -key", o.rule)}
		case len(need) > 1 || len(o.attrs) > 0:
			return "", usageError{fmt.Errorf("rule %s's key reads %s: give each with -attr NAME=VALUE", o.rule, list(need))}
		}
		attrs[need[0]] = o.key
	}
	for _, n := range need {
		if _, ok := attrs[n]; !ok {
			if len(need) == 1 {
				return "", usageError{fmt.Errorf("rule %s's key reads {%s}: give its value with -key VALUE", o.rule, n)}
			}
			return "", usageError{fmt.Errorf("rule %s's key reads %s: -attr %s=VALUE is missing", o.rule, list(need), n)}
		}
	}
	req, err := policy.RequestOf(attrs)
	if err != nil {
		return "", usageError{err}
	}
	return p.Key(o.rule, req)
}

func list(names []string) string {
	if len(names) == 0 {
		return "nothing"
	}
	return strings.Join(names, ", ")
}

// buildStores returns the stores the rule's limits need: a test's, or
// those the flags name.
func buildStores(ctx context.Context, o *options, e env, rule policy.Rule) (map[string]storage.Store, func(), error) {
	used := map[string]bool{o.backend: true}
	for _, l := range rule.Limits {
		used[l.Backend] = true
	}
	for _, t := range rule.Tiers {
		for _, l := range t.Limits {
			used[l.Backend] = true
		}
	}
	delete(used, "")
	stores := map[string]storage.Store{}
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	for b := range used {
		if s, ok := e.stores[b]; ok {
			stores[b] = s
			continue
		}
		s, closer, err := buildStore(ctx, o, e, b)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		stores[b] = s
		if closer != nil {
			closers = append(closers, closer)
		}
	}
	return stores, closeAll, nil
}

func buildStore(ctx context.Context, o *options, e env, backend string) (storage.Store, func(), error) {
	switch backend {
	case "memory":
		fmt.Fprintln(e.stderr, "sluice: note: the memory store is this process's own, so every key is new here; name the authorizer's store with -memcached or -dynamo-table")
		s, err := memory.New(memory.Config{})
		return s, nil, err
	case "memcached":
		if o.memcached == "" {
			return nil, nil, usageError{errors.New("the rule uses memcached: give its nodes with -memcached host:port")}
		}
		cfg := memcached.Config{Addrs: strings.Split(o.memcached, ","), Timeout: o.timeout}
		if o.memcachedTLS {
			cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		s, err := memcached.New(cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("-memcached: %w", err)
		}
		return s, func() { s.Close() }, nil
	case "dynamo":
		if o.dynamoTable == "" {
			return nil, nil, usageError{errors.New("the rule uses dynamo: give the state table with -dynamo-table NAME (and -dynamo-endpoint URL for DynamoDB Local)")}
		}
		client, err := dynamoClient(ctx, o)
		if err != nil {
			return nil, nil, err
		}
		// As the authorizer's store (functions/wiring): an MRSC table's
		// writes cross regions.
		s, err := dynamo.New(client, dynamo.Config{Table: o.dynamoTable, Timeout: o.timeout, CrossRegion: o.tableMode == config.TableMRSC})
		if err != nil {
			return nil, nil, fmt.Errorf("-dynamo-table: %w", err)
		}
		return s, nil, nil
	}
	return nil, nil, usageError{fmt.Errorf("the rule uses backend %q: not memory, memcached or dynamo", backend)}
}

// dynamoClient is a DynamoDB client from the SDK's usual configuration;
// with -dynamo-endpoint, DynamoDB Local's (any credentials do: dummy ones
// and us-east-1 unless the environment gives them).
func dynamoClient(ctx context.Context, o *options) (*dynamodb.Client, error) {
	opts := []func(*awsconfig.LoadOptions) error{awsconfig.WithHTTPClient(dynamo.NewHTTPClient(o.timeout))}
	if o.dynamoURL != "" {
		if os.Getenv("AWS_REGION") == "" && os.Getenv("AWS_DEFAULT_REGION") == "" {
			opts = append(opts, awsconfig.WithRegion("us-east-1"))
		}
		if os.Getenv("AWS_ACCESS_KEY_ID") == "" {
			opts = append(opts, awsconfig.WithCredentialsProvider(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
				return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "sluice -dynamo-endpoint"}, nil
			})))
		}
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, errors.New("no AWS region: set AWS_REGION (or a profile's region), or -dynamo-endpoint for DynamoDB Local")
	}
	if o.dynamoURL == "" {
		if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
			return nil, errors.New("no AWS credentials found (environment, shared config and credentials files, SSO, instance or container role); -dynamo-endpoint for DynamoDB Local")
		}
	}
	return dynamodb.NewFromConfig(cfg, func(opt *dynamodb.Options) {
		if o.dynamoURL != "" {
			opt.BaseEndpoint = aws.String(o.dynamoURL)
		}
	}), nil
}

// header is what the output is about.
type header struct {
	Rule string `json:"rule"`
	Tier string `json:"tier"`
	Key  string `json:"key"`
}

// row is one limit's state.
type row struct {
	Name         string `json:"limit"`
	Algorithm    string `json:"algorithm"`
	Backend      string `json:"backend"`
	Limit        int64  `json:"capacity"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMS int64  `json:"reset_after_ms"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	Allowed      bool   `json:"allowed"`
	resetAfter   time.Duration
	retryAfter   time.Duration
}

func inspect(ctx context.Context, e env, o *options, h header, targets []target, now time.Time) error {
	rows := make([]row, len(targets))
	for i, t := range targets {
		d, err := t.lim.Peek(ctx, h.Key, now)
		if err != nil {
			return fmt.Errorf("%s %s/%s on %s: %w", o.cmd, h.Rule, t.def.Name, t.backend, err)
		}
		rows[i] = row{Name: t.def.Name, Algorithm: t.def.Algorithm.String(), Backend: t.backend,
			Limit: d.Limit, Remaining: d.Remaining, Allowed: d.Allowed,
			ResetAfterMS: ceilMS(d.ResetAfter), RetryAfterMS: ceilMS(d.RetryAfter), resetAfter: d.ResetAfter, retryAfter: d.RetryAfter}
	}
	if o.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			header
			Limits []row `json:"limits"`
		}{h, rows})
	}
	fmt.Fprintf(e.stdout, "rule %s, tier %s, key %s\n", h.Rule, h.Tier, h.Key)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LIMIT\tALGORITHM\tBACKEND\tCAPACITY\tREMAINING\tRESET-AFTER\tRETRY-AFTER")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%v\t%v\n", r.Name, r.Algorithm, r.Backend, r.Limit, r.Remaining, round(r.resetAfter), round(r.retryAfter))
	}
	return tw.Flush()
}

// ceilMS is d in whole milliseconds, rounded up (a wait is never shown
// shorter than it is).
func ceilMS(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// round shows d to the millisecond, rounded up.
func round(d time.Duration) time.Duration { return time.Duration(ceilMS(d)) * time.Millisecond }

func reset(ctx context.Context, e env, o *options, h header, targets []target, now time.Time) error {
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.def.Name + " (" + t.backend + ")"
	}
	if !o.yes {
		fmt.Fprintf(e.stderr, "Reset rule %s, tier %s, key %s: %s? [y/N] ", h.Rule, h.Tier, h.Key, strings.Join(names, ", "))
		line, err := bufio.NewReader(e.stdin).ReadString('\n')
		if err != nil && line == "" {
			return errors.New("reset not confirmed (no answer on stdin; pass -yes to reset without asking)")
		}
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			return errors.New("reset not confirmed: nothing changed")
		}
	}
	for _, t := range targets {
		if err := t.lim.Reset(ctx, h.Key, now); err != nil {
			return fmt.Errorf("reset %s/%s on %s: %w", h.Rule, t.def.Name, t.backend, err)
		}
		if !o.json {
			fmt.Fprintf(e.stdout, "reset %s/%s on %s\n", h.Rule, t.def.Name, t.backend)
		}
	}
	return nil
}
