// Command funclen lists the functions longer than a screen: every function
// or method of a non-test, non-generated .go file under the given
// directories (default ".") whose declaration, from func to its closing
// brace, spans more than -max lines (80). It prints one line per function,
// "path:line: name: n lines", longest first; node_modules, testdata,
// cdk.out and dot-directories are skipped. scripts/funclen runs it and
// fails when it printed anything.
package main

import (
	"cmp"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

type long struct {
	pos   token.Position
	name  string
	lines int
}

func main() {
	max := flag.Int("max", 80, "the most lines a function may span")
	flag.Parse()
	roots := flag.Args()
	if len(roots) == 0 {
		roots = []string{"."}
	}
	var found []long
	for _, root := range roots {
		l, err := scan(root, *max)
		if err != nil {
			fmt.Fprintln(os.Stderr, "funclen:", err)
			os.Exit(2)
		}
		found = append(found, l...)
	}
	slices.SortFunc(found, func(a, b long) int {
		return cmp.Or(cmp.Compare(b.lines, a.lines), cmp.Compare(a.pos.Filename, b.pos.Filename), cmp.Compare(a.pos.Line, b.pos.Line))
	})
	for _, f := range found {
		fmt.Printf("%s:%d: %s: %d lines\n", f.pos.Filename, f.pos.Line, f.name, f.lines)
	}
}

// skipDir reports whether a directory holds no code of the project's own.
func skipDir(name string) bool {
	switch name {
	case "node_modules", "testdata", "cdk.out", "vendor":
		return true
	}
	return len(name) > 1 && (name[0] == '.' || name[0] == '_')
}

// scan returns the functions over max lines in the Go files under root.
func scan(root string, max int) ([]long, error) {
	fset := token.NewFileSet()
	var found []long
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
			if n := end.Line - start.Line + 1; n > max {
				found = append(found, long{start, funcName(fd), n})
			}
		}
		return nil
	})
	return found, err
}

// funcName is a method's Type.Name or a function's name.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
			continue
		case *ast.IndexExpr:
			t = x.X
			continue
		case *ast.IndexListExpr:
			t = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fd.Name.Name
		}
		return fd.Name.Name
	}
}
