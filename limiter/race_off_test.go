//go:build !race

package limiter_test

const raceOn = false
