package authz

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// ReportInitError tells the Lambda Runtime API that initialization failed
// (POST /2018-06-01/runtime/init/error), so that the function's error
// names the cause, e.g. an invalid rule. It does nothing outside Lambda
// (AWS_LAMBDA_RUNTIME_API unset) and ignores the API's answer: the caller
// exits non-zero either way.
func ReportInitError(err error) {
	api := os.Getenv("AWS_LAMBDA_RUNTIME_API")
	if api == "" || err == nil {
		return
	}
	body, _ := json.Marshal(map[string]string{"errorMessage": InitMessage(err), "errorType": InitErrorType(err)})
	req, rerr := http.NewRequest(http.MethodPost, "http://"+api+"/2018-06-01/runtime/init/error", bytes.NewReader(body))
	if rerr != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Lambda-Runtime-Function-Error-Type", "Runtime.InitError")
	c := &http.Client{Timeout: 2 * time.Second}
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
	}
}

// ErrorType is the errorType Lambda reports for an invocation's error err:
// the name of its dynamic type, as aws-lambda-go computes it.
func ErrorType(err error) string {
	t := reflect.TypeOf(err)
	if t.Kind() == reflect.Pointer {
		return t.Elem().Name()
	}
	return t.Name()
}

// The errorType of an init error (InitErrorType): what went wrong, rather
// than the Go type that happens to carry it (fmt's wrapError).
const (
	InitInvalidRules         = "Sluice.InvalidRules"         // policy.ErrInvalidRule
	InitInvalidConfiguration = "Sluice.InvalidConfiguration" // a SLUICE_* variable (*config.Error)
	InitUnreachable          = "Sluice.Unreachable"          // a store or the rules table could not be reached
	InitError                = "Sluice.InitError"            // anything else
)

// InitErrorType classifies an initialization error for the Runtime API's
// errorType.
func InitErrorType(err error) string {
	var ce *config.Error
	var op *net.OpError
	switch {
	case errors.Is(err, policy.ErrInvalidRule):
		return InitInvalidRules
	case errors.As(err, &op), errors.Is(err, storage.ErrUnavailable):
		return InitUnreachable
	case errors.As(err, &ce):
		return InitInvalidConfiguration
	}
	return InitError
}

// InitMessage is err's message with an AWS SDK operation error condensed
// to its operation and its network cause: the SDK nests a refused
// connection in six clauses ("operation error DynamoDB: Scan, exceeded
// maximum number of attempts, 3, https response error StatusCode: 0,
// RequestID: , request send failed, Post \"http://127.0.0.1:1/\": dial tcp
// 127.0.0.1:1: connect: connection refused"), which become "DynamoDB
// Scan: connection refused (dial tcp 127.0.0.1:1, 3 attempts)". Other
// messages are returned as they are.
func InitMessage(err error) string {
	msg := err.Error()
	i := strings.Index(msg, "operation error ")
	var op *net.OpError
	if i < 0 || !errors.As(err, &op) {
		return msg
	}
	prefix, rest := msg[:i], msg[i+len("operation error "):]
	operation, rest, _ := strings.Cut(rest, ", ")
	service, name, _ := strings.Cut(operation, ": ")
	cause := op.Err.Error()
	var sys *os.SyscallError
	if errors.As(op.Err, &sys) {
		cause = sys.Err.Error()
	}
	where := op.Op + " " + op.Net
	if op.Addr != nil {
		where += " " + op.Addr.String()
	}
	if a, _, ok := strings.Cut(strings.TrimPrefix(rest, "exceeded maximum number of attempts, "), ", "); ok && rest != strings.TrimPrefix(rest, "exceeded maximum number of attempts, ") {
		where += ", " + a + " attempts"
	}
	return prefix + service + " " + name + ": " + cause + " (" + where + ")"
}
