package policy

import (
	"fmt"

	"github.com/sluicehq/sluice/limiter"
)

// bindList builds the limiters of limits, one list of limits a request
// checks together on one key (the rule c's own, at field "limits", or a
// tier's), each on its backend (def when it names none); c is the rule at
// index.
//
// A limiter's counters are named by its key space (its parameters) and
// the rule's key, not by the limit's name: two limits of one list with the
// same parameters on one store would share one counter, and a request
// would count twice against it (a limit of 4 admitted 2: TestTwinLimits).
// The later of such twins is built again with its name as its Tag (in
// its key space); the first keeps the plain space, so that every counter
// of a list without twins, and the first twin's, is named as before.
func bindList(c *compiledRule, index int, limits []Limit, field, def string, opts *Options) ([]limiter.Limiter, error) {
	out := make([]limiter.Limiter, len(limits))
	seen := map[string]bool{}
	for j := range limits {
		l := &limits[j]
		backend := l.Backend
		if backend == "" {
			backend = def
		}
		lim, err := bindLimit(c, l, backend, opts, "")
		if sp, ok := lim.(interface{ Space() string }); err == nil && ok && !brokenTwins {
			key := backend + "\x00" + sp.Space()
			if seen[key] {
				lim, err = bindLimit(c, l, backend, opts, l.Name)
			}
			seen[key] = true
		}
		if err != nil {
			return nil, ruleError(c.Name, index, fmt.Sprintf("%s[%d].backend", field, j), "%v", err)
		}
		out[j] = lim
	}
	return out, nil
}

// brokenTwins (tests): twin limits share their counters, as before.
var brokenTwins = false
