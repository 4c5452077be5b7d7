package pgfeed

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
)

// errRefused carries a condition out of pgx.BeginFunc so the transaction
// rolls back and the caller sees the condition itself.
type errRefused struct{ err error }

func (e errRefused) Error() string { return e.err.Error() }

func unrefuse(err error) error {
	var r errRefused
	if errors.As(err, &r) {
		return r.err
	}
	return nil
}

// ReadCursor returns id's cursor; see feed.SyncStore. Operators see cursors
// in Describe; this is the driver's read (see the package doc, "For
// implementers").
func (s *Store) ReadCursor(ctx context.Context, id feed.SinkID) (feed.Cursor, error) {
	if err := id.Validate(); err != nil {
		return feed.Cursor{}, err
	}
	var gen, seq *int64
	err := s.db.QueryRow(ctx, s.sql.readCursor, string(id.Feed), string(id.Sink)).Scan(&gen, &seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return feed.Cursor{}, nil
	}
	if err != nil {
		return feed.Cursor{}, feed.Unreadable("reading the cursor of "+id.String(), err)
	}
	if gen == nil || seq == nil {
		return feed.Cursor{}, nil
	}
	return feed.Cursor{Generation: feed.Generation(*gen), Seq: feed.Seq(*seq)}, nil
}

// CASCursor makes the fenced move m in one transaction: the guarded move,
// then its park changes, which a lost guard rolls back with it (a move without
// park changes is its one statement); see feed.CursorMove. The move also
// checks, in the same statement, that the feed has been where it moves to:
// a generation the feed has moved past loses as superseded, a seq above the
// head or a generation ahead of the feed is refused as invalid. Each landed
// move notifies cursor waiters (SubscribeCursors).
//
// CASCursor is for implementers (see the package doc): syncer's workers call
// it.
func (s *Store) CASCursor(ctx context.Context, m feed.CursorMove) error {
	if err := m.Validate(); err != nil {
		return err
	}
	var expGen, expSeq *int64
	if !m.Expected.IsZero() {
		g, q := int64(m.Expected.Generation), int64(m.Expected.Seq)
		expGen, expSeq = &g, &q
	}
	unpark := make([]string, len(m.Parked.Unpark))
	for i, k := range m.Parked.Unpark {
		unpark[i] = string(k)
	}
	// The last park of a key wins, as feed.ParkChange says.
	last := make(map[feed.Key]int, len(m.Parked.Park))
	for i, p := range m.Parked.Park {
		last[p.Key] = i
	}
	var (
		parkKeys    []string
		parkSeqs    []int64
		parkReasons []string
		parkTimes   []time.Time
	)
	for i, p := range m.Parked.Park {
		if last[p.Key] != i {
			continue
		}
		parkKeys = append(parkKeys, string(p.Key))
		parkSeqs = append(parkSeqs, int64(p.Seq))
		parkReasons = append(parkReasons, p.Reason)
		parkTimes = append(parkTimes, p.ParkedAt)
	}
	if parkKeys == nil {
		parkKeys, parkSeqs, parkReasons, parkTimes = []string{}, []int64{}, []string{}, []time.Time{}
	}
	// move runs the guarded move and says why it was refused, if it was.
	move := func(q DBTX) (refused, err error) {
		var landed, gen, head int64
		err = q.QueryRow(ctx, s.sql.cas,
			string(m.ID.Feed), string(m.ID.Sink), string(m.Holder),
			int64(m.Next.Generation), int64(m.Next.Seq), expGen, expSeq, s.now(), s.names.cursorChannel).Scan(&landed, &gen, &head)
		if err != nil || landed > 0 {
			return nil, err
		}
		return refusal(m, feed.Generation(gen), feed.Seq(head)), nil
	}
	if !m.Parked.Replace && len(unpark) == 0 && len(parkKeys) == 0 {
		// No park changes: the guarded move is one statement, atomic on its
		// own, so it needs no transaction around it (one round trip, not three).
		refused, err := move(s.db)
		if err != nil {
			return feed.WriteFailed("moving the cursor of "+m.ID.String(), err)
		}
		return refused
	}
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		refused, err := move(tx)
		if err != nil {
			return err
		}
		if refused != nil {
			return errRefused{refused}
		}
		_, err = tx.Exec(ctx, s.sql.casParks, string(m.ID.Feed), string(m.ID.Sink),
			m.Parked.Replace, unpark, parkKeys, parkSeqs, parkReasons, parkTimes)
		return err
	})
	if r := unrefuse(err); r != nil {
		return r
	}
	if err != nil {
		return feed.WriteFailed("moving the cursor of "+m.ID.String(), err)
	}
	return nil
}

