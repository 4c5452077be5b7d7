package pgfeed

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
)

// SinkLockKey is the advisory lock key of id under s, for tests that hold the
// lock themselves.
func SinkLockKey(s *Store, id feed.SinkID) int64 { return s.sinkKey(id) }

// ClaimAdvisory runs the advisory lease's claim (statements.claimAdvisory) on
// conn, as the lease's own session does, and says whether it recorded holder.
func ClaimAdvisory(ctx context.Context, s *Store, conn *pgx.Conn, id feed.SinkID, holder feed.LeaseHolder) (bool, error) {
	tag, err := conn.Exec(ctx, s.sql.claimAdvisory, string(id.Feed), string(id.Sink), string(holder), s.now(), s.sinkKey(id))
	return tag.RowsAffected() > 0, err
}

// SealRoundHeld runs one sealing round in a transaction that it holds open
// for hold after the seal, before its commit: a test's way to make two
// overlapping rounds commit in either order.
func SealRoundHeld(ctx context.Context, s *Store, f feed.FeedName, hold time.Duration) (int, error) {
	var n int64
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var err error
		if n, _, err = s.sealIn(ctx, tx, f, int64(s.sealer.Limit), 0); err != nil {
			return err
		}
		time.Sleep(hold)
		return nil
	})
	return int(n), err
}

// SealRoundGated runs one sealing round that takes the feed lock, closes
// locked, and seals only once proceed is closed, then commits: a test's way
// to have a round hold the lock while other work queues behind it, and to
// choose which writes its seal (a snapshot after proceed) sees.
func SealRoundGated(ctx context.Context, s *Store, f feed.FeedName, locked chan<- struct{}, proceed <-chan struct{}) (int, error) {
	var n int64
	err := s.readCommitted(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, takeRoundLock, s.roundKey(f)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.sql.sealLock, string(f)); err != nil {
			return err
		}
		close(locked)
		select {
		case <-proceed:
		case <-ctx.Done():
			return ctx.Err()
		}
		var err error
		n, _, err = s.sealIn(ctx, tx, f, int64(s.sealer.Limit), 0)
		return err
	})
	return int(n), err
}

// SealerFloor is where the last floor move of a sealer of f under s put
// its floor (changesFloor), 0 when none has moved.
func SealerFloor(s *Store, f feed.FeedName) int64 {
	v, _ := s.floors.Load(f)
	n, _ := v.(int64)
	return n
}

// WriteLockKey is the advisory key of f's write lock under s, for tests
// that hold the lock as a writer would.
func WriteLockKey(s *Store, f feed.FeedName) int64 { return s.writeKey(f) }

// AfterReserve has fn run after each reservation of an in-place
// backfill's batch copied beside others, before the batch reads, with the
// batch's share.
func AfterReserve(s *Store, fn func(share int)) { s.afterReserve = fn }

// OnBatch has fn told of each in-place backfill batch's statement that
// ran: whether it inserted its rows plainly, and its error.
func OnBatch(s *Store, fn func(plain bool, err error)) { s.onBatch = fn }

// ProbeSQL is the sealer's probe: $1 the feed, $2 the floor.
func ProbeSQL(s *Store) string { return s.sql.probe }

// Floor is a sealer's floor (changesFloor), for tests that run a sealer's
// rounds one at a time.
type Floor struct{ c changesFloor }

// At is where the floor stands.
func (fl *Floor) At() int64 { return fl.c.at }

// SealRoundFrom probes f and runs one round from the floor fl through
// RunSealer's floorRound.
func SealRoundFrom(ctx context.Context, s *Store, f feed.FeedName, fl *Floor) (int, error) {
	var mode string
	var pending, recorded bool
	if err := s.db.QueryRow(ctx, s.sql.probe, string(f), fl.c.at).Scan(&mode, &pending, &recorded); err != nil {
		return 0, err
	}
	if !pending && !recorded {
		return 0, nil
	}
	return s.floorRound(ctx, f, &fl.c, pending, recorded, fl.c.at)
}

// FloorRescan is how often a sealer probes from 0 rather than its floor.
const FloorRescan = floorRescan
