// Package mysql is a feed.Sink that mirrors a feed into a table of a MariaDB
// or MySQL database, through database/sql and github.com/go-sql-driver/mysql:
// one row per key, which applications query like any other table.
//
//	s, err := mysql.Open(ctx, "kairos:pw@tcp(db:3306)/app", mysql.Options{Table: "orders", Create: true})
//
// # The table
//
// Options.Create makes it as
//
//	CREATE TABLE `orders` (
//	  `key` VARBINARY(512) NOT NULL,
//	  `seq` BIGINT NOT NULL,
//	  `doc` LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
//	  PRIMARY KEY (`key`),
//	  CHECK (`doc` IS NULL OR JSON_VALID(`doc`))
//	) ENGINE=InnoDB
//
// The key is bytes, compared as bytes: every utf8mb4 collation the two
// servers share folds something (case, accents, or trailing spaces under
// PAD SPACE), and would make two keys of a feed one row; 512 bytes fit an
// InnoDB index. The document is stored as the text the feed holds, not as
// MySQL's binary JSON, which turns numbers into doubles and refuses those a
// double cannot hold. A table made by hand needs these three columns (doc may
// be JSON, and must allow NULL) and its primary key on key alone; other
// columns, indexes, constraints and triggers are left alone.
//
// A row whose doc is NULL is a tombstone: a deleted key keeps its row, with
// the seq of its deletion, so readers select WHERE doc IS NOT NULL. That row
// is what lets the seq guard cover deletes: without it, an older upsert
// arriving after the delete (the one stale call of a worker that lost its
// lease) would find no row to compare with and bring the key back. Keeping
// the seq in the key's own row, rather than in a second table, makes the
// guard one row-level upsert that racing calls serialize on. Tombstone rows
// stay until a resync publishes a fresh table, which holds only those of keys
// deleted while it was filled.
//
// # Guarantees
//
// Seq guard: yes, for documents and tombstones alike. Each batch is one
// multi-row INSERT … ON DUPLICATE KEY UPDATE that replaces a row only when
// its stored seq is lower (see Sink.upsert for the form both servers accept),
// so a stale or repeated call changes nothing, and two calls racing on a key
// end with the higher seq's version. A batch is split into several such
// statements only when it would pass max_allowed_packet or
// MaxRowsPerStatement rows; each lands on its own.
//
// Floor: yes (feed.Sink's doc). A shadow table starts with no seqs, so a
// stale call of the generation before could otherwise insert a key the
// rebuild removed. A resync's first non-empty Apply, before it writes a row,
// gives the shadow a CHECK constraint, kairos_floor_ and 8 random hex digits,
// that refuses a row whose seq is below that batch's lowest: the server
// enforces it on the very table each statement writes, in the statement,
// and RENAME TABLE carries it under the live name. It is part of the table's
// definition, not a row, so readers never see it. The sink leaves out of each
// statement the records below the floor it knows for the table; when the
// constraint refuses a row all the same (the table was published by another
// process since), the sink reads the table's floor from information_schema,
// leaves out what is below it and sends the rest again, so a stale record is
// ignored, never rejected. Checking the floor in each VALUES row instead
// made a 500-row upsert about a third slower on MariaDB 10.11; a constraint
// costs the usual path nothing. CREATE TABLE … LIKE copies the live table's
// floor constraint to the next shadow, which replaces it with its own at
// its first batch, or when the worker calls SetFloor (feed.FloorSetter) on
// a resync sent no record.
//
// Publish: atomic. OpenResync creates a shadow table LIKE the live one (with
// its columns, indexes and constraints, but not its triggers) under a name of
// its own; Publish swaps it in with one RENAME TABLE live TO retired, shadow
// TO live, which both servers perform atomically (a reader sees the old
// table or the new one, never neither), and then drops the retired copy.
// Abort drops the shadow only. OpenResync first drops every shadow and
// retired copy an earlier resync of the table left (a crash, an abort that
// could not reach the server), so a resync after a crash starts empty, and a
// crashed worker's late writes to its shadow fail instead of landing.
//
// Rejections, each of its record alone, the rest of the batch applied:
//
//   - a document larger than MaxDocumentBytes, which is what one statement
//     with the longest key leaves of the server's max_allowed_packet (read by
//     New): such a row cannot be sent at all;
//   - a row the server refuses for its own sake, by error number: a CHECK
//     constraint (the JSON check, which on MariaDB 10.11 also refuses documents
//     nested 32 levels deep or more, or a constraint of the user's), a value too
//     long or of the wrong type for a column the user narrowed or added, a
//     NOT NULL column the user added. The statement that held it is then
//     halved, again and again, until each refused row stands alone.
//
// New over a pool of the caller's assumes its driver takes packets as large
// as the server does (the driver's default, 64 MiB, is MySQL 8's and more
// than MariaDB's); Open uses the smaller of the two.
//
// max_allowed_packet is read once, by New: a server whose limit is lowered
// afterwards refuses the larger statements as faults, until a new sink reads
// the new limit.
//
// Errors, the whole batch retried: everything else. Connections refused or
// lost, timeouts, deadlocks and lock waits, a missing table, the server's
// other faults.
//
// A call that ends on its context closes its connection, but the server may
// still finish a statement it had begun; the seq guard makes such a late
// landing harmless, since it can only write a version no newer row replaced.
//
// # Servers
//
// The SQL is written for MariaDB 10.11 and MySQL 8 alike: backtick-quoted
// names, CHECK constraints (enforced from MariaDB 10.2 and MySQL 8.0.16),
// VALUES() in ON DUPLICATE KEY UPDATE (MySQL 8.0.20 and later accept it with
// a deprecation warning), multi-table RENAME TABLE. Floor constraints get
// random names, since MySQL keeps constraint names unique per database; how
// MySQL names the copy LIKE makes of one is untried. Its tests run against
// MariaDB 10.11 only; MySQL 8 has not been run. The session's sql_mode must be
// strict (both servers' default), or the server would cut a value too long
// for its column instead of refusing it; New checks it.
package mysql
