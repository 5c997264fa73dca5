package config

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseDefaults(t *testing.T) {
	e, err := Parse(envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if e.Deadline != DefaultDeadline || e.RulesTTL != DefaultRulesTTL || e.DefaultBackend != BackendMemory ||
		e.HTTPResponses != DefaultHTTPResponses || e.LogLevel != slog.LevelInfo || e.Shed.Enabled() ||
		e.Shed.FleetReserve != DefaultShedFleetReserve || e.Shed.LeaseTTL != DefaultShedLeaseTTL ||
		e.Shed.FleetName != DefaultShedFleetName || e.Shed.UtilizationMaxAge != DefaultShedUtilizationMaxAge ||
		e.Breaker != (Breaker{Failures: DefaultBreakerFailures, OpenFor: DefaultBreakerOpenFor}) || !e.Breaker.Enabled() {
		t.Errorf("defaults %+v", e)
	}
}

func TestParseClientIP(t *testing.T) {
	secret := strings.Repeat("s", MinEdgeSecret)
	e, err := Parse(envOf(map[string]string{EnvClientIP: ClientIPViewerAddress, EnvEdgeSecret: secret}))
	if err != nil || e.ClientIP != ClientIPViewerAddress || e.EdgeSecret != secret {
		t.Errorf("viewer address: %+v %v", e, err)
	}
	for _, tt := range []struct {
		env  map[string]string
		name string
	}{
		{map[string]string{EnvClientIP: ClientIPViewerAddress}, EnvEdgeSecret},
		{map[string]string{EnvClientIP: "x-forwarded-for"}, EnvClientIP},
		{map[string]string{EnvEdgeSecret: secret[1:]}, EnvEdgeSecret},
		{map[string]string{EnvEdgeSecret: strings.Repeat("s", MaxEdgeSecret+1)}, EnvEdgeSecret},
		{map[string]string{EnvEdgeSecret: secret + " x"}, EnvEdgeSecret},
	} {
		var ce *Error
		if _, err := Parse(envOf(tt.env)); !errors.As(err, &ce) || ce.Name != tt.name {
			t.Errorf("%v: %v, want an error naming %s", tt.env, err, tt.name)
		}
	}
	if e, _ := Parse(envOf(nil)); e.ClientIP != ClientIPSourceIP {
		t.Errorf("default client IP %q", e.ClientIP)
	}
}

// TestParseBounds walks each bound of the contract from both sides.
func TestParseBounds(t *testing.T) {
	long := strings.Repeat("n", MaxStoreName)
	for _, tt := range []struct {
		name, ok, bad string
	}{
		{EnvDeadline, MaxDeadline.String(), (MaxDeadline + time.Millisecond).String()},
		{EnvShedLeaseTTL, MaxShedLeaseTTL.String(), (MaxShedLeaseTTL + time.Second).String()},
		{EnvShedFleetCapacity, strconv.Itoa(MaxShedFleetCapacity), strconv.Itoa(MaxShedFleetCapacity + 1)},
		{EnvShedFleetName, long, long + "n"},
		{EnvShedUtilization, long, long + "n"},
		{EnvShedFleetReserve, "0.99", "1"},
		{EnvBreakerFailures, strconv.Itoa(MaxBreakerFailures), strconv.Itoa(MaxBreakerFailures + 1)},
		{EnvBreakerFailures, "0", "-1"},
		{EnvBreakerOpenFor, MaxBreakerOpenFor.String(), (MaxBreakerOpenFor + time.Second).String()},
		{EnvBreakerOpenFor, "1ns", "0s"},
	} {
		on := map[string]string{EnvMemcachedAddrs: "a:1", EnvShedFleetCapacity: "10"}
		on[tt.name] = tt.ok
		if _, err := Parse(envOf(on)); err != nil {
			t.Errorf("%s=%s: %v", tt.name, tt.ok, err)
		}
		on[tt.name] = tt.bad
		var ce *Error
		if _, err := Parse(envOf(on)); !errors.As(err, &ce) || ce.Name != tt.name {
			t.Errorf("%s=%s: err %v, want a *config.Error naming %s", tt.name, tt.bad, err, tt.name)
		}
	}
	if MaxShedFleetCapacity != storage.MaxLeases {
		t.Errorf("MaxShedFleetCapacity %d, storage.MaxLeases %d", MaxShedFleetCapacity, storage.MaxLeases)
	}
}

func TestFormatShares(t *testing.T) {
	got := FormatShares(map[string]float64{"high": 0.8, "low": 0.5, "critical": 1})
	if got != "low=0.5,high=0.8,critical=1" {
		t.Errorf("FormatShares = %q", got)
	}
	e, err := Parse(envOf(map[string]string{EnvMemcachedAddrs: "a:1", EnvShedFleetCapacity: "10", EnvShedFleetShares: FormatShares(map[string]float64{"low": 0.5, "normal": 0.7})}))
	if err != nil || e.Shed.FleetShares[limiter.PriorityLow] != 0.5 || e.Shed.FleetShares[limiter.PriorityNormal] != 0.7 {
		t.Errorf("round trip: %v %v", e.Shed.FleetShares, err)
	}
	if _, err := Parse(envOf(map[string]string{EnvMemcachedAddrs: "a:1", EnvShedFleetCapacity: "10", EnvShedFleetShares: got})); err == nil {
		t.Errorf("critical share accepted")
	}
}

// TestNamesComplete keeps Names equal to the Env* constants of names.go.
func TestNamesComplete(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "names.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var consts []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, id := range vs.Names {
			if lit, ok := vs.Values[i].(*ast.BasicLit); ok && strings.HasPrefix(id.Name, "Env") {
				if v, _ := strconv.Unquote(lit.Value); strings.HasPrefix(v, Prefix) {
					consts = append(consts, v)
				}
			}
		}
		return true
	})
	if got := slices.Sorted(slices.Values(Names())); !slices.Equal(got, slices.Sorted(slices.Values(consts))) {
		t.Errorf("Names() = %v\nconstants %v", got, consts)
	}
}

