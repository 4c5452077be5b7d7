package pgfeed

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/leaserow"
)

// Defaults of SealerOptions.
const (
	// DefaultSealLimit bounds the rows one sealing round seals, so a round's
	// feed lock stays short when a sealer comes back to a backlog.
	DefaultSealLimit = 1000
	// DefaultSealMinPoll is the sealer's pause between probes while rows
	// keep coming (within Linger of the last row it sealed), and after a
	// round that sealed some rows but fewer than the limit. A probe is an
	// index-only read of the partial index on unsealed rows, with no
	// transaction id and no WAL, so probing this often while writes come
	// costs little, and it bounds how long a commit waits for its round.
	DefaultSealMinPoll = time.Millisecond
	// DefaultSealLinger is how long after the last row it sealed the sealer
	// keeps probing every MinPoll before the pause starts to double. It
	// spans the gaps between commits of a steady stream, so a row that
	// commits in one waits at most MinPoll for its probe, and it is short
	// enough that an idle spell costs few probes (Linger/MinPoll of them).
	DefaultSealLinger = 25 * time.Millisecond
	// DefaultSealMaxPoll is the longest pause between two probes of an idle
	// feed: the probe's cost when nothing is written (one statement per
	// pause), and the longest a first write after an idle spell waits.
	DefaultSealMaxPoll = 100 * time.Millisecond
	// DefaultSealModeCheck is how often a sealer of a feed in the locked
	// mode looks whether the feed has moved to the concurrent one, when no
	// notification of the switch reaches it (see SetWriteMode).
	DefaultSealModeCheck = 30 * time.Second
)

// SealerOptions tune a sealer (RunSealer). The zero value is valid and means
// every default.
type SealerOptions struct {
	// Limit bounds the rows a round seals, 1 to feed.MaxBatchLimit.
	// Defaults to DefaultSealLimit.
	Limit int
	// MinPoll is the pause between probes within Linger of the last
	// sealed row, and after a round that sealed fewer rows than Limit (a
	// full round is followed by another at once). Must not be negative.
	// Defaults to DefaultSealMinPoll.
	MinPoll time.Duration
	// Linger is how long after the last sealed row probes stay MinPoll
	// apart. Must not be negative. Defaults to DefaultSealLinger.
	Linger time.Duration
	// MaxPoll is the longest pause between probes of an idle feed; past
	// Linger, the pause doubles from MinPoll up to it while probes find
	// nothing. Must not be below MinPoll. Defaults to DefaultSealMaxPoll.
	MaxPoll time.Duration
	// ModeCheck is how often a sealer of a feed in the locked mode reads
	// the feed's mode again; a switch's notification cuts the wait short,
	// so this bounds only a switch whose notification was lost. Must not be
	// negative. Defaults to DefaultSealModeCheck.
	ModeCheck time.Duration
}

func (o SealerOptions) resolve() (SealerOptions, error) {
	switch {
	case o.Limit < 0 || o.Limit > feed.MaxBatchLimit:
		return o, feed.Invalid("options.sealer.limit", "is %d; it must be 1 to %d", o.Limit, feed.MaxBatchLimit)
	case o.Limit == 0:
		o.Limit = DefaultSealLimit
	}
	switch {
	case o.MinPoll < 0:
		return o, feed.Invalid("options.sealer.min_poll", "is %v; durations must be positive", o.MinPoll)
	case o.MinPoll == 0:
		o.MinPoll = DefaultSealMinPoll
	}
	switch {
	case o.Linger < 0:
		return o, feed.Invalid("options.sealer.linger", "is %v; durations must be positive", o.Linger)
	case o.Linger == 0:
		o.Linger = DefaultSealLinger
	}
	switch {
	case o.MaxPoll < 0:
		return o, feed.Invalid("options.sealer.max_poll", "is %v; durations must be positive", o.MaxPoll)
	case o.MaxPoll == 0:
		o.MaxPoll = max(DefaultSealMaxPoll, o.MinPoll)
	case o.MaxPoll < o.MinPoll:
		return o, feed.Invalid("options.sealer.max_poll", "is %v, below min_poll (%v)", o.MaxPoll, o.MinPoll)
	}
	switch {
	case o.ModeCheck < 0:
		return o, feed.Invalid("options.sealer.mode_check", "is %v; durations must be positive", o.ModeCheck)
	case o.ModeCheck == 0:
		o.ModeCheck = DefaultSealModeCheck
	}
	return o, nil
}

