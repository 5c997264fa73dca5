package main

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestMain lets the test binary play `sam local start-lambda` (when
// SLUICE_FAKE_SAM is set): one warm "container" that answers each
// invocation with how many it has served, and a function error at the
// invocation SLUICE_FAKE_SAM_ERROR_AT.
func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_FAKE_SAM") == "" {
		os.Setenv(envHarness, "1") // the other tests run the harness even where SAM is installed
		os.Exit(m.Run())
	}
	args := strings.Join(os.Args[1:], " ")
	if !strings.HasPrefix(args, "local start-lambda -t ") || !strings.Contains(args, "--warm-containers EAGER") {
		fmt.Fprintf(os.Stderr, "fake sam: unexpected arguments %q\n", args)
		os.Exit(2)
	}
	port := ""
	for i, a := range os.Args {
		if a == "--port" && i+1 < len(os.Args) {
			port = os.Args[i+1]
		}
	}
	errorAt, _ := strconv.Atoi(os.Getenv("SLUICE_FAKE_SAM_ERROR_AT"))
	served := 0
	http.HandleFunc("POST /2015-03-31/functions/Authorizer/invocations", func(w http.ResponseWriter, r *http.Request) {
		served++
		if served == errorAt {
			w.Header().Set("X-Amz-Function-Error", "Unhandled")
			fmt.Fprint(w, `{"errorMessage":"Unauthorized","errorType":"errorString"}`)
			return
		}
		fmt.Fprintf(w, `{"served":%d}`, served)
	})
	fmt.Fprintln(os.Stderr, http.ListenAndServe("127.0.0.1:"+port, nil))
	os.Exit(1)
}

// TestSAMWarmInvocations: with SAM, -n invocations go to one warm
// container of `sam local start-lambda` (so N=4 shows the fourth
// request's denial), and a function error makes the exit status 1.
func TestSAMWarmInvocations(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLUICE_FAKE_SAM", "1")
	for _, tt := range []struct {
		errorAt, code int
	}{{0, 0}, {2, 1}, {4, 1}} {
		t.Setenv("SLUICE_FAKE_SAM_ERROR_AT", strconv.Itoa(tt.errorAt))
		var stdout, stderr bytes.Buffer
		code := run([]string{"-sam", self, "-n", "4", "../../../events/rest-request-denied.json"}, &stdout, &stderr)
		if code != tt.code {
			t.Errorf("error at %d: exit %d, want %d\n%s", tt.errorAt, code, tt.code, stderr.String())
		}
		docs := responses(t, stdout.Bytes())
		if len(docs) != 4 {
			t.Fatalf("error at %d: %d responses, want 4\n%s", tt.errorAt, len(docs), stdout.String())
		}
		for i, d := range docs {
			if i+1 == tt.errorAt {
				if d["errorMessage"] != "Unauthorized" {
					t.Errorf("invocation %d: %v, want the function error", i+1, d)
				}
				continue
			}
			if d["served"] != float64(i+1) {
				t.Errorf("invocation %d: %v, want the %dth of one warm container", i+1, d, i+1)
			}
		}
	}
}
