package memfeed

// faultSet breaks the store on purpose, one rule at a time. It exists for one
// reason: the conformance suites in feedtest must be shown to fail on a store
// that breaks a guarantee, and the broken variants are this store with one
// fault switched on (broken_test.go). Every field is false in any Store a
// caller can build, so none of this is reachable outside this package's tests.
type faultSet struct {
	casIgnoresHolder         bool // fencing: a move by a stale holder lands
	casIgnoresExpected       bool // a move from the wrong cursor lands
	parkSurvivesRefusedCAS   bool // atomic moves: a refused move still parks
	collectIgnoresCursorless bool // collection skips sinks with no cursor
	collectIgnoresParked     bool // collection deletes parked tombstones
	leaseTakesLive           bool // a rival takes a lease before it expires
	ensureHeldIgnoresMargin  bool // EnsureHeld passes until the expiry itself
	retryKeepsSeq            bool // a retry unparks but does not restamp
	readSkipsGeneration      bool // batches always claim the first generation
	writeSkipsFeedLock       bool // writers do not serialise on the feed lock
	casTrustsNext            bool // a move to a place the feed never had lands
	moveWakesNobody          bool // a landed move signals no cursor subscriber
	collectIgnoresPending    bool // collection deletes a tombstone with an unsealed put
	resetKeepsUnsealed       bool // a rebuild leaves the old generation's unsealed writes
}