// SetWriteMode moves f to mode, in one transaction of its own, in READ
// COMMITTED whatever the session's default; see the package doc's "Commit
// order" for when to choose which. It takes the feed's
// write lock exclusive and its generations row FOR UPDATE (creating it, as a
// never-written feed's, when absent), which waits for every open writer of
// either mode and holds back every new one until it commits. Moving to the
// locked mode first seals every unsealed row, so the locked mode never
// meets one. Processes that cached the old mode find out at their next
// write (see Write); a writer whose REPEATABLE READ or SERIALIZABLE
// snapshot predates the switch fails with SQLSTATE 40001 instead (see the
// package doc's # Commit order, Isolation levels), for which a switch that
// changes the mode also rewrites the feed's row of the switches table. A
// switch to the mode the feed already has rewrites neither row, so it fails
// no such writer (to the locked mode, it still seals what waits). The
// switch notifies the store's mode channel at its
// commit, which wakes every sealer of f already running (RunSealer, which
// a syncer.Runner and kairos run start) in any process whose store listens:
// the first writes after a switch to the concurrent mode are sealed as
// promptly as any. A sealer the notification cannot reach (its store
// listens through a transaction pooler, or not at all) reads the mode
// every SealerOptions.ModeCheck instead; set Options.Listen to a direct
// connection there, or lower ModeCheck.
//
// Switch a feed to the concurrent mode only once every process that writes
// to it, reads it or collects its tombstones runs a build that knows the
// mode in its current layout (migration 5): a build that predates the
// mode writes rows sealed over the unsealed writes, and one between
// migrations 2 and 5 would leave its writes where no sealer looks, which
// migration 5's check on the rows table refuses.
func (s *Store) SetWriteMode(ctx context.Context, f feed.FeedName, mode feed.WriteMode) error {
	if err := f.Validate(); err != nil {
		return err
	}
	if err := mode.Validate("mode"); err != nil {
		return err
	}
	err := s.readCommitted(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.sql.setMode, string(f)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.sql.excludeWrite, s.writeKey(f)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.sql.lockReset, string(f)); err != nil {
			return err
		}
		if mode == feed.WriteLocked {
			// Every writer that wrote has committed or rolled back (they
			// hold the write lock to their end), so no row lock is left to
			// skip.
			for {
				n, _, err := s.sealIn(ctx, tx, f, int64(feed.MaxBatchLimit), 0)
				if err != nil {
					return err
				}
				if n == 0 {
					break
				}
			}
			var m string
			var left, recorded bool
			if err := tx.QueryRow(ctx, s.sql.probe, string(f), int64(0)).Scan(&m, &left, &recorded); err != nil {
				return err
			}
			switch {
			case left:
				return errors.New("unsealed rows are locked by another transaction")
			case recorded:
				return errors.New("recorded changes are left after sealing them all under the write lock")
			}
		}
		if _, err := tx.Exec(ctx, s.sql.updateMode, string(f), string(mode)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.sql.notifyMode, s.names.modeChannel, string(f))
		return err
	})
	if err != nil {
		return feed.WriteFailed("setting the write mode of feed "+string(f), err)
	}
	s.modes.Store(f, mode)
	return nil
}

// setReadCommitted puts the transaction it runs in into READ COMMITTED; it
// must come before any statement that takes a snapshot.
const setReadCommitted = `SET TRANSACTION ISOLATION LEVEL READ COMMITTED`

// readCommitted runs fn in a transaction of its own in READ COMMITTED,
// whatever the session's default isolation level (a role or a database
// may set default_transaction_isolation), as Backfill runs its batches:
// its statements after a lock must each read a snapshot taken after the
// lock was granted. A pool or a connection says so in its BEGIN; any other
// DBTX (a transaction, which then runs fn in a savepoint) in a statement of
// its own, which fails unless that transaction is in READ COMMITTED
// already.
func (s *Store) readCommitted(ctx context.Context, fn func(pgx.Tx) error) error {
	if b, ok := s.db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		return pgx.BeginTxFunc(ctx, b, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
	}
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, setReadCommitted); err != nil {
			return err
		}
		return fn(tx)
	})
}

