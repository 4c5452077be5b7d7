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
// # The concurrent write mode
//
// A feed may be moved to the concurrent write mode (SetWriteMode), as in
// pgfeed, whose package doc argues its commit order. Here a writer's
// transaction takes the feed's write lock shared and a lock per key it
// writes, not the feed lock: writers of different keys never wait for each
// other, and a second writer of a key waits for the first, as on pgfeed's
// row. Its committed values wait unsealed beside the keys' sealed rows,
// unread, until a sealing round (SealRound; RunSealer runs rounds, and
// syncer.Runner runs RunSealer) gives them seqs above the head under the
// feed lock, skipping every key an open writer holds. A reset or a mode
// change takes the write lock exclusive, so it waits for every open writer,
// and a reset discards the old generation's unsealed values with its rows.
// Collection leaves a tombstone whose key has an unsealed put.
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
