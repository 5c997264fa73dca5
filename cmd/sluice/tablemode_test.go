package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestTableMode: the DynamoDB store says its writes cross regions
// (storage.CrossRegionWriter) exactly when the table mode is MRSC, as the
// authorizer's store does; the mode comes from -table-mode, else from the
// authorizer's variable (config.EnvTableMode), and a mode that is neither
// is a usage error. Building the store sends no request.
func TestTableMode(t *testing.T) {
	base := []string{"inspect", "-rule", "constant", "-dynamo-table", "t", "-dynamo-endpoint", "http://127.0.0.1:1"}
	for _, c := range []struct {
		name, env string
		args      []string
		cross     bool
		err       string
	}{
		{name: "unset"},
		{name: "flag mrsc", args: []string{"-table-mode", config.TableMRSC}, cross: true},
		{name: "flag eventual", args: []string{"-table-mode", config.TableEventual}},
		{name: "env mrsc", env: config.TableMRSC, cross: true},
		{name: "env eventual", env: " " + config.TableEventual + " "},
		{name: "flag over env", env: config.TableMRSC, args: []string{"-table-mode", ""}},
		{name: "flag bad", args: []string{"-table-mode", "strong"}, err: `-table-mode (or ` + config.EnvTableMode + `) "strong" is not eventual or mrsc`},
		{name: "env bad", env: "MRSC", err: `"MRSC" is not eventual or mrsc`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(config.EnvTableMode, c.env)
			var stderr bytes.Buffer
			o, err := parse(append(append([]string(nil), base...), c.args...), &stderr)
			if c.err != "" {
				var u usageError
				if err == nil || !strings.Contains(err.Error(), c.err) || !errors.As(err, &u) {
					t.Fatalf("%v, want a usage error containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s, closeStore, err := buildStore(context.Background(), o, env{stderr: &stderr, now: time.Now}, "dynamo")
			if err != nil {
				t.Fatal(err)
			}
			if closeStore != nil {
				defer closeStore()
			}
			if got := storage.WritesCrossRegions(s); got != c.cross {
				t.Errorf("WritesCrossRegions %v, want %v (mode %q)", got, c.cross, o.tableMode)
			}
		})
	}
}
