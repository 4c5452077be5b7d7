package pgfeed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
)

// Store is the Postgres feed and sync store for every feed under one schema
// and table prefix. It implements feed.Writer[pgx.Tx], feed.Reader,
// feed.SyncStore and feed.CursorWatcher and is safe for concurrent use.
// Migrate must have run; New checks that it did.
type Store struct {
	db     DBTX
	names  names
	sql    statements
	lease  feed.LeaseOptions
	clock  feed.Clock
	system bool // clock is the system clock: the database stamps times
	logger *slog.Logger

	advisory *pgxpool.Pool

	listenMu sync.Mutex
	listener *listener
	closed   bool
	listen   func(ctx context.Context) (*pgx.Conn, error)
	// listenTimeout is Options.ListenTimeout, resolved.
	listenTimeout time.Duration
	// listenCheck is Options.ListenCheck, resolved.
	listenCheck time.Duration
	// sealer is Options.Sealer, resolved.
	sealer SealerOptions

	// modes caches each feed's write mode (feed.FeedName → feed.WriteMode)
	// as this store last found it. A stale entry costs one statement more:
	// each write statement checks the mode the row records, does nothing
	// when it differs, and the write runs the other one (see Write).
	modes sync.Map
	// writeKeys caches each feed's write-lock key (feed.FeedName → int64):
	// the key is a hash of the feed's name, which cost an eighth of a
	// concurrent Write's client time when computed at every write.
	writeKeys sync.Map
	// changeSeals caches each feed's sealChanges statement (feed.FeedName →
	// string), which names the feed's capture document function.
	changeSeals sync.Map
	// floors holds the floor (changesFloor) each sealer of this store
	// last moved to, feed.FeedName → int64, for tests to watch.
	floors sync.Map
	// afterReserve, when a test sets it, runs after each reservation of an
	// in-place backfill's batch, before the batch reads, with the batch's
	// share (see inPlaceRun.parallel).
	afterReserve func(share int)
	// onBatch, when a test sets it, is told of each in-place batch
	// statement that ran: whether it inserted plainly (see
	// inPlaceRun.batch), and its error.
	onBatch func(plain bool, err error)
}

// testBatch tells a test's onBatch of an in-place batch's statement.
func (s *Store) testBatch(plain bool, err error) {
	if s.onBatch != nil {
		s.onBatch(plain, err)
	}
}

var (
	_ feed.Writer[pgx.Tx] = (*Store)(nil)
	_ feed.Reader         = (*Store)(nil)
	_ feed.SyncStore      = (*Store)(nil)
)

// New returns a store over db, or an *feed.InvalidError naming the option
// that is wrong. It then checks, in two short statements bounded by ctx,
// that db answers and that the schema is migrated to the version this build
// needs (see the package doc's # Schema): a database that cannot be reached
// is an *feed.UnreadableError, a schema behind a *NotMigratedError, so a
// missing Migrate shows at startup rather than at the first write. The
// check writes nothing and raises no error on a missing table, so a pgx.Tx
// given as db stays usable whatever it finds. With Options.AdvisoryLock set
// it also checks that pool: a pool recognisably behind a transaction pooler
// is refused (the package doc's # Leases says how it is recognised), which
// needs one more round trip.
func New(ctx context.Context, db DBTX, opts Options) (*Store, error) {
	if db == nil {
		return nil, feed.Invalid("db", "must not be nil")
	}
	n, err := resolveNames(opts.Schema, opts.TablePrefix)
	if err != nil {
		return nil, err
	}
	lease, err := opts.Lease.Resolve("lease")
	if err != nil {
		return nil, err
	}
	switch {
	case opts.ListenTimeout < 0:
		return nil, feed.Invalid("options.listen_timeout", "is %v; durations must be positive", opts.ListenTimeout)
	case opts.ListenTimeout == 0:
		opts.ListenTimeout = DefaultListenTimeout
	}
	switch {
	case opts.ListenCheck < 0:
		return nil, feed.Invalid("options.listen_check", "is %v; durations must be positive", opts.ListenCheck)
	case opts.ListenCheck == 0:
		opts.ListenCheck = DefaultListenCheck
	}
	sealer, err := opts.Sealer.resolve()
	if err != nil {
		return nil, err
	}
	if err := n.migrations().Check(ctx, db); err != nil {
		return nil, err
	}
	if opts.Clock == nil {
		opts.Clock = feed.SystemClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Store{
		db:       db,
		names:    n,
		sql:      n.statements(),
		lease:    lease,
		clock:    opts.Clock,
		system:   feed.IsSystemClock(opts.Clock),
		logger:   opts.Logger,
		advisory: opts.AdvisoryLock,
		listen:   opts.Listen,

		listenTimeout: opts.ListenTimeout,
		listenCheck:   opts.ListenCheck,
		sealer:        sealer,
	}
	if s.advisory != nil {
		if err := checkSessionPool(ctx, s.advisory); err != nil {
			return nil, err
		}
	}
	if s.listen == nil {
		switch d := db.(type) {
		case *pgxpool.Pool:
			s.listen = func(ctx context.Context) (*pgx.Conn, error) {
				c, err := d.Acquire(ctx)
				if err != nil {
					return nil, err
				}
				return c.Hijack(), nil
			}
		case *pgx.Conn:
			cfg := d.Config().Copy()
			s.listen = func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg) }
		}
	}
	return s, nil
}

