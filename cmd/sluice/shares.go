package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/config"
)

// errShares: the rule's limits are kept as regional shares (a global rule
// on an eventual table), which the command does not read or reset.
var errShares = errors.New("kept as regional shares")

// refuseShares is inspect and reset of a global rule on an eventual table
// (docs/operator.md, "A global rule"): the authorizer decides such a rule
// not on its plain key but on each region's own items, against the
// region's share (internal/regions). The share in force and the items'
// names are read only by internal/regions' own code, and removing a
// region's counters would un-count the units its processes hold in
// capacity leases, so the command checks -region and refuses, rather
// than show the plain key (always new: full, whatever the regions
// admitted) or reset it (nothing the authorizer reads).
func (o *options) refuseShares() error {
	name, place, list, err := o.regionPlace()
	if err != nil {
		return err
	}
	head := fmt.Sprintf("rule %s has scope global on an eventual table", o.rule)
	where := fmt.Sprintf("region %s (place %d of %s) decides it on its own items against its share, not on this key", name, place, list)
	if o.cmd == "reset" {
		return fmt.Errorf("reset refused, nothing changed: %s: %w: %s; resetting them is not offered: units its processes hold in capacity leases would be spent on top of its share (docs/operator.md). The share gives itself back: a window's units leave its view a window and a sub-window after they were taken, a bucket refills at its share's rate", head, errShares, where)
	}
	return fmt.Errorf("%s: %w: %s, and reading that share is not built; the region's entry is in its item regions/<limit>:<key>/<place> (docs/operator.md)", head, errShares, where)
}

// regionPlace checks -region and -regions as the authorizer checks its
// variables (config.Parse) and returns the region, its place and the
// regions.
func (o *options) regionPlace() (string, int, string, error) {
	region := strings.TrimSpace(o.region)
	if region == "" {
		return "", 0, "", usageError{fmt.Errorf("rule %s has scope global on an eventual table: give the region whose share to read with -region NAME (default: %s)", o.rule, config.EnvAWSRegion)}
	}
	env, err := config.Parse(func(k string) string {
		switch k {
		case config.EnvTableMode:
			return config.TableEventual
		case config.EnvRegions:
			return o.regions
		case config.EnvAWSRegion:
			return region
		}
		return ""
	})
	if err != nil {
		var ce *config.Error
		if errors.As(err, &ce) {
			flag := map[string]string{config.EnvRegions: "-regions", config.EnvAWSRegion: "-region"}[ce.Name]
			if flag != "" {
				return "", 0, "", usageError{fmt.Errorf("%s (or %s): %s", flag, ce.Name, ce.Msg)}
			}
		}
		return "", 0, "", err
	}
	return env.Regions[env.Region], env.Region, strings.Join(env.Regions, ","), nil
}
