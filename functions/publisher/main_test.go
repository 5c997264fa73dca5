package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
)

// TestBuildErrors: a missing setting stops the start with the variable's
// name.
func TestBuildErrors(t *testing.T) {
	t.Setenv("AWS_REGION", "us-east-1")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	base := map[string]string{config.EnvShedUtilization: "orders", config.EnvDynamoTable: "state",
		config.EnvPublishNamespace: "AWS/Lambda", config.EnvPublishMetric: "ConcurrentExecutions"}
	for _, drop := range []string{config.EnvShedUtilization, config.EnvDynamoTable, config.EnvPublishMetric} {
		env := map[string]string{}
		for k, v := range base {
			if k != drop {
				env[k] = v
			}
		}
		_, err := build(context.Background(), func(k string) string { return env[k] }, log)
		want := drop
		if drop == config.EnvDynamoTable {
			want = config.EnvShedBackend
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("without %s: err = %v, want one naming %s", drop, err, want)
		}
	}
	if _, err := build(context.Background(), func(k string) string { return base[k] }, log); err != nil {
		t.Errorf("complete configuration: %v", err)
	}
}
