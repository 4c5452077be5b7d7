// Package feedtest holds what every implementation of the feed contract tests
// itself with: a manual clock to drive lease timings without sleeping, and the
// conformance suites a store, a reader and a sink run from their own tests.
package feedtest
