//go:build race

package pgfeed_test

// raceEnabled says the tests run under the race detector, which multiplies
// the time and memory of a byte-by-byte pass over a large document.
const raceEnabled = true
