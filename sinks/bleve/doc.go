// Package bleve is a feed.Sink that mirrors a feed into an embedded
// full-text index (github.com/blevesearch/bleve/v2) on local disk: one bleve
// document per key, indexed with a configurable mapping (DefaultMapping, every
// field by its JSON type, unless Options.Mapping says otherwise), with the
// feed's JSON stored whole beside it. It needs no server, which makes it the
// search sink of the demo; a Searcher reads it from the same process.
//
// The package's name is the library's: import one of the two under another
// name (kbleve, say) where both are needed.
//
// # Layout
//
// Options.Dir holds a lock file (LOCK), a pointer file (CURRENT) naming the
// live index directory, and index directories named after the generation
// they were built for and a random suffix (g00000002-1f0c9a7e), each holding
// the bleve index and a small bolt file of seqs. Nothing else may live there:
// New refuses a directory without a pointer that holds other files, and a
// pointer that names no index is an error, never a reason to start empty.
//
// # Writes and the seq guard
//
// Each Apply is one bleve batch, which bleve returns from only once it has
// persisted it. Before the batch, the seqs stored for the batch's keys are
// read from the index's seq file, records older than them dropped, and the new
// seqs, tombstones' included, written and synced; all of it under one lock per
// directory that every Sink and Searcher of the process shares, so the
// comparison and the write are one step for every writer that can reach the
// index (see the next section for why no other process can). A record below a
// key's stored seq changes nothing, a tombstone's seq is remembered after its
// document is gone, and applying a batch again changes nothing: the sink
// keeps the seq guard of feed.Sink's doc.
//
// Writing the seqs before the batch keeps the guard across a crash between
// the two: a seq stored for a document that did not land stops only older
// records, and the worker resends that document with the same seq, which the
// guard lets through (equal is not older).
//
// A resync's copy starts with no seqs, so it also keeps a floor: the lowest
// seq of the first batch it was sent. The worker fills a copy from the start
// of its generation in seq order and then only moves forward, so every later
// record is at or above the floor, and a stale call from a worker of the
// generation before (whose seqs are all below it) is ignored even for keys the
// new copy never had. A copy that was sent no record is given its floor by
// the worker through SetFloor (feed.FloorSetter), stored the same way.
//
// Seqs live in a bolt file of their own rather than in bleve's internal store
// because bleve copies and persists its whole internal store with every
// batch, a cost that would grow with the number of keys.
//
// # One process per directory
//
// bleve's index is a single-process store, and the directory's lock makes
// the whole directory one: while a process has a Sink or a Searcher open on
// it, New and NewSearcher in any other process wait Options.LockTimeout and
// fail with ErrLocked. Within a process, every Sink and Searcher of one
// directory share one open index; the last Close closes it.
//
// For the worker lease that means: two workers of one process for the same
// directory (a Reopen, in the conformance suite's terms) are safe, since the
// shared lock makes their writes one at a time and the seq guard holds
// between them. A worker in another process cannot build its sink at all
// while the first process has the directory open, so a standby process takes
// over only after the first one has closed its sink or exited; the lease
// still decides which worker sends and fences the cursor as for any sink.
// The index is on local disk, so the sink serves the one machine it runs on;
// run searches in the sink's process (the demo does) or serve them from it.
//
// # Resync and atomic publish
//
// OpenResync throws away every unpublished index directory (a crashed
// resync's, or that of a worker that has since lost its lease, whose calls
// then fail with ErrClosed) and creates a fresh, empty one, so a resync for a
// generation a crash left half-filled starts clean. Publish syncs the new
// index's files, writes its name to CURRENT.tmp, syncs it, renames it over
// CURRENT and syncs the directory: after a crash the pointer names the old
// index or the new one, whole. The process's searchers are then handed the
// new index; a search under way keeps the old one until it returns, and the
// old directory is closed and removed when the last such search ends (or,
// after a crash, at the next open). Abort removes its own directory and
// nothing else.
//
// # Searcher
//
// A Searcher shares its process's open directory with the sinks, so it
// learns of a publish at once, in memory, without polling the pointer file:
// each call takes the live index when it starts and keeps it to its end. It
// runs bleve searches (Search; ask for SourceField to have hits' documents),
// reads a document back by key (Document) and the seq the guard holds for
// each key, a deleted one's included (Seqs).
//
// # Documents
//
// A document is stored exactly as the feed handed it out, in the stored,
// unindexed field SourceField, so it reads back as the same JSON, numbers
// included. For the index it is decoded with numbers as float64, as bleve
// indexes them; a number beyond float64's range is left out of the index
// (and kept in SourceField). A document that is not an object is indexed
// under ValueField. A mapping applies to the indexes the sink creates: an
// existing index keeps the mapping it was built with, so a changed
// Options.Mapping takes effect at the next resync.
//
// # Rejections and errors
//
// A record is rejected, alone, when its document is larger than
// Options.MaxDocumentBytes, or when the index's mapping or bleve refuses to
// build it into a document (MapDocument's or the batch's refusal of that one
// document). Everything else is an error and the worker retries the batch: a
// disk or file fault (a write, a sync, an index directory gone), a closed
// sink or directory, a resync thrown away. A batch bleve itself fails (on a
// full disk, say) also leaves the index opened again from its files before
// the error returns: bleve keeps such a batch live in memory with parts
// already released, which no read or later write may touch, so what never
// reached the disk is dropped, searches serve what did, and the worker's
// resend lands the batch. The sink cannot be cut off from a
// server, having none, so its conformance harness has no Fault; its tests
// check instead that a closed sink, a removed index directory and a damaged
// pointer or index are errors.
//
// Apply checks ctx before it starts; a batch under way runs to its end (bleve
// takes no context), which for a batch of hundreds of records is tens of
// milliseconds.
package bleve