// refusal is the error of a move the cas statement refused, from the feed's
// generation and head it compared with: the feed's place first, then the
// sink's guard, in the order memfeed decides; see feed.CursorMove.
func refusal(m feed.CursorMove, gen feed.Generation, head feed.Seq) error {
	switch {
	case m.Next.Generation > gen:
		return feed.Invalid("move.next.generation", "is %d; the feed is at generation %d", m.Next.Generation, gen)
	case m.Next.Generation < gen:
		return &feed.CursorSupersededError{ID: m.ID, Generation: gen}
	case m.Next.Seq > head:
		return feed.Invalid("move.next.seq", "is %d, above the feed's head %d; a cursor moves only past seqs the feed handed out", m.Next.Seq, head)
	}
	return &feed.CursorSupersededError{ID: m.ID}
}

// ReadParked returns id's parked records in key order.
func (s *Store) ReadParked(ctx context.Context, id feed.SinkID) ([]feed.ParkedRecord, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, s.sql.readParked, string(id.Feed), string(id.Sink))
	if err != nil {
		return nil, feed.Unreadable("reading the parked records of "+id.String(), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (feed.ParkedRecord, error) {
		var (
			p   feed.ParkedRecord
			key string
			seq int64
		)
		err := r.Scan(&key, &seq, &p.Reason, &p.ParkedAt)
		p.Key, p.Seq = feed.Key(key), feed.Seq(seq)
		return p, err
	})
	if err != nil {
		return nil, feed.Unreadable("reading the parked records of "+id.String(), err)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// RetryParked unparks key for id and restamps its row; see feed.SyncStore. One
// transaction takes the feed lock first (FOR NO KEY UPDATE: the lock a locked
// writer's upsert and a sealing round take, which a concurrent writer's KEY
// SHARE does not wait for), so the new seq is handed out in commit order with
// every writer's and every round's.
func (s *Store) RetryParked(ctx context.Context, id feed.SinkID, key feed.Key) (bool, error) {
	if err := id.Validate(); err != nil {
		return false, err
	}
	if err := key.Validate(); err != nil {
		return false, err
	}
	err := s.readCommitted(ctx, func(tx pgx.Tx) error {
		// No generations row means the feed was never written: it has no
		// row to restamp, and nothing to lock against. The round lock
		// first, as a round takes it: a restamp between a backfill batch's
		// reservation and its commit would put the key's feed row, which
		// may be older than the table's, above the batch's copy.
		if _, err := tx.Exec(ctx, takeRoundLock, s.roundKey(id.Feed)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.sql.sealLock, string(id.Feed)); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, s.sql.unparkOne, string(id.Feed), string(id.Sink), string(key))
		if err != nil {
			return err
		}
		n := 0
		for rows.Next() {
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n == 0 {
			return errRefused{errNotParked}
		}
		_, err = tx.Exec(ctx, s.sql.restamp, string(id.Feed), string(key), s.names.channel)
		return err
	})
	if errors.Is(unrefuse(err), errNotParked) {
		return false, nil
	}
	if err != nil {
		return false, feed.WriteFailed("retrying parked key "+string(key)+" of "+id.String(), err)
	}
	return true, nil
}

var errNotParked = errors.New("not parked")

// CollectTombstones deletes the tombstones every registered sink has passed,
// in one statement, so against one snapshot of the cursors; see
// feed.SyncStore. It never waits on a row lock: a tombstone another
// transaction holds (a write of its key, another collection) is left for
// the next collection, so collections from several processes, and the
// application's writes, never deadlock with one another over it. It also
// deletes, in batches, the rows of a generation a backfill moved the feed
// away from and did not finish deleting (see the package doc's # Backfill);
// those are not counted.
func (s *Store) CollectTombstones(ctx context.Context, f feed.FeedName) (int, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	var n int64
	if err := s.db.QueryRow(ctx, s.sql.collect, string(f)).Scan(&n); err != nil {
		return 0, feed.WriteFailed("collecting the tombstones of feed "+string(f), err)
	}
	// The rows of a generation a backfill moved the feed from, which that
	// backfill did not finish deleting; they are not tombstones, and not
	// counted.
	if err := s.sweepStores(ctx, s.db, string(f), "retired"); err != nil {
		return int(n), feed.WriteFailed("deleting the rows of an earlier generation of feed "+string(f), err)
	}
	return int(n), nil
}

// OldestTombstone says when f's oldest tombstone was made (at) and how old
// it is (age), both on the database's clock, so a caller's own clock plays
// no part in the age; at is zero when f holds no tombstone. It is one probe
// of a partial index on tombstones, however large the feed, which is what
// lets kairos run read it in the background for its
// kairos_feed_oldest_tombstone_age_seconds.
//
// A tombstone's time is that of the transaction that made it (the
// migration's notes on deleted_at say which one in each write mode): an age
// that keeps growing says a sink has not passed it, it is parked, or no
// collection has run since (CollectTombstones; kairos collect says which
// sink holds it back). A tombstone written by a build from before the
// stamp has none and is not counted.
func (s *Store) OldestTombstone(ctx context.Context, f feed.FeedName) (at time.Time, age time.Duration, err error) {
	if err := f.Validate(); err != nil {
		return time.Time{}, 0, err
	}
	var (
		t   *time.Time
		sec *float64
	)
	if err := s.db.QueryRow(ctx, s.sql.oldestTombstone, string(f)).Scan(&t, &sec); err != nil {
		return time.Time{}, 0, feed.Unreadable("reading the oldest tombstone of feed "+string(f), err)
	}
	if t == nil || sec == nil {
		return time.Time{}, 0, nil
	}
	return *t, time.Duration(*sec * float64(time.Second)), nil
}

// RemoveSink unregisters id; see feed.SyncStore. One transaction first takes
// the sink's advisory lock for its own length, which a live advisory lease's
// session refuses, then deletes the cursor row only when no live lease row
// holds it, in the same statement as that test, then the parks. Both tests
// run whatever lease kind this store was built with, since another process may
// lease the sink with the other kind.
func (s *Store) RemoveSink(ctx context.Context, id feed.SinkID) (bool, error) {
	if err := id.Validate(); err != nil {
		return false, err
	}
	var removed bool
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, s.sql.lockSinkXact, s.sinkKey(id)).Scan(&locked); err != nil {
			return err
		}
		if !locked {
			return s.refuseRemove(ctx, tx, id)
		}
		tag, err := tx.Exec(ctx, s.sql.removeCursor, string(id.Feed), string(id.Sink), s.now())
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			var left int64
			if err := tx.QueryRow(ctx, s.sql.cursorExists, string(id.Feed), string(id.Sink)).Scan(&left); err != nil {
				return err
			}
			if left > 0 {
				return s.refuseRemove(ctx, tx, id)
			}
		}
		parked, err := tx.Exec(ctx, s.sql.removeParked, string(id.Feed), string(id.Sink))
		if err != nil {
			return err
		}
		removed = tag.RowsAffected() > 0 || parked.RowsAffected() > 0
		return nil
	})
	if r := unrefuse(err); r != nil {
		return false, r
	}
	if err != nil {
		return false, feed.WriteFailed("removing sink "+id.String(), err)
	}
	return removed, nil
}

