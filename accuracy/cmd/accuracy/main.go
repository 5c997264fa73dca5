// Command accuracy writes Sluice's accuracy report: it replays traffic
// traces through every limiter configuration on a simulated clock, compares
// each with the exact sliding log, and writes OUT/accuracy.md and its
// figures (PNG and SVG) under OUT/accuracy/.
//
//	go run ./cmd/accuracy -out ../docs   # from accuracy/: what make accuracy runs
//	go run ./cmd/accuracy -out /tmp/mine -trace requests.txt
//
// A trace file holds one timestamp per line: RFC 3339 or decimal seconds
// since the Unix epoch. The same flags give the same bytes on every run.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluicehq/sluice/accuracy"
)

type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(s string) error { *f = append(*f, s); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "accuracy:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	o := accuracy.DefaultOptions()
	fs := flag.NewFlagSet("accuracy", flag.ContinueOnError)
	out := fs.String("out", "docs", "directory for accuracy.md and accuracy/*.{png,svg}")
	var traces files
	fs.Var(&traces, "trace", "a trace file, one timestamp per line (repeatable)")
	fs.Int64Var(&o.Params.Limit, "limit", o.Params.Limit, "requests per window")
	fs.DurationVar(&o.Params.Window, "window", o.Params.Window, "window length")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the generated traces")
	fs.IntVar(&o.Seeds, "seeds", o.Seeds, "bursty traces in the seed sweep")
	fs.IntVar(&o.Bursty, "bursty", o.Bursty, "length of each bursty trace, in windows")
	fs.IntVar(&o.Steady, "steady", o.Steady, "length of the steady trace, in windows")
	fs.IntVar(&o.EdgeCycles, "edge-cycles", o.EdgeCycles, "cycles of the edge traces")
	fs.IntVar(&o.Shapes.Windows, "shape-windows", o.Shapes.Windows, "length of each shape trace, in windows")
	fs.IntVar(&o.Shapes.Seeds, "shape-seeds", o.Shapes.Seeds, "seeds per shape")
	fs.BoolVar(&o.Draft, "draft", false, "small, low-resolution figures (a quick look; the numbers do not change)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, path := range traces {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		tr, err := accuracy.ReadTrace(filepath.Base(path), f)
		f.Close()
		if err != nil {
			return err
		}
		o.Files = append(o.Files, tr)
	}
	start := time.Now()
	r, err := accuracy.Run(o)
	if err != nil {
		return err
	}
	if err := r.Write(*out); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "accuracy: wrote %s in %v\n", filepath.Join(*out, "accuracy.md"), time.Since(start).Round(time.Millisecond))
	return nil
}
