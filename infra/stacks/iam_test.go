package stacks

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/infra/sluice"
)

// TestIAMMatchesClientInterfaces keeps the DynamoDB grants equal to what the
// authorizer can call: the methods of the client interfaces its code is
// written against (the compiler holds the code to them). The rate-limit
// store and the load shedders' lease and gauge store (backends/dynamo
// Store and Leases) share Client; the rules table is read through the
// rules loader's ScanAPI (found wherever it lives under functions/). A new
// call there fails this test until the grant follows; a grant nothing
// calls fails it too.
func TestIAMMatchesClientInterfaces(t *testing.T) {
	for _, tt := range []struct {
		file, iface string
		granted     []string
	}{
		{"../../backends/dynamo/store.go", "Client", sluice.StateTableActions},
		{findDecl(t, "../../functions", "ScanAPI"), "ScanAPI", sluice.RulesTableActions},
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

// TestTableAttributesMatchAuthorizer keeps the key and TTL attributes of
// the tables the construct creates equal to the ones the authorizer's
// code reads (backends/dynamo; the rules loader).
func TestTableAttributesMatchAuthorizer(t *testing.T) {
	for _, tt := range []struct {
		file, name, want string
	}{
		{"../../backends/dynamo/store.go", "AttrPK", sluice.StatePartitionKey},
		{"../../backends/dynamo/store.go", "AttrTTL", sluice.StateTTLAttribute},
		{findDecl(t, "../../functions", "RulesAttrName"), "RulesAttrName", sluice.RulesPartitionKey},
	} {
		if got := stringConst(t, tt.file, tt.name); got != tt.want {
			t.Errorf("%s %s = %q; the construct uses %q", tt.file, tt.name, got, tt.want)
		}
	}
}

// findDecl returns the non-test Go file under dir that declares name.
func findDecl(t *testing.T, dir, name string) string {
	t.Helper()
	var found string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || found != "" || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil
		}
		for _, decl := range f.Decls {
			if g, ok := decl.(*ast.GenDecl); ok {
				for _, sp := range g.Specs {
					switch sp := sp.(type) {
					case *ast.TypeSpec:
						if sp.Name.Name == name {
							found = path
						}
					case *ast.ValueSpec:
						for _, id := range sp.Names {
							if id.Name == name {
								found = path
							}
						}
					}
				}
			}
		}
		return nil
	})
	if found == "" {
		t.Fatalf("no declaration of %s under %s", name, dir)
	}
	return found
}

func stringConst(t *testing.T, file, name string) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("reading the authorizer's source: %v", err)
	}
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, sp := range g.Specs {
			vs, ok := sp.(*ast.ValueSpec)
			if !ok {
				continue
			}
			for i, id := range vs.Names {
				if id.Name == name && i < len(vs.Values) {
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok {
						v, _ := strconv.Unquote(lit.Value)
						return v
					}
				}
			}
		}
	}
	t.Fatalf("%s: no string constant %s", file, name)
	return ""
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
	return found
}
