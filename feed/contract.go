package feed

import (
	"context"
	"time"
)

// Writer writes changes to a feed inside the caller's transaction, so a change
// reaches the feed if and only if the caller's own writes commit.
//
// Tx is the implementation's transaction: pgx.Tx for pgfeed, *memfeed.Tx for the
// in-memory oracle. Write validates and compacts the changes with
// PrepareChanges (nothing is written when one is bad), takes the feed lock (held
// to the transaction's end, so seqs are handed out in commit order), gives the
// changes a contiguous seq range, and arranges a wake-up for the feed's
// subscribers when the transaction commits. A feed in the concurrent write
// mode (WriteConcurrent) is written without the feed lock: its changes get
// their seqs from the store's sealer after the commit, still in commit
// order, and the result lists their keys instead (WriteResult.Unsealed).
type Writer[Tx any] interface {
	Write(ctx context.Context, tx Tx, feed FeedName, changes []Change) (WriteResult, error)
}

// Reader reads a feed. A feed that was never written reads as empty, at
// generation 1 and head 0.
type Reader interface {
	// Head is the highest seq the feed has handed out to a committed row.
	Head(ctx context.Context, feed FeedName) (Seq, error)
	// Generation is the feed's current generation.
	Generation(ctx context.Context, feed FeedName) (Generation, error)
	// ReadBatch returns the records with seq > after, in seq order, up to
	// limit (see BatchLimit; a record over the byte bound ends the batch
	// unless it would be the batch's first), with the generation and head
	// they belong to, read in one snapshot, and Batch.More set when it
	// stopped at a limit. after is ≥ 0.
	ReadBatch(ctx context.Context, feed FeedName, after Seq, limit BatchLimit) (Batch, error)
	// Subscribe returns a subscription that is signalled after commits to the
	// feed. Subscribe before reading: a commit after Subscribe returns always
	// signals, so "subscribe, then catch up, then wait" never sleeps through a
	// change.
	Subscribe(ctx context.Context, feed FeedName) (Subscription, error)
}

// Subscription wakes a waiting worker after commits to one feed. Wake-ups are
// coalesced: many commits while nobody waits leave one signal. A wake-up says
// only "look again"; it may be spurious, and a worker must also poll slowly in
// case a wake-up was lost to a reconnect.
type Subscription interface {
	// C is signalled after commits.
	C() <-chan struct{}
	// Close ends the subscription. It is safe to call more than once.
	Close()
}

// Store is a feed's reader and its sync store in one value, as the driver
// takes them: a worker reads the feed and moves the cursor beside it, in the
// same database. pgfeed's and memfeed's stores are one. A test that wraps one
// role only (a spy on the leases, say) embeds the two in a struct of its own.
type Store interface {
	Reader
	SyncStore
}

// SyncStore keeps each sink's cursor, parked list and lease, in the same
// database as the feed. Every method validates its input first and returns an
// *InvalidError before touching any state. Infrastructure faults are
// *UnreadableError on reads and *WriteFailedError on writes, so the driver backs
// off and tries again.
type SyncStore interface {
	// AcquireLease takes the lease of id for this worker, registering the sink
	// (creating its cursor row, cursor absent) on its first lease. A lease held
	// by a live worker refuses with a *LeaseHeldError. The lease lives until
	// Release or until ctx ends, whichever comes first (so a caller must not
	// end ctx while a sink call it let through is still running); a crashed
	// worker's lease lapses on its own.
	AcquireLease(ctx context.Context, id SinkID) (Lease, error)
	// ReadCursor returns the sink's cursor; the zero Cursor when it has none or
	// is not registered.
	ReadCursor(ctx context.Context, id SinkID) (Cursor, error)
	// CASCursor makes the fenced move m (see CursorMove) in one atomic step, or
	// returns a *CursorSupersededError (or, for a Next the feed never had, an
	// *InvalidError) and changes nothing. A store that is a CursorWatcher
	// wakes the feed's cursor subscribers once a move lands.
	CASCursor(ctx context.Context, m CursorMove) error
	// ReadParked returns the sink's parked records, in key order.
	ReadParked(ctx context.Context, id SinkID) ([]ParkedRecord, error)
	// RetryParked unparks key for the sink and restamps the key's row with a
	// fresh seq under the exclusive feed lock, so every sink sees it again after
	// its cursor. A key whose row is gone (a rebuild emptied the feed since it
	// was parked) is only unparked. It returns false, changing nothing, when the
	// key was not parked for the sink.
	RetryParked(ctx context.Context, id SinkID, key Key) (bool, error)
	// CollectTombstones deletes the feed's tombstones that every registered
	// sink's cursor is at or past, keeping any tombstone whose key is parked for
	// some sink. It collects nothing while any registered sink has no cursor, or
	// while no sink is registered. A tombstone a concurrent write or
	// collection holds may be left for a later call. It returns how many
	// it deleted.
	CollectTombstones(ctx context.Context, feed FeedName) (int, error)
	// RemoveSink unregisters the sink: its cursor row and parked list go. A sink
	// whose lease a live worker holds is refused with a *LeaseHeldError. It
	// returns whether there was anything to remove.
	RemoveSink(ctx context.Context, id SinkID) (bool, error)
	// Describe reports the feed for an operator. Only a known feed has a
	// report: one whose generation and head are recorded (a committed write
	// or reset made them; pgfeed's BindTx and LockTx too) or that has any
	// registered sink. Any other name is refused with an *UnknownFeedError,
	// so a misspelt name does not read as an empty feed.
	Describe(ctx context.Context, feed FeedName) (Description, error)
}

