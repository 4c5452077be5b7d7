//go:build !race

package pgfeed_test

// raceEnabled says the tests run under the race detector; see race_test.go.
const raceEnabled = false
