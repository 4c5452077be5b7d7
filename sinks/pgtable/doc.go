// Package pgtable is a feed.Sink that mirrors a feed into a PostgreSQL table
// of the user's choosing, usually in another database than the feed's (give
// New a pool of its own): one row per key, with the key, the seq of the
// version stored and the document as jsonb, plus typed columns filled from
// each document by JSON path (Options.Columns), so that the target is a
// relational table people query, index and join.
//
// # Writes and the seq guard
//
// Each Apply is one statement, whatever the batch: the records as arrays,
// unnested and upserted with ON CONFLICT on the key, updating a row only
// WHERE its stored seq is lower than the record's. A record older than what
// the table holds (a stale call from a worker that lost its lease) changes
// nothing, and applying a batch again changes nothing. The sink keeps the
// seq guard of feed.Sink's doc.
//
// # A resync's floor
//
// A resync's shadow table starts with no seqs, so the guard alone would let a
// stale call of the generation before insert a key the rebuild removed, into
// the shadow or, once published, into the live table. So the sink also keeps
// the floor of feed.Sink's doc: a resync's first non-empty Apply records its
// batch's lowest seq as the shadow's table comment ("kairos-pgtable floor
// 1234") before it writes a row, and the upsert keeps only the records at or
// above the floor of the table it writes, read from the catalog in the same
// statement (a batch stays one statement; the lookup is one index probe a
// statement). The comment belongs to the table, not to a row: readers never
// see it, the publishing rename carries it under the live name, and DROP
// takes it away with the table, leaving nothing to keep in step. A side table
// of floors would have to be kept in step by every publish, abort and crash
// cleanup, and keyed by table oid it could hand a dropped table's floor to a
// new one. Any other comment reads as no floor: an operator's comment on the
// live table replaces its floor until the next resync. A resync sent no
// record is given its floor by the worker through Resync.SetFloor
// (feed.FloorSetter), recorded in the same comment.
//
// # Tombstones stay as rows
//
// A tombstone is written through the same guarded upsert as a document: it
// leaves the key's row with the tombstone's seq and a NULL document (and NULL
// mapped columns). Its seq must be remembered somewhere, or an older upsert
// arriving after a newer delete would bring the key back; keeping it on the
// key's own row lets the primary key's ON CONFLICT arbitrate a put racing a
// delete of the same key, in the same statement as the rest of the batch,
// which a side table of tombstones could only do with locks of its own.
// Queries of live documents therefore filter on the document column:
// WHERE doc IS NOT NULL (a view over the table is the user's to make). A
// resync starts a table without the tombstones of earlier generations, so
// tombstone rows never outlive the next rebuild.
//
// # Resync and atomic publish
//
// OpenResync creates a shadow table LIKE the live one (columns, defaults,
// constraints and indexes), granting it what the live one grants to other
// roles (triggers and foreign keys pointing at the table are not carried
// over: a table with those is one to keep in step some other way), named after it with a random suffix, after dropping any shadow an
// earlier resync left (a crash, or a worker that has since lost its lease),
// so a resync always starts empty. Publish renames the live table away, the
// shadow into its name, and drops the old copy, in one transaction: a
// reader sees the old table or the new one, never a mix and never a missing
// table. The new table's indexes then take the names the old one's had
// ("orders_pkey"), so the table reads the same after every resync. Abort
// drops its own shadow and nothing else.
//
// # Rejections and errors
//
// A record is rejected, alone, when a mapped column cannot hold the value
// at its path (a string where the column is integer, a fraction for bigint, a
// timestamp that is not RFC 3339): the reason names the column, its type and
// its path. The conversions are checked before the statement runs, so a
// batch with a bad record is still one statement. A row PostgreSQL itself
// refuses (SQLSTATE class 22, a data exception, or 23, a constraint the user
// added, or 54000, an index row too large) makes the sink apply that batch
// row by row, with the same statement, to reject just those rows. Everything
// else (connections, timeouts, serialization failures, a missing table) is
// an error: the worker retries the batch, and nothing is rejected.
//
// The sink stores any document a feed hands out: the feed refuses at write
// time what jsonb cannot hold, so MaxDocumentBytes is 0.
//
// # Names
//
// Schema, table and column names are plain lower-case identifiers, checked
// by New and always quoted; the sink names the schema in every statement and
// never relies on search_path, so it works through PgBouncer in transaction
// mode.
package pgtable