// CursorWatcher is a SyncStore that can wake whoever waits for a sink's
// cursor to move: a web handler that must answer only once its write reached
// the search index, say (syncer.WaitApplied). It is optional, since a waiter
// can always poll ReadCursor; pgfeed's and memfeed's stores implement it.
//
// The wake-up comes from the store, not from the worker that moved the
// cursor, so it reaches a waiter in any process that shares the store's
// database, including one that runs no worker at all.
type CursorWatcher interface {
	// SubscribeCursors returns a subscription signalled after a cursor move
	// of any sink of feed lands. The same rules as Reader.Subscribe hold: a
	// move that lands after SubscribeCursors returns always signals
	// (subscribe, then read the cursor, then wait); wake-ups coalesce and may
	// be spurious; and a waiter must still poll slowly, for a wake-up lost to
	// a reconnect.
	SubscribeCursors(ctx context.Context, feed FeedName) (Subscription, error)
}

// Lease is the right to send to one sink now. Its holder is recorded on the
// sink's cursor row and fences every cursor move.
type Lease interface {
	// ID is the sink the lease is for.
	ID() SinkID
	// Holder is this lease's id, which cursor moves must name.
	Holder() LeaseHolder
	// EnsureHeld returns nil while a sink call made now cannot land after a
	// rival took the lease, and a *LeaseLostError once it might. Call it before
	// every sink call that changes the sink.
	EnsureHeld(ctx context.Context) error
	// Margin is how long a sink call that EnsureHeld let through may take and
	// still be sure to land before a rival can hold the lease (a lease row's
	// margin; see LeaseOptions). ok is false for a lease with no such bound (an
	// advisory lock: its session can die at any moment, and a call already
	// under way then lands as late as its own length). The driver bounds every
	// sink call from it, so a call's deadline always matches the lease it runs
	// under, whatever the store was configured with.
	Margin() (margin time.Duration, ok bool)
	// Release gives the lease up and clears its holder (best effort: a crashed
	// release only leaves the lease to lapse). Safe to call more than once.
	Release(ctx context.Context) error
}

