package sluice

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// MaxInlineRules bounds a rules document passed inline: Lambda allows 4 KB
// of environment variables in all, and the others need the rest.
const MaxInlineRules = 3072

// lambdaTaskRoot is where Lambda unpacks the deployment package.
const lambdaTaskRoot = "/var/task"

// rulesSource is what the construct made of Props.Rules.
type rulesSource struct {
	prop  string        // the Props field that gave them, for errors
	doc   []byte        // the document, when known at synth
	rules []policy.Rule // parsed doc
	// One of:
	inline string // SLUICE_RULES_YAML
	file   string // SLUICE_RULES_FILE
	table  bool   // SLUICE_RULES_TABLE
}

// loadRules reads and parses the rules of r at synth. Errors name the prop
// and carry policy's message (rule name and field).
func loadRules(r Rules, bootstrapDir string) (*rulesSource, error) {
	var set []string
	for _, f := range []struct {
		name string
		on   bool
	}{{"YAML", r.YAML != ""}, {"File", r.File != ""}, {"BundlePath", r.BundlePath != ""}, {"Table", r.Table != nil}} {
		if f.on {
			set = append(set, "Rules."+f.name)
		}
	}
	switch {
	case len(set) == 0:
		return nil, errors.New("Rules: required: set YAML, File, BundlePath or Table")
	case len(set) > 1:
		return nil, fmt.Errorf("Rules: set exactly one of YAML, File, BundlePath, Table (got %s)", strings.Join(set, ", "))
	}
	if r.TableTTL != 0 && r.Table == nil {
		return nil, errors.New("Rules.TableTTL: only rules from a table are cached")
	}
	src := &rulesSource{prop: set[0]}
	switch {
	case r.Table != nil:
		src.table = true
		return src, nil
	case r.YAML != "":
		src.doc = []byte(r.YAML)
	case r.File != "":
		b, err := os.ReadFile(r.File)
		if err != nil {
			return nil, fmt.Errorf("Rules.File: %w", err)
		}
		src.doc = b
	case r.BundlePath != "":
		p := filepath.ToSlash(r.BundlePath)
		if path.IsAbs(p) || strings.HasPrefix(path.Clean(p), "..") {
			return nil, fmt.Errorf("Rules.BundlePath: %q must be a relative path inside BootstrapDir", r.BundlePath)
		}
		b, err := os.ReadFile(filepath.Join(bootstrapDir, filepath.FromSlash(p)))
		if err != nil {
			return nil, fmt.Errorf("Rules.BundlePath: %w", err)
		}
		src.doc = b
		src.file = path.Join(lambdaTaskRoot, path.Clean(p))
	}
	rules, err := policy.Parse(src.doc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src.prop, err)
	}
	src.rules = rules
	if src.file == "" {
		if len(src.doc) > MaxInlineRules {
			return nil, fmt.Errorf("%s: %d bytes of rules exceed %d to pass inline (Lambda allows 4 KB of environment); use Rules.BundlePath or Rules.Table", src.prop, len(src.doc), MaxInlineRules)
		}
		src.inline = string(src.doc)
	}
	return src, nil
}

// DeriveRetryAfter returns the longest time any limit of rules can make a
// client wait before one request of the rule's cost passes again, if the
// client sends nothing meanwhile, rounded up to a whole second (at least
// one), and the limit that sets it:
//
//   - a window (sliding_window, fixed_window, sliding_log): its window;
//   - a token bucket: the refills that bring back one request's cost,
//     ceil(cost/refill_amount) x refill_time.
//
// A static Retry-After of that value never sends a client back before the
// limit that refused it could admit it (a client obeying "1" against a
// one-minute window retries about sixty times); the price is waiting longer
// than needed when a shorter limit refused it. The 429's JSON body carries
// the exact per-request retryAfter. With no limit, it is one second.
func DeriveRetryAfter(rules []policy.Rule) (time.Duration, string) {
	longest, source := time.Duration(0), ""
	for _, r := range rules {
		cost := max(r.Cost, 1)
		for i, l := range r.Limits {
			var d time.Duration
			var how string
			switch l.Algorithm {
			case policy.TokenBucket:
				refill := max(l.RefillAmount, 1)
				n := (cost + refill - 1) / refill
				if l.RefillTime > 0 && n > int64(math.MaxInt64/2/l.RefillTime) {
					d = time.Duration(math.MaxInt64 / 2)
				} else {
					d = time.Duration(n) * l.RefillTime
				}
				how = fmt.Sprintf("%s, %d x refill_time %v", l.Algorithm, n, l.RefillTime)
			default:
				d = l.Window
				how = fmt.Sprintf("%s, window %v", l.Algorithm, l.Window)
			}
			if d > longest {
				name := l.Name
				if name == "" {
					name = fmt.Sprintf("%s/%d", r.Name, i)
				}
				longest, source = d, fmt.Sprintf("rule %q limit %q (%s)", r.Name, name, how)
			}
		}
	}
	secs := max((longest+time.Second-1)/time.Second, 1)
	if source == "" {
		source = "no limit in the rules"
	}
	return secs * time.Second, source
}
