package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// quick are flags for a short run: short traces, draft figures.
var quick = []string{"-bursty", "10", "-steady", "5", "-seeds", "1", "-edge-cycles", "2", "-shape-windows", "2", "-shape-seeds", "1", "-draft"}

func TestRunWritesReport(t *testing.T) {
	dir := t.TempDir()
	args := append([]string{"-out", dir, "-trace", "../../testdata/sample.txt"}, quick...)
	if err := run(args); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "accuracy.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Accuracy of Sluice's limiters", "## Recommendation", "### sample.txt", "accuracy/tradeoff.png", "## Traffic shapes", "accuracy/shapes-frontier.png"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("accuracy.md lacks %q", want)
		}
	}
	for _, name := range []string{"tradeoff.png", "tradeoff.svg", "frontier.png", "counts-bursty.svg", "counts-sample.txt.png", "admitted-edge-end.png"} {
		if st, err := os.Stat(filepath.Join(dir, "accuracy", name)); err != nil || st.Size() == 0 {
			t.Errorf("figure %s: %v", name, err)
		}
	}
}

func TestRunErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.txt")
	if err := os.WriteFile(bad, []byte("12:00\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-nope"}, "flag provided but not defined"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"-trace", filepath.Join(dir, "missing.txt")}, "no such file"},
		{[]string{"-trace", bad}, "bad.txt line 1"},
		{[]string{"-limit", "0"}, "limit must be between"},
		{[]string{"-window", "10ms"}, "window must be at least"},
		{[]string{"-bursty", "0"}, "options need"},
	}
	for _, tt := range tests {
		err := run(append([]string{"-out", dir}, tt.args...))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
}
