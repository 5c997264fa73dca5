package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/infra/sluice"
)

// TestReadmeShowsThisCode keeps the README's "Protect an existing API"
// block equal to the code between the README markers of pets.go, which
// TestPetsStack synthesizes.
func TestReadmeShowsThisCode(t *testing.T) {
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Protect an existing API\n")
	if !ok {
		t.Fatal("README.md has no section \"## Protect an existing API\"")
	}
	block := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(section)
	if block == nil {
		t.Fatal("the section has no ```go block")
	}
	src, err := os.ReadFile("pets.go")
	if err != nil {
		t.Fatal(err)
	}
	code := regexp.MustCompile(`(?s)// README:begin\n(.*?)\n\t// README:end`).FindStringSubmatch(string(src))
	if code == nil {
		t.Fatal("pets.go has no README markers")
	}
	var lines []string
	for _, l := range strings.Split(code[1], "\n") {
		lines = append(lines, strings.TrimPrefix(l, "\t"))
	}
	if want := strings.Join(lines, "\n") + "\n"; block[1] != want {
		t.Errorf("README block:\n%s\npets.go:\n%s", block[1], want)
	}
}

func TestPetsStack(t *testing.T) {
	defer jsii.Close()
	tmp := t.TempDir()
	boot := filepath.Join(tmp, "authorizer")
	if err := os.MkdirAll(boot, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(boot, "bootstrap"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{
		Outdir:  jsii.String(filepath.Join(tmp, "out")),
		Context: &map[string]any{sluice.ContextBootstrapDir: boot},
	})
	stack := NewPetsStack(app, "Pets", nil)
	var tpl assertions.Template
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("synthesis: %v", r)
			}
		}()
		tpl = assertions.Template_FromStack(stack, nil)
	}()
	b, _ := json.Marshal(tpl.ToJSON())
	var doc struct {
		Resources map[string]struct {
			Type       string
			Properties map[string]any
		}
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var authID string
	responses := map[string]string{}
	var methods, functions int
	for id, r := range doc.Resources {
		switch r.Type {
		case "AWS::ApiGateway::Authorizer":
			authID = id
			if r.Properties["AuthorizerResultTtlInSeconds"] != float64(0) {
				t.Errorf("authorizer TTL %v, want 0", r.Properties["AuthorizerResultTtlInSeconds"])
			}
		case "AWS::ApiGateway::GatewayResponse":
			params, _ := r.Properties["ResponseParameters"].(map[string]any)
			responses[r.Properties["ResponseType"].(string)] = r.Properties["StatusCode"].(string) + " " + params["gatewayresponse.header.Retry-After"].(string)
		case "AWS::Lambda::Function":
			functions++
		}
	}
	for _, r := range doc.Resources {
		if r.Type == "AWS::ApiGateway::Method" {
			methods++
			if id, _ := r.Properties["AuthorizerId"].(map[string]any); r.Properties["AuthorizationType"] != "CUSTOM" || id["Ref"] != authID {
				t.Errorf("method %v %v not behind the authorizer %s", r.Properties["HttpMethod"], r.Properties["AuthorizationType"], authID)
			}
		}
	}
	if methods != 1 || functions != 1 {
		t.Errorf("%d methods, %d functions; want 1 and 1", methods, functions)
	}
	want := map[string]string{
		"ACCESS_DENIED":                  "429 '60'", // rules.yaml's one-minute windows
		"AUTHORIZER_FAILURE":             "503 '1'",
		"AUTHORIZER_CONFIGURATION_ERROR": "503 '1'",
		"THROTTLED":                      "429 '1'",
	}
	for k, v := range want {
		if responses[k] != v {
			t.Errorf("gateway response %s: %q, want %q", k, responses[k], v)
		}
	}
	tpl.HasResourceProperties(jsii.String("AWS::IAM::Policy"), map[string]any{
		"PolicyDocument": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{
			assertions.Match_ObjectLike(&map[string]any{"Action": []any{"dynamodb:GetItem", "dynamodb:UpdateItem"}}),
		})},
	})
}
