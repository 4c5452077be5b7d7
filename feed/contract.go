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
// subscribers when the transaction commits.
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
	// ReadBatch returns up to limit records with seq > after, in seq order,
	// with the generation and head they belong to, read in one snapshot. limit
	// is 1 to MaxBatchLimit; after is ≥ 0.
	ReadBatch(ctx context.Context, feed FeedName, after Seq, limit int) (Batch, error)
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
	// returns a *CursorSupersededError and changes nothing.
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
	// while no sink is registered. It returns how many it deleted.
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

// Sink is a system a feed is mirrored into. It has no transactions; it upserts
// a record's document (or deletes its key, for a tombstone) idempotently.
//
// Apply tells apart two failures. A rejection concerns one record (the target
// refuses that document): it is returned in the slice, the record is parked,
// and the worker moves on. An error concerns the sink (unreachable, overloaded,
// timed out): the worker retries the whole batch later. A sink returns either
// rejections or an error, and on an error it may have applied any part of the
// batch, which the retry makes good since applying is idempotent.
type Sink interface {
	Apply(ctx context.Context, records []Record) ([]Rejection, error)
	// OpenResync opens a fresh, empty copy of the sink for generation, which
	// the worker fills from the start of the feed and then publishes.
	OpenResync(ctx context.Context, generation Generation) (ResyncTarget, error)
}

// ResyncTarget is a fresh copy of a sink being filled by a resync. Records are
// applied to it in seq order, tombstones included; Publish swaps it in at once
// where the sink allows it (a sink that cannot says so in its documentation and
// rebuilds in place); Abort throws it away, and must touch nothing but this
// unpublished copy, since a worker calls it after its lease may be gone.
type ResyncTarget interface {
	Apply(ctx context.Context, records []Record) ([]Rejection, error)
	Publish(ctx context.Context) error
	Abort(ctx context.Context) error
}
