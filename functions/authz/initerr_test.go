package authz

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/policy"
)

// TestInitErrors: the Runtime API is told what failed at start-up: an
// errorType that names the kind of failure (not fmt's wrapError) and, for
// an AWS SDK error, a message with the operation and the network cause
// instead of the SDK's six nested clauses. The SDK error here is a real
// one: a Scan against a closed port.
func TestInitErrors(t *testing.T) {
	client := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String("http://127.0.0.1:1"),
		Credentials: aws.AnonymousCredentials{},
	})
	_, sdkErr := client.Scan(t.Context(), &dynamodb.ScanInput{TableName: aws.String("rules")})
	if sdkErr == nil {
		t.Fatal("a Scan of a closed port succeeded")
	}
	_, ruleErr := policy.Parse([]byte("rules: [{name: x}]"))
	for _, tt := range []struct {
		err       error
		wantType  string
		wantMsg   string
		notInMsgs []string
	}{
		{fmt.Errorf("wiring: SLUICE_RULES_TABLE: rules table rules: %w", sdkErr), InitUnreachable,
			"wiring: SLUICE_RULES_TABLE: rules table rules: DynamoDB Scan: connection refused (dial tcp 127.0.0.1:1, 3 attempts)",
			[]string{"operation error", "StatusCode", "request send failed"}},
		{fmt.Errorf("wiring: SLUICE_RULES_YAML: %w", ruleErr), InitInvalidRules, "wiring: SLUICE_RULES_YAML: " + ruleErr.Error(), nil},
		{&config.Error{Name: "SLUICE_DEADLINE", Msg: "bad"}, InitInvalidConfiguration, "config: SLUICE_DEADLINE: bad", nil},
		{errors.New("something else"), InitError, "something else", nil},
	} {
		var got map[string]string
		api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			json.Unmarshal(b, &got)
			if r.URL.Path != "/2018-06-01/runtime/init/error" || r.Header.Get("Lambda-Runtime-Function-Error-Type") != "Runtime.InitError" {
				t.Errorf("%s %v", r.URL.Path, r.Header)
			}
			w.WriteHeader(http.StatusAccepted)
		}))
		t.Setenv("AWS_LAMBDA_RUNTIME_API", strings.TrimPrefix(api.URL, "http://"))
		ReportInitError(tt.err)
		api.Close()
		if got["errorType"] != tt.wantType || got["errorMessage"] != tt.wantMsg {
			t.Errorf("init error %q:\n got %q %q\nwant %q %q", tt.err, got["errorType"], got["errorMessage"], tt.wantType, tt.wantMsg)
		}
		for _, s := range tt.notInMsgs {
			if strings.Contains(got["errorMessage"], s) {
				t.Errorf("message %q still has %q", got["errorMessage"], s)
			}
		}
	}
}