// SealRound runs one sealing round on f and returns how many writes it took
// (unsealed rows sealed, recorded keys read, sealed or found unchanged);
// see the package doc's "Commit order". It is for implementers and tests:
// RunSealer runs rounds under the feed's sealer lease. Rounds need no lease
// to be safe, only to be few: two rounds at once serialise on the feed
// lock, and each seals what the other did not.
func (s *Store) SealRound(ctx context.Context, f feed.FeedName) (int, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	var (
		mode              string
		pending, recorded bool
	)
	if err := s.db.QueryRow(ctx, s.sql.probe, string(f), int64(0)).Scan(&mode, &pending, &recorded); err != nil {
		return 0, feed.WriteFailed("sealing feed "+string(f), err)
	}
	n, _, err := s.sealRound(ctx, f, pending, recorded, 0)
	if err != nil {
		return 0, feed.WriteFailed("sealing feed "+string(f), err)
	}
	return n, nil
}

// batcher is what sends a pgx.Batch: a pool, a connection, a transaction.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// takeRoundLock takes a feed's round lock (Store.roundKey) exclusive, a
// round's first lock.
const takeRoundLock = `SELECT pg_advisory_xact_lock($1::bigint)`

// sealRound is one round: the round lock and the feed lock (sealLock),
// then the seal when pending says the feed has unsealed rows and
// sealChanges when recorded says it has recorded changes (a probe's
// answers: a source it leaves out waits for the next round), in one
// transaction. It returns how many writes it took: unsealed rows sealed,
// and recorded keys read (sealed or found unchanged). Sent as one batch
// where db can (a pool, a connection), that is one round trip and one
// commit: the batch opens its transaction itself, in READ COMMITTED
// whatever the session's default, so that each statement takes its own
// snapshot and the seals' are taken after the lock was granted. (In
// REPEATABLE READ, a round read the snapshot of its first statement, taken
// before the lock, and failed with 40001 when a writer had rewritten an
// unsealed row since; the sealer then paused.) The BEGIN is explicit: a
// SET TRANSACTION heading the batch's implicit transaction worked as well,
// but PostgreSQL warned at every round that it belongs in a transaction
// block, a line in the server's log and a notice to the client per round.
func (s *Store) sealRound(ctx context.Context, f feed.FeedName, pending, recorded bool, floor int64) (int, changeNews, error) {
	if b, ok := s.db.(batcher); ok {
		if _, inTx := s.db.(pgx.Tx); !inTx {
			var n, keys, sealed, notified int64
			var news changeNews
			batch := &pgx.Batch{}
			batch.Queue(beginReadCommitted)
			batch.Queue(takeRoundLock, s.roundKey(f))
			batch.Queue(s.sql.sealLock, string(f))
			if pending {
				batch.Queue(s.sql.seal, string(f), int64(s.sealer.Limit), s.names.channel).QueryRow(func(r pgx.Row) error {
					return r.Scan(&n, &notified)
				})
			}
			if recorded {
				batch.Queue(s.changeSeal(f), string(f), int64(s.sealer.Limit), s.names.channel, floor).QueryRow(func(r pgx.Row) error {
					news.ran = true
					return r.Scan(&keys, &sealed, &notified, &news.taken, &news.left, &news.xmin, &news.xmax)
				})
			}
			batch.Queue(`COMMIT`)
			if err := b.SendBatch(ctx, batch).Close(); err != nil {
				s.rollbackAborted(ctx)
				return 0, changeNews{}, err
			}
			return int(n + keys), news, nil
		}
	}
	var n int64
	var news changeNews
	err := s.readCommitted(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, takeRoundLock, s.roundKey(f)); err != nil {
			return err
		}
		var err error
		n, news, err = s.sealIn(ctx, tx, f, int64(s.sealer.Limit), floor)
		return err
	})
	if err != nil {
		return 0, changeNews{}, err
	}
	return int(n), news, nil
}

// beginReadCommitted opens a sealing round's batch: its transaction, in
// READ COMMITTED whatever the session's default.
const beginReadCommitted = `BEGIN ISOLATION LEVEL READ COMMITTED`