// Close stops the listener, if one runs, and waits for it. Subscriptions stop
// being signalled, and Subscribe fails from then on. It does not close db,
// which is the caller's, nor release leases, which are their holders'.
func (s *Store) Close() {
	s.listenMu.Lock()
	l := s.listener
	s.listener, s.closed = nil, true
	s.listenMu.Unlock()
	if l != nil {
		l.close()
	}
}

// now is the time parameter of statements that stamp or compare: nil with
// the system clock, so the database's clock_timestamp() decides.
func (s *Store) now() *time.Time {
	if s.system {
		return nil
	}
	t := s.clock.Now()
	return &t
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// Write writes changes to f inside the caller's tx; see feed.Writer. The
// whole batch is one statement, whatever its size. Documents travel as text,
// so they survive every exec mode, the simple protocol included.
//
// In the locked mode (the default) the statement takes the feed lock and
// returns the seqs. In the concurrent mode it takes no feed lock, leaves the
// rows unsealed, and returns the generation and the keys (WriteResult's
// Unsealed): the feed's sealer gives them seqs after the commit. Each
// statement checks the mode the feed's row records and writes nothing when
// it is the other one, so a mode this store had cached from before a
// SetWriteMode costs the write one statement more, never a row in the wrong
// mode. (The locked statement's refusal still holds the feed lock to the
// transaction's end, which delays the sealer by as much, once per store
// after a switch.) In REPEATABLE READ or SERIALIZABLE a write fails with
// SQLSTATE 40001 when a switch committed after the transaction's snapshot
// (see the package doc's # Commit order, Isolation levels); run the
// transaction again.
func (s *Store) Write(ctx context.Context, tx pgx.Tx, f feed.FeedName, changes []feed.Change) (feed.WriteResult, error) {
	if tx == nil {
		return feed.WriteResult{}, feed.Invalid("tx", "must not be nil")
	}
	if err := f.Validate(); err != nil {
		return feed.WriteResult{}, err
	}
	changes, err := feed.PrepareChanges(changes)
	if err != nil || len(changes) == 0 {
		return feed.WriteResult{}, err
	}
	keys, docs := writeArrays(changes)
	fail := func(err error) (feed.WriteResult, error) {
		return feed.WriteResult{}, feed.WriteFailed("writing to feed "+string(f), err)
	}
	mode, err := s.mode(ctx, tx, f)
	if err != nil {
		return fail(err)
	}
	// At most one switch of mode is followed: a second would mean the mode
	// changed twice inside this transaction, which SetWriteMode's FOR UPDATE
	// rules out once this transaction holds either statement's lock.
	for range 2 {
		if mode == feed.WriteConcurrent {
			var gen int64
			var snapshot bool
			b := &pgx.Batch{}
			b.Queue(s.sql.shareWrite, s.writeKey(f)).QueryRow(func(r pgx.Row) error { return r.Scan(&snapshot) })
			b.Queue(s.sql.writeConcurrent, string(f), keys, docs).QueryRow(func(r pgx.Row) error { return r.Scan(&gen) })
			err := tx.SendBatch(ctx, b).Close()
			if err == nil && snapshot {
				// The upsert read the mode from the transaction's snapshot,
				// which may predate the lock; this fails the transaction
				// if a switch committed since (see statements.modeSeen).
				_, err = tx.Exec(ctx, s.sql.modeSeen, string(f))
				if err != nil {
					return fail(err)
				}
			}
			if err == nil {
				return concurrentResult(gen, changes), nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fail(err)
			}
			mode = feed.WriteLocked
		} else {
			var gen, head int64
			err := tx.QueryRow(ctx, s.sql.write, string(f), int64(len(changes)), keys, docs, s.names.channel).Scan(&gen, &head)
			if err == nil {
				return lockedResult(gen, head, len(changes)), nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fail(err)
			}
			mode = feed.WriteConcurrent
		}
		s.modes.Store(f, mode)
	}
	return fail(errors.New("the feed's write mode changed while the write ran"))
}

// writeArrays is a prepared write's keys and documents as the statements
// take them: documents as text, which survives every exec mode, the simple
// protocol included, and nil for a deletion.
func writeArrays(changes []feed.Change) (keys []string, docs []*string) {
	keys = make([]string, len(changes))
	docs = make([]*string, len(changes))
	for i, c := range changes {
		keys[i] = string(c.Key)
		if !c.Deleted() {
			d := string(c.Doc)
			docs[i] = &d
		}
	}
	return keys, docs
}

// lockedResult is a locked-mode write's result: its n changes took the
// seqs up to the new head.
func lockedResult(gen, head int64, n int) feed.WriteResult {
	return feed.WriteResult{Generation: feed.Generation(gen), First: feed.Seq(head - int64(n) + 1), Last: feed.Seq(head)}
}

// concurrentResult is a concurrent-mode write's result: no seqs, its keys
// unsealed.
func concurrentResult(gen int64, changes []feed.Change) feed.WriteResult {
	keys := make([]feed.Key, len(changes))
	for i, c := range changes {
		keys[i] = c.Key
	}
	return feed.WriteResult{Generation: feed.Generation(gen), Unsealed: keys}
}

// QueueWrite queues the write of changes to f on b, the caller's own batch,
// so that it travels with the application's statements and costs no round
// trip of its own; done gets its result once the batch's results are read
// (by SendBatch's BatchResults.Close, or as they are read in order). It is
// Write's batched form: the same rules in either write mode, as one call of
// migration 6's write_result function, which starts with the mode this
// store had cached and follows the mode the feed's row records.
//
// The write commits or rolls back with the statements around it: send b
// inside the caller's transaction, or outside any, where PostgreSQL runs the
// whole batch as one implicit transaction (pgx sends a batch as one pipeline
// with one Sync, or as one multi-statement query in the simple protocol),
// so a failing statement anywhere in it undoes the write too. A connection
// behind a transaction pooler works either way.
//
// The feed's name and the changes are checked now, before anything is
// queued: a mistake is returned (an *feed.InvalidError) and b is left as
// it was. An empty write queues nothing and calls done at once with the
// zero result. A failure of the write itself is returned by the batch's
// Close (or by the read of its result) as a *feed.WriteFailedError. done
// may be nil; it is called at most once, only when the write succeeded.
//
// As with Write, a transaction in REPEATABLE READ or SERIALIZABLE fails with
// SQLSTATE 40001 when a switch of the feed's mode committed after its
// snapshot, and in either mode the application's own statement must lock
// the key's row before the feed write (a DELETE that finds no row locks
// nothing): see the README's rule for writing the feed yourself.
func (s *Store) QueueWrite(b *pgx.Batch, f feed.FeedName, changes []feed.Change, done func(feed.WriteResult)) error {
	if b == nil {
		return feed.Invalid("batch", "must not be nil")
	}
	if err := f.Validate(); err != nil {
		return err
	}
	changes, err := feed.PrepareChanges(changes)
	if err != nil {
		return err
	}
	if len(changes) == 0 {
		if done != nil {
			done(feed.WriteResult{})
		}
		return nil
	}
	keys, docs := writeArrays(changes)
	mode := feed.WriteLocked
	if m, ok := s.modes.Load(f); ok {
		mode = m.(feed.WriteMode)
	}
	b.Queue(s.sql.writeResult, string(f), keys, docs, s.names.channel, s.writeKey(f), string(mode)).QueryRow(func(r pgx.Row) error {
		var gen int64
		var head *int64
		if err := r.Scan(&gen, &head); err != nil {
			return feed.WriteFailed("writing to feed "+string(f), err)
		}
		var res feed.WriteResult
		if head == nil {
			s.modes.Store(f, feed.WriteConcurrent)
			res = concurrentResult(gen, changes)
		} else {
			s.modes.Store(f, feed.WriteLocked)
			res = lockedResult(gen, *head, len(changes))
		}
		if done != nil {
			done(res)
		}
		return nil
	})
	return nil
}

// roundKey is the advisory key of f's round lock: a sealing round and
// RetryParked take it exclusive before the feed lock, and a batch of an
// in-place backfill that runs beside other batches takes it shared before
// its seqs are reserved, holding it to its commit. A round that sealed
// while such a batch was under way would not see the batch's rows, and a
// keyed capture's round seals only the keys whose document differs from
// the feed's: it would find a key the table and the feed both lack (a row
// deleted since the batch read it) unchanged, and the batch's copy would
// then stand. A restamp would put a key's feed row, which may be older
// than the table's, above the batch's copy. Neither waits long for it: a
// batch holds it for one batch.
func (s *Store) roundKey(f feed.FeedName) int64 {
	return lockKey("round", s.names.schema, s.names.prefix, string(f))
}

// writeKey is f's write lock (statements.shareWrite), cached per feed.
func (s *Store) writeKey(f feed.FeedName) int64 {
	if k, ok := s.writeKeys.Load(f); ok {
		return k.(int64)
	}
	k := lockKey("write", s.names.schema, s.names.prefix, string(f))
	s.writeKeys.Store(f, k)
	return k
}

// mode is f's write mode as this store last found it, read on q the first
// time.
func (s *Store) mode(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, f feed.FeedName) (feed.WriteMode, error) {
	if m, ok := s.modes.Load(f); ok {
		return m.(feed.WriteMode), nil
	}
	var m string
	if err := q.QueryRow(ctx, s.sql.modeOf, string(f)).Scan(&m); err != nil {
		return "", err
	}
	s.modes.Store(f, feed.WriteMode(m))
	return feed.WriteMode(m), nil
}

// span is one row of a batch being read: its key starts at key in the
// batch's key buffer and ends where the next row's starts; doc is its
// document, cut out of a document buffer, nil for a tombstone.
type span struct {
	seq int64
	key int
	doc []byte
}

// Document buffers of a batch read start at minDocBuffer bytes and double up
// to maxDocBuffer: a batch of a few rows costs little, a full one a few
// allocations.
const (
	minDocBuffer = 4 << 10
	maxDocBuffer = 128 << 10
)

// records makes the batch's records, their keys cut out of the one string
// that holds them all.
func records(spans []span, keys string) []feed.Record {
	out := make([]feed.Record, len(spans))
	end := len(keys)
	for i := len(spans) - 1; i >= 0; i-- {
		sp := spans[i]
		out[i] = feed.Record{Key: feed.Key(keys[sp.key:end]), Seq: feed.Seq(sp.seq), Doc: sp.doc}
		end = sp.key
	}
	return out
}

// WriteCommitted writes changes to f in a transaction of its own.
func (s *Store) WriteCommitted(ctx context.Context, f feed.FeedName, changes []feed.Change) (feed.WriteResult, error) {
	var res feed.WriteResult
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var err error
		res, err = s.Write(ctx, tx, f, changes)
		return err
	})
	if err != nil {
		return feed.WriteResult{}, feed.WriteFailed("writing to feed "+string(f), err)
	}
	return res, nil
}

