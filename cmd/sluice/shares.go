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
// (docs/operator.md, "A global rule"): the authorizer does not decide
// such a rule on its plain key but on each region's own items, against
// the region's share (internal/regions). Reading the share in force, or
// resetting the region's items, needs what only internal/regions' own
// code reads today (the share entry in the region's item, the names of
// the items its processes decide on), so the command checks -region and
// refuses rather than show or reset the plain key, which the authorizer
// never reads: a fresh key there would say the key is full whatever its
// regions admitted.
func (o *options) refuseShares() error {
	name, place, list, err := o.regionPlace()
	if err != nil {
		return err
	}
	head := fmt.Sprintf("rule %s has scope global on an eventual table", o.rule)
	why := fmt.Sprintf("each region decides it on its own items against its share, not on the key this command reads; reading region %s's share (place %d of %s) is not built", name, place, list)
	if o.cmd == "reset" {
		return fmt.Errorf("reset refused, nothing changed: %s: %w: %s. A region's share gives itself back: a window's units leave its view a window and a sub-window after they were taken, a bucket refills at its share's rate", head, errShares, why)
	}
	return fmt.Errorf("%s: %w: %s. Its figures are in the authorizer's Shares metrics and its region's items (docs/regions.md)", head, errShares, why)
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
