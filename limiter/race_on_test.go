//go:build race

package limiter_test

// raceOn: the race detector is on, and the hot-key throughput tests
// (TestLeasesHotKey*) leave their measurement to make test's run
// without it.
const raceOn = true
