package authz

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"reflect"
	"time"
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
	body, _ := json.Marshal(map[string]string{"errorMessage": err.Error(), "errorType": ErrorType(err)})
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

// ErrorType is the errorType Lambda reports for err: the name of its
// dynamic type, as aws-lambda-go computes it.
func ErrorType(err error) string {
	t := reflect.TypeOf(err)
	if t.Kind() == reflect.Pointer {
		return t.Elem().Name()
	}
	return t.Name()
}
