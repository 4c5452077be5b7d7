// Package faults proves Kairos's guarantees under process and server
// faults: workers frozen or killed, lock sessions ended, PostgreSQL
// restarted, a transaction pooler in the way, a disk that fills up or
// turns read-only. It has no code of its own; its tests are the proof, and
// this comment says what they check and how. Network faults (a proxy that
// stalls, cuts or slows connections) live in the separate faults module.
//
// # Invariants
//
// Every test checks, along the way and at its end, the ones its fault can
// break:
//
//   - I1: once writers stop and workers catch up, each sink holds exactly
//     the feed's live documents of the current generation, less what is
//     parked for it.
//   - I2: no key ever goes back to an older version in a sink.
//   - I3: every row at or below a committed cursor was applied or parked.
//   - I4: a worker that lost its lease starts no new sink call; at most the
//     one call in flight lands late, and its cursor move fails.
//   - I5: holders and generations never repeat, across restarts.
//   - I6: after shutdown, no goroutine is left (TestMain runs goleak over
//     the whole package), no session holds a sink's advisory lock (pg_locks),
//     no cursor row still names a holder, and no database session of a
//     stopped daemon is left.
//
// # How they are observed
//
// In process, every worker's sink is wrapped by a recorder (record_test.go)
// that logs each call that reached the target (process, operation, seqs,
// start and end, error) and, after each call to the live copy, reads from
// the target itself the seq each of the call's keys now holds: the seq
// column of a PostgreSQL or MariaDB table, the Redis sink's seq keys, the
// seq header of the key's last message in the NATS copy (a delete marker's
// included), the seq a webhook receiver keeps, the seq of the record the
// Kafka sink's Reader keeps, and for the bleve index the lower of the seq
// its guard holds (Searcher.Seqs) and the seq the document it serves was
// sent with. A key whose seq is ever lower than one read before went back
// (I2), whoever sent it. A file sink's reader folds each key to its highest
// seq, so there the file's own lines are checked as well (below). The
// recorder's hook runs where the worker calls the sink, right after its
// EnsureHeld, which is where a test freezes a worker.
//
// Across processes (`kairos run` subprocesses, the command built once from
// this module for the package), a watcher (watch_test.go) samples every
// 100ms the store's description (cursors never go back, a replaced holder
// never comes back, the generation never goes back) and the target table
// (no key's seq goes back; never two generations at once: every document
// the tests write carries the generation it was written in as "g"). A file
// sink's file is itself the log of every record that reached it, in order,
// so its lines are checked for a key going back.
//
// Workers of one test stand for separate processes: each has its own store
// and pools, whose sessions carry an application name of their own, so a
// test can end them (pg_terminate_backend) and keep them from reconnecting.
//
// # What needs what
//
// The tests use the shared PostgreSQL, PgBouncer, MariaDB, Redis and NATS
// JetStream of the other packages' tests (scripts/test starts them); Kafka
// is kfake, franz-go's in-process cluster, started by the test that uses
// it, since no Kafka broker can run where they do. Two need root: the
// private PostgreSQL cluster of the restart test (initdb and pg_ctl as user
// postgres, on a spare port, in a directory of its own) and the tmpfs of
// the disk tests (mounted, shrunk, remounted read-only). Without root, or without a server, a test is skipped on a
// laptop and fails in CI (CI set). The soak runs about half a minute by
// default; KAIROS_SOAK=1 runs the long one (50000 changes), KAIROS_SOAK=<n>
// runs n changes.
package faults