// Feeds names every feed Describe knows, in name order: each feed written
// to, and each with a registered sink.
func (s *Store) Feeds(ctx context.Context) ([]feed.FeedName, error) {
	rows, err := s.db.Query(ctx, s.sql.listFeeds)
	if err != nil {
		return nil, feed.Unreadable("listing feeds", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, feed.Unreadable("listing feeds", err)
	}
	out := make([]feed.FeedName, len(names))
	for i, n := range names {
		out[i] = feed.FeedName(n)
	}
	return out, nil
}

// Describe reports f for an operator, or refuses a feed it does not know
// (no generations row and no registered sink, judged in one statement); see
// feed.SyncStore and feed.Description. It is three reads, each its own
// snapshot. A sink's Pending counts sealed rows only; the feed's Unsealed
// counts the rows whose latest write waits for the sealer, whose lease is
// Sealer.
func (s *Store) Describe(ctx context.Context, f feed.FeedName) (feed.Description, error) {
	if err := f.Validate(); err != nil {
		return feed.Description{}, err
	}
	fail := func(err error) (feed.Description, error) {
		return feed.Description{}, feed.Unreadable("describing feed "+string(f), err)
	}
	d := feed.Description{Feed: f}
	var (
		gen, head, unsealed int64
		known               bool
		mode                string
		sealer              *string
		sealerExpires       *time.Time
		oldest              *time.Time
	)
	if err := s.db.QueryRow(ctx, s.sql.describeFeed, string(f)).Scan(&gen, &head, &known, &mode, &unsealed, &sealer, &sealerExpires, &oldest); err != nil {
		return fail(err)
	}
	if !known {
		return feed.Description{}, &feed.UnknownFeedError{Feed: f}
	}
	d.Generation, d.Head = feed.Generation(gen), feed.Seq(head)
	d.Mode, d.Unsealed = feed.WriteMode(mode), unsealed
	if oldest != nil {
		d.OldestTombstone = *oldest
	}
	if sealer != nil {
		d.Sealer = &feed.LeaseState{Holder: feed.LeaseHolder(*sealer)}
		if sealerExpires != nil {
			d.Sealer.ExpiresAt = *sealerExpires
		}
	}
	rows, err := s.db.Query(ctx, s.sql.describeSinks, string(f))
	if err != nil {
		return fail(err)
	}
	d.Sinks, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (feed.SinkState, error) {
		var (
			st          feed.SinkState
			sink        string
			gen, seq    *int64
			advance     *time.Time
			holder      *string
			expires     *time.Time
			pendingRows int64
		)
		if err := r.Scan(&sink, &gen, &seq, &advance, &holder, &expires, &pendingRows); err != nil {
			return st, err
		}
		st.Sink, st.Pending = feed.SinkName(sink), pendingRows
		if gen != nil && seq != nil {
			st.Cursor = feed.Cursor{Generation: feed.Generation(*gen), Seq: feed.Seq(*seq)}
		}
		if advance != nil {
			st.LastAdvance = *advance
		}
		if holder != nil {
			st.Lease = &feed.LeaseState{Holder: feed.LeaseHolder(*holder)}
			if expires != nil {
				st.Lease.ExpiresAt = *expires
			}
		}
		return st, nil
	})
	if err != nil {
		return fail(err)
	}
	if len(d.Sinks) == 0 {
		d.Sinks = nil
		return d, nil
	}
	rows, err = s.db.Query(ctx, s.sql.describeParked, string(f))
	if err != nil {
		return fail(err)
	}
	bySink := make(map[feed.SinkName][]feed.ParkedRecord)
	var (
		sink, key, reason string
		seq               int64
		at                time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&sink, &key, &seq, &reason, &at}, func() error {
		bySink[feed.SinkName(sink)] = append(bySink[feed.SinkName(sink)], feed.ParkedRecord{Key: feed.Key(key), Seq: feed.Seq(seq), Reason: reason, ParkedAt: at})
		return nil
	})
	if err != nil {
		return fail(err)
	}
	for i := range d.Sinks {
		d.Sinks[i].Parked = bySink[d.Sinks[i].Sink]
	}
	return d, nil
}

// refuseRemove is RemoveSink's refusal: a *feed.LeaseHeldError naming the
// holder and expiry recorded on the sink's row, read in the same
// transaction, so an operator learns who holds the sink and until when.
func (s *Store) refuseRemove(ctx context.Context, tx pgx.Tx, id feed.SinkID) error {
	held, err := s.leaseHeld(ctx, tx, id)
	if err != nil {
		return err
	}
	return errRefused{held}
}
