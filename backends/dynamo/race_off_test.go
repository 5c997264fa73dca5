//go:build !race

package dynamo_test

const raceOn = false
