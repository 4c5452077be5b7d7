// Package feedtest is what every implementation of the feed contract tests
// itself with: the conformance suites a store, a reader and a sink run from
// their own tests, and ManualClock, which drives lease timings without
// sleeping. memfeed, the in-memory oracle, passes every suite; a store or sink
// that passes them keeps the guarantees of the feed package's doc, as far as a
// black-box test can see them.
//
// # Wiring a store
//
// A store's test calls RunFeed and RunSyncStore with a NewStore: a function
// that builds the store for one subtest, bound to the StoreOptions it is given
// (SuiteLease timings and a ManualClock that replaces the database's clock for
// every stamp, comparison and lease timer), and returns a StoreHarness. Write
// commits changes in a transaction of its own; Rebuild is a rebuild's feed
// half (generation moved on, feed emptied, one transaction). Each subtest calls
// NewStore once and uses feed names of its own, so subtests run in parallel
// against one shared database or a schema each. A store with several execution
// paths (pgx's query exec modes) runs the suites once per path, as River's
// driver suite is run. The suites count the timers armed on the clock, so a
// store should arm timers on it only for its leases' heartbeats.
//
//	func TestConformance(t *testing.T) {
//		feedtest.RunFeed(t, newHarness)
//		feedtest.RunSyncStore(t, newHarness)
//	}
//
// A sink's test calls RunSink with a function that returns a fresh, empty sink
// against its real server (an index, table or key prefix of its own) and a
// SinkHarness: how to read what it serves, which optional parts of the sink
// contract it keeps (the seq guard, atomic publish), a key it was configured
// to reject, its document size limit, how to make its server unreachable and
// how to reopen it as a restarted process would. A sink with several
// execution paths runs RunSink once per path; the subtests are short, so
// they can run against the real server in parallel.
//
// # Both write modes
//
// A harness with SetMode and Seal (and a Store with SealedRange) runs every
// subtest of RunFeed and RunSyncStore twice: once as written, in the locked
// mode, and once under "Concurrent/" with every feed it writes moved to the
// concurrent mode first. There each write must come back with no seqs and
// its keys in Unsealed; the harness then seals it (rounds until one seals
// nothing) and hands the subtest the seqs its keys got, so the subtests
// check the same rows in both modes. Rounds seal in key order, not in a
// write's order, which only Compaction states apart. The subtests under
// "Concurrent/" alone leave writes unsealed on purpose.
//
// # Why the suites can fail
//
// A suite that passes on everything proves nothing. memfeed's broken_test.go
// runs RunFeed and RunSyncStore, in a child process, against memfeed with one
// fault switched on at a time (a move that ignores the holder or the expected
// cursor, a park that survives a refused move, collection that ignores a sink
// without a cursor or a parked tombstone, a lease taken while live, EnsureHeld
// without its margin, a retry that keeps the seq, a batch with the wrong
// generation, writers without the feed lock, a move trusted to any next
// cursor, a move that wakes no cursor subscriber, collection that deletes a
// tombstone with an unsealed put, a rebuild that keeps unsealed writes) and
// requires each run to fail in
// the subtest that covers the broken rule, and the run with no fault to pass.
// This package's own tests do the same for RunSink with a map sink broken one
// rule at a time.
//
// # What RunFeed proves
//
//   - NeverWritten: a feed nobody wrote reads at generation 1, head 0, empty.
//   - RoundTrip: documents read back as written (compared with JSONEqual, as
//     jsonb normalises them), at seqs 1, 2, 3 in the order given; an empty
//     write writes nothing.
//   - Compaction: one row per key; an update moves its key to a new seq; a
//     deletion leaves a tombstone with a nil Doc; within a batch the last
//     change of a key wins and takes one seq.
//   - ConcurrentWritersCommitOrder: guarantee 2. Eight writers commit while a
//     reader tails the feed by seq; every write gets a contiguous range, no
//     seq is handed out twice, and the tail sees every row exactly once, so no
//     row committed below a seq the tail had passed.
//   - ReadBatchWindow: ReadBatch honours after and its record limit, reports
//     the generation and head with the records, and sets More exactly when
//     records follow the batch.
//   - ReadBatchBytes: the byte bound ends a batch before the record that
//     would pass it, with More set; a first record larger than the bound
//     comes alone, never an empty batch; tombstones count their key; 0 is no
//     bound; and reading on by bytes gets every record once, in order.
//   - Rebuild: a rebuild moves the generation on and empties the feed; seqs
//     are not reset, so new rows land above the old head.
//   - Subscribe: a commit after Subscribe signals it; Close is idempotent.
//   - FeedsIndependent: seqs, rows and generations are per feed.
//   - BadInput: guarantee 9. Bad keys, documents (invalid JSON, JSON null, a
//     \u0000 escape, a lone surrogate, invalid UTF-8, a number outside
//     numeric's range, a nil document not made by feed.Delete), feed names,
//     limits (records and bytes) and afters are refused with an
//     *feed.InvalidError naming the field, and a batch with one bad change
//     writes nothing.
//   - Concurrent/UnsealedBesideSealed (concurrent mode only): a write is
//     invisible to readers until sealed, its key's sealed value stays
//     readable meanwhile, SealedRange says unsealed, and a round seals the
//     latest committed value of each key above the head.
//   - Concurrent/RebuildDropsUnsealed: a rebuild discards the old
//     generation's unsealed writes, so none reaches the new one.
//   - Concurrent/SetModeLockedSeals: moving back to the locked mode seals
//     what is unsealed first; a bad mode is refused naming the field.
//
// That an open transaction blocks the next writer of its feed (the feed lock)
// needs a transaction the harness does not expose; each store tests it itself.
//
// # What RunSyncStore proves
//
//   - LeaseHeld: a live lease refuses a rival with a *feed.LeaseHeldError for
//     its SinkID; leases are per (feed, sink).
//   - ReleaseThenRetake: a released lease is lost to its holder and can be
//     taken again, each take with a fresh holder.
//   - ContextEndReleases: the lease lives until its context ends, then frees.
//   - ExpiryAndFencing: guarantee 4. With its holder frozen (Skip), a rival
//     is refused 1ms before ttl and takes over at ttl; the old holder's
//     EnsureHeld fails and its moves and park changes are superseded.
//   - EnsureHeldMargin: EnsureHeld passes until ttl − margin after the take
//     and fails from then, while rivals are still refused.
//   - HeartbeatKeepsLease: renewals on the heartbeat keep the lease past twice
//     its ttl; the stored expiry is the last renewal plus ttl.
//   - CASFromZero, CASExpectedMismatch, CASWrongHolder: a move lands only
//     from the expected cursor (the zero Cursor before the first) and only for
//     the recorded holder; an unregistered sink cannot be moved.
//   - RefusedCASChangesNothing: guarantee 5. A refused move changes neither
//     the cursor, the parked list nor the last advance.
//   - CASRefusesUnknownNext: a move to a seq above the head, or to a
//     generation the feed has not reached, is an *feed.InvalidError naming
//     move.next.seq or move.next.generation; after a rebuild, a move of the
//     generation before it is a *feed.CursorSupersededError naming the new
//     generation; none changes the cursor, the parked list or the last
//     advance; a move into the new generation at seq 0 lands.
//   - CursorWake (when the harness's Store or Reader is a
//     feed.CursorWatcher): every move that
//     lands, with or without park changes, signals the feed's cursor
//     subscription; Close is idempotent.
//   - ParkChanges: feed.ParkChange's order (unpark, then park; last park of a
//     key wins; Replace), and ReadParked in key order.
//   - RetryParked: a retry unparks the key and restamps its row, document or
//     tombstone, at head + 1, so a reader after the sink's cursor sees it
//     again, and wakes subscribers; a key not parked gives false and changes
//     nothing.
//   - CollectTombstones, CollectKeepsParked: guarantee 7. Nothing goes while
//     no sink is registered or a registered sink has no cursor; only
//     tombstones at or below every cursor go, never documents; a tombstone
//     parked for any sink stays, and its retry still works; counts are exact.
//   - RemoveSink: refused while a live lease is held, allowed after release or
//     expiry; removes the cursor and parks; false when there is nothing.
//   - Describe: head, generation, sinks in name order with cursor, last
//     advance, lease holder and expiry, parked list and pending count.
//   - RenewalAfterTakeover: a holder frozen past its ttl whose row a rival
//     took loses its lease at its next renewal, and the rival's expiry stays.
//   - DescribeUnknown: a feed neither written nor rebuilt and with no
//     registered sink is refused with a *feed.UnknownFeedError, however
//     often it was read; one registered sink, a write or a rebuild alone
//     makes it known.
//   - BadInput: guarantee 9 for every method: names, keys, holder, cursors,
//     park seqs, reasons and times, refused before anything is written.
//   - Concurrent/CollectKeepsUnsealedPut (concurrent mode only): guarantee
//     7 with an unsealed put beside a collectable tombstone, which stays.
//   - Concurrent/DescribeUnsealed: Describe reports the mode and the
//     unsealed backlog, and a sink's Pending counts sealed rows only.
//
// Guarantee 8 (mixed lease kinds) concerns the Postgres store's two kinds and
// is tested there.
//
// # What RunSink proves
//
//   - Upsert, Delete, DeleteAbsent: a record's document is stored under its
//     key, a tombstone deletes it, deleting an absent key is no error.
//   - IdempotentReapply: applying a batch again changes nothing.
//   - AwkwardKeys: keys round-trip byte for byte, live and through a resync:
//     '.', '/', ':', '*', '>', '%' and escapes, quotes, a backslash, tabs and
//     newlines, leading and trailing spaces, emoji and other non-ASCII, keys
//     differing only in case or Unicode normal form, and keys of
//     feed.MaxKeyLen bytes differing only in their last byte; deleting and
//     rewriting every other one touches exactly those.
//   - Documents: nested and deeply nested documents, unicode (escaped or
//     not, surrogate pairs, control characters), bare scalars and, when
//     MaxDocumentBytes allows, two 1 MiB documents in one batch read back
//     equal (JSONEqual), live and through a resync.
//   - NumericEdges: numbers at the edges of what a feed accepts (PostgreSQL
//     numeric's range: 131072 digits before the point, 16383 after it) and
//     past int64 and float64 read back as the same values.
//   - OversizedDocument (when MaxDocumentBytes is set, at most 16 MiB): a
//     document a byte over the limit is a rejection of that record with a
//     reason, never an error, and the rest of its batch is applied, resyncs
//     included; a document of exactly the limit is stored.
//   - FaultIsError (when the harness has a Fault): while the server is gone,
//     Apply, a resync's Apply and Publish return errors, never rejections;
//     after it is back, the failed batch applied again and the resync started
//     over leave everything.
//   - ResyncInvisibleUntilPublish: a resync target is invisible until
//     Publish, which replaces the whole copy (keys the resync lacks vanish).
//   - PublishAtomic (when the harness says AtomicPublish): over four
//     resyncs in a row, two readers reading in a loop while Publish runs see
//     the old copy or the new one, whole, never a mix or an empty copy.
//   - ResyncTombstones: tombstones in a resync stream leave their keys out.
//   - AbortKeepsLive: Abort leaves the live copy, and a later resync starts
//     empty.
//   - ResyncAfterCrash: a resync left half-filled, neither published nor
//     aborted, leaves the live copy alone, and OpenResync of the same
//     generation from a reopened sink (Reopen) starts it empty.
//   - ConditionalOnSeq (when the harness says so): an older seq, document or
//     tombstone, does not replace a newer document.
//   - ConditionalOnSeqAfterDelete (likewise): the guard remembers a
//     tombstone's seq, so an older document does not bring a deleted key
//     back.
//   - ConcurrentApply (likewise): an older and a newer batch racing on the
//     same keys, round after round, from Sink and a reopened sink, end with
//     the newer version of every key whichever lands last; the older one's
//     tombstones delete nothing.
//   - StaleGenerationAfterPublish (likewise): the floor of feed.Sink's doc. A
//     stale batch of the generation before (seqs below the copy's first),
//     sent to a resync's copy while it fills and to the published copy after
//     Publish, from Sink and a reopened sink, changes nothing: it neither
//     brings back keys the copy lacks (deleted, or never sent) nor touches
//     the keys it holds; the copy's own later records still land.
//   - StaleGenerationAfterEmptyPublish (likewise): a copy sent no record
//     takes its floor from SetFloor (feed.FloorSetter, which a sink that
//     keeps the guard must implement): after SetFloor(10) and Publish, a
//     stale batch below 10, sent to the copy and then from Sink and reopened
//     sinks, adds nothing; records at 10 and above land. SetFloor(0) is an
//     *feed.InvalidError.
//   - Rejection (when the harness has a RejectKey): a refused record comes
//     back as a feed.Rejection with its key, seq and a reason, not an error,
//     and the rest of the batch is applied, resyncs included.
//   - BadInput: OpenResync refuses a generation below 1.
package feedtest
