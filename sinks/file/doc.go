// Package file is a feed.Sink that mirrors a feed into one JSON-lines file:
// a line per change, folded by readers into the live documents. It needs no
// server, so it is what a demo, a static site build, an export or a test
// fixture reaches for.
//
//	s, err := file.New(file.Options{Path: "out/products.jsonl"})
//	docs, err := file.Read("out/products.jsonl")
//
// # The file
//
// The first line is a header, {"kairos_file":1,"generation":G}, G being the
// generation of the resync that wrote the copy (0 for a copy no resync
// made), with "floor":F once the resync was sent its first records or was
// given its floor by SetFloor (see Guarantees). Every other line is one record, in the order it was written:
//
//	{"key":"k1","seq":12,"doc":{"name":"lamp"}}
//	{"key":"k2","seq":13,"deleted":true}
//
// The document is the feed's, compacted onto one line; its numbers and
// strings are as the feed holds them. Read (or any reader following the
// same rule) keeps, per key, the line with the highest seq; a deleted line
// removes the key; a last line without its newline (a write under way) is
// left out. A key's lines need not be in seq order: a stale call's older
// line may come after a newer one, and the rule undoes it.
//
// # Guarantees
//
// Seq guard: Apply writes only the records whose seq is above the one the
// file holds for their key, tombstones included (a key's tombstone stays in
// the file, so an older write after a delete is refused). Comparison and
// write are one step across processes: each Apply holds an exclusive lock
// on Path+".lock" (flock on Unix) while it reads what other processes
// appended since its last call and appends its own lines, so a stale
// worker's call and its rival's never interleave.
//
// A resync's copy also records, in its header, the lowest seq it was first
// sent (its floor), and refuses any record below it: seqs are never reset
// across generations, so such a record is of an older generation, sent by a
// stale worker after the copy was published, and would otherwise bring back
// a key the rebuild no longer has. A copy that was sent no record gets its
// floor in its header from SetFloor (feed.FloorSetter), which the worker
// calls before Publish.
//
// Durability: Apply returns once its lines are written and fsynced, so the
// cursor moves only past what is on disk.
//
// Atomic publish: a resync writes a fresh copy, Path+".g<generation>.tmp",
// and Publish renames it over Path (after an fsync of the copy, then of the
// directory): a reader opening Path gets the old copy whole or the new one,
// never a mix or an empty file. OpenResync for a generation truncates that
// generation's copy, so a resync after a crash starts clean; Abort removes
// it. Readers that keep the file open across a publish keep reading the old
// copy; reopen Path to see the new one.
//
// Compaction: the file grows by a line per change. When it holds more than
// Options.CompactRatio times as many lines as keys (and at least
// Options.CompactMinLines), Apply rewrites it with one line per key, the
// latest, tombstones kept, and renames the rewrite over Path as Publish
// does; a reader sees the same live documents before and after.
//
// Rejections: a record whose document is larger than
// Options.MaxDocumentBytes, the rest of the batch applied. Errors: any
// failure to lock, read, write, fsync or rename (a full disk, a directory
// gone or read-only); the batch is retried whole and, the guard keeping
// whatever landed, nothing is written twice.
//
// One process, or several on one host sharing the file's directory, may
// write the file: the lock is a host-local flock, not a lock on a network
// file system. On systems without flock (Windows), the lock holds within
// one process only.
package file
