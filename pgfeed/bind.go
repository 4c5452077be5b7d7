package pgfeed

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
)

// bindStatement records a projection binding on the feed's generations row
// unless one is recorded, creating the row (generation 1, head 0: what a
// never-written feed reads as) when absent, and returns the binding the row
// holds afterwards. It always updates the row, so it takes the row lock:
// two processes binding at once serialise, and the second reads the first's
// binding.
func (s *Store) bindStatement() string {
	g := s.names.generations
	return `INSERT INTO ` + g + ` AS g (feed, projection, partition) VALUES ($1::text, $2::text, $3::text)
ON CONFLICT (feed) DO UPDATE SET
	projection = coalesce(g.projection, excluded.projection),
	partition = CASE WHEN g.projection IS NULL THEN excluded.partition ELSE g.partition END
RETURNING g.projection, coalesce(g.partition, '')`
}

// BindTx is for implementers (see the package doc): pgread.WithFeed calls it.
// It records, inside the caller's tx, that f is materialised by the
// checkpoint (projection, partition), unless the feed is bound already, and
// returns the binding the feed holds: the one just recorded, or the earlier
// one. The caller compares the two; pgread.WithFeed refuses a feed bound to
// another checkpoint. A binding is never changed by this call; the
// generations row is the feed lock, so tx holds it until its end.
//
// projection follows feed's name rule; partition is empty or follows it too.
func (s *Store) BindTx(ctx context.Context, tx pgx.Tx, f feed.FeedName, projection, partition string) (boundProjection, boundPartition string, err error) {
	if tx == nil {
		return "", "", feed.Invalid("tx", "must not be nil")
	}
	if err := f.Validate(); err != nil {
		return "", "", err
	}
	if _, err := feed.ParseFeedName(projection); err != nil {
		return "", "", renameInvalid(err, "projection")
	}
	if partition != "" {
		if _, err := feed.ParseFeedName(partition); err != nil {
			return "", "", renameInvalid(err, "partition")
		}
	}
	if err := tx.QueryRow(ctx, s.bindStatement(), string(f), projection, partition).Scan(&boundProjection, &boundPartition); err != nil {
		return "", "", feed.WriteFailed("binding feed "+string(f), err)
	}
	return boundProjection, boundPartition, nil
}

func renameInvalid(err error, field string) error {
	if inv, ok := err.(*feed.InvalidError); ok {
		return &feed.InvalidError{Field: field, Reason: inv.Reason, Err: inv.Err}
	}
	return err
}

// LockTx is for implementers (see the package doc): pgread.WithFeed's Commit
// calls it. It takes f's feed lock (its generations row, created as a
// never-written feed's when absent) inside the caller's tx, until tx's end: the lock a
// Write takes first, of the feed's mode. In the locked mode that is FOR
// UPDATE, as a RetryParked and a ResetTx take it; in the concurrent mode it
// is the write lock, shared, as a concurrent writer takes it, so projections
// committing to one feed do not wait for each other, and a ResetTx still
// waits for them. A caller that will write other rows and then the feed takes it
// before them, so that it takes its locks in the order a reset does. In
// REPEATABLE READ or SERIALIZABLE it fails, as Write does, with SQLSTATE
// 40001 when a switch of the feed's mode committed after the transaction's
// snapshot, rather than take the lock of the mode the snapshot shows.
func (s *Store) LockTx(ctx context.Context, tx pgx.Tx, f feed.FeedName) error {
	if tx == nil {
		return feed.Invalid("tx", "must not be nil")
	}
	if err := f.Validate(); err != nil {
		return err
	}
	fail := func(err error) error { return feed.WriteFailed("locking feed "+string(f), err) }
	mode, err := s.mode(ctx, tx, f)
	if err != nil {
		return fail(err)
	}
	if mode == feed.WriteConcurrent {
		var snapshot bool
		if err := tx.QueryRow(ctx, s.sql.shareWrite, s.writeKey(f)).Scan(&snapshot); err != nil {
			return fail(err)
		}
		var one int
		err := tx.QueryRow(ctx, s.sql.shareFeed, string(f)).Scan(&one)
		if err == nil && snapshot {
			// shareFeed read the transaction's snapshot, which may predate
			// the lock (see statements.modeSeen).
			_, err = tx.Exec(ctx, s.sql.modeSeen, string(f))
			if err != nil {
				return fail(err)
			}
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fail(err)
		}
		// The feed left the concurrent mode since this store looked: the
		// locked mode's lock follows.
		s.modes.Store(f, feed.WriteLocked)
	}
	var head int64
	err = tx.QueryRow(ctx, s.sql.lockFeed, string(f)).Scan(&head)
	if errors.Is(err, pgx.ErrNoRows) {
		err = tx.QueryRow(ctx, `INSERT INTO `+s.names.generations+` AS g (feed) VALUES ($1::text)
ON CONFLICT (feed) DO UPDATE SET head = g.head RETURNING g.head`, string(f)).Scan(&head)
	}
	if err != nil {
		return fail(err)
	}
	return nil
}
