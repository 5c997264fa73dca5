package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildAuthorizer builds the authorizer's bootstrap as `make invoke` and
// the authorizer's own tests do (-tags lambda.norpc, -trimpath, no cgo):
// the same compile flags, so that a fresh clone's build cache compiles
// its dependencies once for all of them, not again for this test.
func buildAuthorizer(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed: %v", err)
	}
	out := filepath.Join(t.TempDir(), "bootstrap")
	cmd := exec.Command(goTool, "build", "-tags", "lambda.norpc", "-trimpath", "-o", out, "../../authorizer")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// responses splits stdout into its JSON documents.
func responses(t *testing.T, out []byte) []map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(out))
	var docs []map[string]any
	for dec.More() {
		var d map[string]any
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("stdout %q: %v", out, err)
		}
		docs = append(docs, d)
	}
	return docs
}

func TestInvoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the bootstrap")
	}
	bin := buildAuthorizer(t)
	t.Setenv("SLUICE_RULES_FILE", "")
	t.Setenv("SLUICE_RULES_YAML", "")
	t.Setenv("SLUICE_RULES_TABLE", "")
	t.Setenv("SLUICE_MEMCACHED_ADDRS", "")
	t.Setenv("SLUICE_DYNAMO_TABLE", "")

	var stdout, stderr bytes.Buffer
	if code := run([]string{"-bootstrap", bin, "-q", "../../../events/rest-request.json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	docs := responses(t, stdout.Bytes())
	if len(docs) != 1 || docs[0]["principalId"] != "sluice" || !strings.Contains(stderr.String(), "invoke: init ") {
		t.Errorf("stdout %s\nstderr %s", stdout.String(), stderr.String())
	}

	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"-bootstrap", bin, "-q", "-n", "4", "../../../events/http-request-denied.json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	docs = responses(t, stdout.Bytes())
	if len(docs) != 4 || docs[3]["isAuthorized"] != false || docs[2]["isAuthorized"] != true {
		t.Errorf("four invocations: %s", stdout.String())
	}

	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"-bootstrap", bin, "-q", "../../../events/rest-token-empty.json"}, &stdout, &stderr); code != 1 {
		t.Fatalf("an Unauthorized error: exit %d, want 1", code)
	}
	if docs = responses(t, stdout.Bytes()); len(docs) != 1 || docs[0]["errorMessage"] != "Unauthorized" {
		t.Errorf("stdout %s", stdout.String())
	}

	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"-bootstrap", bin, "-q", "-env", "SLUICE_RULES_YAML=rules: [x]", "../../../events/rest-token.json"}, &stdout, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "init error") {
		t.Errorf("invalid rules: exit %d, stderr %s", code, stderr.String())
	}
}

func TestInvokeUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	for _, args := range [][]string{{}, {"a.json", "b.json"}, {"-n", "0", "x.json"}, {"-bootstrap", "/does/not/exist", "../../../events/rest-token.json"}, {"/no/such/event.json"}, {"-env", "NOEQUALS", "x.json"}} {
		if code := run(args, &stdout, &stderr); code != 2 {
			t.Errorf("run(%q) = %d, want 2", args, code)
		}
	}
	stderr.Reset()
	if code := run([]string{"-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "usage: invoke") {
		t.Errorf("run(-h) = %d, want 0 and the usage; stderr %s", code, stderr.String())
	}
}
