// Package syncer is Kairos's sync driver: a Worker keeps one sink in step with
// one feed, and a Runner supervises a worker per (feed, sink) pair under one
// context. It runs over any feed.Reader, feed.SyncStore and feed.Sink that keep
// the contract of package feed: memfeed in tests, pgfeed in production.
//
// # The worker
//
// A worker takes the sink's lease, reads the sink's cursor and parked list,
// and then either resyncs (the cursor is absent or of an older generation:
// fill a fresh copy of the sink from the start of the current generation,
// publish it, and move the cursor to the last seq read with the parked list
// replaced by what the copy refused; a copy it sent no record is first given
// its floor, feed.FloorSetter) or sends incremental batches after the
// cursor, parking what the sink refuses and unparking keys whose newer version
// it took. Caught up, it waits for the feed's wake-up or the poll interval.
// Worker's doc draws the state machine.
//
// # Why a resync's copy is exact
//
// Writers keep changing the feed while a resync streams it, yet when the stream
// ends at the last seq it read, L, the fresh copy holds exactly the feed's live
// documents at L. A key's row only ever moves up to a higher seq (a new version
// or a tombstone), and seqs come out in commit order. The stream reads batches
// after the last seq read, and a batch is only ever cut at its end (by its
// record count or its byte bound), so it holds every row of its snapshot in
// its range, from the seq it was read after to its last. The stream ends on
// the first batch that says nothing follows it (feed.Batch.More is false; a
// batch cut by bytes is short but says More, so it never ends the stream), so
// in that last batch's snapshot no row lies above L. Take a key's row in that
// snapshot, at some s ≤ L, and the batch whose range covered s: it saw its own
// last seq committed, so the row at s was already committed then (commit
// order), and it is unchanged since (seqs are never reused), so that batch
// returned it; every later version of the key came in a later batch, in seq
// order. A key updated mid-stream is therefore applied twice and ends at its
// latest version, and a key deleted mid-stream ends with its tombstone
// applied. Tombstones are not collected from under a resync: collection waits
// for every registered sink's cursor, and this sink's is absent or of an older
// generation, below every row of this one. A rebuild empties the feed and
// moves the generation in one step; every batch is checked against the
// generation the copy was opened for, and a moved one aborts the copy and
// starts the resync again.
//
// The cursor then becomes (generation, L), the last seq actually read rather
// than the batch's head: the head may stand above rows that were never read
// (collected tombstones, the previous generation's seqs), and the last seq read
// needs no argument. With nothing read L is 0, below every row of the
// generation, so nothing is skipped.
//
// # Guarantees
//
//   - The cursor moves only past records the sink has applied or refused, and
//     only under this worker's lease: the store fences every move by holder.
//   - No regress: records go to the sink in seq order, one batch at a time,
//     and a worker never has two sink calls in flight. Across a lease change,
//     at most the one call in flight when the lease was lost lands late, since
//     EnsureHeld is asked before every call that changes the sink and every
//     call runs under Options.SinkTimeout, shorter than the lease margin
//     (feed.LeaseOptions has the arithmetic).
//   - A shutdown gives the lease up only after the last sink call returned, so
//     a rival never sends beside a call of a stopping worker.
//   - At least once: the cursor may stand behind what the sink took (the call
//     in flight, and the batches whose move Options.MoveInterval put off), and
//     whoever holds the lease next sends those again. It reads them from the
//     feed, which keeps only each key's latest version, so a resend never
//     takes a key back.
//
// # Reading your writes
//
// An API that has just written a change often must answer only once the
// search index or the cache shows it. The write already says where it landed
// (feed.WriteResult); WaitApplied waits until a sink's cursor has passed it
// and says how it ended: applied, parked for that sink (which records, with
// the sink's reasons), or superseded by a rebuild (the sink's cursor moved to
// a later generation). WaitAppliedAll does so for every sink registered when
// it is called, and Runner.WaitCaughtUp for every target of a runner at its
// feed's head as read when it is called.
//
// The decision reads only what every feed.SyncStore exposes, the cursor and
// the parked list, so it lives once, here, over any store; no store repeats
// it. What differs per store is how a waiter learns that a cursor moved
// without polling hard: the optional feed.CursorWatcher. pgfeed notifies a
// channel of its own from the cursor-move statement itself, so a waiter in a
// process that runs no worker (a web handler beside the daemon) is woken
// within milliseconds of the move wherever the worker runs; memfeed wakes
// in-process. A store that is no CursorWatcher still works, at the pace of
// WaitOptions.PollInterval, which is also the fallback for a wake-up lost to
// a reconnect. A wrapper around a store must keep its SubscribeCursors, or
// its waiters only poll.
//
// # How it fails
//
// Infrastructure faults (feed.ErrUnreadable, feed.ErrWriteFailed, a
// *SinkError: a sink that errs, hangs past its deadline or panics) never end
// Run and never move the cursor: the worker backs off exponentially with
// jitter, re-reads its cursor and parked list, and tries again. A lost lease
// or a superseded cursor makes it stop sending, release the lease and take it
// again from the start, except a resync's final move refused because a
// rebuild moved the feed on (feed.CursorSupersededError.Generation): the
// copy just published is of a generation gone, and the resync starts again
// under the same lease. An feed.ErrInvalid from the store is a bug in the
// store or the worker; it is logged as an error and backed off like a fault,
// so it neither spins nor goes unseen. A worker that cannot subscribe to the
// feed's wake-ups, or whose subscribe does not answer within its poll
// interval, polls meanwhile and shows it in State.WakeUps: lost wake-ups cost
// latency, never progress.
// State exposes each worker's phase,
// cursor, lag, counts, lease (or the rival it waits for) and last error, with
// when it recovered, while it runs; Worker's doc says what it logs.
package syncer