// rollbackAborted ends the transaction a failed round's batch left open
// and aborted on the store's connection, when the store was given one (a
// pgx.Conn, or a pool's connection it holds): its next statement would
// fail otherwise. A pool destroys such a connection when the batch
// releases it, so there is nothing to do then.
func (s *Store) rollbackAborted(ctx context.Context) {
	var pc *pgconn.PgConn
	switch c := s.db.(type) {
	case interface{ PgConn() *pgconn.PgConn }:
		pc = c.PgConn()
	case interface{ Conn() *pgx.Conn }:
		pc = c.Conn().PgConn()
	}
	if pc == nil || pc.IsClosed() || pc.TxStatus() == 'I' {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := pc.Exec(rctx, `ROLLBACK`).Close(); err != nil {
		s.logger.Warn("pgfeed: rolling back a failed sealing round", "err", err)
	}
}

// sealIn is a round inside tx, each source of writes taken up to limit:
// the feed lock, the seal, and sealChanges from floor up when the feed has
// recorded changes there (asked after the lock). It returns how many
// writes it took, as sealRound does, and what sealChanges reports for the
// floor.
func (s *Store) sealIn(ctx context.Context, tx pgx.Tx, f feed.FeedName, limit, floor int64) (int64, changeNews, error) {
	var n, keys, sealed, notified int64
	var news changeNews
	if _, err := tx.Exec(ctx, s.sql.sealLock, string(f)); err != nil {
		return 0, news, err
	}
	if err := tx.QueryRow(ctx, s.sql.seal, string(f), limit, s.names.channel).Scan(&n, &notified); err != nil {
		return 0, news, err
	}
	var recorded bool
	if err := tx.QueryRow(ctx, s.sql.recorded, string(f), floor).Scan(&recorded); err != nil || !recorded {
		return n, news, err
	}
	news.ran = true
	err := tx.QueryRow(ctx, s.changeSeal(f), string(f), limit, s.names.channel, floor).Scan(&keys, &sealed, &notified, &news.taken, &news.left, &news.xmin, &news.xmax)
	return n + keys, news, err
}

// changeSeal is f's sealChanges statement, built once per feed.
func (s *Store) changeSeal(f feed.FeedName) string {
	if q, ok := s.changeSeals.Load(f); ok {
		return q.(string)
	}
	q := s.names.sealChanges(s.names.captureDocsName(f))
	s.changeSeals.Store(f, q)
	return q
}

// changeNews is what a round that read recorded changes (sealChanges)
// tells its sealer's floor: the highest id it took and the lowest visible
// id above that it left (nil when none), and its snapshot's xmin and xmax.
type changeNews struct {
	ran         bool
	taken, left *int64
	xmin, xmax  int64
}

// floorRescan is how long a sealer reads a feed's recorded changes from
// its floor before it probes once more from 0 (changesFloor).
const floorRescan = 10 * time.Second

// changesFloor is a sealer's lower bound on the ids of its feed's rows in
// the changes table: no row below it is left, and none can come. Its probes
// and rounds read the table from the floor up. A round deletes the rows it
// seals, and their entries stay in the table's index, dead, until a VACUUM
// (every autovacuum cycle, or never while a long transaction holds the
// horizon back); read from 0, each probe and each round stepped over all
// of them, so their cost grew with every write since the last VACUUM
// (11,000 buffers a probe after 11,000 writes under an old snapshot, where
// one from the floor reads about 40).
//
// Why a floor can be known. The ids come from an identity column (CACHE 1,
// its default), so they are handed out in increasing order. A row is
// inserted only by a capture's trigger or record, after the statement it
// fires for wrote the table's rows, so its transaction has its xid before
// it takes its id. Let a round read the changes with a snapshot S, and take
// every visible row up to id m (it read from the floor up, in id order).
// Every id up to m was handed out before m's row committed, which was
// before S, so by a transaction whose xid is below S's xmax. Once a later
// round's snapshot has its xmin at or above that xmax, each of those
// transactions has ended, and each row up to m that committed is visible
// to it; when that round also took every visible row up to m (the lowest
// it left is above m), none is left once it commits, and no id up to m is
// handed out again. The floor then moves to m + 1, and that round's own
// highest id becomes the next candidate.
//
// A transaction open since before a candidate's round (with an xid) holds
// the floor where it is, as it holds VACUUM back; one without an xid (a
// read-only report, pg_dump) holds back VACUUM but not the floor. The
// floor is the sealer's own: it starts at 0 when the sealer starts, takes
// the lease, or meets a fault, and every floorRescan the sealer probes
// once from 0 (and runs one round from there), so rows below the floor
// that came some other way (the table emptied with RESTART IDENTITY, the
// schema dropped and migrated again under a running sealer) are sealed
// within that time.
type changesFloor struct {
	at         int64 // no row below it is left, and none can come
	next, xmax int64 // the candidate: a round's highest id taken, and its snapshot's xmax
	candidate  bool
	rescanned  time.Time // when the sealer last probed from 0
}

// learn takes a committed round's news and reports whether the floor
// moved.
func (c *changesFloor) learn(r changeNews) bool {
	if !r.ran {
		return false
	}
	moved := false
	if c.candidate && r.xmin >= c.xmax && (r.left == nil || *r.left > c.next) {
		// A candidate's next is never below the floor it was taken at.
		c.at, c.candidate, moved = c.next+1, false, true
	}
	if !c.candidate && r.taken != nil && *r.taken >= c.at {
		c.next, c.xmax, c.candidate = *r.taken, r.xmax, true
	}
	return moved
}

// restart puts the floor back to 0, as of now.
func (c *changesFloor) restart(now time.Time) {
	*c = changesFloor{rescanned: now}
}

// from is where the cycle of probe and rounds that starts now reads from:
// the floor, or 0 once every floorRescan.
func (c *changesFloor) from(now time.Time) int64 {
	if now.Sub(c.rescanned) >= floorRescan {
		c.rescanned = now
		return 0
	}
	return c.at
}

// floorRound is a round of f read from from, whose news floor learns
// (and the store records where floor moved, for tests).
func (s *Store) floorRound(ctx context.Context, f feed.FeedName, floor *changesFloor, pending, recorded bool, from int64) (int, error) {
	n, news, err := s.sealRound(ctx, f, pending, recorded, from)
	if err != nil {
		return 0, err
	}
	if floor.learn(news) {
		s.floors.Store(f, floor.at)
	}
	return n, nil
}

// RunSealer seals f's unsealed rows until ctx ends, while f is in the
// concurrent write mode and this process holds the feed's sealer lease (a
// lease row of its own, timed like a sink's lease rows, Options.Lease). Any
// number of processes may run it for one feed: one holds the lease and
// seals, the others wait to take over. While f is in the locked mode it
// holds no lease and reads the mode again when a switch is notified
// (SetWriteMode; modewake.go), or after SealerOptions.ModeCheck. It
// returns nil when ctx ends; a fault is logged and retried after a pause,
// never returned, so a database outage delays sealing and loses nothing
// (the writes wait unsealed). syncer.Runner runs it for every feed of its
// targets.
//
// The loop: a probe (the mode and whether any row is unsealed, from the
// partial index); when it finds rows, a round, followed at once by another
// while each is full; then the next probe after a pause. The pause is
// MinPoll while the last sealed row is at most Linger old, so a steady
// stream of commits is sealed within about MinPoll and a round trip of each;
// past Linger it doubles up to MaxPoll while probes find nothing, which
// keeps an idle feed's cost to one probe per MaxPoll. A probe that finds
// nothing runs no round, so an idle or lingering sealer takes no lock, no
// transaction id and writes no WAL. A round that seals nothing after a probe
// found rows met only rows held by open writers: the pause doubles then
// too, so a long transaction costs a round per pause, not one per MinPoll.
// A row an open writer holds is skipped by the round and sealed by a later
// one, with that writer's value.
func (s *Store) RunSealer(ctx context.Context, f feed.FeedName) error {
	if err := f.Validate(); err != nil {
		return err
	}
	o := s.sealer
	modes := &modeWake{s: s, f: f}
	defer modes.close()
	var lease *leaserow.Lease
	defer func() {
		if lease != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = lease.Release(rctx)
			cancel()
		}
	}()
	wait := o.MinPoll
	var lastSealed time.Time
	var floor changesFloor
	pause := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	fault := func(what string, err error) bool {
		if ctx.Err() != nil {
			return false
		}
		s.logger.Warn("pgfeed: sealer fault", "feed", string(f), "op", what, "err", err)
		floor.restart(time.Now())
		return pause(s.lease.Heartbeat)
	}
	for ctx.Err() == nil {
		var (
			mode              string
			pending, recorded bool
		)
		from := floor.from(time.Now())
		if err := s.db.QueryRow(ctx, s.sql.probe, string(f), from).Scan(&mode, &pending, &recorded); err != nil {
			if !fault("probe", err) {
				return nil
			}
			continue
		}
		if feed.WriteMode(mode) != feed.WriteConcurrent {
			if lease != nil {
				_ = lease.Release(ctx)
				lease = nil
			}
			if !modes.wait(ctx, o.ModeCheck) {
				return nil
			}
			continue
		}
		if lease != nil && lease.EnsureHeld(ctx) != nil {
			_ = lease.Release(ctx)
			lease = nil
		}
		if lease == nil {
			l, err := s.takeSealer(ctx, f)
			if err != nil {
				if !fault("lease", err) {
					return nil
				}
				continue
			}
			if l == nil { // another process seals
				if !pause(s.lease.Heartbeat) {
					return nil
				}
				continue
			}
			lease = l
			floor.restart(time.Now())
		}
		sealed, held := 0, false
		if pending || recorded {
			for ctx.Err() == nil {
				n, err := s.floorRound(ctx, f, &floor, pending, recorded, from)
				if err != nil {
					fault("round", err)
					break
				}
				from = floor.at // a rescan is one round from 0
				sealed += n
				if n < o.Limit {
					held = n == 0
					break
				}
			}
		}
		switch now := time.Now(); {
		case sealed > 0:
			lastSealed, wait = now, o.MinPoll
		case !held && now.Sub(lastSealed) < o.Linger:
			wait = o.MinPoll
		default:
			wait = min(max(2*wait, o.MinPoll), o.MaxPoll)
		}
		if !pause(wait) {
			return nil
		}
	}
	return nil
}

