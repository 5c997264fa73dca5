package stacks

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestIAMMatchesClientInterfaces keeps the DynamoDB grants equal to what the
// authorizer can call: the methods of the client interfaces its code is
// written against (the compiler holds the code to them). The rate-limit
// store and the load shedders' lease and gauge store (backends/dynamo
// Store and Leases) share Client; the rules table is read through
// functions/authz's ScanAPI. A new call there fails this test until the
// grant follows; a grant nothing calls fails it too.
func TestIAMMatchesClientInterfaces(t *testing.T) {
	for _, tt := range []struct {
		file, iface string
		granted     []string
	}{
		{"../../backends/dynamo/store.go", "Client", stateTableActions},
		{"../../functions/authz/rulestable.go", "ScanAPI", rulesTableActions},
	} {
		methods := interfaceMethods(t, tt.file, tt.iface)
		var want []string
		for _, m := range methods {
			want = append(want, "dynamodb:"+m)
		}
		slices.Sort(want)
		got := slices.Sorted(slices.Values(tt.granted))
		if !slices.Equal(got, want) {
			t.Errorf("%s %s calls %v; granted %v", tt.file, tt.iface, want, got)
		}
	}
	// Both lease-store and rate-limit-store types hold that Client.
	for _, typ := range []string{"Store", "Leases"} {
		if !structHasFieldOfType(t, "../../backends/dynamo", typ, "Client") {
			t.Errorf("backends/dynamo %s does not call DynamoDB through Client: check its grants", typ)
		}
	}
}

func interfaceMethods(t *testing.T, file, name string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("reading the authorizer's source: %v", err)
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != name {
			return true
		}
		it, ok := ts.Type.(*ast.InterfaceType)
		if !ok {
			t.Fatalf("%s: %s is not an interface", file, name)
		}
		for _, m := range it.Methods.List {
			for _, id := range m.Names {
				out = append(out, id.Name)
			}
		}
		return false
	})
	if len(out) == 0 {
		t.Fatalf("%s: no interface %s with methods", file, name)
	}
	return out
}

func structHasFieldOfType(t *testing.T, dir, typ, field string) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("reading %s: %v", dir, err)
	}
	found := false
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		{
			ast.Inspect(f, func(n ast.Node) bool {
				ts, ok := n.(*ast.TypeSpec)
				if !ok || ts.Name.Name != typ {
					return true
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					return false
				}
				for _, fl := range st.Fields.List {
					if id, ok := fl.Type.(*ast.Ident); ok && id.Name == field {
						found = true
					}
				}
				return false
			})
		}
	}
	return found
}
