// Package memfeed is the in-memory feed, sync store and sink: the executable
// specification every other implementation is held to. feedtest's suites pass
// on it, and the Postgres store is compared with it step by step.
//
// # Why it is simple
//
// One mutex guards the whole store and every operation holds it from start to
// end, so each operation is atomic by construction and the code can be checked
// by reading it. What a database gets from transactions and row locks, this
// store gets from that one lock, with one exception kept on purpose: the feed
// lock. A writer's transaction (Tx) takes its feed's lock at its first write
// and holds it to commit or rollback, exactly as pgfeed's row lock on the
// generations row, so seqs come out in commit order and an open transaction
// blocks the next writer, RetryParked and ResetFeed, as it does in Postgres.
//
// # Leases and time
//
// Leases are lease rows (feed.LeaseOptions explains the arithmetic), stamped and
// compared with the injected feed.Clock; the heartbeat and EnsureHeld come from
// the same engine pgfeed uses. A test that injects a manual clock drives expiry
// and renewals without sleeping.
//
// # What it is not
//
// It keeps nothing across a restart, and every operation copies documents in
// and out, so it is for tests, examples and demos, not for production feeds.
package memfeed
