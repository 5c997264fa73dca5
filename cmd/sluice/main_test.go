package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// TestMain runs main itself when asked (TestExitStatus runs this binary
// as the command).
func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_TEST_RUN_MAIN") == "1" {
		os.Args = append([]string{"sluice"}, strings.Fields(os.Getenv("SLUICE_TEST_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testRules has every algorithm in one rule, a rule whose key reads two
// attributes, and tiers.
const testRules = `
rules:
  - name: per-ip
    match: {paths: ["/ip"]}
    key: "{ip}"
    limits:
      - {name: per-minute, algorithm: sliding_window, limit: 3, window: 1m}
      - {name: burst, algorithm: token_bucket, max_amount: 2, refill_time: 1m}
      - {name: log, algorithm: sliding_log, limit: 4, window: 1m}
      - {name: fixed, algorithm: fixed_window, limit: 5, window: 1m}
      - {name: subwindows, algorithm: sliding_window, limit: 6, window: 1m, representation: subwindows}
  - name: tenant
    match: {paths: ["/tenant/**"]}
    key: "t:{header:X-Tenant}:{ip}"
    tier: "{header:X-Plan}"
    limits:
      - {name: tenant-minute, algorithm: sliding_window, limit: 2, window: 1m}
    tiers:
      pro:
        - {name: pro-minute, algorithm: sliding_window, limit: 4, window: 1m}
  - name: constant
    match: {paths: ["/constant"]}
    key: "all"
    limits:
      - {algorithm: fixed_window, limit: 1, window: 1h}
`

var t0 = time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC)

func rulesFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(testRules), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// authorizer is the authorizer's policy on stores (without a deny cache,
// so that each request reaches the store, as in a new process).
func authorizer(t *testing.T, stores map[string]storage.Store, backend string) *policy.Policy {
	t.Helper()
	p, err := policy.Load([]byte(testRules), policy.Options{Stores: stores, DefaultBackend: backend, NoDenyCache: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// result is the -json output.
type result struct {
	Rule, Tier, Key string
	Limits          []struct {
		Limit, Algorithm, Backend string
		Capacity, Remaining       int64
		ResetAfterMS              int64 `json:"reset_after_ms"`
		RetryAfterMS              int64 `json:"retry_after_ms"`
		Allowed                   bool
	}
}

// runJSON runs the command with -json and decodes its output.
func runJSON(t *testing.T, e env, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	e.stdout, e.stderr = &out, &errb
	if e.now == nil {
		e.now = func() time.Time { return t0 }
	}
	if err := runEnv(e, append(args, "-json")); err != nil {
		t.Fatalf("sluice %q: %v\n%s", args, err, errb.String())
	}
	var r result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("sluice %q printed %q: %v", args, out.String(), err)
	}
	return r
}

// exhaustAndReset is the operator's walkthrough on one backend: a client
// exhausts per-ip; inspect shows every limit at 0 with a RetryAfter;
// reset -yes; inspect shows every limit full, and the next request is
// allowed. flags name the store; e may hold injected stores.
func exhaustAndReset(t *testing.T, e env, p *policy.Policy, flags ...string) {
	t.Helper()
	ctx := context.Background()
	ip := fmt.Sprintf("198.51.100.%d", time.Now().UnixNano()%250+1)
	req := &policy.Request{SourceIP: ip, Path: "/ip"}
	for range 6 {
		p.Evaluate(ctx, req, t0)
	}
	if res := p.Evaluate(ctx, req, t0); res.Outcome != policy.Deny {
		t.Fatalf("the client is not denied: %+v", res)
	}
	args := append([]string{"inspect", "-rules", rulesFile(t), "-rule", "per-ip", "-key", ip}, flags...)
	// The denied requests' window refunds are sent without waiting
	// (memcached: noreply decrs on the authorizer's connection): inspect
	// until two in a row agree, so that they have landed.
	r := runJSON(t, e, args...)
	for i := 0; i < 20; i++ {
		again := runJSON(t, e, args...)
		if fmt.Sprint(again) == fmt.Sprint(r) {
			break
		}
		r = again
		time.Sleep(50 * time.Millisecond)
	}
	if r.Key != "per-ip:"+ip || r.Tier != "default" || len(r.Limits) != 5 {
		t.Fatalf("inspect: %+v", r)
	}
	// The requests were admitted until the bucket (2) ran out: 2 taken
	// everywhere, and the bucket empty.
	want := map[string]int64{"per-minute": 1, "burst": 0, "log": 2, "fixed": 3, "subwindows": 4}
	for _, l := range r.Limits {
		if l.Remaining != want[l.Limit] || l.Capacity == 0 || l.ResetAfterMS <= 0 {
			t.Errorf("inspect after 2 admitted requests: %s = %+v, want %d remaining and a reset-after", l.Limit, l, want[l.Limit])
		}
		if l.Limit == "burst" && (l.Allowed || l.RetryAfterMS <= 0) {
			t.Errorf("inspect: the empty bucket %+v; want denied with a retry-after", l)
		}
	}
	// Inspecting took nothing.
	if again := runJSON(t, e, args...); fmt.Sprint(again) != fmt.Sprint(r) {
		t.Fatalf("a second inspect differs: %+v, then %+v", r, again)
	}

	resetArgs := append([]string{"reset", "-yes", "-rules", rulesFile(t), "-rule", "per-ip", "-key", ip}, flags...)
	after := runJSON(t, e, resetArgs...)
	for _, l := range after.Limits {
		if l.Remaining != l.Capacity || !l.Allowed || l.ResetAfterMS != 0 {
			t.Errorf("after reset: %s = %+v, want full", l.Limit, l)
		}
	}
	if res := p.Evaluate(ctx, req, t0); res.Outcome != policy.Allow {
		t.Fatalf("after reset the next request: %+v, want allowed", res)
	}
}

// TestMemory: the walkthrough on an embedded memory store (the stores
// are given to run, as an embedding program would).
func TestMemory(t *testing.T) {
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	stores := map[string]storage.Store{"memory": mem}
	exhaustAndReset(t, env{stores: stores}, authorizer(t, stores, "memory"))
}

// TestMemcached: the walkthrough against the test memcached, the command
// building its own store from -memcached.
func TestMemcached(t *testing.T) {
	addr := testserver.Memcached(t)
	s, err := memcached.New(memcached.Config{Addrs: []string{addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	exhaustAndReset(t, env{}, authorizer(t, map[string]storage.Store{"memcached": s}, "memcached"), "-memcached", addr)
}

// TestDynamo: the walkthrough against DynamoDB Local (behind the test cap
// proxy), the command building its own client from -dynamo-endpoint.
func TestDynamo(t *testing.T) {
	endpoint := testserver.DynamoDB(t)
	table := fmt.Sprintf("sluice-cmd-test-%d", time.Now().UnixNano())
	client := dynamodb.New(dynamodb.Options{
		BaseEndpoint: aws.String(endpoint), Region: "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local"}, nil
		}),
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, client, table); err != nil {
		t.Fatal(err)
	}
	s, err := dynamo.New(client, dynamo.Config{Table: table, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	exhaustAndReset(t, env{}, authorizer(t, map[string]storage.Store{"dynamo": s}, "dynamo"), "-dynamo-table", table, "-dynamo-endpoint", endpoint)
}

// TestKeysAndTiers: -attr for a key of two attributes, -tier, a constant
// key, and a reset of one rule leaving another rule's key alone.
func TestKeysAndTiers(t *testing.T) {
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	stores := map[string]storage.Store{"memory": mem}
	p := authorizer(t, stores, "memory")
	ctx := context.Background()
	req := &policy.Request{SourceIP: "2001:db8::7", Path: "/tenant/a", Headers: policy.Header{"X-Tenant": "acme co", "X-Plan": "pro"}}
	p.Evaluate(ctx, req, t0)
	p.Evaluate(ctx, &policy.Request{Path: "/constant"}, t0)
	e := env{stores: stores}
	file := rulesFile(t)
	r := runJSON(t, e, "inspect", "-rules", file, "-rule", "tenant", "-tier", "pro", "-attr", "header:X-Tenant=acme co", "-attr", "ip=2001:db8::7")
	if r.Key != "tenant:t:acme%20co:2001%3Adb8%3A%3A%2F64" || len(r.Limits) != 1 || r.Limits[0].Limit != "pro-minute" || r.Limits[0].Remaining != 3 {
		t.Fatalf("inspect tenant, tier pro: %+v; want the authorizer's key and 3 of 4 left", r)
	}
	if r := runJSON(t, e, "inspect", "-rules", file, "-rule", "tenant", "-attr", "header:X-Tenant=acme co", "-attr", "ip=2001:db8::7"); r.Limits[0].Remaining != 2 {
		t.Fatalf("inspect tenant, default tier: %+v; want untouched", r)
	}
	r = runJSON(t, e, "inspect", "-rules", file, "-rule", "constant")
	if r.Key != "constant:all" || r.Limits[0].Remaining != 0 {
		t.Fatalf("inspect constant: %+v; want key constant:all, used up", r)
	}
	runJSON(t, e, "reset", "-yes", "-rules", file, "-rule", "constant")
	if r := runJSON(t, e, "inspect", "-rules", file, "-rule", "tenant", "-tier", "pro", "-attr", "header:X-Tenant=acme co", "-attr", "ip=2001:db8::7"); r.Limits[0].Remaining != 3 {
		t.Fatalf("after resetting another rule: %+v; want tenant unchanged", r)
	}
}

// TestConfirm: reset asks first; anything but y changes nothing; the
// table output names what it did.
func TestConfirm(t *testing.T) {
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	stores := map[string]storage.Store{"memory": mem}
	p := authorizer(t, stores, "memory")
	p.Evaluate(context.Background(), &policy.Request{Path: "/constant"}, t0) // constant: used up
	file := rulesFile(t)
	for _, c := range []struct {
		answer string
		reset  bool
	}{{"", false}, {"n\n", false}, {"yes please\n", false}, {"y\n", true}} {
		var out, errb bytes.Buffer
		e := env{stdin: strings.NewReader(c.answer), stdout: &out, stderr: &errb, now: func() time.Time { return t0 }, stores: stores}
		err := runEnv(e, []string{"reset", "-rules", file, "-rule", "constant"})
		if !strings.Contains(errb.String(), "Reset rule constant, tier default, key constant:all: constant/0 (memory)? [y/N]") {
			t.Fatalf("answer %q: no question: %q", c.answer, errb.String())
		}
		if c.reset {
			if err != nil || !strings.Contains(out.String(), "reset constant/constant/0 on memory\n") || !hasRow(out.String(), "constant/0 fixed_window memory 1 1 0s 0s") {
				t.Fatalf("answer %q: %v, printed %q", c.answer, err, out.String())
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "not confirmed") {
			t.Fatalf("answer %q: %v; want not confirmed", c.answer, err)
		}
		d, err := p.Evaluate(context.Background(), &policy.Request{Path: "/constant"}, t0), error(nil)
		if d.Outcome != policy.Deny || err != nil {
			t.Fatalf("answer %q: the key was reset: %+v", c.answer, d)
		}
	}
}

// hasRow reports whether the table out has a row of the fields of want.
func hasRow(out, want string) bool {
	for _, line := range strings.Split(out, "\n") {
		if strings.Join(strings.Fields(line), " ") == want {
			return true
		}
	}
	return false
}

// TestErrors: every mistake is a clear one-line error and nothing runs.
func TestErrors(t *testing.T) {
	file := rulesFile(t)
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("rules:\n  - name: x\n    key: \"{ip\"\n    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args  []string
		want  string
		usage bool
	}{
		{nil, "missing command: inspect or reset", true},
		{[]string{"peek"}, `unknown command "peek"`, true},
		{[]string{"inspect", "-nope"}, "flag provided but not defined: -nope", true},
		{[]string{"inspect", "-rules", file}, "-rule NAME is required", true},
		{[]string{"inspect", "-rule", "per-ip", "-key", "1.2.3.4", "extra"}, `unexpected arguments ["extra"]`, true},
		{[]string{"inspect", "-rules", file, "-rule", "per-ip", "-key", "1.2.3.4", "-backend", "mongo"}, `-backend "mongo" is not memory, memcached or dynamo`, true},
		{[]string{"inspect", "-rules", file, "-rule", "nope"}, `has no rule "nope" (rules: per-ip, tenant, constant)`, true},
		{[]string{"inspect", "-rules", file, "-rule", "tenant", "-tier", "gold", "-attr", "ip=1.2.3.4", "-attr", "header:X-Tenant=a"}, `rule "tenant" has no tier "gold" (tiers: default, pro)`, true},
		{[]string{"inspect", "-rules", file, "-rule", "per-ip"}, "rule per-ip's key reads {ip}: give its value with -key VALUE", true},
		{[]string{"inspect", "-rules", file, "-rule", "tenant", "-key", "a"}, "rule tenant's key reads header:X-Tenant, ip: give each with -attr NAME=VALUE", true},
		{[]string{"inspect", "-rules", file, "-rule", "tenant", "-attr", "ip=1.2.3.4"}, "-attr header:X-Tenant=VALUE is missing", true},
		{[]string{"inspect", "-rules", file, "-rule", "tenant", "-attr", "token=x"}, "-attr token: rule tenant's key does not read it", true},
		{[]string{"inspect", "-rules", file, "-rule", "tenant", "-attr", "novalue"}, `"novalue" is not NAME=VALUE`, true},
		{[]string{"inspect", "-rules", file, "-rule", "constant", "-key", "x"}, "rule constant has a constant key: leave out -key", true},
		{[]string{"inspect", "-rules", filepath.Join(t.TempDir(), "missing.yaml"), "-rule", "x"}, "no such file or directory", false},
		{[]string{"inspect", "-rules", bad, "-rule", "x"}, "unclosed '{'", false},
		{[]string{"inspect", "-rules", file, "-rule", "constant", "-backend", "memcached"}, "the rule uses memcached: give its nodes with -memcached host:port", true},
		{[]string{"inspect", "-rules", file, "-rule", "constant", "-backend", "dynamo"}, "the rule uses dynamo: give the state table with -dynamo-table NAME", true},
		{[]string{"inspect", "-rules", file, "-rule", "constant", "-dynamo-endpoint", "http://127.0.0.1:1"}, "-dynamo-endpoint needs -dynamo-table NAME", true},
		{[]string{"inspect", "-rules", file, "-rule", "constant", "-timeout", "0s"}, "-timeout 0s must be positive", true},
		// A backend that is down.
		{[]string{"inspect", "-rules", file, "-rule", "constant", "-memcached", "127.0.0.1:1", "-timeout", "2s"}, "inspect constant/constant/0 on memcached: ", false},
		{[]string{"reset", "-yes", "-rules", file, "-rule", "constant", "-memcached", "127.0.0.1:1", "-timeout", "2s"}, "reset constant/constant/0 on memcached: ", false},
		{[]string{"inspect", "-rules", file, "-rule", "constant", "-dynamo-table", "t", "-dynamo-endpoint", "http://127.0.0.1:1", "-timeout", "2s"}, "inspect constant/constant/0 on dynamo: ", false},
	} {
		var out, errb bytes.Buffer
		err := runEnv(env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, now: time.Now}, c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("sluice %q: %v; want an error containing %q", c.args, err, c.want)
			continue
		}
		var u usageError
		if errors.As(err, &u) != c.usage {
			t.Errorf("sluice %q: %v: usage error %v, want %v", c.args, err, !c.usage, c.usage)
		}
		if strings.Contains(oneLine(err.Error()), "\n") || len(oneLine(err.Error())) > 600 {
			t.Errorf("sluice %q: not one short line: %q", c.args, err)
		}
		if out.Len() > 0 {
			t.Errorf("sluice %q failed but printed %q", c.args, out.String())
		}
	}
}

// TestExitStatus runs the command as a process: 0 on success, 2 for a
// bad command line, 1 when the store fails, with one line on stderr.
func TestExitStatus(t *testing.T) {
	file, global := rulesFile(t), globalFile(t)
	for _, c := range []struct {
		args   string
		status int
	}{
		{"inspect -rules " + file + " -rule constant", 0},
		// A global rule on an eventual table: refused (1) once the
		// region checks pass; an unlisted region is a usage error (2).
		{"inspect -rules " + global + " -rule global-ip -key 1.2.3.4 -table-mode eventual -region eu-west-1 -regions us-east-1,eu-west-1 -dynamo-table t -dynamo-endpoint http://127.0.0.1:1", 1},
		{"reset -yes -rules " + global + " -rule global-ip -key 1.2.3.4 -table-mode eventual -region sa-east-1 -regions us-east-1,eu-west-1 -dynamo-table t -dynamo-endpoint http://127.0.0.1:1", 2},
		{"inspect -rules " + file + " -rule nope", 2},
		{"inspect -rules " + file + " -rule constant -memcached 127.0.0.1:1 -timeout 2s", 1},
	} {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "SLUICE_TEST_RUN_MAIN=1", "SLUICE_TEST_ARGS="+c.args)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		err := cmd.Run()
		status := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			status = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if status != c.status {
			t.Errorf("sluice %s: exit %d, want %d (stderr %q)", c.args, status, c.status, errb.String())
		}
		if c.status != 0 {
			lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
			if last := lines[len(lines)-1]; !strings.HasPrefix(last, "sluice: ") {
				t.Errorf("sluice %s: stderr %q; want a last line \"sluice: ...\"", c.args, errb.String())
			}
		}
	}
}

// The limiters the command builds peek and reset.
var _ limiter.Inspector = (*limiter.SlidingWindow)(nil)
