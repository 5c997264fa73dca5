package sluice

import (
	"errors"
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/jsii-runtime-go"
)

// What real DynamoDB serves (docs/infra.md "Sizing the state table"): a
// partition at most PartitionWriteUnits write and PartitionReadUnits read
// units a second, so one key's item tops out near PartitionWriteUnits
// writes a second; a new on-demand table OnDemandStartWriteUnits and
// OnDemandStartReadUnits a second at once, growing by doubling its
// previous peak within 30 minutes.
const (
	PartitionWriteUnits     = 1000
	PartitionReadUnits      = 3000
	OnDemandStartWriteUnits = 4000
	OnDemandStartReadUnits  = 12000
)

// TableThroughput sizes an on-demand state table: its warm throughput
// (what it serves at once, TableV2 warmThroughput) and its maximum
// throughput (Billing.onDemand's maxReadRequestUnits and
// maxWriteRequestUnits: requests past it are throttled). The zero value
// leaves AWS's defaults: no pre-warming, no maximum. On a global table
// both apply to every replica.
//
// Bounds (Check): a warm value is at least what a new on-demand table
// serves anyway (OnDemandStartReadUnits, OnDemandStartWriteUnits; DynamoDB
// only ever raises warm throughput, and pre-warming is billed); a maximum
// is at least 1; a warm value above the maximum of the same kind is
// refused (the maximum would throttle it). AWS checks the rest at deploy:
// a warm value above the account's per-table quota (40,000 units by
// default) or below the table's current warm throughput fails the
// deployment.
type TableThroughput struct {
	// WarmReadUnitsPerSecond and WarmWriteUnitsPerSecond pre-warm the
	// table. 0: not set.
	WarmReadUnitsPerSecond  int
	WarmWriteUnitsPerSecond int
	// MaxReadRequestUnits and MaxWriteRequestUnits cap the table's read
	// and write request units a second. 0: no maximum.
	MaxReadRequestUnits  int
	MaxWriteRequestUnits int
}

// IsZero reports whether nothing is set.
func (t TableThroughput) IsZero() bool { return t == TableThroughput{} }

// Check checks the bounds above. Errors name the field as
// "TableThroughput.<Field>" (the construct's prop), one error a field.
func (t TableThroughput) Check() error { return errors.Join(t.problems()...) }

func (t TableThroughput) problems() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("TableThroughput.%s: "+format, append([]any{field}, args...)...))
	}
	for _, f := range []struct {
		name     string
		v, floor int
		what     string
	}{
		{"WarmReadUnitsPerSecond", t.WarmReadUnitsPerSecond, OnDemandStartReadUnits, "read units a second a new on-demand table serves at once"},
		{"WarmWriteUnitsPerSecond", t.WarmWriteUnitsPerSecond, OnDemandStartWriteUnits, "write units a second a new on-demand table serves at once"},
		{"MaxReadRequestUnits", t.MaxReadRequestUnits, 1, "read request unit"},
		{"MaxWriteRequestUnits", t.MaxWriteRequestUnits, 1, "write request unit"},
	} {
		switch {
		case f.v < 0:
			bad(f.name, "%d is negative (0 leaves AWS's default)", f.v)
		case f.v > 0 && f.v < f.floor:
			bad(f.name, "%d is below %d, the %s (0 leaves AWS's default)", f.v, f.floor, f.what)
		}
	}
	if w, m := t.WarmReadUnitsPerSecond, t.MaxReadRequestUnits; w > 0 && m > 0 && w > m {
		bad("WarmReadUnitsPerSecond", "%d is above MaxReadRequestUnits (%d), which would throttle it", w, m)
	}
	if w, m := t.WarmWriteUnitsPerSecond, t.MaxWriteRequestUnits; w > 0 && m > 0 && w > m {
		bad("WarmWriteUnitsPerSecond", "%d is above MaxWriteRequestUnits (%d), which would throttle it", w, m)
	}
	return errs
}

// Billing is the table's on-demand billing, with the maximum throughput
// when one is set.
func (t TableThroughput) Billing() awsdynamodb.Billing {
	if t.MaxReadRequestUnits == 0 && t.MaxWriteRequestUnits == 0 {
		return awsdynamodb.Billing_OnDemand(nil)
	}
	return awsdynamodb.Billing_OnDemand(&awsdynamodb.MaxThroughputProps{
		MaxReadRequestUnits:  units(t.MaxReadRequestUnits),
		MaxWriteRequestUnits: units(t.MaxWriteRequestUnits),
	})
}

// Warm is the table's warm throughput, nil when none is set.
func (t TableThroughput) Warm() *awsdynamodb.WarmThroughput {
	if t.WarmReadUnitsPerSecond == 0 && t.WarmWriteUnitsPerSecond == 0 {
		return nil
	}
	return &awsdynamodb.WarmThroughput{
		ReadUnitsPerSecond:  units(t.WarmReadUnitsPerSecond),
		WriteUnitsPerSecond: units(t.WarmWriteUnitsPerSecond),
	}
}

func units(n int) *float64 {
	if n == 0 {
		return nil
	}
	return jsii.Number(float64(n))
}