var nameRE = regexp.MustCompile(`SLUICE_[A-Z0-9_]*`)

// testSupport are packages of test tooling whose own variables
// (SLUICE_TEST_MEMCACHED, SLUICE_HISTORY_SEED, ...) locate test servers or
// seed test runs: no part of the authorizer's contract, and not read by any
// deployment. They may never spell a name of the contract.
var testSupport = []string{"internal/testserver/", "limiter/limitertest/"}

// TestNamesLiveHere enforces that no SLUICE_* name is written in two
// places: outside this package, no Go string literal in the repository
// (both modules, tests excepted: a test that pins a name's spelling is the
// point) spells one; code uses the constants.
func TestNamesLiveHere(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	contract := map[string]bool{}
	for _, n := range Names() {
		contract[n] = true
	}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", "cdk.out", "build", "testdata", "vendor":
				return filepath.SkipDir
			}
			if rel == "config" || (strings.HasPrefix(d.Name(), ".") && rel != ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		files++
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			v, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			for _, name := range nameRE.FindAllString(v, -1) {
				if !contract[name] && slices.ContainsFunc(testSupport, func(dir string) bool { return strings.HasPrefix(rel, dir) }) {
					continue
				}
				t.Errorf("%s:%d: %q spells %s: use the constant of package config (config.Env..., config.Prefix)", rel, fset.Position(lit.Pos()).Line, v, name)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("scanned %d Go files under %s; the walk is broken", files, root)
	}
}

func TestParseBreakerOff(t *testing.T) {
	e, err := Parse(envOf(map[string]string{EnvBreakerFailures: "0", EnvBreakerOpenFor: "250ms"}))
	if err != nil || e.Breaker.Enabled() || e.Breaker.OpenFor != 250*time.Millisecond {
		t.Errorf("breaker %+v, %v; want off", e.Breaker, err)
	}
}