// Sink is a system a feed is mirrored into: a search index, a cache, a bus, a
// table in another database. It has no transactions; it upserts a record's
// document, or deletes its key for a tombstone, by key and idempotently. This
// doc and ResyncTarget's are the one home of the sink contract; feedtest.RunSink
// checks each rule against the real server, and a sink package's doc says which
// of the optional parts it keeps (the seq guard, atomic publish) and what it
// rejects.
//
// # Apply
//
// A batch holds records of distinct keys in ascending seq order, tombstones
// included (nil Doc). Apply upserts each document under its key and deletes
// each tombstone's key; deleting a key the sink does not have is no error.
// Keys are stored byte for byte: keys that differ only in case, trailing
// spaces or Unicode normal form are different documents, and no character is
// a separator or a wildcard. A document reads back as the same JSON value,
// numbers included, however the target spells it (key order, whitespace and
// number spelling may change; a number beyond float64 may not round).
// Applying the same batch again changes nothing: after a fault or a lease
// change the worker sends again what the sink may already have taken. Record
// documents may share buffers with the rest of the batch (see Record); a sink
// that keeps one past the call copies it.
//
// Apply tells apart two failures. A rejection concerns one record: the target
// refuses that document (too large, a type the index cannot map, a key it
// cannot store). It is returned in the slice with the record's key, its seq
// (or 0, meaning the record's own) and a reason an operator can act on; the
// worker parks it, cleaned to one line (CleanReason), and moves on. A
// rejection must name a record of the batch, or the worker treats the whole
// call as failed. An error concerns the sink: unreachable, overloaded, timed
// out, a server-side fault. The worker retries the whole batch later, so an
// error must never be returned for one bad record, nor a rejection for an
// outage, which would park records that are fine. A sink returns either
// rejections or an error; with an error it may have applied any part of the
// batch.
//
// Apply honours ctx: the worker bounds each call so that it ends before the
// lease could pass to a rival, and never starts another call while one runs.
// A call that returns must leave nothing of itself still running.
//
// # The seq guard
//
// A worker that loses its lease may have one call still landing after a rival
// took over. A sink that can make each write conditional on the record's seq
// (a SQL upsert WHERE the stored seq is lower, a server-side script, an
// external version) should: it keeps each key's seq beside its document,
// tombstones included, and ignores a record whose seq is below the stored
// one, so even that stale call cannot bring back an older version. The stale
// call and the rival's may run at the same moment, so the comparison and the
// write are one step on the target, never a read followed by a write. A sink
// that cannot keep the guard says so in its package doc.
//
// A resync's copy starts with no stored seqs, so the guard alone would let a
// stale call of the generation before, landing on the copy while it fills or
// on the live copy after Publish, bring back a key the rebuild removed. A
// sink that keeps the guard therefore also keeps a floor with each copy: the
// lowest seq of the first non-empty batch the copy was sent. It ignores
// every record below the floor (no rejection, no error), on the copy and,
// once published, on the live copy. From Publish on, the floor is kept in the
// sink beside the live copy, not in one process, so every process's calls
// meet it; before, a sink may hold it in its ResyncTarget alone when nothing
// but that target ever writes the filling copy (a namespace, bucket or topic
// of its own), and must keep it in the sink otherwise (a shadow table another
// process's target may reopen). It
// is sound because seqs are never reset (see Seq): the worker fills a copy
// from the start of its generation in seq order and then only moves on, so
// no record of the copy's generation is below its first batch, and every
// record of an older generation is. A copy that was sent no record (its
// generation's feed was empty) gets its floor from FloorSetter instead,
// which every sink that keeps the guard implements on its ResyncTarget.
type Sink interface {
	Apply(ctx context.Context, records []Record) ([]Rejection, error)
	// OpenResync opens a fresh, empty copy of the sink for generation (1 or
	// more; anything else is an *InvalidError for "generation"), which the
	// worker fills from the start of the feed and then publishes. The live
	// copy keeps serving, unchanged, until Publish. Opening a copy for a
	// generation that an earlier, unfinished resync left half-filled (a
	// crash) starts it empty again.
	OpenResync(ctx context.Context, generation Generation) (ResyncTarget, error)
}

// ResyncTarget is a fresh copy of a sink being filled by a resync, after a
// rebuild or for a sink that never had a cursor.
//
// Apply follows Sink.Apply's rules, on this copy only: the records of the
// current generation arrive in seq order, a key more than once across
// batches (updated mid-stream), tombstones included (a key deleted
// mid-stream); nothing reaches what readers are served.
//
// Publish makes this copy the live one, at once where the sink can (a new
// index behind an alias, a shadow table renamed in one transaction, a key
// namespace switched by one pointer): readers see the old copy or the new
// one, never a mix or an empty one. Keys the copy does not hold are gone
// from what is served afterwards, and Sink.Apply then writes to the new copy.
// A sink that cannot swap rebuilds in place instead: it says so in its doc,
// and its Publish still leaves exactly the copy's keys, deleting the others.
//
// Abort throws the copy away and must touch nothing but it: the worker calls
// it when a resync cannot finish (a fault, a generation that moved on, a lost
// lease, shutdown), possibly after a rival took the lease. A later
// OpenResync starts empty; nothing of the aborted copy leaks into it.
type ResyncTarget interface {
	Apply(ctx context.Context, records []Record) ([]Rejection, error)
	Publish(ctx context.Context) error
	Abort(ctx context.Context) error
}

// FloorSetter is a ResyncTarget that can be given its floor (Sink's doc, the
// seq guard) without being sent a record. A copy that was sent none learns
// no floor from its first batch, so without one a stale call of the
// generation before, landing after Publish, would add keys the rebuild
// removed. Every sink that keeps the seq guard implements it, on the same
// mechanism that keeps the floor of its first batch.
//
// The worker calls SetFloor once, before Publish, on a copy it sent no
// record, with the head its resync's last read saw plus one: every seq
// handed out so far, the stale calls' included, is at or below that head,
// and every later record of the copy's generation is above it. A copy that
// was sent records keeps the floor of its first batch, which is never
// higher and needs no call. SetFloor makes floor the copy's floor, kept as a
// first batch's would be (Sink's doc): in the target until Publish where
// that suffices, beside the copy otherwise, and beside the live copy from
// Publish on. A later Apply to the target does not replace it. floor is 1
// or more; anything else is an *InvalidError for "floor".
type FloorSetter interface {
	SetFloor(ctx context.Context, floor Seq) error
}
