// Package feed is Kairos's contract: the vocabulary of a feed and its sinks as
// types, the errors every implementation returns, and the interfaces a store, a
// reader and a sink implement. It has no dependencies beyond the standard
// library; implementations live beside it (memfeed, the in-memory oracle;
// pgfeed, PostgreSQL) and prove themselves against the suites in feedtest.
//
// # The model
//
// A feed is a named, key-compacted change log of one read model, written in the
// same transaction as the read model itself (Writer). It keeps one row per key:
// the key's latest JSON document, or a tombstone, stamped with a Seq that rises
// in commit order. A sync worker mirrors the feed into each Sink, one lease per
// (feed, sink) deciding who sends, with a Cursor per sink that only the lease's
// holder can move (SyncStore). A record a sink refuses is parked for that sink
// and the cursor moves past it; an operator retries it later. A rebuild moves
// the feed to a new Generation and empties it; every sink then resyncs into a
// fresh copy and publishes it.
//
// # Guarantees
//
// Every implementation keeps these, and feedtest holds it to them:
//
//   - Commit order: a reader that saw seq s never later sees a newly committed
//     row below s (Writer's feed lock).
//   - Fencing: a cursor move names the lease holder and lands only while that
//     holder is recorded (CursorMove); a worker whose lease is gone cannot move
//     the cursor or change the parked list.
//   - Atomic moves: a move that loses its guard changes nothing, parks included.
//   - Safe collection: a tombstone goes only when every registered sink is past
//     it, never while a registered sink has no cursor, never while its key is
//     parked for any sink (SyncStore.CollectTombstones). Collection can trust
//     the cursors because a move only lands on a place the feed has been: its
//     generation, at or below its head (CursorMove).
//   - At most one stale sink call per lost lease (LeaseOptions).
//   - Bad input is refused with an *InvalidError naming the field, before
//     anything is written.
//
// # Errors
//
// Conditions are sentinels matched with errors.Is (ErrLeaseHeld, ErrLeaseLost,
// ErrCursorSuperseded, ErrUnreadable, ErrWriteFailed, ErrInvalid), each with a
// typed form for errors.As that carries the details and wraps the cause.
// Infrastructure faults are ErrUnreadable or ErrWriteFailed, which the driver
// retries with backoff; ErrLeaseLost and ErrCursorSuperseded make it stop
// sending and take the lease again; ErrInvalid is a caller's bug.
package feed
