package dynamo

import (
	"maps"
	"slices"
)

// ThrottleCodes returns the error codes mapError reports as throttling,
// sorted.
func ThrottleCodes() []string { return slices.Sorted(maps.Keys(throttleCodes)) }