// ResetTx is a rebuild's feed half, inside the caller's tx: it takes the feed's
// write lock exclusive and its generations row FOR UPDATE first (so a writer
// in flight, of either mode, finishes before it, and one that starts after
// waits), moves the generation on and
// empties the feed, unsealed rows included, all at the caller's commit. The
// delete is a statement of its own, after the lock, so it sees and removes
// every row a writer it waited for committed: no unsealed row of the old
// generation is ever sealed into the new one, and no write that committed
// before the reset survives it. That holds in READ COMMITTED, where the
// delete reads a snapshot of its own; a tx in REPEATABLE READ or
// SERIALIZABLE reads the snapshot it took before the lock, so ResetTx
// refuses it (an *feed.InvalidError, nothing written) for a feed in the
// concurrent mode, whose writers touch no row the reset locks, while in
// the locked mode a write committed in between fails the lock with
// SQLSTATE 40001. Seqs are not reset, so a cursor of the old
// generation stays below every row of the new one. It returns the new
// generation.
func (s *Store) ResetTx(ctx context.Context, tx pgx.Tx, f feed.FeedName) (feed.Generation, error) {
	if tx == nil {
		return 0, feed.Invalid("tx", "must not be nil")
	}
	if err := f.Validate(); err != nil {
		return 0, err
	}
	var gen int64
	var snapshot bool
	if err := tx.QueryRow(ctx, s.sql.excludeWriteIn, s.writeKey(f)).Scan(&snapshot); err != nil {
		return 0, feed.WriteFailed("resetting feed "+string(f), err)
	}
	if _, err := tx.Exec(ctx, s.sql.lockReset, string(f)); err != nil {
		return 0, feed.WriteFailed("resetting feed "+string(f), err)
	}
	if snapshot {
		// The row lock just taken fails on a generations row newer than
		// the snapshot, so the mode read now is the feed's.
		var mode, level string
		if err := tx.QueryRow(ctx, s.sql.modeIn, string(f)).Scan(&mode, &level); err != nil {
			return 0, feed.WriteFailed("resetting feed "+string(f), err)
		}
		if feed.WriteMode(mode) == feed.WriteConcurrent {
			return 0, feed.Invalid("tx", "runs in %s; resetting feed %s, which is in the concurrent write mode, needs READ COMMITTED: in this level the reset reads the snapshot the transaction took before its lock, and an unsealed write committed in between would outlive the reset into the new generation", level, f)
		}
	}
	if err := tx.QueryRow(ctx, s.sql.reset, string(f)).Scan(&gen); err != nil {
		return 0, feed.WriteFailed("resetting feed "+string(f), err)
	}
	if _, err := tx.Exec(ctx, s.sql.emptyFeed, string(f), s.names.channel); err != nil {
		return 0, feed.WriteFailed("resetting feed "+string(f), err)
	}
	return feed.Generation(gen), nil
}