// takeSealer takes f's sealer lease row, or returns nil when a live holder
// has it.
func (s *Store) takeSealer(ctx context.Context, f feed.FeedName) (*leaserow.Lease, error) {
	holder := newHolder("sealer")
	ttl := micros(s.lease.TTL)
	takenAt := s.clock.Now()
	tag, err := s.db.Exec(ctx, s.sql.takeSealer, string(f), string(holder), s.at(takenAt), ttl)
	if err != nil {
		return nil, err
	}
	if tag.RowsAffected() == 0 {
		return nil, nil
	}
	return leaserow.Start(ctx, leaserow.Config{
		ID:      feed.SinkID{Feed: f, Sink: "sealer"},
		Holder:  holder,
		Timings: s.lease,
		Clock:   s.clock,
		TakenAt: takenAt,
		Logger:  s.logger,
		Renew: func(ctx context.Context, at time.Time) (bool, error) {
			tag, err := s.db.Exec(ctx, s.sql.renewSealer, string(f), string(holder), s.at(at), ttl)
			if err != nil {
				return false, err
			}
			return tag.RowsAffected() > 0, nil
		},
		Clear: func(ctx context.Context) error {
			_, err := s.db.Exec(ctx, s.sql.clearSealer, string(f), string(holder))
			return err
		},
	}), nil
}