// Head returns f's head; see feed.Reader. While an in-place backfill's
// batch holds seqs it has not committed, that is the seq before the first
// of them, which ReadBatch gives too: no reader may pass them yet (see the
// package doc's # Backfill).
func (s *Store) Head(ctx context.Context, f feed.FeedName) (feed.Seq, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	var head int64
	if err := s.db.QueryRow(ctx, s.sql.head, string(f)).Scan(&head); err != nil {
		return 0, feed.Unreadable("reading the head of feed "+string(f), err)
	}
	return feed.Seq(head), nil
}

// Generation returns f's generation; see feed.Reader.
func (s *Store) Generation(ctx context.Context, f feed.FeedName) (feed.Generation, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	var gen int64
	if err := s.db.QueryRow(ctx, s.sql.generation, string(f)).Scan(&gen); err != nil {
		return 0, feed.Unreadable("reading the generation of feed "+string(f), err)
	}
	return feed.Generation(gen), nil
}

// ReadBatch reads the records after seq after, up to limit, with their
// generation and the head, in one statement and so one snapshot; see
// feed.Reader.
//
// The statement asks for one row more than limit.Records, so that More says
// whether records follow, not only that the batch is full; and the byte
// bound is kept here, by stopping at the row that would pass it, so that
// what the batch holds is bounded. The rows after that one still cross the
// wire and are dropped unread (closing a result drains it): a byte-cut batch
// of large documents costs up to limit.Records rows of transfer, which is
// why a syncer worker asks for few records once it sees batches cut by
// bytes. Bounding in SQL instead (a running sum of each row's text length)
// converts every document to text twice on every read, which costs the
// catch-up of small documents about a third of its rate
// (BenchmarkReadBatchBytes measures both).
func (s *Store) ReadBatch(ctx context.Context, f feed.FeedName, after feed.Seq, limit feed.BatchLimit) (feed.Batch, error) {
	if err := f.Validate(); err != nil {
		return feed.Batch{}, err
	}
	if after < 0 {
		return feed.Batch{}, feed.Invalid("after", "is %d; seqs are never negative", after)
	}
	if err := limit.Validate("limit"); err != nil {
		return feed.Batch{}, err
	}
	rows, err := s.db.Query(ctx, s.sql.readBatch, string(f), int64(after), int64(limit.Records)+1)
	if err != nil {
		return feed.Batch{}, feed.Unreadable("reading feed "+string(f), err)
	}
	defer rows.Close()
	// A catch-up reads a million rows in a few seconds, so the read costs as
	// few allocations as it can: the scan targets live outside the loop (Scan
	// takes them as interfaces, so per-row targets would each escape), pgx
	// hands over its own buffer for the key and the document (DriverBytes,
	// valid until the next row), and the documents are copied into a few
	// shared buffers, the keys into one string, which the records then slice.
	// That makes a batch a handful of allocations instead of two per row, at
	// the price feed.Record's doc states: a document kept keeps its buffer.
	var (
		seq      int64
		key, doc pgtype.DriverBytes
		keys     []byte
		docs     []byte
		spans    []span
		b        feed.Batch
		meta     bool
		size     int
	)
	targets := []any{&key, &seq, &doc}
	bad := func(format string, args ...any) error {
		return feed.Unreadable("reading feed "+string(f), fmt.Errorf(format, args...))
	}
	for rows.Next() {
		if err := rows.Scan(targets...); err != nil {
			return feed.Batch{}, feed.Unreadable("reading feed "+string(f), err)
		}
		if key == nil { // the generation and head row; see statements.readBatch
			head, err := strconv.ParseInt(string(doc), 10, 64)
			if meta || err != nil {
				return feed.Batch{}, bad("the batch read returned a second or malformed head row (head %q)", doc)
			}
			meta, b.Generation, b.Head = true, feed.Generation(seq), feed.Seq(head)
			continue
		}
		if b.More {
			continue // cut: only the head row, should it come last, is still wanted
		}
		if n := len(spans); (n > 0 && seq <= spans[n-1].seq) || seq <= int64(after) {
			return feed.Batch{}, bad("the batch read returned seq %d out of order", seq)
		}
		if size += len(key) + len(doc); len(spans) == limit.Records || (limit.Bytes > 0 && size > limit.Bytes && len(spans) > 0) {
			// This row is past a limit: it ends the batch, unkept, and
			// says more follows.
			b.More = true
			if meta {
				break
			}
			continue
		}
		sp := span{seq: seq, key: len(keys)}
		keys = append(keys, key...)
		if doc != nil {
			if len(doc) > cap(docs)-len(docs) {
				// A new buffer, not a grown one: the documents already cut
				// out of the old buffer stay where they are, and nothing is
				// copied twice. Buffers double up to maxDocBuffer, so a batch
				// of a few small rows stays small.
				next := min(max(2*cap(docs), minDocBuffer), maxDocBuffer)
				docs = make([]byte, 0, max(next, len(doc)))
			}
			at := len(docs)
			docs = append(docs, doc...)
			sp.doc = docs[at:len(docs):len(docs)]
		}
		spans = append(spans, sp)
	}
	if err := rows.Err(); err != nil {
		return feed.Batch{}, feed.Unreadable("reading feed "+string(f), err)
	}
	if !meta {
		return feed.Batch{}, bad("the batch read returned no head row")
	}
	if len(spans) > 0 {
		b.Records = records(spans, string(keys))
	}
	return b, nil
}