// SealedRange says where a concurrent-mode write of keys stands, for
// read-your-writes (syncer.WaitApplied): sealed is false while any of the
// keys' rows waits unsealed, its write or a later one; once none does, first
// and last are the lowest and highest seq of the keys' rows, each the
// write's own or a later write's, and gen the feed's generation, in the same
// snapshot. A key with no row (a delete whose tombstone was collected, or a
// reset that emptied the feed) plays no part. It is for implementers.
func (s *Store) SealedRange(ctx context.Context, f feed.FeedName, keys []feed.Key) (gen feed.Generation, first, last feed.Seq, sealed bool, err error) {
	if err := f.Validate(); err != nil {
		return 0, 0, 0, false, err
	}
	ks := make([]string, len(keys))
	for i, k := range keys {
		ks[i] = string(k)
	}
	var (
		g        int64
		lo, hi   *int64
		unsealed bool
	)
	if err := s.db.QueryRow(ctx, s.sql.sealedRange, string(f), ks).Scan(&g, &lo, &hi, &unsealed); err != nil {
		return 0, 0, 0, false, feed.Unreadable("reading the seal of a write to feed "+string(f), err)
	}
	if unsealed {
		return feed.Generation(g), 0, 0, false, nil
	}
	if lo != nil {
		first, last = feed.Seq(*lo), feed.Seq(*hi)
	}
	return feed.Generation(g), first, last, true, nil
}
